import AppAttest
import AttestCrypto
import AttestWire
import CBOR
import CommandLineSupport
import Foundation

/// `attestctl verify attestation|assertion`: offline verification for operators debugging a device.
enum VerifyCommand {
    static let usage = """
    usage: attestctl verify attestation --object <base64|@file> --key-id <base64>
             (--challenge <base64> | --client-data-hash <base64>) --app-id <TEAMID.bundle> [--app-id …]
             [--at <ISO 8601 time>] [--trust-anchor <PEM file>]…
             --challenge is hashed (SHA-256), as the wire protocol does; --client-data-hash is used raw, of any length
             (Apple's guide vectors pass the challenge's own bytes)
           attestctl verify assertion --object <base64|@file> --public-key <base64 point|@PEM file>
             (--client-data <base64> | --client-data-hash <base64>) --app-id <TEAMID.bundle> --previous-counter N
           attestctl verify receipt --object <base64|@file> [--at <ISO 8601 time>] [--receipt-trust-anchor <PEM file>]
             a receipt on its own (an attestation's or a refreshed one): signature, chain to Apple Root CA - G3
             (or the given root) at --at, and its fields
             attestation and receipt take --receipt-trust-anchor: a PEM file with a root trusted for receipts in place of G3 and
             the intermediate receipts must be signed under (pinned, as Apple's is), for tests
           each prints one JSON object (--json is accepted and changes nothing): verified, then (when true) what the authenticator data says:
             validation_category (number), distribution (name), bundle_version, platform (ios|macos), flags,
             extensions (the whole map), code_directory_hash[_type] (Macs); attestations also
             mac_security_posture_ok (the aclBlob is Apple's Mac value), acl_blob, os_version, os_build, os_platform
             (informational, from the certificate's OID 1.2.840.113635.100.8.7), and receipt: {valid, reason (when
             false), type, environment, app_id, created_at, not_before, expires_at, risk_metric}; when false: reason and detail
    """
    static let help = CommandHelp(usage, tool: "attestctl")

    static func run(_ arguments: [String]) throws -> Int32 {
        if wantsHelp(arguments) { print(help.text(for: ["verify"] + arguments) ?? usage); return 0 }
        guard let kind = arguments.first else { throw UsageError(usage) }
        switch kind {
        case "attestation": return try attestation(Array(arguments.dropFirst()))
        case "assertion": return try assertion(Array(arguments.dropFirst()))
        case "receipt": return try receipt(Array(arguments.dropFirst()))
        default: throw UsageError(usage)
        }
    }

    static func verifier(anchorFiles: [String]) throws -> AppAttestVerifier {
        var anchors: [Certificate] = []
        for path in anchorFiles {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { throw UsageError("--trust-anchor: cannot read \(path)") }
            do { anchors += try Certificate.all(pem: text) } catch { throw UsageError("--trust-anchor \(path): \(error)") }
        }
        return try AppAttestVerifier(additionalAnchors: anchors, receipts: .unchecked)
    }

    static func appIDs(_ arguments: Arguments) throws -> [AppID] {
        let texts = arguments.all("app-id")
        guard !texts.isEmpty else { throw UsageError("--app-id is required") }
        guard texts.count <= 32 else { throw UsageError("at most 32 --app-id") }
        return try texts.map { text in
            guard let id = AppID(text) else { throw UsageError("--app-id \(text) is not TEAMID.bundle.id") }
            return id
        }
    }

    static func hashArgument(_ arguments: Arguments, raw: String) throws -> [UInt8] {
        switch (try arguments.value(raw), try arguments.value("client-data-hash")) {
        case (let data?, nil): return sha256(try readBytesArgument(data, name: raw))
        case (nil, let hash?):
            // Raw, of any length: Apple's guide vectors pass the challenge's bytes, not a SHA-256.
            let bytes = try readBytesArgument(hash, name: "client-data-hash")
            guard bytes.count <= AppAttestVerifier.maxClientDataHashBytes else {
                throw UsageError("--client-data-hash is \(bytes.count) bytes, limit \(AppAttestVerifier.maxClientDataHashBytes)")
            }
            return bytes
        default: throw UsageError("give exactly one of --\(raw) and --client-data-hash")
        }
    }

    /// What the authenticator data says about the build, in the fields operators script against.
    static func appReport(_ app: AttestedApp) -> [String: Any] {
        let extensions = app.extensions
        return ["validation_category": app.validationCategory.map { Int($0) } ?? NSNull(),
                "distribution": app.distribution?.rawValue ?? NSNull(),
                "bundle_version": app.bundleVersion ?? NSNull(),
                "platform": app.platform.rawValue,
                "flags": String(format: "0x%02x", app.flags),
                "code_directory_hash": extensions?.codeDirectoryHash.map(hexString) ?? NSNull(),
                "code_directory_hash_type": extensions?.codeDirectoryHashType.map { Int($0) } ?? NSNull(),
                "extensions": extensions.map(extensionsReport) ?? NSNull()]
    }

    /// Every entry of the map (unknown keys too): text as text, integers as numbers, byte strings
    /// as {"hex": …}, the category as its number.
    static func extensionsReport(_ extensions: AuthenticatorExtensions) -> [String: Any] {
        var result: [String: Any] = [:]
        for entry in extensions.entries {
            guard case .text(let key) = entry.key else { continue }
            result[key] = key == AuthenticatorExtensions.validationCategoryKey ? extensions.validationCategory.map { Int($0) } as Any : cborReport(entry.value)
        }
        return result
    }

    static func cborReport(_ value: CBORValue) -> Any {
        switch value {
        case .text(let t): return t
        case .unsigned(let n): return n
        case .negative: return value.intValue.map { $0 as Any } ?? "negative"
        case .bytes(let b): return ["hex": hexString(b)]
        case .array(let items): return items.map(cborReport)
        case .map(let entries): return entries.map { ["key": cborReport($0.key), "value": cborReport($0.value)] }
        case .tagged(let tag, let inner): return ["tag": tag, "value": cborReport(inner)]
        case .bool(let b): return b
        case .null, .undefined: return NSNull()
        case .simple(let n): return ["simple": n]
        case .float(let d): return d
        }
    }

    /// The receipt verifier the options name: the pinned G3 root, or `--receipt-trust-anchor` roots in its place.
    static func receiptVerifier(_ arguments: Arguments) throws -> ReceiptVerifier {
        let files = arguments.all("receipt-trust-anchor")
        guard !files.isEmpty else { return try ReceiptVerifier.apple() }
        var anchors: [Certificate] = []
        for path in files {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { throw UsageError("--receipt-trust-anchor: cannot read \(path)") }
            do { anchors += try Certificate.all(pem: text) } catch { throw UsageError("--receipt-trust-anchor \(path): \(error)") }
        }
        do { return try ReceiptVerifier.anchors(fromPEMBundle: anchors) } catch { throw UsageError("--receipt-trust-anchor: \(error)") }
    }

    /// The `receipt` object, exactly these fields: valid, reason (when not), and what the receipt
    /// says when it could be read (null otherwise). The detail goes to stderr.
    static func receiptReport(_ receipt: Receipt?, error: VerificationError?) -> [String: Any] {
        var report: [String: Any] = ["valid": error == nil && receipt != nil]
        if let error {
            report["reason"] = error.reason.rawValue
            FileHandle.standardError.write(Data("receipt: \(error.reason.rawValue): \(error.detail)\n".utf8))
        }
        report["type"] = receipt?.type.rawValue ?? NSNull()
        report["environment"] = receipt?.environment.rawValue ?? NSNull()
        report["app_id"] = receipt?.appID ?? NSNull()
        report["created_at"] = receipt.map { iso8601(milliseconds: $0.createdAt) } ?? NSNull()
        report["not_before"] = receipt?.notBefore.map { iso8601(milliseconds: $0) } ?? NSNull()
        report["expires_at"] = receipt?.expiresAt.map { iso8601(milliseconds: $0) } ?? NSNull()
        report["risk_metric"] = receipt?.riskMetric ?? NSNull()
        return report
    }

    static func iso8601(milliseconds date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }

    static func time(_ arguments: Arguments) throws -> Date {
        guard let at = try arguments.value("at") else { return Date() }
        guard let parsed = parseISO8601(at) else { throw UsageError("--at \(at) is not an ISO 8601 time") }
        return parsed
    }

    /// `verify receipt`: a receipt on its own (the attestation's or a refreshed one): signature,
    /// chain to the pinned root at `--at`, fields.
    static func receipt(_ argv: [String]) throws -> Int32 {
        // --json is accepted (the output is JSON either way) so scripts written to the issues' spelling work.
        let arguments = try Arguments(argv, options: ["object", "at", "receipt-trust-anchor"], flags: ["json"])
        let object = try readBytesArgument(try arguments.required("object"), name: "object")
        let time = try time(arguments)
        let verifier = try receiptVerifier(arguments)
        do {
            let receipt = try verifier.read(object, at: time)
            var report = receiptReport(receipt, error: nil)
            report["verified"] = true
            printJSON(report)
            return 0
        } catch let error as VerificationError {
            var report = receiptReport(nil, error: error)
            report["verified"] = false
            printJSON(report)
            return 1
        }
    }

    static func attestation(_ argv: [String]) throws -> Int32 {
        let arguments = try Arguments(argv, options: ["object", "key-id", "challenge", "client-data-hash", "app-id", "at", "trust-anchor",
                                                      "receipt-trust-anchor"], flags: ["json"])
        let object = try readBytesArgument(try arguments.required("object"), name: "object")
        let keyID = try readBytesArgument(try arguments.required("key-id"), name: "key-id")
        let clientDataHash = try hashArgument(arguments, raw: "challenge")
        let ids = try appIDs(arguments)
        let time = try time(arguments)
        let verifier = try verifier(anchorFiles: arguments.all("trust-anchor"))
        // As attestd decides: receipts are checked against G3, or --receipt-trust-anchor; with only a
        // test attestation root (--trust-anchor) no Apple receipt can exist, so they are reported, not required.
        let receipts = try receiptVerifier(arguments)
        let receiptsRequired = arguments.all("trust-anchor").isEmpty || !arguments.all("receipt-trust-anchor").isEmpty
        do {
            let result = try verifier.verifyAttestation(object, keyID: keyID, clientDataHash: clientDataHash, allowedAppIDs: ids, at: time)
            var receiptError: VerificationError?
            var receipt: Receipt?
            do {
                receipt = try receipts.validateAttestationReceipt(result.receipt, appID: result.appID, credentialCertificate: result.credentialCertificate,
                                                                  clientDataHash: clientDataHash, environment: result.environment, at: time)
            } catch let error as VerificationError {
                receiptError = error
                receipt = try? receipts.read(result.receipt, at: time)
            }
            if let receiptError, receiptsRequired {
                printJSON(["verified": false, "reason": receiptError.reason.rawValue, "detail": receiptError.detail,
                           "receipt": receiptReport(receipt, error: receiptError)])
                return 1
            }
            var report = appReport(result.app)
            report["receipt"] = receiptReport(receipt, error: receiptError)
            report.merge(["verified": true, "keyId": Data(result.keyID).base64EncodedString(), "appId": result.appID.description,
                          "environment": result.environment.rawValue, "publicKey": Data(result.publicKey).base64EncodedString(),
                          "receiptBytes": result.receipt.count,
                          "mac_security_posture_ok": result.macSecurityPostureOK,
                          "acl_blob": result.accessControlPolicy.map { Data($0).base64EncodedString() } ?? NSNull(),
                          "os_version": result.osInformation?.version ?? NSNull(), "os_build": result.osInformation?.build ?? NSNull(),
                          "os_platform": result.osInformation?.platform ?? NSNull(),
                          "os_variant": result.osInformation?.variant ?? NSNull()]) { _, new in new }
            printJSON(report)
            return 0
        } catch let error as VerificationError {
            printJSON(["verified": false, "reason": error.reason.rawValue, "detail": error.detail])
            return 1
        }
    }

    static func assertion(_ argv: [String]) throws -> Int32 {
        let arguments = try Arguments(argv, options: ["object", "public-key", "client-data", "client-data-hash", "app-id", "previous-counter"],
                                      flags: ["json"])
        let object = try readBytesArgument(try arguments.required("object"), name: "object")
        let keyArgument = try arguments.required("public-key")
        let key: ECPublicKey
        do {
            if keyArgument.hasPrefix("@"), let pem = try? String(contentsOfFile: String(keyArgument.dropFirst()), encoding: .utf8), pem.contains("-----BEGIN") {
                key = try ECPublicKey(pem: pem)
            } else {
                key = try ECPublicKey(p256Point: try readBytesArgument(keyArgument, name: "public-key"))
            }
        } catch let error as UsageError { throw error } catch { throw UsageError("--public-key: \(error)") }
        let clientDataHash = try hashArgument(arguments, raw: "client-data")
        let ids = try appIDs(arguments)
        guard ids.count == 1 else { throw UsageError("verify assertion takes one --app-id") }
        guard let previous = try arguments.integer("previous-counter", range: 0...Int(UInt32.max)) else { throw UsageError("--previous-counter is required") }
        let verifier = try AppAttestVerifier()
        do {
            let result = try verifier.verifyAssertion(object, publicKey: key, clientDataHash: clientDataHash, appID: ids[0], previousCounter: UInt32(previous))
            var report = appReport(result.app)
            report["verified"] = true
            report["counter"] = Int(result.counter)
            printJSON(report)
            return 0
        } catch let error as VerificationError {
            printJSON(["verified": false, "reason": error.reason.rawValue, "detail": error.detail])
            return 1
        }
    }
}
