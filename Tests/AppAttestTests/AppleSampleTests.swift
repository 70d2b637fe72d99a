import AppAttest
import AttestWire
import AttestCrypto
import CBOR
import Foundation
import Testing

@Suite(.enabled(if: AppleSample.available, AppleSample.skipReason))
struct AppleSampleTests {
    let verifier = try! AppAttestVerifier()
    static let samples = AppleSample.all()
    static let everySample = AppleSample.everySample()
    static let withAssertions = AppleSample.withAssertions()

    @Test func samplesArePresent() {
        // Fails loudly in a checkout that has the shared folder but not the samples in it.
        #expect(Self.everySample.count >= 14)
        #expect(Self.everySample.filter { $0.name.hasPrefix("macos") }.count >= 2)
        #expect(Self.everySample.contains { $0.expectedAttestation?.accepted == false })
    }

    /// What the sample's `expect` block says, against what the verifier read.
    func check(_ app: AttestedApp, against expected: AppleSample.Expected, _ sample: AppleSample, sourceLocation: SourceLocation = #_sourceLocation) {
        if let flags = expected.flags { #expect(app.flags == flags, "\(sample) flags", sourceLocation: sourceLocation) }
        guard let expectedMap = expected.extensions else {
            #expect(app.extensions == nil, "\(sample): no map expected", sourceLocation: sourceLocation)
            return
        }
        guard let extensions = app.extensions else {
            Issue.record("\(sample): the extension map was not read", sourceLocation: sourceLocation)
            return
        }
        #expect(Self.report(extensions) == expectedMap, "\(sample) extensions", sourceLocation: sourceLocation)
        if case .number(let n) = expectedMap[AuthenticatorExtensions.validationCategoryKey] {
            #expect(app.validationCategory == UInt32(n), sourceLocation: sourceLocation)
            #expect(app.distribution == Distribution(category: UInt32(n)), sourceLocation: sourceLocation)
        }
        if case .text(let version) = expectedMap[AuthenticatorExtensions.bundleVersionKey] {
            #expect(app.bundleVersion == version, sourceLocation: sourceLocation)
        } else {
            #expect(app.bundleVersion == nil, sourceLocation: sourceLocation)
        }
    }

    /// The map as the samples' `expect` blocks write it: the category as its number, byte strings as hex.
    static func report(_ extensions: AuthenticatorExtensions) -> [String: AppleSample.Expected.Value] {
        var result: [String: AppleSample.Expected.Value] = [:]
        for entry in extensions.entries {
            guard case .text(let key) = entry.key else { continue }
            switch (key, entry.value) {
            case (AuthenticatorExtensions.validationCategoryKey, _): result[key] = extensions.validationCategory.map { .number(UInt64($0)) }
            case (_, .text(let t)): result[key] = .text(t)
            case (_, .unsigned(let n)): result[key] = .number(n)
            case (_, .bytes(let b)): result[key] = .hex(hexString(b))
            default: Issue.record("unexpected value for \(key)")
            }
        }
        return result
    }

    @Test(arguments: everySample.filter { $0.attestation != nil })
    func attestationReadsWhatItsExpectSays(_ sample: AppleSample) throws {
        let attestation = try #require(sample.attestation)
        let expected = sample.expectedAttestation ?? AppleSample.Expected()
        let keyID = try #require(sample.keyID)
        guard expected.accepted else {
            #expect(throws: VerificationError.self, "\(sample) must be refused: \(expected.why ?? "")") {
                _ = try verifier.verifyAttestation(attestation.object, keyID: keyID, clientDataHash: attestation.clientDataHash,
                                                   allowedAppIDs: [sample.appID], at: attestation.time)
            }
            return
        }
        let result = try verifier.verifyAttestation(attestation.object, keyID: keyID, clientDataHash: attestation.clientDataHash,
                                                    allowedAppIDs: [sample.appID], at: attestation.time)
        #expect(result.keyID == keyID)
        #expect(result.appID == sample.appID)
        if let environment = sample.environment { #expect(result.environment == environment) }
        #expect(result.receipt.count > 1000)
        if let pem = sample.publicKeyPEM { #expect(result.publicKey == (try ECPublicKey(pem: pem)).x962) }
        check(result.app, against: expected, sample)
        #expect(result.platform == sample.platformByOSInformation)
        if let acl = expected.aclBlob { #expect(result.accessControlPolicy == acl) }
        if let isMac = expected.aclBlobIsApplesMacValue { #expect(result.macSecurityPostureOK == isMac) }
        if let fields = expected.osInformation {
            for (tag, value) in fields { #expect(result.osInformation?.fields[tag] == value, "8.7 tag \(tag)") }
            #expect(result.osInformation?.version == fields[1400])
        }
    }

    /// The macOS beta sample's publisher removed the receipt: refused for exactly that.
    @Test func attestationWithoutItsReceiptIsRefused() throws {
        let sample = try #require(Self.everySample.first { $0.expectedAttestation?.accepted == false })
        let attestation = try #require(sample.attestation)
        do {
            _ = try verifier.verifyAttestation(attestation.object, keyID: try #require(sample.keyID), clientDataHash: attestation.clientDataHash,
                                               allowedAppIDs: [sample.appID], at: attestation.time)
            Issue.record("accepted an attestation without a receipt")
        } catch let error as VerificationError {
            #expect(error.reason == .malformed)
            #expect(error.detail.contains("receipt"))
        }
    }

    @Test(arguments: samples) func attestationFailsOnceItsCertificateExpired(_ sample: AppleSample) throws {
        let leaf = try LeafCertificate(der: try #require(CBORDecoder.decode(sample.attestation!.object)["attStmt"]?["x5c"]?.arrayValue?.first?.bytesValue))
        expectReason(.certificateNotValidAtTime) {
            _ = try verifier.verifyAttestation(sample.attestation!.object, keyID: sample.keyID!, clientDataHash: sample.attestation!.clientDataHash,
                                               allowedAppIDs: [sample.appID], at: leaf.notAfter.addingTimeInterval(86_400))
        }
    }

    @Test(arguments: withAssertions) func assertionReadsWhatItsExpectSays(_ sample: AppleSample) throws {
        let key = try ECPublicKey(pem: sample.publicKeyPEM!)
        for assertion in sample.assertions {
            let result = try verifier.verifyAssertion(assertion.object, publicKey: key, clientDataHash: assertion.clientDataHash,
                                                      appID: sample.appID, previousCounter: assertion.previousCounter)
            #expect(result.counter == assertion.counter)
            if let expected = sample.expectedAssertions {
                #expect(expected.accepted)
                check(result.app, against: expected, sample)
            } else {
                #expect(result.app.extensions == nil)
            }
        }
    }

    @Test(arguments: samples) func cborRoundTripsByteForByte(_ sample: AppleSample) throws {
        // Apple's encoder uses preferred serialization, as ours does: decode → encode is the identity.
        #expect(CBOREncoder.encode(try CBORDecoder.decode(sample.attestation!.object)) == sample.attestation!.object)
    }

    // MARK: Each step broken in a real sample

    func verify(_ sample: AppleSample, object: [UInt8]? = nil, keyID: [UInt8]? = nil, clientDataHash: [UInt8]? = nil,
                appIDs: [AppID]? = nil, environments: Set<AttestationEnvironment> = [.development, .production],
                with verifier: AppAttestVerifier? = nil) throws {
        _ = try (verifier ?? self.verifier).verifyAttestation(
            object ?? sample.attestation!.object, keyID: keyID ?? sample.keyID!, clientDataHash: clientDataHash ?? sample.attestation!.clientDataHash,
            allowedAppIDs: appIDs ?? [sample.appID], allowedEnvironments: environments, at: sample.attestationTime)
    }

    @Test(arguments: samples) func truncatedObjectIsMalformed(_ sample: AppleSample) {
        expectReason(.malformed) { try verify(sample, object: Array(sample.attestation!.object.dropLast(10))) }
    }

    @Test(arguments: samples) func otherFormatIsUnsupported(_ sample: AppleSample) throws {
        let object = try rewrite(sample.attestation!.object) { entries in
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
        let object = try rewrite(sample.attestation!.object) { entries in
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
        var keyID = sample.keyID!
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

    @Test(arguments: samples) func integrationOfTheOtherEnvironmentRefusesTheKey(_ sample: AppleSample) {
        let other: AttestationEnvironment = sample.environment == .production ? .development : .production
        expectReason(.environmentNotAllowed) { try verify(sample, environments: [other]) }
    }

    @Test(arguments: withAssertions) func assertionStepsBreakIndividually(_ sample: AppleSample) throws {
        let key = try ECPublicKey(pem: sample.publicKeyPEM!)
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
