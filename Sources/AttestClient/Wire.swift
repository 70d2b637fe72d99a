import AttestWire
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(CryptoKit)
import CryptoKit
#else
import AttestCrypto
#endif

/// SHA-256 from the platform: CryptoKit on Apple's systems, OpenSSL (through AttestCrypto) on
/// Linux, where the client runs in tests and tools. The module needs nothing else from either.
func platformSHA256(_ bytes: [UInt8]) -> [UInt8] {
    #if canImport(CryptoKit)
    return Array(SHA256.hash(data: bytes))
    #else
    return sha256(bytes)
    #endif
}

/// The token exchange as this client sends and reads it, on top of `AttestWire` (the protocol's
/// paths, hashes, encodings and JSON shapes, shared with the server).
enum Wire {
    static let challengeLength = WireProtocol.challengeLength
    static let keyIDLength = WireProtocol.keyIDLength

    // MARK: Client data hashes

    static func registrationClientDataHash(challenge: [UInt8]) -> [UInt8] {
        WireProtocol.registrationClientDataHash(challenge: challenge, sha256: platformSHA256)
    }

    static func tokenClientDataHash(challenge: [UInt8], clientID: String, rawKeyID: [UInt8]) -> [UInt8] {
        WireProtocol.tokenClientDataHash(challenge: challenge, clientID: clientID, keyID: rawKeyID, sha256: platformSHA256)
    }

    // MARK: Requests

    static func challengeRequest(baseURL: URL, clientID: String, keyID: String) -> URLRequest {
        jsonRequest(url(baseURL, WireProtocol.challengePath), ChallengeRequest(clientID: clientID, keyID: keyID).json)
    }

    static func registerRequest(baseURL: URL, clientID: String, keyID: String, attestation: Data) -> URLRequest {
        jsonRequest(url(baseURL, WireProtocol.registerPath),
                    RegisterRequest(clientID: clientID, keyID: keyID, attestationObject: attestation.base64EncodedString()).json)
    }

    static func tokenRequest(baseURL: URL, clientID: String, keyID: String, assertion: Data) -> URLRequest {
        var request = URLRequest(url: url(baseURL, WireProtocol.tokenPath))
        request.httpMethod = "POST"
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        request.httpBody = Data(TokenRequest(clientID: clientID, keyID: keyID, assertion: assertion.base64EncodedString()).formBody.utf8)
        return request
    }

    /// The protocol's paths are absolute; the base URL may carry a path of its own.
    private static func url(_ baseURL: URL, _ path: String) -> URL {
        baseURL.appendingPathComponent(String(path.dropFirst()))
    }

    private static func jsonRequest(_ url: URL, _ body: String) -> URLRequest {
        var request = URLRequest(url: url)
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        request.httpBody = Data(body.utf8)
        return request
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
        guard let body = try? JSONDecoder().decode(ChallengeResponse.self, from: data), let text = body.challenge else {
            throw AttestClientError.invalidResponse("challenge response without a challenge")
        }
        // A fresh challenge is used at once, so its expires_in does not matter here.
        return Challenge(bytes: try decodeChallenge(text))
    }

    static func parseTokenGrant(_ data: Data) throws -> TokenGrant {
        guard let body = try? JSONDecoder().decode(TokenResponse.self, from: data) else {
            throw AttestClientError.invalidResponse("token response is not the expected JSON")
        }
        guard let token = body.accessToken, !token.isEmpty else {
            throw AttestClientError.invalidResponse("token response without access_token")
        }
        guard let expiresIn = serverDuration(body.expiresIn), expiresIn > 0 else {
            throw AttestClientError.invalidResponse("token response without a positive expires_in")
        }
        // An unusable pre-issued challenge only costs a round trip, so it is dropped rather than fatal.
        let next = body.nextChallenge.flatMap { try? decodeChallenge($0) }
        return TokenGrant(accessToken: token, expiresIn: expiresIn, nextChallenge: next,
                          nextChallengeExpiresIn: serverDuration(body.nextChallengeExpiresIn))
    }

    private static func decodeChallenge(_ text: String) throws -> [UInt8] {
        guard let bytes = Base64.decode(text), bytes.count == challengeLength else {
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

    static func serverDuration(_ seconds: Double?) -> TimeInterval? { WireProtocol.serverDuration(seconds) }

    static func retryAfter(_ header: String?) -> TimeInterval? { WireProtocol.retryAfter(header) }
}
