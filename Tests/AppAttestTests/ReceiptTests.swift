import AppAttest
import AttestCrypto
import AttestWire
import CBOR
import Foundation
import Testing
import TestAuthority

/// Every real receipt against Apple Root CA - G3 at its own time, each check broken on its own,
/// and the payload parser on receipts of the project's test receipt authority.
@Suite(.enabled(if: AppleSample.available, AppleSample.skipReason))
struct AppleReceiptTests {
    let verifier = try! ReceiptVerifier.apple()
    static let samples = AppleSample.all()

    /// Every receipt published with the samples: the attestations' own and the refreshed ones.
    static let receipts: [(sample: AppleSample, receipt: AppleSample.SampleReceipt)] = samples.flatMap { sample in
        var list = sample.receipts.map { (sample, $0) }
        if let own = sample.expectedAttestationReceipt, !sample.receipts.contains(where: { $0.object == own.object }) { list.append((sample, own)) }
        return list
    }

    static func credentialCertificate(_ sample: AppleSample) throws -> [UInt8] {
        try #require(CBORDecoder.decode(sample.attestation!.object)["attStmt"]?["x5c"]?.arrayValue?.first?.bytesValue)
    }

    @Test func everySampleReceiptIsHere() {
        #expect(Self.receipts.count >= 18)
        #expect(Self.receipts.contains { $0.receipt.type == "RECEIPT" && $0.receipt.riskMetric != nil })
        #expect(Self.receipts.contains { $0.sample.name.hasPrefix("macos") })
    }

    @Test(arguments: 0..<receipts.count) func receiptReadsExactlyWhatItSays(_ index: Int) throws {
        let (sample, expected) = Self.receipts[index]
        let receipt = try verifier.read(expected.object, at: expected.at)
        #expect(receipt.type.rawValue == expected.type, "\(sample)")
        #expect(receipt.environment.rawValue == expected.environment, "\(sample)")
        #expect(receipt.createdAt == ISO8601Time.parse(expected.creationTime), "\(sample) created \(expected.creationTime)")
        #expect(receipt.expiresAt == expected.expirationTime.flatMap(ISO8601Time.parse), "\(sample)")
        #expect(receipt.notBefore == expected.notBefore.flatMap(ISO8601Time.parse), "\(sample)")
        #expect(receipt.riskMetric == expected.riskMetric, "\(sample)")
        #expect(receipt.appID == (expected.appID ?? sample.appID.description), "\(sample)")
        #expect(receipt.attestedCertificate == (try Self.credentialCertificate(sample)), "\(sample): not the attestation's certificate")
        if let hash = expected.clientHash { #expect(receipt.clientHash == hash, "\(sample)") }
        // Every refreshed receipt also passes the refresh's own checks at its time.
        if receipt.type == .receipt {
            let environment: AttestationEnvironment = expected.environment == "production" ? .production : .development
            _ = try verifier.validateRefreshedReceipt(expected.object, appID: sample.appID, credentialCertificate: try Self.credentialCertificate(sample),
                                                      environment: environment, at: receipt.createdAt)
        }
    }

    @Test(arguments: samples) func attestationReceiptValidatesAtItsTime(_ sample: AppleSample) throws {
        let attestation = try #require(sample.attestation)
        let receipt = try verifier.validateAttestationReceipt(
            try #require(attestation.receiptBytes), appID: sample.appID, credentialCertificate: try Self.credentialCertificate(sample),
            clientDataHash: attestation.clientDataHash, environment: sample.environment ?? .development, at: attestation.time)
        #expect(receipt.type == .attest)
        #expect(receipt.riskMetric == nil)
    }

    // MARK: Each check broken on its own

    var ios: AppleSample { get throws { try #require(Self.samples.first { $0.name == "ios-14.4" }) } }

    func validate(_ sample: AppleSample, receipt: [UInt8]? = nil, appID: AppID? = nil, certificate: [UInt8]? = nil,
                  environment: AttestationEnvironment? = nil, at time: Date? = nil, with other: ReceiptVerifier? = nil) throws {
        let attestation = sample.attestation!
        _ = try (other ?? verifier).validateAttestationReceipt(
            receipt ?? attestation.receiptBytes!, appID: appID ?? sample.appID, credentialCertificate: certificate ?? (try Self.credentialCertificate(sample)),
            clientDataHash: attestation.clientDataHash, environment: environment ?? sample.environment ?? .development, at: time ?? attestation.time)
    }

    @Test func theRealReceiptValidatesAsIs() throws { try validate(try ios) }

    @Test func aFlippedPayloadByteBreaksTheSignature() throws {
        let sample = try ios
        var receipt = sample.attestation!.receiptBytes!
        // A byte inside the App ID text of the payload.
        let appID = Array(sample.appID.description.utf8)
        let at = try #require(receipt.indices.first { receipt[$0...].starts(with: appID) })
        receipt[at + 3] ^= 0x01
        expectReason(.receiptSignature) { try validate(sample, receipt: receipt) }
    }

    @Test func anotherSignerIsRefused() throws {
        // Apple's own payload, signed by someone else's chain: the signature is good, the chain is not G3's.
        let sample = try ios
        let real = try ReceiptVerifier(anchors: [try Certificate(pem: String(contentsOfFile: AppleSample.directory.appendingPathComponent("Apple_Root_CA_G3.pem").path, encoding: .utf8))])
            .read(sample.attestation!.receiptBytes!, at: sample.attestation!.time)
        let payload = try #require(try SignedDataVerifier(anchors: [try AppleRootCAG3.certificate()]).verify(real.der, at: sample.attestation!.time).content)
        let forged = try TestReceiptAuthority.shared.sign(payload: payload)
        expectReason(.receiptSignature) { try validate(sample, receipt: forged) }
        // The same forgery is accepted only by a verifier told to trust that authority.
        try validate(sample, receipt: forged, with: TestReceiptAuthority.shared.verifier())
    }

    @Test func theAppAttestationRootIsNotAReceiptRoot() throws {
        let appAttest = ReceiptVerifier(anchors: [try Certificate(pem: String(contentsOfFile: AppleSample.directory.appendingPathComponent("Apple_App_Attestation_Root_CA.pem").path, encoding: .utf8))])
        expectReason(.receiptSignature) { try validate(try ios, with: appAttest) }
    }

    @Test func aWrongAppIDIsAMismatch() throws {
        let sample = try ios
        expectReason(.receiptMismatch) { try validate(sample, appID: AppID(teamID: sample.appID.teamID, bundleID: "com.example.other")) }
    }

    @Test func anotherDevicesCertificateIsAMismatch() throws {
        let others = Self.samples.filter { $0.name != "ios-14.4" }
        let other = try #require(others.first)
        expectReason(.receiptMismatch) { try validate(try ios, certificate: try Self.credentialCertificate(other)) }
    }

    @Test func aStaleCreationTimeIsRefused() throws {
        let sample = try ios
        expectReason(.receiptStale) { try validate(sample, at: sample.attestation!.time.addingTimeInterval(ReceiptVerifier.maxAge + 60)) }
        expectReason(.receiptStale) { try validate(sample, at: sample.attestation!.time.addingTimeInterval(-(ReceiptVerifier.maxAge + 60))) }
    }

    @Test func aSandboxReceiptForAProductionKeyIsAMismatch() throws {
        let sample = try ios
        #expect(sample.environment == .development)
        expectReason(.receiptMismatch) { try validate(sample, environment: .production) }
    }

    @Test func aRefreshedReceiptIsNotAnAttestationsReceipt() throws {
        let sample = try ios
        let refreshed = try #require(sample.receipts.first { $0.type == "RECEIPT" })
        expectReason(.receiptMismatch) { try validate(sample, receipt: refreshed.object, at: refreshed.at) }
    }

    @Test func aReceiptOutsideItsChainsValidityIsRefused() throws {
        // Years later the signer certificate has expired, whatever the receipt says; also once the
        // verifier has verified (and remembered) the signer's path at the receipt's own time.
        let sample = try ios
        _ = try verifier.read(sample.attestation!.receiptBytes!, at: sample.attestation!.time)
        expectReason(.receiptSignature) { _ = try verifier.read(sample.attestation!.receiptBytes!, at: sample.attestation!.time.addingTimeInterval(5 * 365 * 86_400)) }
    }

    @Test(arguments: samples) func truncationsAndJunkNeverPass(_ sample: AppleSample) throws {
        let receipt = try #require(sample.attestation?.receiptBytes)
        for cut in stride(from: 0, to: receipt.count, by: max(1, receipt.count / 40)) {
            #expect(throws: VerificationError.self) { _ = try verifier.read(Array(receipt.prefix(cut)), at: sample.attestation!.time) }
        }
        #expect(throws: VerificationError.self) { _ = try verifier.read(receipt + [0], at: sample.attestation!.time) }
        #expect(throws: VerificationError.self) { _ = try verifier.read([UInt8](repeating: 0x30, count: 40_000), at: sample.attestation!.time) }
    }
}

/// The payload rules, on receipts of the test receipt authority (valid signatures, so each
/// refusal is the parser's).
@Suite struct ReceiptPayloadTests {
    let verifier = TestReceiptAuthority.shared.verifier()
    let now = Date(timeIntervalSince1970: 1_790_000_000.25)
    var fields: TestReceiptAuthority.Fields {
        TestReceiptAuthority.Fields(appID: "ABCDE12345.com.example.app", attestedCertificate: [0x30, 0x03, 0x02, 0x01, 0x01],
                                    clientHash: sha256(Array("c".utf8)), createdAt: now)
    }

    func reason(_ fields: TestReceiptAuthority.Fields) -> VerificationReason? {
        do { _ = try verifier.read(try TestReceiptAuthority.shared.receipt(fields), at: now); return nil } catch let error as VerificationError {
            return error.reason
        } catch { return nil }
    }

    @Test func anUnsortedSetIsReadInOrder() throws {
        let receipt = try verifier.read(try TestReceiptAuthority.shared.receipt(fields.refreshed(at: now, riskMetric: 7)), at: now)
        #expect(receipt.type == .receipt && receipt.riskMetric == 7 && receipt.environment == .sandbox)
        #expect(receipt.notBefore == now.addingTimeInterval(86_400))
        #expect(abs(receipt.createdAt.timeIntervalSince(now)) < 0.001)
        #expect(receipt.refreshableAt == receipt.notBefore)
    }

    @Test func eachFieldRuleRefusesOnItsOwn() throws {
        var f = fields; f.extra = [(2, Array("X.y".utf8))]
        #expect(reason(f) == .receiptMalformed)   // a field twice
        f = fields; f.type = "OTHER"
        #expect(reason(f) == .receiptMalformed)
        f = fields; f.environment = "staging"
        #expect(reason(f) == .receiptMalformed)
        f = fields; f.extra = [(17, Array("-1".utf8))]
        #expect(reason(f) == .receiptMalformed)
        f = fields; f.extra = [(99, [1, 2, 3])]
        #expect(reason(f) == nil)   // unknown fields are skipped
        for bad in ["2026-13-01T00:00:00Z", "2026-01-01 00:00:00Z", "2026-01-01T00:00:00", "2026-01-01T00:00:00.1234567890Z", "2026-01-01T00:00:00.Z"] {
            #expect(ISO8601Time.parse(bad) == nil, "\(bad)")
        }
        #expect(ISO8601Time.parse("2021-01-23T12:26:41.564Z") == Date(timeIntervalSince1970: 1_611_404_801.564))
        #expect(ISO8601Time.parse("2026-04-21T18:13:12Z") == Date(timeIntervalSince1970: 1_776_795_192))
        for payload: [UInt8] in [[0x30, 0x00], [0x31, 0x03, 0x02, 0x01, 0x01], [0x31, 0x05, 0x30, 0x03, 0x02, 0x01, 0x02], [0x31, 0x80, 0x00, 0x00]] {
            #expect(throws: VerificationError.self) { _ = try verifier.read(try TestReceiptAuthority.shared.sign(payload: payload), at: now) }
        }
    }
}

/// Apple's pins, read from every real receipt (the attestations' own and the refreshed ones).
@Suite(.enabled(if: AppleSample.available, AppleSample.skipReason))
struct AppleReceiptPinTests {
    @Test func theApplePinIsTheIntermediateOfEveryRealReceiptAndItsSignersCarryWhatIsPinned() throws {
        let receipts = AppleReceiptTests.receipts
        try #require(receipts.count >= 18, "the real receipts in ../shared/fixtures/apple")
        for (sample, receipt) in receipts {
            // Read with Apple's pins: each real receipt passes them.
            _ = try ReceiptVerifier.apple().read(receipt.object, at: receipt.at)
            let certificates = try ReceiptSignerPinTests.certificateSet(receipt.object)
            let intermediate = try #require(certificates.first { $0.subjectName.contains("Apple Application Integration CA 5 - G1") })
            #expect(hexString(intermediate.spkiSHA256) == ReceiptVerifier.appleIntermediateSPKISHA256, "\(sample.name)")
            let signer = try #require(certificates.first { $0.subjectName.contains("Application Attestation Fraud Receipt Signing") })
            #expect(signer.declaresDigitalSignature && signer.extensionValue(oid: ReceiptVerifier.signerMarkerOID) != nil, "\(sample.name)")
        }
        // With another intermediate pinned, Apple's own receipts no longer pass: the pin is what decides.
        let elsewhere = ReceiptVerifier(anchors: [try AppleRootCAG3.certificate()], pinnedIntermediates: [TestReceiptAuthority.shared.intermediate])
        let first = try #require(receipts.first)
        #expect(throws: VerificationError.self) { _ = try elsewhere.read(first.receipt.object, at: first.receipt.at) }
    }
}

/// The receipt signer is pinned beyond the root: Apple's intermediate by its key, a signer with
/// digitalSignature key usage and Apple's marker extension; and a "not before" near its creation.
@Suite struct ReceiptSignerPinTests {
    let now = Date(timeIntervalSince1970: 1_790_000_000)
    var fields: TestReceiptAuthority.Fields {
        TestReceiptAuthority.Fields(appID: "ABCDE12345.com.example.app", attestedCertificate: [0x30, 0x03, 0x02, 0x01, 0x01],
                                    clientHash: sha256(Array("c".utf8)), createdAt: now)
    }

    func refusal(_ receipt: [UInt8]) -> VerificationError? {
        do { _ = try TestReceiptAuthority.shared.verifier().read(receipt, at: now); return nil } catch { return error as? VerificationError }
    }

    @Test func aSignerUnderAnotherIntermediateOfTheSameRootIsRefused() throws {
        let receipt = try TestReceiptAuthority.shared.receipt(fields.refreshed(at: now, riskMetric: 0), signedBy: .rogueIntermediate)
        // Its chain is sound: only the pin refuses it.
        _ = try ReceiptVerifier(anchors: [TestReceiptAuthority.shared.root], pinnedIntermediates: [
            try Certificate(pem: String(contentsOfFile: ServerFixtures.receiptAuthority("rogue-intermediate.pem"), encoding: .utf8))]).read(receipt, at: now)
        let error = try #require(refusal(receipt))
        #expect(error.reason == .receiptSignature && error.detail.contains("pinned receipt intermediate"), "\(error)")
    }

    @Test func aSignerWithoutDigitalSignatureKeyUsageIsRefused() throws {
        let error = try #require(refusal(try TestReceiptAuthority.shared.receipt(fields, signedBy: .keyAgreementOnly)))
        #expect(error.reason == .receiptSignature && error.detail.contains("digitalSignature"), "\(error)")
    }

    @Test func aFarFutureNotBeforeIsRefused() throws {
        var future = fields.refreshed(at: now, riskMetric: 0)
        future.notBefore = Date(timeIntervalSince1970: 253_370_764_800)   // 9999-01-01
        future.expiresAt = Date(timeIntervalSince1970: 253_402_214_400)
        let error = try #require(refusal(try TestReceiptAuthority.shared.receipt(future)))
        #expect(error.reason == .receiptMalformed && error.detail.contains("days after its creation"), "\(error)")
        var inverted = fields.refreshed(at: now, riskMetric: 0)
        inverted.expiresAt = now.addingTimeInterval(3600)
        #expect(refusal(try TestReceiptAuthority.shared.receipt(inverted))?.detail.contains("after its expiry") == true)
        // Apple's own spacing (a day) passes.
        #expect(refusal(try TestReceiptAuthority.shared.receipt(fields.refreshed(at: now, riskMetric: 0))) == nil)
    }

    /// The certificates of a SignedData's set, through OpenSSL's PKCS#7 reader (as openssl pkcs7 -print_certs).
    static func certificateSet(_ der: [UInt8]) throws -> [Certificate] {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("receipt-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let input = directory.appendingPathComponent("r.p7")
        try Data(der).write(to: input)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = ["pkcs7", "-inform", "DER", "-in", input.path, "-print_certs"]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return try Certificate.all(pem: String(decoding: data, as: UTF8.self))
    }
}

enum ServerFixtures {
    static func receiptAuthority(_ file: String) -> String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/test-receipt-authority/\(file)").path
    }
}
