import AppAttest
import AttestCrypto
import Foundation
import Testing

/// The real iPhone samples in ../shared/fixtures/apple (never copied into the repository).
struct AppleSample: CustomStringConvertible, Sendable {
    let name: String
    let appID: AppID
    let keyID: [UInt8]
    let publicKeyPEM: String
    let attestation: [UInt8]
    let attestationClientDataHash: [UInt8]
    let attestationTime: Date
    let assertions: [Assertion]

    struct Assertion: Sendable {
        let object: [UInt8]
        let clientDataHash: [UInt8]
        let counter: UInt32
    }

    var description: String { name }

    static let directory: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("shared/fixtures/apple")

    static var available: Bool { FileManager.default.fileExists(atPath: directory.path) }

    /// Why tests on the samples are skipped (shown in the test report) when the folder is absent.
    static let skipReason: Comment = "../shared/fixtures/apple is absent: real-device verification not tested"

    /// All samples, or an empty list when the folder is absent (the suites using them are then
    /// disabled with `skipReason`, so the report shows them as skipped, not passed).
    static func all() -> [AppleSample] {
        guard available else { return [] }
        let files = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        return files.filter { $0.hasSuffix(".json") }.sorted().compactMap { try? load(directory.appendingPathComponent($0)) }
    }

    static func load(_ url: URL) throws -> AppleSample {
        let json = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as! [String: Any]
        let attestation = json["attestation"] as! [String: Any]
        func b64(_ any: Any?) -> [UInt8] { Array(Data(base64Encoded: any as! String)!) }
        return AppleSample(
            name: json["name"] as! String,
            appID: AppID(json["appId"] as! String)!,
            keyID: b64(json["keyId"]),
            publicKeyPEM: json["publicKeyPEM"] as! String,
            attestation: b64(attestation["object"]),
            attestationClientDataHash: b64(attestation["clientDataHash"]),
            attestationTime: parseTime(attestation["at"] as! String),
            assertions: (json["assertions"] as! [[String: Any]]).map {
                Assertion(object: b64($0["object"]), clientDataHash: b64($0["clientDataHash"]), counter: UInt32($0["counter"] as! Int))
            })
    }

    static func parseTime(_ text: String) -> Date {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.date(from: text)!
    }
}
