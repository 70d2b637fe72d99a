import AttestCrypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The wire format of the token exchange (see PROTOCOL.md): paths, bodies, hashes, parsing.
enum Wire {
    static let challengePath = "v1/oauth/app-attest/challenge"
    static let registerPath = "v1/oauth/app-attest/register"
    static let tokenPath = "v1/oauth/token"
    static let grantType = "urn:anthropic:params:oauth:grant-type:app-attest"
    static let tokenHashDomain = Array("anthropic-app-attest-token-v1".utf8)
    static let challengeLength = 32
    static let keyIDLength = 32
    /// Server-supplied durations beyond this are ignored as nonsense.
    static let maxServerDuration: TimeInterval = 86_400

    // MARK: Client data hashes

    static func registrationClientDataHash(challenge: [UInt8]) -> [UInt8] {
        sha256(challenge)
    }

    /// The fixed-length challenge and key ID around the client ID keep the concatenation unambiguous.
    static func tokenClientDataHash(challenge: [UInt8], clientID: String, rawKeyID: [UInt8]) -> [UInt8] {
        sha256(tokenHashDomain + challenge + Array(clientID.utf8) + rawKeyID)
    }

    // MARK: Requests

    static func challengeRequest(baseURL: URL, clientID: String, keyID: String) -> URLRequest {
        jsonRequest(baseURL.appendingPathComponent(challengePath), ["client_id": clientID, "key_id": keyID])
    }

    static func registerRequest(baseURL: URL, clientID: String, keyID: String, attestation: Data) -> URLRequest {
        jsonRequest(baseURL.appendingPathComponent(registerPath), [
            "client_id": clientID, "key_id": keyID, "attestation_object": attestation.base64EncodedString(),
        ])
    }

    static func tokenRequest(baseURL: URL, clientID: String, keyID: String, assertion: Data) -> URLRequest {
        var request = URLRequest(url: baseURL.appendingPathComponent(tokenPath))
        request.httpMethod = "POST"
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        request.httpBody = Data(formEncode([
            "grant_type": grantType, "client_id": clientID, "key_id": keyID,
            "assertion": assertion.base64EncodedString(),
        ]).utf8)
        return request
    }

    private static func jsonRequest(_ url: URL, _ body: [String: String]) -> URLRequest {
        var request = URLRequest(url: url)
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // Encoding a [String: String] cannot fail.
        request.httpBody = try! encoder.encode(body)
        return request
    }

    /// `name=value` pairs sorted by name, both percent-encoded.
    static func formEncode(_ fields: [String: String]) -> String {
        fields.sorted { $0.key < $1.key }
            .map { "\(percentEncode($0.key))=\(percentEncode($0.value))" }
            .joined(separator: "&")
    }

    /// Percent-encodes everything but RFC 3986 unreserved characters, so `+ / = :` are escaped.
    static func percentEncode(_ text: String) -> String {
        var encoded = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
                 UInt8(ascii: "_"), UInt8(ascii: "~"):
                encoded.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                encoded += "%" + hex([byte]).uppercased()
            }
        }
        return encoded
    }

    // MARK: Responses

    struct Challenge {
        let bytes: [UInt8]
    }

    struct TokenGrant {
        let accessToken: String
        let expiresIn: TimeInterval
        let nextChallenge: [UInt8]?
        /// nil when missing or not a sane duration: the challenge is then treated as about to expire.
        let nextChallengeExpiresIn: TimeInterval?
    }

    static func parseChallenge(_ data: Data) throws -> Challenge {
        struct Body: Decodable { let challenge: String? }
        guard let body = try? JSONDecoder().decode(Body.self, from: data), let text = body.challenge else {
            throw AttestClientError.invalidResponse("challenge response without a challenge")
        }
        // A fresh challenge is used at once, so its expires_in does not matter here.
        return Challenge(bytes: try decodeChallenge(text))
    }

    static func parseTokenGrant(_ data: Data) throws -> TokenGrant {
        struct Body: Decodable {
            let access_token: String?
            let expires_in: Double?
            let next_challenge: String?
            let next_challenge_expires_in: Double?
        }
        guard let body = try? JSONDecoder().decode(Body.self, from: data) else {
            throw AttestClientError.invalidResponse("token response is not the expected JSON")
        }
        guard let token = body.access_token, !token.isEmpty else {
            throw AttestClientError.invalidResponse("token response without access_token")
        }
        guard let expiresIn = serverDuration(body.expires_in), expiresIn > 0 else {
            throw AttestClientError.invalidResponse("token response without a positive expires_in")
        }
        // An unusable pre-issued challenge only costs a round trip, so it is dropped rather than fatal.
        let next = body.next_challenge.flatMap { try? decodeChallenge($0) }
        return TokenGrant(accessToken: token, expiresIn: expiresIn, nextChallenge: next,
                          nextChallengeExpiresIn: serverDuration(body.next_challenge_expires_in))
    }

    private static func decodeChallenge(_ text: String) throws -> [UInt8] {
        guard let bytes = decodeBase64(text), bytes.count == challengeLength else {
            throw AttestClientError.invalidResponse("challenge is not base64 of \(challengeLength) bytes")
        }
        return bytes
    }

    /// The `error` field of an error body: `{"error": "code"}` or `{"error": {"type": "code"}}`.
    static func errorCode(_ data: Data) -> String? {
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return nil }
        if let code = object["error"] as? String { return code }
        return (object["error"] as? [String: Any])?["type"] as? String
    }

    /// A server duration in seconds, or nil if missing, negative, non-finite or over a day.
    static func serverDuration(_ seconds: Double?) -> TimeInterval? {
        guard let seconds, seconds.isFinite, seconds >= 0, seconds <= maxServerDuration else { return nil }
        return seconds
    }

    /// `Retry-After` in delta-seconds; the HTTP-date form is not used by this protocol.
    static func retryAfter(_ header: String?) -> TimeInterval? {
        guard let header else { return nil }
        return serverDuration(Double(header.trimmingCharacters(in: .whitespaces)))
    }

    // MARK: Encoding helpers

    /// Base64 in the standard or URL-safe alphabet, padded or not (shared with the server).
    static func decodeBase64(_ text: String) -> [UInt8]? { Base64.decode(text) }

    static func hex(_ bytes: [UInt8]) -> String { hexString(bytes) }
}
