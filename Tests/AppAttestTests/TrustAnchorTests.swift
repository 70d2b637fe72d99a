import AttestWire
@testable import AppAttest
import AttestCrypto
import Foundation
import Testing
import TestAuthority

@Suite struct TrustAnchorTests {
    @Test func embeddedAppleRootMatchesItsPublishedFingerprint() throws {
        let root = try AppleAppAttestationRoot.certificate()
        #expect(hexString(root.sha256Fingerprint) == AppleAppAttestationRoot.sha256Fingerprint)
        #expect(root.subjectName.contains("Apple App Attestation Root CA"))
    }

    @Test func aSubstitutedRootIsRefusedAtStartup() {
        #expect(throws: TrustAnchorError.self) { _ = try AppleAppAttestationRoot.checked(pem: TestAuthority.rootPEM) }
    }

    @Test func extraAnchorsAreOnlyThoseNamed() throws {
        #expect(try AppAttestVerifier().chainVerifier.anchors.count == 1)
        #expect(try AppAttestVerifier(additionalAnchors: [TestAuthority.shared.root]).chainVerifier.anchors.count == 2)
    }
}
