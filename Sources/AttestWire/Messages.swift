// The JSON bodies of the token exchange (PROTOCOL.md §1–3). Decodable for whoever reads them
// (the server reads requests, the client reads responses); `json` writes them the way the server
// and the tools send them. Durations are Double when read: a client must tolerate any JSON number.

/// `POST /v1/oauth/app-attest/challenge`.
public struct ChallengeRequest: Codable, Sendable, Equatable {
    public var clientID: String
    /// Base64 of the 32-byte App Attest key ID.
    public var keyID: String

    public init(clientID: String, keyID: String) {
        self.clientID = clientID
        self.keyID = keyID
    }

    enum CodingKeys: String, CodingKey {
        case clientID = "client_id", keyID = "key_id"
    }

    public var json: String { JSONText.object([("client_id", clientID), ("key_id", keyID)]) }
}

/// The challenge response: base64 of 32 random bytes and its remaining lifetime.
public struct ChallengeResponse: Codable, Sendable, Equatable {
    public var challenge: String?
    public var expiresIn: Double?

    public init(challenge: String, expiresIn: Int) {
        self.challenge = challenge
        self.expiresIn = Double(expiresIn)
    }

    enum CodingKeys: String, CodingKey {
        case challenge, expiresIn = "expires_in"
    }

    public var json: String { JSONText.object([("challenge", challenge as Any), ("expires_in", expiresIn as Any)]) }

    /// From a response body without Foundation's decoder; nil where JSONDecoder would throw (not
    /// an object, or a member of the wrong type). Absent and null members are nil.
    public init?(json bytes: [UInt8]) {
        guard let members = JSONObjectReader.members(bytes),
              let challenge = members.optionalString("challenge"), let expiresIn = members.optionalNumber("expires_in") else { return nil }
        self.challenge = challenge
        self.expiresIn = expiresIn
    }
}

/// `POST /v1/oauth/app-attest/register`.
public struct RegisterRequest: Codable, Sendable, Equatable {
    public var clientID: String
    public var keyID: String
    /// Base64 of the CBOR attestation object from DCAppAttestService.attestKey.
    public var attestationObject: String

    public init(clientID: String, keyID: String, attestationObject: String) {
        self.clientID = clientID
        self.keyID = keyID
        self.attestationObject = attestationObject
    }

    enum CodingKeys: String, CodingKey {
        case clientID = "client_id", keyID = "key_id", attestationObject = "attestation_object"
    }

    public var json: String {
        JSONText.object([("client_id", clientID), ("key_id", keyID), ("attestation_object", attestationObject)])
    }
}

/// `POST /v1/oauth/token`, a form body.
public struct TokenRequest: Sendable, Equatable {
    public var grantType: String
    public var clientID: String
    public var keyID: String
    /// Base64 of the CBOR assertion {signature, authenticatorData}.
    public var assertion: String

    public init(clientID: String, keyID: String, assertion: String, grantType: String = WireProtocol.grantType) {
        self.grantType = grantType
        self.clientID = clientID
        self.keyID = keyID
        self.assertion = assertion
    }

    /// The form body, fields sorted by name and percent-encoded.
    public var formBody: String {
        FormEncoding.encode(pairs: [("grant_type", grantType), ("client_id", clientID), ("key_id", keyID), ("assertion", assertion)])
    }
}

/// The answer to register and token requests.
public struct TokenResponse: Codable, Sendable, Equatable {
    public var accessToken: String?
    public var tokenType: String?
    public var expiresIn: Double?
    /// Optional: a fresh challenge for the same key, which saves the next refresh a round trip.
    public var nextChallenge: String?
    public var nextChallengeExpiresIn: Double?

    public init(accessToken: String, expiresIn: Int, nextChallenge: String?, nextChallengeExpiresIn: Int?) {
        self.accessToken = accessToken
        self.tokenType = WireProtocol.tokenType
        self.expiresIn = Double(expiresIn)
        self.nextChallenge = nextChallenge
        self.nextChallengeExpiresIn = nextChallengeExpiresIn.map(Double.init)
    }

    enum CodingKeys: String, CodingKey {
        case accessToken = "access_token", tokenType = "token_type", expiresIn = "expires_in"
        case nextChallenge = "next_challenge", nextChallengeExpiresIn = "next_challenge_expires_in"
    }

    public var json: String {
        var fields: [(String, Any)] = [("access_token", accessToken as Any), ("token_type", tokenType as Any),
                                       ("expires_in", expiresIn as Any)]
        if let nextChallenge { fields.append(("next_challenge", nextChallenge)) }
        if let nextChallengeExpiresIn { fields.append(("next_challenge_expires_in", nextChallengeExpiresIn)) }
        return JSONText.object(fields)
    }

    /// From a response body without Foundation's decoder, as `ChallengeResponse(json:)`.
    public init?(json bytes: [UInt8]) {
        guard let members = JSONObjectReader.members(bytes),
              let accessToken = members.optionalString("access_token"), let tokenType = members.optionalString("token_type"),
              let expiresIn = members.optionalNumber("expires_in"), let nextChallenge = members.optionalString("next_challenge"),
              let nextChallengeExpiresIn = members.optionalNumber("next_challenge_expires_in") else { return nil }
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresIn = expiresIn
        self.nextChallenge = nextChallenge
        self.nextChallengeExpiresIn = nextChallengeExpiresIn
    }
}

extension [String: JSONObjectReader.Value] {
    /// `.some(nil)` when absent or null, nil when present with another type.
    func optionalString(_ name: String) -> String?? {
        switch self[name] {
        case nil, .null?: return .some(nil)
        case .string(let text)?: return .some(text)
        default: return nil
        }
    }

    func optionalNumber(_ name: String) -> Double?? {
        switch self[name] {
        case nil, .null?: return .some(nil)
        case .number(let value)?: return .some(value)
        default: return nil
        }
    }
}

/// The opaque error body of the token exchange: `{"error":"invalid_grant"}`.
public struct OAuthErrorResponse: Codable, Sendable, Equatable {
    public var error: String

    public init(_ error: OAuthError) { self.error = error.rawValue }

    public var json: String { JSONText.object([("error", error)]) }
}

/// The error codes the device exchange answers with (PROTOCOL.md, "Errors the client acts on").
public enum OAuthError: String, Sendable, CaseIterable {
    case invalidRequest = "invalid_request"
    case invalidClient = "invalid_client"
    case invalidGrant = "invalid_grant"
    case rateLimited = "rate_limit_error"
    case serverError = "server_error"
}

/// The Messages API's error envelope, which answers bearer-token requests:
/// `{"type":"error","error":{"type":…,"message":…},"request_id":…}`.
public struct APIErrorResponse: Sendable, Equatable {
    public var type: String
    public var message: String
    public var requestID: String?

    public init(type: String, message: String, requestID: String? = nil) {
        self.type = type
        self.message = message
        self.requestID = requestID
    }

    public var json: String {
        var fields: [(String, Any)] = [("type", "error"), ("error", [("type", type), ("message", message)] as [(String, Any)])]
        if let requestID { fields.append(("request_id", requestID)) }
        return JSONText.object(fields)
    }
}
