import AppAttest
import AttestCrypto
import CBOR
import Foundation
import Testing
import TestAuthority

/// Every verification step broken on its own in the test authority's output, where a real sample
/// cannot be altered without breaking an earlier step (the nonce covers authData).
@Suite struct TestAuthorityTests {
    let authority = TestAuthority.shared
    let verifier = try! AppAttestVerifier(additionalAnchors: [TestAuthority.shared.root])
    let appID = AppID(teamID: "ABCDE12345", bundleID: "com.example.attest")
    let clientDataHash = sha256(Array("challenge".utf8))
    let now = Date()

    func attest(_ key: DeviceKey, _ options: TestAuthority.AttestationOptions = .init(),
                environments: Set<AttestationEnvironment> = [.development, .production],
                verifier: AppAttestVerifier? = nil, at time: Date? = nil) throws -> VerifiedAttestation {
        let object = try authority.attestation(key: key, appID: appID, clientDataHash: clientDataHash, at: now, options: options)
        return try (verifier ?? self.verifier).verifyAttestation(object, keyID: key.keyID, clientDataHash: clientDataHash,
                                                                 allowedAppIDs: [appID], allowedEnvironments: environments, at: time ?? now)
    }

    @Test func embeddedAuthorityMatchesTheFilesOnDisk() throws {
        let root = try String(contentsOf: testAuthorityRoot, encoding: .utf8)
        #expect(root.trimmingCharacters(in: .whitespacesAndNewlines) == TestAuthority.rootPEM.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(try Certificate(pem: root).isCA)
    }

    @Test func validAttestationVerifiesInBothEnvironments() throws {
        let key = try DeviceKey.generate()
        let development = try attest(key)
        #expect(development.environment == .development)
        #expect(development.publicKey == key.publicKey.x962)
        #expect(development.appID == appID)
        var options = TestAuthority.AttestationOptions()
        options.environment = .production
        #expect(try attest(key, options).environment == .production)
    }

    @Test func testAuthorityIsNotTrustedByDefault() throws {
        let key = try DeviceKey.generate()
        expectReason(.certificateChainInvalid) { _ = try attest(key, verifier: try AppAttestVerifier()) }
    }

    @Test func expiredAndNotYetValidCredentialCertificates() throws {
        let key = try DeviceKey.generate()
        expectReason(.certificateNotValidAtTime) { _ = try attest(key, at: now.addingTimeInterval(3 * 86_400)) }
        expectReason(.certificateNotValidAtTime) { _ = try attest(key, at: now.addingTimeInterval(-2 * 86_400)) }
        // The intermediate's own validity is checked too, not only the leaf's.
        var options = TestAuthority.AttestationOptions()
        options.notBefore = Date(timeIntervalSince1970: 0)
        options.notAfter = Date(timeIntervalSince1970: 4_000_000_000)
        expectReason(.certificateNotValidAtTime) { _ = try attest(key, options, at: Date(timeIntervalSince1970: 1_000_000_000)) }
    }

    @Test func eachStepRejectsExactlyItsOwnMutation() throws {
        let key = try DeviceKey.generate()
        var o = TestAuthority.AttestationOptions()
        o.format = "none"
        expectReason(.unsupportedFormat) { _ = try attest(key, o) }

        o = .init(); o.nonceClientDataHash = sha256(Array("other".utf8))
        expectReason(.nonceMismatch) { _ = try attest(key, o) }

        o = .init(); o.certifiedKey = try DeviceKey.generate().publicKey
        expectReason(.keyIDMismatch) { _ = try attest(key, o) }

        o = .init(); o.rpIDHash = sha256(Array("ABCDE12345.com.example.other".utf8))
        expectReason(.rpIDMismatch) { _ = try attest(key, o) }

        o = .init(); o.counter = 1
        expectReason(.counterNotZero) { _ = try attest(key, o) }

        o = .init(); o.aaguid = Array("appattestdevelo!".utf8)
        expectReason(.unknownAAGUID) { _ = try attest(key, o) }

        o = .init(); o.environment = .production
        expectReason(.environmentNotAllowed) { _ = try attest(key, o, environments: [.development]) }

        o = .init(); o.credentialID = sha256(Array("someone else".utf8))
        expectReason(.credentialIDMismatch) { _ = try attest(key, o) }
    }

    @Test func malformedInputsAreRejectedAsMalformed() throws {
        let key = try DeviceKey.generate()
        let object = try authority.attestation(key: key, appID: appID, clientDataHash: clientDataHash, at: now)
        func check(_ object: [UInt8], keyID: [UInt8]? = nil, hash: [UInt8]? = nil) {
            expectReason(.malformed) {
                _ = try verifier.verifyAttestation(object, keyID: keyID ?? key.keyID, clientDataHash: hash ?? clientDataHash,
                                                   allowedAppIDs: [appID], at: now)
            }
        }
        check([])
        check(object + [0x00])                               // trailing byte
        check([UInt8](repeating: 0xa0, count: 20_000))       // over the size limit
        check(object, keyID: [1, 2, 3])
        check(object, hash: [UInt8](repeating: 0, count: 1025))   // over the clientDataHash limit
        check(CBOREncoder.encode(.map([CBORMapEntry("fmt", "apple-appattest")])))
        check(try rewrite(object) { e in e[2].value = .bytes([UInt8](repeating: 0, count: 36)) })  // authData too short
    }

    @Test func chainsOtherThanLeafPlusIntermediateAreRefused() throws {
        let key = try DeviceKey.generate()
        let object = try authority.attestation(key: key, appID: appID, clientDataHash: clientDataHash, at: now)
        for extra in [[], [authority.root.der], [authority.intermediate.der, authority.root.der]] {
            let changed = try rewrite(object) { entries in
                guard case .map(var statement) = entries[1].value, case .array(let x5c) = statement[0].value else { return }
                statement[0].value = .array(extra.isEmpty ? [x5c[0]] : [x5c[0]] + extra.map { .bytes($0) })
                entries[1].value = .map(statement)
            }
            expectReason(.certificateChainInvalid) {
                _ = try verifier.verifyAttestation(changed, keyID: key.keyID, clientDataHash: clientDataHash, allowedAppIDs: [appID], at: now)
            }
        }
    }

    @Test func assertionsFromTheAuthorityVerifyAndCountersAdvance() throws {
        let key = try DeviceKey.generate()
        var counter: UInt32 = 0
        for i in 1...3 {
            let hash = sha256(Array("request \(i)".utf8))
            let assertion = try authority.assertion(key: key, appID: appID, clientDataHash: hash, counter: UInt32(i * 2))
            counter = try verifier.verifyAssertion(assertion, publicKey: key.publicKey, clientDataHash: hash, appID: appID,
                                                   previousCounter: counter).counter
            #expect(counter == UInt32(i * 2))
        }
        let replay = try authority.assertion(key: key, appID: appID, clientDataHash: clientDataHash, counter: counter)
        expectReason(.counterNotIncreasing) {
            _ = try verifier.verifyAssertion(replay, publicKey: key.publicKey, clientDataHash: clientDataHash, appID: appID, previousCounter: counter)
        }
    }

    @Test func chainCacheStillChecksEveryCertificatePerCall() throws {
        // After the intermediate is cached, a leaf from a different (untrusted) issuer is still refused.
        let key = try DeviceKey.generate()
        _ = try attest(key)
        let rogueCA = try ECPrivateKey.generate(curve: "P-384")
        let rogue = CertificateIssuer(certificate: authority.intermediate, key: rogueCA)  // claims the same issuer name
        let leaf = try rogue.issueLeaf(subjectCommonName: "rogue", subjectKey: key.publicKey, notBefore: now.addingTimeInterval(-60),
                                       notAfter: now.addingTimeInterval(60), extensions: [])
        #expect(throws: ChainError.self) {
            _ = try verifier.chainVerifier.verify(chain: [leaf.der, authority.intermediate.der], at: now)
        }
    }
}
