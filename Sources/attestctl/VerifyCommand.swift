import AppAttest
import AttestCrypto
import AttestWire
import CommandLineSupport
import Foundation

/// `attestctl verify attestation|assertion`: offline verification for operators debugging a device.
enum VerifyCommand {
    static let usage = """
    usage: attestctl verify attestation --object <base64|@file> --key-id <base64>
             (--challenge <base64> | --client-data-hash <base64>) --app-id <TEAMID.bundle> [--app-id …]
             [--at <ISO 8601 time>] [--trust-anchor <PEM file>]…
           attestctl verify assertion --object <base64|@file> --public-key <base64 point|@PEM file>
             (--client-data <base64> | --client-data-hash <base64>) --app-id <TEAMID.bundle> --previous-counter N
    """

    static func run(_ arguments: [String]) throws -> Int32 {
        if wantsHelp(arguments) { print(usage); return 0 }
        guard let kind = arguments.first else { throw UsageError(usage) }
        switch kind {
        case "attestation": return try attestation(Array(arguments.dropFirst()))
        case "assertion": return try assertion(Array(arguments.dropFirst()))
        default: throw UsageError(usage)
        }
    }

    static func verifier(anchorFiles: [String]) throws -> AppAttestVerifier {
        var anchors: [Certificate] = []
        for path in anchorFiles {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { throw UsageError("--trust-anchor: cannot read \(path)") }
            do { anchors += try Certificate.all(pem: text) } catch { throw UsageError("--trust-anchor \(path): \(error)") }
        }
        return try AppAttestVerifier(additionalAnchors: anchors)
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
            let bytes = try readBytesArgument(hash, name: "client-data-hash")
            guard bytes.count == 32 else { throw UsageError("--client-data-hash must be 32 bytes") }
            return bytes
        default: throw UsageError("give exactly one of --\(raw) and --client-data-hash")
        }
    }

    static func attestation(_ argv: [String]) throws -> Int32 {
        let arguments = try Arguments(argv, options: ["object", "key-id", "challenge", "client-data-hash", "app-id", "at", "trust-anchor"])
        let object = try readBytesArgument(try arguments.required("object"), name: "object")
        let keyID = try readBytesArgument(try arguments.required("key-id"), name: "key-id")
        let clientDataHash = try hashArgument(arguments, raw: "challenge")
        let ids = try appIDs(arguments)
        var time = Date()
        if let at = try arguments.value("at") {
            guard let parsed = parseISO8601(at) else { throw UsageError("--at \(at) is not an ISO 8601 time") }
            time = parsed
        }
        let verifier = try verifier(anchorFiles: arguments.all("trust-anchor"))
        do {
            let result = try verifier.verifyAttestation(object, keyID: keyID, clientDataHash: clientDataHash, allowedAppIDs: ids, at: time)
            printJSON(["verified": true, "keyId": Data(result.keyID).base64EncodedString(), "appId": result.appID.description,
                       "environment": result.environment.rawValue, "publicKey": Data(result.publicKey).base64EncodedString(),
                       "receiptBytes": result.receipt.count])
            return 0
        } catch let error as VerificationError {
            printJSON(["verified": false, "reason": error.reason.rawValue, "detail": error.detail])
            return 1
        }
    }

    static func assertion(_ argv: [String]) throws -> Int32 {
        let arguments = try Arguments(argv, options: ["object", "public-key", "client-data", "client-data-hash", "app-id", "previous-counter"])
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
            printJSON(["verified": true, "counter": Int(result.counter)])
            return 0
        } catch let error as VerificationError {
            printJSON(["verified": false, "reason": error.reason.rawValue, "detail": error.detail])
            return 1
        }
    }
}
