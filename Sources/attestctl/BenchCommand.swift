import AppAttest
import AttestCrypto
import Foundation
import TestAuthority

/// `attestctl bench verify`: single-threaded verification throughput, with in-process ECDSA
/// baselines measured in the same run so the ratios survive a noisy machine.
enum BenchCommand {
    static let usage = "usage: attestctl bench verify [--seconds S] [--sample <fixture.json>]"

    static func run(_ argv: [String]) throws -> Int32 {
        guard argv.first == "verify" else { throw UsageError(usage) }
        let arguments = try Arguments(Array(argv.dropFirst()), options: ["seconds", "sample"])
        let seconds = Double(try arguments.integer("seconds", default: 5, range: 1...3600)!)
        let workload = try arguments.value("sample").map(sampleWorkload) ?? authorityWorkload()
        #if DEBUG
        FileHandle.standardError.write(Data("warning: debug build; benchmark figures are meaningless (use -c release)\n".utf8))
        #endif
        print("workload: \(workload.name)")

        // Warm up once (also proves the inputs verify) before timing.
        _ = try workload.attest()
        _ = try workload.assert()
        let slice = seconds / 4
        let p384 = try baseline(curve: "P-384", seconds: slice)
        let p256 = try baseline(curve: "P-256", seconds: slice)
        let attestations = try rate(seconds: slice * 2 * 0.75) { _ = try workload.attest() }
        let assertions = try rate(seconds: slice * 2 * 0.25) { _ = try workload.assert() }

        print("attestation_verifications_per_second: \(format(attestations))")
        print("assertion_verifications_per_second: \(format(assertions))")
        print("baseline_ecdsa_p384_verifications_per_second: \(format(p384))")
        print("baseline_ecdsa_p256_verifications_per_second: \(format(p256))")
        print("attestation_ratio_to_p384: \(String(format: "%.3f", attestations / p384))")
        print("assertion_ratio_to_p256: \(String(format: "%.3f", assertions / p256))")
        return 0
    }

    struct Workload {
        let name: String
        let attest: () throws -> VerifiedAttestation
        let assert: () throws -> VerifiedAssertion
    }

    static func authorityWorkload() throws -> Workload {
        let authority = TestAuthority.shared
        let verifier = try AppAttestVerifier(additionalAnchors: [authority.root])
        let key = try DeviceKey.generate()
        let appID = AppID(teamID: "ABCDE12345", bundleID: "com.example.bench")
        let hash = sha256(Array("bench challenge".utf8))
        let now = Date()
        let object = try authority.attestation(key: key, appID: appID, clientDataHash: hash, at: now)
        let assertion = try authority.assertion(key: key, appID: appID, clientDataHash: hash, counter: 1)
        let storedKey = try ECPublicKey(p256Point: key.publicKey.x962)
        return Workload(
            name: "test authority (P-384 CA, P-256 device key)",
            attest: { try verifier.verifyAttestation(object, keyID: key.keyID, clientDataHash: hash, allowedAppIDs: [appID], at: now) },
            assert: { try verifier.verifyAssertion(assertion, publicKey: storedKey, clientDataHash: hash, appID: appID, previousCounter: 0) })
    }

    static func sampleWorkload(_ path: String) throws -> Workload {
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
        let verifier = try AppAttestVerifier()
        let key = try ECPublicKey(pem: pem)
        return Workload(
            name: "real sample \(json["name"] as? String ?? path), verified at \(at)",
            attest: { try verifier.verifyAttestation(object, keyID: keyID, clientDataHash: hash, allowedAppIDs: [appID], at: at) },
            assert: { try verifier.verifyAssertion(assertionObject, publicKey: key, clientDataHash: assertionHash, appID: appID, previousCounter: 0) })
    }

    /// One raw ECDSA verification of a fixed digest with a parsed key: what `openssl speed` measures.
    static func baseline(curve: String, seconds: Double) throws -> Double {
        let key = try ECPrivateKey.generate(curve: curve)
        let publicKey = try key.publicKey()
        let message = Array("baseline".utf8)
        let signature = try key.signSHA256(message)
        let digest = sha256(message)
        return try rate(seconds: seconds) {
            guard publicKey.isValidSignature(signature, digest: digest) else { throw UsageError("baseline signature did not verify") }
        }
    }

    static func rate(seconds: Double, _ body: () throws -> Void) throws -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        let deadline = start + UInt64(seconds * 1e9)
        var count = 0
        var now = start
        repeat {
            for _ in 0..<16 { try body() }
            count += 16
            now = DispatchTime.now().uptimeNanoseconds
        } while now < deadline
        return Double(count) / (Double(now - start) / 1e9)
    }

    static func format(_ value: Double) -> String { String(format: "%.1f", value) }
}
