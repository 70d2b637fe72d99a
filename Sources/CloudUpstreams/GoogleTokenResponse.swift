// No imports: the relay fuzzer (`make fuzz-relay`) compiles this file with JSONScan.swift, so
// the token endpoint's answer is fuzzed as shipped. The service account's errors are here too,
// since the parser throws them.

public enum GoogleServiceAccountError: Error, Equatable, Sendable, CustomStringConvertible {
    case notJSONObject
    /// The key file has no non-empty string member by this name.
    case missingField(String)
    /// The key file's `type` is not `service_account` (the value, cut short).
    case wrongType(String)
    /// `private_key` is not a PEM private key OpenSSL can read without a passphrase.
    case unreadablePrivateKey
    /// `private_key` is a key of this other type (OpenSSL's name for it: "EC", "ED25519"…).
    case notRSAKey(String)
    case invalidLifetime(Int)
    case signingFailed(String)
    /// The token endpoint answered with an OAuth error (`error`, `error_description`).
    case tokenRefused(error: String, description: String?)
    case malformedTokenResponse(String)

    public var description: String {
        switch self {
        case .notJSONObject: "the service-account key file is not a JSON object"
        case .missingField(let name): "the service-account key file has no \"\(name)\" string"
        case .wrongType(let type): "the key file's type is \"\(type)\", not \"service_account\""
        case .unreadablePrivateKey: "the key file's private_key is not an unencrypted PEM private key"
        case .notRSAKey(let type): "the key file's private_key is a \(type) key, not RSA"
        case .invalidLifetime(let lifetime): "an assertion lives 1 to 3600 seconds, not \(lifetime)"
        case .signingFailed(let why): "RS256 signing failed: \(why)"
        case .tokenRefused(let error, let description): "the token endpoint refused the grant: \(error)" + (description.map { " (\($0))" } ?? "")
        case .malformedTokenResponse(let why): "malformed token response: \(why)"
        }
    }
}

/// Google's token endpoint's answer to the service account's grant (RFC 6749 section 5).
public enum GoogleTokenResponse {
    /// The access token and its lifetime in seconds from the token endpoint's JSON answer.
    public static func parse(_ body: [UInt8]) throws(GoogleServiceAccountError) -> (accessToken: String, expiresIn: Int) {
        var accessToken: [UInt8]?
        var expiresIn: Int?
        var error: [UInt8]?
        var errorDescription: [UInt8]?
        let isObject = body.withUnsafeBytes { bytes in
            JSONScan.forEachMember(of: bytes) { name, value in
                switch String(decoding: name, as: UTF8.self) {
                case "access_token": accessToken = JSONScan.string(bytes, value)
                case "expires_in": expiresIn = JSONScan.integer(bytes, value)
                case "error": error = JSONScan.string(bytes, value)
                case "error_description": errorDescription = JSONScan.string(bytes, value)
                default: break
                }
            }
        }
        guard isObject else { throw .malformedTokenResponse("not a JSON object") }
        if let error {
            throw .tokenRefused(error: String(String(decoding: error, as: UTF8.self).prefix(100)),
                                description: errorDescription.map { String(String(decoding: $0, as: UTF8.self).prefix(300)) })
        }
        guard let accessToken, !accessToken.isEmpty else { throw .malformedTokenResponse("no access_token string") }
        guard let expiresIn, expiresIn > 0 else { throw .malformedTokenResponse("no positive integer expires_in") }
        return (String(decoding: accessToken, as: UTF8.self), expiresIn)
    }
}
