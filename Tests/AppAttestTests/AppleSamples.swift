import AppAttest
import AttestCrypto
import CBOR
import Foundation
import Testing

/// The real Apple samples in ../shared/fixtures/apple and its 2026/ folder (never copied into the
/// repository), with what each one's `expect` block says a verifier reads from it.
struct AppleSample: CustomStringConvertible, Sendable {
    let name: String
    let appID: AppID
    let environment: AttestationEnvironment?
    let keyID: [UInt8]?
    /// Absent from some attestation-only samples.
    let publicKeyPEM: String?
    let attestation: Attestation?
    let assertions: [Assertion]
    let expectedAttestation: Expected?
    let expectedAssertions: Expected?
    /// Receipts published beside the attestation (the iOS 14 samples: its ATTEST one and refreshed RECEIPT ones).
    let receipts: [SampleReceipt]

    /// A receipt and what it says (the sample's `properties`, or the 2026 samples' `expect.receipt`).
    struct SampleReceipt: Sendable {
        let object: [UInt8]
        let at: Date
        let type: String
        let environment: String
        let creationTime: String
        let expirationTime: String?
        let notBefore: String?
        let riskMetric: Int?
        let appID: String?
        /// Only for ATTEST receipts (RECEIPT ones carry a mangled copy).
        let clientHash: [UInt8]?
    }

    /// The attestation's own receipt and what its expect block (if any) says of it.
    var expectedAttestationReceipt: SampleReceipt? {
        guard let attestation else { return nil }
        return receipts.first { $0.type == "ATTEST" && $0.object == attestation.receiptBytes } ?? attestation.expectedReceipt
    }

    struct Attestation: Sendable {
        let object: [UInt8]
        /// attStmt.receipt, when the statement has one.
        let receiptBytes: [UInt8]?
        let expectedReceipt: SampleReceipt?
        /// Given directly (Apple's guide vectors: the challenge's raw bytes), or SHA-256 of clientData.
        let clientDataHash: [UInt8]
        let time: Date
    }

    struct Assertion: Sendable {
        let object: [UInt8]
        let clientDataHash: [UInt8]
        let counter: UInt32
        let previousCounter: UInt32
    }

    /// An `expect` block: a 2020-format sample without one is simply accepted.
    struct Expected: Sendable {
        var accepted = true
        var why: String?
        /// The extension map, with the category as an integer and byte strings as hex.
        var extensions: [String: Value]?
        var flags: UInt8?
        var aclBlob: [UInt8]?
        var aclBlobIsApplesMacValue: Bool?
        var osInformation: [Int: String]?

        enum Value: Sendable, Equatable, CustomStringConvertible {
            case text(String), number(UInt64), hex(String)
            var description: String {
                switch self { case .text(let t): "\"\(t)\""; case .number(let n): "\(n)"; case .hex(let h): "h'\(h)'" }
            }
        }
    }

    var description: String { name }
    var attestationTime: Date { attestation!.time }

    /// The platform the OS-information extension names (the samples' own account, which the
    /// verifier's rule — the code-directory hash in the map — must agree with).
    var platformByOSInformation: DevicePlatform { expectedAttestation?.osInformation?[1026] == "macosx" || name.hasPrefix("macos") ? .macos : .ios }

    static let directory: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("shared/fixtures/apple")

    static var available: Bool { FileManager.default.fileExists(atPath: directory.path) }

    /// Why tests on the samples are skipped (shown in the test report) when the folder is absent.
    static let skipReason: Comment = "../shared/fixtures/apple is absent: real-device verification not tested"

    /// Every sample of both folders; a file that does not load is a test failure, not a skip.
    static func everySample() -> [AppleSample] {
        guard available else { return [] }
        var result: [AppleSample] = []
        for folder in [directory, directory.appendingPathComponent("2026")] {
            let files = ((try? FileManager.default.contentsOfDirectory(atPath: folder.path)) ?? []).filter { $0.hasSuffix(".json") }.sorted()
            for file in files {
                do { result.append(try load(folder.appendingPathComponent(file))) } catch {
                    Issue.record("\(file) does not load: \(error)")
                }
            }
        }
        return result
    }

    /// Samples whose attestation a verifier must accept.
    static func all() -> [AppleSample] { everySample().filter { $0.attestation != nil && $0.expectedAttestation?.accepted != false } }
    static func withAssertions() -> [AppleSample] { everySample().filter { !$0.assertions.isEmpty } }

    struct LoadError: Error, CustomStringConvertible { let description: String }

    static func load(_ url: URL) throws -> AppleSample {
        guard let json = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any] else { throw LoadError(description: "not an object") }
        func bytes(_ any: Any?) throws -> [UInt8] {
            guard let text = any as? String, let data = Data(base64Encoded: text) else { throw LoadError(description: "not base64: \(String(describing: any))") }
            return Array(data)
        }
        func hash(_ item: [String: Any]) throws -> [UInt8] {
            if let given = item["clientDataHash"] { return try bytes(given) }
            return sha256(try bytes(item["clientData"]))
        }
        guard let name = json["name"] as? String, let appText = json["appId"] as? String, let appID = AppID(appText) else {
            throw LoadError(description: "name or appId missing")
        }
        let pem = json["publicKeyPEM"] as? String
        let expect = json["expect"] as? [String: Any]
        var attestation: Attestation?
        if let item = json["attestation"] as? [String: Any] {
            guard let at = item["at"] as? String, let time = parseTime(at) else { throw LoadError(description: "attestation.at missing") }
            let object = try bytes(item["object"])
            let receiptBytes = (try? CBORDecoder.decode(object))?["attStmt"]?["receipt"]?.bytesValue
            var expectedReceipt: SampleReceipt?
            if let r = (expect?["attestation"] as? [String: Any])?["receipt"] as? [String: Any], let receiptBytes {
                expectedReceipt = SampleReceipt(object: receiptBytes, at: time, type: r["receiptType"] as? String ?? "", environment: r["environment"] as? String ?? "",
                                                creationTime: r["creationTime"] as? String ?? "", expirationTime: r["expirationTime"] as? String,
                                                notBefore: nil, riskMetric: nil, appID: r["appId"] as? String,
                                                clientHash: (r["clientHash"] as? String).flatMap { Data(base64Encoded: $0) }.map(Array.init))
            }
            attestation = Attestation(object: object, receiptBytes: receiptBytes, expectedReceipt: expectedReceipt, clientDataHash: try hash(item), time: time)
        }
        let receipts = try ((json["receipts"] as? [[String: Any]]) ?? []).map { item -> SampleReceipt in
            let p = item["properties"] as? [String: Any] ?? [:]
            guard let at = (item["at"] as? String).flatMap(parseTime) else { throw LoadError(description: "receipt.at missing") }
            let type = p["type"] as? String ?? ""
            return SampleReceipt(object: try bytes(item["object"]), at: at, type: type, environment: p["environment"] as? String ?? "",
                                 creationTime: p["creationTime"] as? String ?? "", expirationTime: p["expirationTime"] as? String,
                                 notBefore: p["notBefore"] as? String, riskMetric: p["riskMetric"] as? Int, appID: appText,
                                 clientHash: type == "ATTEST" ? (p["clientHashBase64"] as? String).flatMap { Data(base64Encoded: $0) }.map(Array.init) : nil)
        }
        let assertionItems = (json["assertions"] as? [[String: Any]]) ?? []
        if !assertionItems.isEmpty && pem == nil { throw LoadError(description: "assertions without publicKeyPEM") }
        let assertions = try assertionItems.map { item in
            Assertion(object: try bytes(item["object"]), clientDataHash: try hash(item), counter: UInt32(item["counter"] as? Int ?? 0),
                      previousCounter: UInt32(item["previousCounter"] as? Int ?? 0))
        }
        return AppleSample(
            name: name, appID: appID, environment: (json["environment"] as? String).flatMap(AttestationEnvironment.init(rawValue:)),
            keyID: try json["keyId"].flatMap { $0 is NSNull ? nil : try bytes($0) }, publicKeyPEM: pem,
            attestation: attestation, assertions: assertions,
            expectedAttestation: try (expect?["attestation"] as? [String: Any]).map(expected),
            expectedAssertions: try (expect?["assertions"] as? [String: Any]).map(expected), receipts: receipts)
    }

    static func expected(_ block: [String: Any]) throws -> Expected {
        var result = Expected()
        result.accepted = block["accepted"] as? Bool ?? true
        result.why = block["why"] as? String
        if let map = block["extensions"] as? [String: Any] {
            var values: [String: Expected.Value] = [:]
            for (key, value) in map {
                switch value {
                case let text as String: values[key] = .text(text)
                case let number as NSNumber: values[key] = .number(number.uint64Value)
                case let object as [String: Any]:
                    guard let hex = object["hex"] as? String else { throw LoadError(description: "extension \(key): \(object)") }
                    values[key] = .hex(hex)
                default: throw LoadError(description: "extension \(key): \(value)")
                }
            }
            result.extensions = values
        }
        if let flags = block["flags"] as? String, flags.hasPrefix("0x") { result.flags = UInt8(flags.dropFirst(2), radix: 16) }
        if let acl = block["aclBlob"] as? String { result.aclBlob = Data(base64Encoded: acl).map(Array.init) }
        result.aclBlobIsApplesMacValue = block["aclBlobIsApplesMacValue"] as? Bool
        if let info = block["osInfo_1.2.840.113635.100.8.7"] as? [String: String] {
            result.osInformation = Dictionary(uniqueKeysWithValues: info.compactMap { key, value in Int(key).map { ($0, value) } })
        }
        return result
    }

    static func parseTime(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = formatter.date(from: text) { return date }
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.date(from: text)
    }
}
