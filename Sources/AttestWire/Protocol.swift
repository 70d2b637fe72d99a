/// The device token exchange as it appears on the wire (PROTOCOL.md): paths, the grant type and
/// the client-data constructions. Shared by the server, the client module and the tools, and free
/// of dependencies so that it builds wherever an app does (iOS has no OpenSSL): the digest is a
/// parameter, taken from OpenSSL on the server and from CryptoKit in an app.
public enum WireProtocol {
    public static let challengePath = "/v1/oauth/app-attest/challenge"
    public static let registerPath = "/v1/oauth/app-attest/register"
    public static let tokenPath = "/v1/oauth/token"
    /// The Messages API, which the access token authorizes (and nothing else).
    public static let messagesPath = "/v1/messages"
    public static let countTokensPath = "/v1/messages/count_tokens"

    public static let grantType = "urn:anthropic:params:oauth:grant-type:app-attest"
    public static let tokenType = "Bearer"
    /// The 29-byte ASCII prefix of a token request's client data; it carries the version.
    public static let tokenHashDomain: [UInt8] = Array("anthropic-app-attest-token-v1".utf8)
    public static let challengeLength = 32
    public static let keyIDLength = 32
    /// Server-supplied durations (`expires_in`, `Retry-After`) beyond a day are nonsense and ignored.
    public static let maxServerDuration: Double = 86_400

    /// A SHA-256 implementation: the caller's (OpenSSL, CryptoKit), so this module needs none.
    public typealias SHA256 = ([UInt8]) -> [UInt8]

    /// clientDataHash of a registration: SHA-256(challenge).
    public static func registrationClientDataHash(challenge: [UInt8], sha256: SHA256) -> [UInt8] {
        sha256(challenge)
    }

    /// The bytes whose SHA-256 is a token request's clientDataHash:
    /// "anthropic-app-attest-token-v1" ‖ challenge ‖ UTF-8(client ID) ‖ raw key ID. The fixed-length
    /// challenge and key ID around the variable-length client ID keep the concatenation unambiguous.
    public static func tokenClientData(challenge: [UInt8], clientID: String, keyID: [UInt8]) -> [UInt8] {
        var data = [UInt8]()
        data.reserveCapacity(tokenHashDomain.count + challenge.count + clientID.utf8.count + keyID.count)
        data += tokenHashDomain
        data += challenge
        data += clientID.utf8
        data += keyID
        return data
    }

    public static func tokenClientDataHash(challenge: [UInt8], clientID: String, keyID: [UInt8], sha256: SHA256) -> [UInt8] {
        sha256(tokenClientData(challenge: challenge, clientID: clientID, keyID: keyID))
    }

    /// A server duration in seconds, or nil if missing, negative, non-finite or over a day.
    public static func serverDuration(_ seconds: Double?) -> Double? {
        guard let seconds, seconds.isFinite, seconds >= 0, seconds <= maxServerDuration else { return nil }
        return seconds
    }

    /// `Retry-After` in delta-seconds (the protocol never uses the HTTP-date form).
    public static func retryAfter(_ header: String?) -> Double? {
        guard let header else { return nil }
        var text = Substring(header)
        while text.first == " " || text.first == "\t" { text.removeFirst() }
        while text.last == " " || text.last == "\t" { text.removeLast() }
        return serverDuration(Double(text))
    }
}
