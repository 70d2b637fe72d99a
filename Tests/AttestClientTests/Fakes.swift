import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
@testable import AttestClient
import AttestWire

/// A clock the tests move by hand.
final class TestClock: @unchecked Sendable {
    private let lock = NSLock()
    private var current = Date(timeIntervalSince1970: 1_700_000_000)

    var now: Date { lock.locked { current } }
    func advance(_ seconds: TimeInterval) { lock.locked { current += seconds } }
}

struct TestFailure: Error, Equatable {
    let message: String
}

/// Stands in for DCAppAttestService: "attestations" and "assertions" are readable strings that
/// embed the key ID and client data hash, so the fake server can check what was signed.
final class FakeAttester: DeviceAttester, @unchecked Sendable {
    private let lock = NSLock()
    private var _isSupported = true
    private var keyCount = 0
    private var _attestCount = 0
    private var _assertionCount = 0
    private var _attestError: Error?
    private var _keyError: Error?
    private var _lostKeys: Set<String> = []

    var isSupported: Bool {
        get { lock.locked { _isSupported } }
        set { lock.locked { _isSupported = newValue } }
    }
    var attestError: Error? {
        get { lock.locked { _attestError } }
        set { lock.locked { _attestError = newValue } }
    }
    var keyError: Error? {
        get { lock.locked { _keyError } }
        set { lock.locked { _keyError = newValue } }
    }
    var generatedKeys: Int { lock.locked { keyCount } }
    var attestCount: Int { lock.locked { _attestCount } }
    var assertionCount: Int { lock.locked { _assertionCount } }
    func loseKey(_ keyID: String) { lock.locked { _ = _lostKeys.insert(keyID) } }

    /// Key IDs whose base64 contains `+`, `/` and `=`, to exercise escaping.
    static func keyID(number: Int) -> String {
        Data([0xFB, 0xFF] + [UInt8](repeating: UInt8(number), count: 30)).base64EncodedString()
    }

    static func attestation(keyID: String, clientDataHash: Data) -> Data {
        Data("attest:\(keyID):\(hexString([UInt8](clientDataHash)))".utf8)
    }

    static func assertion(keyID: String, clientDataHash: Data) -> Data {
        // Leading 0xFB 0xFF makes the base64 start with "+/".
        Data([0xFB, 0xFF]) + Data("assert:\(keyID):\(hexString([UInt8](clientDataHash)))".utf8)
    }

    func generateKey() async throws -> String {
        try lock.locked {
            if let _keyError { throw _keyError }
            keyCount += 1
            return Self.keyID(number: keyCount)
        }
    }

    func attestKey(_ keyID: String, clientDataHash: Data) async throws -> Data {
        try lock.locked {
            _attestCount += 1
            if let _attestError { throw _attestError }
            return Self.attestation(keyID: keyID, clientDataHash: clientDataHash)
        }
    }

    func generateAssertion(_ keyID: String, clientDataHash: Data) async throws -> Data {
        try lock.locked {
            _assertionCount += 1
            if _lostKeys.contains(keyID) { throw AttestClientError.missingCredential }
            return Self.assertion(keyID: keyID, clientDataHash: clientDataHash)
        }
    }
}

/// An in-memory server speaking PROTOCOL.md, strict about what it accepts, with scripted
/// answers that take precedence when queued.
final class FakeServer: HTTPTransport, @unchecked Sendable {
    enum Endpoint: String, CaseIterable, Sendable {
        case challenge = "/v1/oauth/app-attest/challenge"
        case register = "/v1/oauth/app-attest/register"
        case token = "/v1/oauth/token"
    }

    struct Recorded {
        let endpoint: Endpoint
        let contentType: String?
        let body: String
    }

    struct Scripted {
        let status: Int
        let body: String
        let headers: [String: String]
    }

    let clientID: String
    private let lock = NSLock()
    private var pending: [String: [UInt8]] = [:]     // key ID → outstanding challenge
    private var registered: Set<String> = []
    private var challengeCount = 0
    private var tokenCount = 0
    private var scripts: [Endpoint: [Scripted]] = [:]
    private var _requests: [Recorded] = []

    // Behaviour knobs (set before use).
    var tokenLifetime: Double = 3600
    var nextChallengeTTL: Double? = nil          // issue next_challenge with this TTL when set
    var urlSafeUnpadded = false                   // encode challenges base64url without padding
    var tokenDelay: UInt64 = 0                    // nanoseconds before answering register/token
    var onRegister: (@Sendable () -> Void)?

    init(clientID: String = "clid_test") {
        self.clientID = clientID
    }

    var requests: [Recorded] { lock.locked { _requests } }
    func count(_ endpoint: Endpoint) -> Int { requests.filter { $0.endpoint == endpoint }.count }
    func markRegistered(_ keyID: String) { lock.locked { _ = registered.insert(keyID) } }
    func isRegistered(_ keyID: String) -> Bool { lock.locked { registered.contains(keyID) } }

    func enqueue(_ endpoint: Endpoint, status: Int, body: String = "", headers: [String: String] = [:]) {
        lock.locked { scripts[endpoint, default: []].append(Scripted(status: status, body: body, headers: headers)) }
    }

    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        guard let endpoint = Endpoint(rawValue: request.url!.path), request.httpMethod == "POST" else {
            return reply(request, 405, "")
        }
        let body = String(decoding: request.httpBody ?? Data(), as: UTF8.self)
        let scripted: Scripted? = lock.locked {
            _requests.append(Recorded(endpoint: endpoint, contentType: request.value(forHTTPHeaderField: "Content-Type"),
                                      body: body))
            return scripts[endpoint]?.isEmpty == false ? scripts[endpoint]!.removeFirst() : nil
        }
        if endpoint != .challenge && tokenDelay > 0 { try await Task.sleep(nanoseconds: tokenDelay) }
        if let scripted { return reply(request, scripted.status, scripted.body, scripted.headers) }
        let (status, json) = lock.locked { handle(endpoint, request: request, body: body) }
        return reply(request, status, json)
    }

    private func reply(_ request: URLRequest, _ status: Int, _ body: String,
                       _ headers: [String: String] = [:]) -> (Data, HTTPURLResponse) {
        (Data(body.utf8), HTTPURLResponse(url: request.url!, statusCode: status, httpVersion: "HTTP/1.1",
                                          headerFields: headers)!)
    }

    private static let invalidRequest = (400, #"{"error":"invalid_request"}"#)
    private static let invalidGrant = (401, #"{"error":"invalid_grant"}"#)

    // Called with `lock` held.
    private func handle(_ endpoint: Endpoint, request: URLRequest, body: String) -> (Int, String) {
        switch endpoint {
        case .challenge:
            guard request.value(forHTTPHeaderField: "Content-Type") == "application/json",
                  let fields = try? JSONDecoder().decode([String: String].self, from: Data(body.utf8)),
                  Set(fields.keys) == ["client_id", "key_id"], fields["client_id"] == clientID,
                  let keyID = fields["key_id"], Base64.decode(keyID)?.count == 32 else { return Self.invalidRequest }
            let challenge = mintChallenge(for: keyID)
            return (200, #"{"challenge":"\#(encode(challenge))","expires_in":300}"#)

        case .register:
            guard request.value(forHTTPHeaderField: "Content-Type") == "application/json",
                  let fields = try? JSONDecoder().decode([String: String].self, from: Data(body.utf8)),
                  Set(fields.keys) == ["client_id", "key_id", "attestation_object"], fields["client_id"] == clientID,
                  let keyID = fields["key_id"], let object = fields["attestation_object"].flatMap(Base64.decode)
            else { return Self.invalidRequest }
            guard let challenge = pending.removeValue(forKey: keyID), !registered.contains(keyID),
                  Data(object) == FakeAttester.attestation(
                      keyID: keyID, clientDataHash: Data(Wire.registrationClientDataHash(challenge: challenge)))
            else { return Self.invalidGrant }
            onRegister?()
            registered.insert(keyID)
            return (200, grant(for: keyID))

        case .token:
            guard request.value(forHTTPHeaderField: "Content-Type") == "application/x-www-form-urlencoded",
                  let fields = Self.parseForm(body),
                  Set(fields.keys) == ["grant_type", "client_id", "key_id", "assertion"],
                  fields["grant_type"] == WireProtocol.grantType, fields["client_id"] == clientID,
                  let keyID = fields["key_id"], let rawKeyID = Base64.decode(keyID),
                  let assertion = fields["assertion"].flatMap(Base64.decode) else { return Self.invalidRequest }
            guard registered.contains(keyID), let challenge = pending.removeValue(forKey: keyID),
                  Data(assertion) == FakeAttester.assertion(
                      keyID: keyID, clientDataHash: Data(Wire.tokenClientDataHash(
                          challenge: challenge, clientID: clientID, rawKeyID: rawKeyID)))
            else { return Self.invalidGrant }
            return (200, grant(for: keyID))
        }
    }

    private func mintChallenge(for keyID: String) -> [UInt8] {
        challengeCount += 1
        let challenge = [0xFB, 0xFF] + [UInt8](repeating: UInt8(challengeCount & 0xFF), count: 30)
        pending[keyID] = challenge
        return challenge
    }

    private func grant(for keyID: String) -> String {
        tokenCount += 1
        var json = #"{"access_token":"tok-\#(tokenCount)","token_type":"Bearer","expires_in":\#(tokenLifetime)"#
        if let nextChallengeTTL {
            json += #","next_challenge":"\#(encode(mintChallenge(for: keyID)))","next_challenge_expires_in":\#(nextChallengeTTL)"#
        }
        return json + "}"
    }

    private func encode(_ bytes: [UInt8]) -> String {
        let standard = Data(bytes).base64EncodedString()
        guard urlSafeUnpadded else { return standard }
        return standard.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// application/x-www-form-urlencoded: `+` means space, so an unescaped base64 `+` is corrupted.
    static func parseForm(_ body: String) -> [String: String]? {
        var fields: [String: String] = [:]
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2,
                  let name = parts[0].replacingOccurrences(of: "+", with: " ").removingPercentEncoding,
                  let value = parts[1].replacingOccurrences(of: "+", with: " ").removingPercentEncoding,
                  fields[name] == nil else { return nil }
            fields[name] = value
        }
        return fields
    }
}

/// A client wired to fakes, plus the fakes.
struct Harness {
    let clock = TestClock()
    let attester = FakeAttester()
    let server = FakeServer()
    let store = InMemoryCredentialStore()
    static let baseURL = URL(string: "https://attest.example.test/")!

    func makeClient() -> AppAttestClient {
        let clock = clock
        return AppAttestClient(clientID: server.clientID, baseURL: Self.baseURL, attester: attester, store: store,
                               transport: server, now: { clock.now })
    }

    /// An install that registered `keyID` earlier and holds a token expiring in `tokenTTL` seconds.
    func seedRegisteredKey(_ keyID: String = FakeAttester.keyID(number: 99), tokenTTL: TimeInterval? = nil) throws {
        server.markRegistered(keyID)
        try store.setKeyID(keyID, for: server.clientID)
        if let tokenTTL {
            try store.setToken(StoredToken(token: "old-token", expiresAt: clock.now + tokenTTL), for: server.clientID)
        }
    }
}

extension NSLock {
    /// The test doubles' own locking (the module's shared state uses LockedValueBox).
    func locked<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }
}
