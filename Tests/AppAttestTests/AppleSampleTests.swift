import AppAttest
import AttestCrypto
import CBOR
import Foundation
import Testing

@Suite(.enabled(if: AppleSample.available, AppleSample.skipReason))
struct AppleSampleTests {
    let verifier = try! AppAttestVerifier()
    static let samples = AppleSample.all()

    @Test func samplesArePresent() {
        // Fails loudly in a checkout that has the shared folder but no samples in it.
        #expect(Self.samples.count >= 5)
    }

    @Test(arguments: samples) func attestationVerifiesAtItsOwnTime(_ sample: AppleSample) throws {
        let result = try verifier.verifyAttestation(sample.attestation, keyID: sample.keyID, clientDataHash: sample.attestationClientDataHash,
                                                    allowedAppIDs: [sample.appID], at: sample.attestationTime)
        #expect(result.keyID == sample.keyID)
        #expect(result.appID == sample.appID)
        #expect(result.environment == .development)
        #expect(result.receipt.count > 1000)
        #expect(result.publicKey == (try ECPublicKey(pem: sample.publicKeyPEM)).x962)
    }

    @Test(arguments: samples) func attestationFailsAWeekLater(_ sample: AppleSample) {
        expectReason(.certificateNotValidAtTime) {
            _ = try verifier.verifyAttestation(sample.attestation, keyID: sample.keyID, clientDataHash: sample.attestationClientDataHash,
                                           allowedAppIDs: [sample.appID], at: sample.attestationTime.addingTimeInterval(7 * 86_400))
        }
    }

    @Test(arguments: samples) func assertionVerifies(_ sample: AppleSample) throws {
        let key = try ECPublicKey(pem: sample.publicKeyPEM)
        for assertion in sample.assertions {
            let result = try verifier.verifyAssertion(assertion.object, publicKey: key, clientDataHash: assertion.clientDataHash,
                                                      appID: sample.appID, previousCounter: 0)
            #expect(result.counter == assertion.counter)
        }
    }

    @Test(arguments: samples) func cborRoundTripsByteForByte(_ sample: AppleSample) throws {
        // Apple's encoder uses preferred serialization, as ours does: decode → encode is the identity.
        #expect(CBOREncoder.encode(try CBORDecoder.decode(sample.attestation)) == sample.attestation)
    }

    // MARK: Each step broken in a real sample

    func verify(_ sample: AppleSample, object: [UInt8]? = nil, keyID: [UInt8]? = nil, clientDataHash: [UInt8]? = nil,
                appIDs: [AppID]? = nil, environments: Set<AttestationEnvironment> = [.development, .production],
                with verifier: AppAttestVerifier? = nil) throws {
        _ = try (verifier ?? self.verifier).verifyAttestation(
            object ?? sample.attestation, keyID: keyID ?? sample.keyID, clientDataHash: clientDataHash ?? sample.attestationClientDataHash,
            allowedAppIDs: appIDs ?? [sample.appID], allowedEnvironments: environments, at: sample.attestationTime)
    }

    @Test(arguments: samples) func truncatedObjectIsMalformed(_ sample: AppleSample) {
        expectReason(.malformed) { try verify(sample, object: Array(sample.attestation.dropLast(10))) }
    }

    @Test(arguments: samples) func otherFormatIsUnsupported(_ sample: AppleSample) throws {
        let object = try rewrite(sample.attestation) { entries in
            entries[entries.firstIndex { $0.key == "fmt" }!].value = .text("packed")
        }
        expectReason(.unsupportedFormat) { try verify(sample, object: object) }
    }

    @Test(arguments: samples) func untrustedRootIsRejected(_ sample: AppleSample) {
        // Only the test authority trusted: Apple's real chain must not verify.
        let testOnly = AppAttestVerifier(anchors: [try! Certificate(pem: String(contentsOf: testAuthorityRoot, encoding: .utf8))])
        expectReason(.certificateChainInvalid) { try verify(sample, with: testOnly) }
    }

    @Test(arguments: samples) func tamperedCertificateSignatureIsRejected(_ sample: AppleSample) throws {
        let object = try rewrite(sample.attestation) { entries in
            let i = entries.firstIndex { $0.key == "attStmt" }!
            guard case .map(var statement) = entries[i].value, case .array(var x5c) = statement[0].value,
                  case .bytes(var leaf) = x5c[0] else { Issue.record("unexpected shape"); return }
            leaf[leaf.count - 5] ^= 0x01  // inside the signature value
            x5c[0] = .bytes(leaf)
            statement[0].value = .array(x5c)
            entries[i].value = .map(statement)
        }
        expectReason(.certificateChainInvalid) { try verify(sample, object: object) }
    }

    @Test(arguments: samples) func otherChallengeIsANonceMismatch(_ sample: AppleSample) {
        expectReason(.nonceMismatch) { try verify(sample, clientDataHash: sha256(Array("another challenge".utf8))) }
    }

    @Test(arguments: samples) func otherKeyIDIsAKeyIDMismatch(_ sample: AppleSample) {
        var keyID = sample.keyID
        keyID[0] ^= 0xff
        expectReason(.keyIDMismatch) { try verify(sample, keyID: keyID) }
    }

    @Test(arguments: samples) func otherAppIsAnRPIDMismatch(_ sample: AppleSample) {
        expectReason(.rpIDMismatch) { try verify(sample, appIDs: [AppID(teamID: sample.appID.teamID, bundleID: "com.example.other")]) }
        expectReason(.rpIDMismatch) { try verify(sample, appIDs: [AppID(teamID: "ABCDE12345", bundleID: sample.appID.bundleID)]) }
    }

    @Test(arguments: samples) func oneOfManyAppIDsMatches(_ sample: AppleSample) throws {
        let others = (0..<31).map { AppID(teamID: sample.appID.teamID, bundleID: "com.example.app\($0)") }
        try verify(sample, appIDs: others + [sample.appID])
    }

    @Test(arguments: samples) func productionOnlyIntegrationRefusesDevelopmentKey(_ sample: AppleSample) {
        expectReason(.environmentNotAllowed) { try verify(sample, environments: [.production]) }
    }

    @Test(arguments: samples) func assertionStepsBreakIndividually(_ sample: AppleSample) throws {
        let key = try ECPublicKey(pem: sample.publicKeyPEM)
        guard let assertion = sample.assertions.first else { return }
        func check(_ object: [UInt8]? = nil, clientDataHash: [UInt8]? = nil, appID: AppID? = nil, previous: UInt32 = 0,
                   key other: ECPublicKey? = nil) throws {
            _ = try verifier.verifyAssertion(object ?? assertion.object, publicKey: other ?? key,
                                             clientDataHash: clientDataHash ?? assertion.clientDataHash,
                                             appID: appID ?? sample.appID, previousCounter: previous)
        }
        expectReason(.malformed) { try check(Array(assertion.object.dropLast(3))) }
        expectReason(.malformed) { try check(CBOREncoder.encode(.map([CBORMapEntry("signature", .bytes([1]))]))) }
        expectReason(.signatureInvalid) { try check(clientDataHash: sha256(Array("other request".utf8))) }
        expectReason(.signatureInvalid) { try check(key: try DeviceKeyForTests.otherP256Key()) }
        expectReason(.rpIDMismatch) { try check(appID: AppID(teamID: "ABCDE12345", bundleID: "com.example.other")) }
        expectReason(.counterNotIncreasing) { try check(previous: assertion.counter) }
        expectReason(.counterNotIncreasing) { try check(previous: assertion.counter + 5) }
    }
}

let testAuthorityRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().appendingPathComponent("Fixtures/test-authority/root.pem")

enum DeviceKeyForTests {
    static func otherP256Key() throws -> ECPublicKey { try ECPrivateKey.generate().publicKey() }
}

/// Decodes a top-level CBOR map, lets `change` edit its entries, and re-encodes it.
func rewrite(_ object: [UInt8], _ change: (inout [CBORMapEntry]) -> Void) throws -> [UInt8] {
    guard case .map(var entries) = try CBORDecoder.decode(object) else { throw CBORError.truncated(offset: 0) }
    change(&entries)
    return CBOREncoder.encode(.map(entries))
}

/// Expects `body` to throw a VerificationError with exactly `reason`.
func expectReason(_ reason: VerificationReason, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) {
    do {
        try body()
        Issue.record("expected \(reason.rawValue), but verification succeeded", sourceLocation: sourceLocation)
    } catch let error as VerificationError {
        #expect(error.reason == reason, "detail: \(error.detail)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected \(reason.rawValue), got \(error)", sourceLocation: sourceLocation)
    }
}
