import AppAttest
import AttestCrypto
import CBOR
import CommandLineSupport
import Foundation
import RelayRoutes
import TestAuthority

/// `attest-sim bench verify`: single-threaded verification throughput, with in-process ECDSA
/// baselines measured in the same run so the ratios survive a noisy machine.
enum BenchCommand {
    static let usage = """
        usage: attest-sim bench verify [--seconds S] [--sample <fixture.json>] [--breakdown]
               attest-sim bench receipts [--seconds S] [--sample <fixture.json>]
                 an attestation's verification with its receipt validated (the test receipt authority's, or
                 Apple Root CA - G3 for a real sample) against the same verification with receipts unchecked, in one run
               attest-sim bench refresh [--devices N] [--seconds S] [--rate PER_SECOND]
                 the receipt-refresh job against a TLS stub of Apple's data service with N devices due
               attest-sim bench scan [--megabytes N] [--seconds S]
                 the relay policy's bounded scan (model, max_tokens) of an image request of N MB (default 20),
                 against reading the bytes once (memchr) and a full JSONSerialization decode, in one run
        """

    static func run(_ argv: [String]) throws -> Int32 {
        if wantsHelp(argv) { print(usage); return 0 }
        if argv.first == "scan" { return try scan(Array(argv.dropFirst())) }
        if argv.first == "receipts" { return try receipts(Array(argv.dropFirst())) }
        if argv.first == "refresh" { return try RefreshBenchCommand.run(Array(argv.dropFirst())) }
        guard argv.first == "verify" else { throw UsageError(usage) }
        let arguments = try Arguments(Array(argv.dropFirst()), options: ["seconds", "sample"], flags: ["breakdown"])
        let seconds = Double(try arguments.integer("seconds", default: 5, range: 1...3600)!)
        let workload = try arguments.value("sample").map { try sampleWorkload($0) } ?? authorityWorkload()
        warnIfDebugBuild()
        print("workload: \(workload.name)")

        // Warm up once (also proves the inputs verify) before timing.
        _ = try workload.attest()
        _ = try workload.assert()
        // Baselines and workloads alternate in short slices, so that a noisy neighbour or a clock
        // change affects both sides of each ratio alike.
        let p384Key = try BaselineKey(curve: "P-384")
        let p256Key = try BaselineKey(curve: "P-256")
        var p384 = Meter(), p256 = Meter(), attestations = Meter(), assertions = Meter()
        let rounds = max(4, Int(seconds * 4))
        let slice = seconds / Double(rounds) / 4
        for _ in 0..<rounds {
            try p384.run(seconds: slice) { try p384Key.verify() }
            try attestations.run(seconds: slice) { _ = try workload.attest() }
            try p256.run(seconds: slice) { try p256Key.verify() }
            try assertions.run(seconds: slice) { _ = try workload.assert() }
        }
        let (attestations_, assertions_, p384_, p256_) = (attestations.rate, assertions.rate, p384.rate, p256.rate)

        if arguments.has("breakdown") { try breakdown(workload, seconds: seconds / 2) }
        print("attestation_verifications_per_second: \(format(attestations_))")
        print("assertion_verifications_per_second: \(format(assertions_))")
        print("baseline_ecdsa_p384_verifications_per_second: \(format(p384_))")
        print("baseline_ecdsa_p256_verifications_per_second: \(format(p256_))")
        print("attestation_ratio_to_p384: \(String(format: "%.3f", attestations_ / p384_))")
        // A sample's attestation with its receipt costs one P-384 verification (the credential
        // certificate) and one P-256 (the receipt's signer): the most its rate could reach.
        print("attestation_ratio_to_p384_plus_p256: \(String(format: "%.3f", attestations_ * (1 / p384_ + 1 / p256_)))")
        print("assertion_ratio_to_p256: \(String(format: "%.3f", assertions_ / p256_))")
        return 0
    }

    static func warnIfDebugBuild() {
        #if DEBUG
        FileHandle.standardError.write(Data("warning: debug build; benchmark figures are meaningless (use -c release)\n".utf8))
        #endif
    }

    /// µs per scan of a Messages request carrying an N MB base64 image, the fields after it.
    static func scan(_ argv: [String]) throws -> Int32 {
        let arguments = try Arguments(argv, options: ["megabytes", "seconds"])
        let megabytes = try arguments.integer("megabytes", default: 20, range: 1...32)!
        let seconds = Double(try arguments.integer("seconds", default: 3, range: 1...3600)!)
        warnIfDebugBuild()
        let image = String(repeating: "iVBORw0KGgoAAAANSUhEUgAA", count: megabytes * 1_000_000 / 24)
        let body = Array((#"{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":""#
            + image + #""}},{"type":"text","text":"What is in this picture?"}]}],"model":"claude-sonnet-4-5","max_tokens":1024}"#).utf8)
        let input = MessagesRequestFields.policyInput(body, spendsTokens: true)
        guard input.model == "claude-sonnet-4-5", input.maxTokens == 1024, input.problem == nil else { throw UsageError("the scan misread the body") }
        var scan = Meter(), read = Meter(), decode = Meter()
        let rounds = max(3, Int(seconds))
        for _ in 0..<rounds {
            try scan.run(seconds: seconds / Double(rounds) / 2) { _ = MessagesRequestFields.policyInput(body, spendsTokens: true) }
            // Reading every byte once: memchr for a byte the body does not hold.
            try read.run(seconds: seconds / Double(rounds) / 4) {
                guard body.withUnsafeBytes({ memchr($0.baseAddress!, 0x01, $0.count) }) == nil else { throw UsageError("unexpected byte") }
            }
        }
        // What the scan avoids: a full decode (slow; a few runs are enough).
        try decode.run(seconds: 0.5) { _ = try JSONSerialization.jsonObject(with: Data(body)) }
        let microseconds = { (meter: Meter) in 1e6 / meter.rate }
        print("body_bytes: \(body.count)")
        print("bounded_scan_us: \(format(microseconds(scan)))")
        print("baseline_read_once_memchr_us: \(format(microseconds(read)))")
        print("baseline_jsonserialization_decode_us: \(format(microseconds(decode)))")
        print("scan_ratio_to_read_once: \(String(format: "%.2f", microseconds(scan) / microseconds(read)))")
        print("decode_ratio_to_scan: \(String(format: "%.1f", microseconds(decode) / microseconds(scan)))")
        return 0
    }

    /// Microseconds per step of an attestation, each timed alone, next to a raw P-384 verification.
    static func breakdown(_ workload: Workload, seconds: Double) throws {
        let chain = workload.chain
        let intermediate = try Certificate(der: chain[1])
        let issuerKey = try intermediate.publicKey()
        let leaf = try LeafCertificate(der: chain[0])
        let p384 = try BaselineKey(curve: "P-384")
        var steps: [(String, Meter)] = [("raw_p384_verify", Meter()), ("full_attestation", Meter()),
                                        ("leaf_parse_strict_der", Meter()), ("leaf_parse_openssl_d2i_X509_for_comparison", Meter()),
                                        ("leaf_signature_sha256_and_p384_verify", Meter()), ("cbor_decode", Meter()),
                                        ("leaf_nonce_extension_and_key_id", Meter())]
        let bodies: [() throws -> Void] = [
            { try p384.verify() },
            { _ = try workload.attest() },
            { _ = try LeafCertificate(der: chain[0]) },
            { _ = try Certificate(der: chain[0]) },
            { guard issuerKey.isValidSignature(leaf.signatureForBenchmark, digest: sha256(leaf.signedBytesForBenchmark)) else { throw UsageError("leaf signature") } },
            { _ = try CBORDecoder.decode(workload.object) },
            { _ = leaf.extensionValue(oid: "1.2.840.113635.100.8.2"); _ = sha256(leaf.publicKeyPoint) },
        ]
        let rounds = 8
        for _ in 0..<rounds {
            for index in steps.indices { try steps[index].1.run(seconds: seconds / Double(rounds * steps.count), bodies[index]) }
        }
        for (name, meter) in steps { print("breakdown_\(name)_us: \(String(format: "%.1f", 1e6 / meter.rate))") }
    }

    struct Workload {
        let name: String
        /// The attestation object and its x5c, for the breakdown.
        let object: [UInt8]
        var chain: [[UInt8]] {
            (try? CBORDecoder.decode(object))?["attStmt"]?["x5c"]?.arrayValue?.compactMap(\.bytesValue) ?? []
        }
        let attest: () throws -> VerifiedAttestation
        let assert: () throws -> VerifiedAssertion
    }

    /// What the receipt check adds to a registration: the same attestation verified with and
    /// without it, alternating in short slices.
    static func receipts(_ argv: [String]) throws -> Int32 {
        let arguments = try Arguments(argv, options: ["seconds", "sample"])
        let seconds = Double(try arguments.integer("seconds", default: 5, range: 1...3600)!)
        let sample = try arguments.value("sample")
        let without = try sample.map { try sampleWorkload($0, receipts: .unchecked) } ?? authorityWorkload(receipts: .unchecked)
        let with = try sample.map { try sampleWorkload($0, receipts: .apple) }
            ?? authorityWorkload(receipts: .anchors([TestReceiptAuthority.shared.root, TestReceiptAuthority.shared.intermediate]))
        warnIfDebugBuild()
        print("workload: \(with.name)")
        guard try with.attest().validatedReceipt != nil, try without.attest().validatedReceipt == nil else {
            throw UsageError("the workload's receipt was not validated where it should be")
        }
        var checked = Meter(), unchecked = Meter()
        let rounds = max(4, Int(seconds * 4))
        for _ in 0..<rounds {
            try unchecked.run(seconds: seconds / Double(rounds) / 2) { _ = try without.attest() }
            try checked.run(seconds: seconds / Double(rounds) / 2) { _ = try with.attest() }
        }
        print("attestations_without_receipt_per_second: \(format(unchecked.rate))")
        print("attestations_with_receipt_per_second: \(format(checked.rate))")
        print("receipt_microseconds_per_registration: \(format((1 / checked.rate - 1 / unchecked.rate) * 1e6))")
        print("receipt_cost_ratio: \(String(format: "%.3f", unchecked.rate / checked.rate))")
        return 0
    }

    static func authorityWorkload(receipts: AppAttestVerifier.ReceiptPolicy = .unchecked) throws -> Workload {
        let authority = TestAuthority.shared
        let verifier = try AppAttestVerifier(additionalAnchors: [authority.root], receipts: receipts)
        let key = try DeviceKey.generate()
        let appID = AppID(teamID: "ABCDE12345", bundleID: "com.example.bench")
        let hash = sha256(Array("bench challenge".utf8))
        let now = Date()
        let object = try authority.attestation(key: key, appID: appID, clientDataHash: hash, at: now)
        let assertion = try authority.assertion(key: key, appID: appID, clientDataHash: hash, counter: 1)
        let storedKey = try ECPublicKey(p256Point: key.publicKey.x962)
        return Workload(
            name: "test authority (P-384 CA, P-256 device key)", object: object,
            attest: { try verifier.verifyAttestation(object, keyID: key.keyID, clientDataHash: hash, allowedAppIDs: [appID], at: now) },
            assert: { try verifier.verifyAssertion(assertion, publicKey: storedKey, clientDataHash: hash, appID: appID, previousCounter: 0) })
    }

    static func sampleWorkload(_ path: String, receipts: AppAttestVerifier.ReceiptPolicy = .apple) throws -> Workload {
        guard let data = FileManager.default.contents(atPath: path),
              let json = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
              let attestation = json["attestation"] as? [String: Any],
              let assertion = (json["assertions"] as? [[String: Any]])?.first,
              let appText = json["appId"] as? String, let appID = AppID(appText),
              let keyID = (json["keyId"] as? String).flatMap(decodeBase64),
              let pem = json["publicKeyPEM"] as? String,
              let object = (attestation["object"] as? String).flatMap(decodeBase64),
              let hash = (attestation["clientDataHash"] as? String).flatMap(decodeBase64),
              let at = (attestation["at"] as? String).flatMap(parseISO8601),
              let assertionObject = (assertion["object"] as? String).flatMap(decodeBase64),
              let assertionHash = (assertion["clientDataHash"] as? String).flatMap(decodeBase64)
        else { throw UsageError("--sample \(path) is not a sample in the format of shared/fixtures/apple/README.md") }
        let verifier = try AppAttestVerifier(receipts: receipts)
        let key = try ECPublicKey(pem: pem)
        return Workload(
            name: "real sample \(json["name"] as? String ?? path), verified at \(at)", object: object,
            attest: { try verifier.verifyAttestation(object, keyID: keyID, clientDataHash: hash, allowedAppIDs: [appID], at: at) },
            assert: { try verifier.verifyAssertion(assertionObject, publicKey: key, clientDataHash: assertionHash, appID: appID, previousCounter: 0) })
    }

    /// One raw ECDSA verification of a fixed digest with a parsed key: what `openssl speed` measures.
    struct BaselineKey {
        let publicKey: ECPublicKey
        let signature: [UInt8]
        let digest: [UInt8]

        init(curve: String) throws {
            let key = try ECPrivateKey.generate(curve: curve)
            publicKey = try key.publicKey()
            let message = Array("baseline".utf8)
            signature = try key.signSHA256(message)
            digest = sha256(message)
        }

        func verify() throws {
            guard publicKey.isValidSignature(signature, digest: digest) else { throw UsageError("baseline signature did not verify") }
        }
    }

    /// Operations and seconds accumulated over several slices.
    struct Meter {
        var count = 0
        var nanoseconds: UInt64 = 0
        var rate: Double { Double(count) / (Double(nanoseconds) / 1e9) }

        mutating func run(seconds: Double, _ body: () throws -> Void) throws {
            let start = DispatchTime.now().uptimeNanoseconds
            let deadline = start + UInt64(seconds * 1e9)
            var now = start
            repeat {
                for _ in 0..<4 { try body() }
                count += 4
                now = DispatchTime.now().uptimeNanoseconds
            } while now < deadline
            nanoseconds += now - start
        }
    }

    static func format(_ value: Double) -> String { String(format: "%.1f", value) }
}
