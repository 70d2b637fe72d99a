import AttestWire
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Where `authenticateIfNeeded()` got its token.
public enum AuthenticationSource: String, Sendable {
    /// The device attested a new key (first run, or after its key was lost or rejected).
    case registered
    /// The registered key signed an assertion for a new token.
    case refreshed
    /// A token with at least a minute left was already in memory or in the store.
    case cached
}

/// The device side of the App Attest token exchange for one client ID: attests once per install,
/// then renews its access token with assertions. Use one instance per client ID in a process.
public actor AppAttestClient {
    /// A token is renewed this long before it expires.
    static let refreshMargin: TimeInterval = 60
    /// A pre-issued challenge needs this much TTL left to be worth signing and sending.
    static let minimumChallengeTTL: TimeInterval = 15
    /// A rejected or lost key is replaced (re-attested) at most this often.
    static let keyReplacementInterval: TimeInterval = 600
    /// Backoff after a failed registration when the server gives no Retry-After.
    static let registrationRetryDelay: TimeInterval = 60
    /// Default backoff for 429 on registration (registration quota) and on the token endpoint.
    static let registrationRateLimitDelay: TimeInterval = 900
    static let tokenRateLimitDelay: TimeInterval = 60
    /// Pause after a refresh that failed for another reason (5xx, network, invalid_client).
    static let refreshFailureDelay: TimeInterval = 10

    public nonisolated let clientID: String
    private let baseURL: URL
    private let attester: any DeviceAttester
    private let store: any CredentialStore
    private let transport: any HTTPTransport
    private let now: @Sendable () -> Date

    private var keyID: String?
    private var keyIDLoaded = false
    private var token: StoredToken?
    private var tokenLoaded = false
    /// A token the caller reported as rejected; never reloaded from the store.
    private var droppedToken: String?
    private var pendingChallenge: PendingChallenge?
    private var inFlight: Task<Grant, Error>?
    private var registrationBackoff: Backoff?
    private var refreshBackoff: Backoff?
    private var lastKeyReplacement: Date?
    private var unattestedKeyID: String?

    public init(clientID: String, baseURL: URL, attester: any DeviceAttester, store: any CredentialStore,
                transport: any HTTPTransport = URLSessionTransport(),
                now: @escaping @Sendable () -> Date = { Date() }) {
        self.clientID = clientID
        self.baseURL = baseURL
        self.attester = attester
        self.store = store
        self.transport = transport
        self.now = now
    }

    // MARK: Public API

    /// Makes sure this install has a registered key and a token with at least a minute left,
    /// attesting at most once. Unlike `currentToken()`, a failed renewal is an error here even
    /// if the old token has not expired yet.
    @discardableResult
    public func authenticateIfNeeded() async throws -> AuthenticationSource {
        if freshToken() != nil { return .cached }
        return try await sharedAcquisition().source
    }

    /// A token valid for at least a minute: from memory, the store, or a renewal (registration
    /// if there is no key yet). If renewal fails, a token that has not expired yet is served.
    public func currentToken() async throws -> String {
        if let token = freshToken() { return token.token }
        do {
            return try await sharedAcquisition().token.token
        } catch {
            if let token = loadedToken(), token.expiresAt > now() { return token.token }
            throw error
        }
    }

    /// When the current token expires, for display; nil if there is none.
    public func currentTokenExpiry() -> Date? {
        loadedToken()?.expiresAt
    }

    /// Drops `usedToken` after the API rejected it, unless a newer token has replaced it already.
    public func invalidateToken(usedToken: String) {
        if token?.token == usedToken { token = nil }
        droppedToken = usedToken
        // Best effort: `droppedToken` keeps it from being reloaded even if the store fails.
        if let stored = try? store.token(for: clientID), stored.token == usedToken {
            try? store.setToken(nil, for: clientID)
        }
    }

    // MARK: Token state

    private func loadedToken() -> StoredToken? {
        if !tokenLoaded {
            tokenLoaded = true
            // The stored token is only a cache: if it can't be read, renewing replaces it.
            if let stored = try? store.token(for: clientID), stored.token != droppedToken {
                token = stored
            }
        }
        return token
    }

    private func freshToken() -> StoredToken? {
        guard let token = loadedToken(), token.expiresAt.timeIntervalSince(now()) >= Self.refreshMargin else {
            return nil
        }
        return token
    }

    private func storedKeyID() throws -> String? {
        if !keyIDLoaded {
            do {
                keyID = try store.keyID(for: clientID)
            } catch {
                throw AttestClientError.storeFailed(underlying: error)
            }
            keyIDLoaded = true
        }
        return keyID
    }

    // MARK: Acquisition

    private struct Grant: Sendable {
        let token: StoredToken
        let source: AuthenticationSource
    }

    /// All concurrent callers await the same task, so there is one renewal or registration at a time.
    private func sharedAcquisition() async throws -> Grant {
        if let inFlight { return try await inFlight.value }
        let task = Task { try await self.acquire() }
        inFlight = task
        defer { inFlight = nil }
        return try await task.value
    }

    private func acquire() async throws -> Grant {
        guard attester.isSupported else { throw AttestClientError.attestationUnsupported }
        guard let keyID = try storedKeyID() else {
            return Grant(token: try await register(), source: .registered)
        }
        do {
            return Grant(token: try await refresh(keyID: keyID), source: .refreshed)
        } catch let rejection as KeyRejected {
            if let last = lastKeyReplacement, now().timeIntervalSince(last) < Self.keyReplacementInterval {
                // Until the key may be replaced again, calls fail at once instead of repeating
                // challenge, assertion and POST each time.
                refreshBackoff = Backoff(until: last.addingTimeInterval(Self.keyReplacementInterval), cause: rejection.publicError)
                throw rejection.publicError
            }
            lastKeyReplacement = now()
            forgetKey()
            return Grant(token: try await register(), source: .registered)
        }
    }

    /// The server rejected the key twice, or the attester no longer has it: re-attest.
    private enum KeyRejected: Error {
        case byServer
        case lostByAttester

        var publicError: AttestClientError {
            switch self {
            case .byServer: return .attestationFailed(underlying: AttestClientError.serverError(status: 401, code: "invalid_grant"))
            case .lostByAttester: return .missingCredential
            }
        }
    }

    private func forgetKey() {
        keyID = nil
        pendingChallenge = nil
        // Best effort: a successful registration overwrites the stored key anyway.
        try? store.setKeyID(nil, for: clientID)
    }

    private func refresh(keyID: String) async throws -> StoredToken {
        if let error = refreshBackoff?.error(at: now()) { throw error }
        guard let rawKeyID = Base64.decode(keyID), rawKeyID.count == Wire.keyIDLength else {
            throw KeyRejected.lostByAttester
        }
        do {
            // invalid_grant is opaque (raced or expired challenge too), so retry once with a fresh challenge.
            for attempt in 0..<2 {
                let challenge: [UInt8]
                if attempt == 0, let preissued = takePendingChallenge(for: keyID) {
                    challenge = preissued
                } else {
                    challenge = try await fetchChallenge(keyID: keyID)
                }
                let hash = Wire.tokenClientDataHash(challenge: challenge, clientID: clientID, rawKeyID: rawKeyID)
                let assertion: Data
                do {
                    assertion = try await attester.generateAssertion(keyID, clientDataHash: Data(hash))
                } catch AttestClientError.missingCredential {
                    throw KeyRejected.lostByAttester
                } catch {
                    throw AttestClientError.attestationFailed(underlying: error)
                }
                let request = Wire.tokenRequest(baseURL: baseURL, clientID: clientID, keyID: keyID, assertion: assertion)
                do {
                    return try accept(try await send(request), keyID: keyID)
                } catch let reply as ServerReply where reply.status == 401 && reply.code == "invalid_grant" {
                    continue
                }
            }
            throw KeyRejected.byServer
        } catch let reply as ServerReply {
            let error = reply.publicError(rateLimitDefault: Self.tokenRateLimitDelay)
            if case .rateLimited(let delay) = error {
                refreshBackoff = Backoff(until: now().addingTimeInterval(delay), cause: error)
            } else {
                // Any other refusal or server error: pause (as long as the server asks, at least
                // briefly) so that every call during the last minute of a still-valid token does
                // not repeat challenge + assertion + POST.
                let delay = max(reply.retryAfter ?? 0, Self.refreshFailureDelay)
                refreshBackoff = Backoff(until: now().addingTimeInterval(delay), cause: error)
            }
            throw error
        } catch let error as AttestClientError {
            // Offline, an assertion the attester could not make, an unreadable answer: each would
            // otherwise be repeated on every call (the last one mints a token each time).
            refreshBackoff = Backoff(until: now().addingTimeInterval(Self.refreshFailureDelay), cause: error)
            throw error
        }
    }

    private func register() async throws -> StoredToken {
        if let error = registrationBackoff?.error(at: now()) { throw error }
        // A new key per attestation attempt (a key is attested only once), but one that never
        // reached attestKey (say, the challenge request failed offline) is reused.
        let keyID: String
        if let spare = unattestedKeyID {
            keyID = spare
        } else {
            do {
                keyID = try await attester.generateKey()
            } catch {
                throw AttestClientError.attestationFailed(underlying: error)
            }
            unattestedKeyID = keyID
        }
        var attempted = false
        let data: Data
        do {
            let challenge = try await fetchChallenge(keyID: keyID)
            attempted = true
            unattestedKeyID = nil
            let attestation: Data
            do {
                attestation = try await attester.attestKey(
                    keyID, clientDataHash: Data(Wire.registrationClientDataHash(challenge: challenge)))
            } catch {
                throw AttestClientError.attestationFailed(underlying: error)
            }
            data = try await send(Wire.registerRequest(baseURL: baseURL, clientID: clientID, keyID: keyID,
                                                       attestation: attestation))
        } catch {
            // Back off once an attestation was spent, and whenever the server asked us to.
            let reply = error as? ServerReply
            let publicError = reply?.publicError(rateLimitDefault: Self.registrationRateLimitDelay)
                ?? (error as? AttestClientError) ?? .network(underlying: error)
            if case .rateLimited(let delay) = publicError {
                registrationBackoff = Backoff(until: now().addingTimeInterval(delay), cause: publicError)
            } else if attempted && !(error is CancellationError) {
                let delay = reply?.retryAfter ?? Self.registrationRetryDelay
                registrationBackoff = Backoff(until: now().addingTimeInterval(delay), cause: publicError)
            } else if let reply {
                // The server refused the challenge itself (down, or the client ID unknown): no
                // attestation was spent, but asking again at once on every call adds to its load.
                let delay = max(reply.retryAfter ?? 0, Self.refreshFailureDelay)
                registrationBackoff = Backoff(until: now().addingTimeInterval(delay), cause: publicError)
            }
            throw error is CancellationError ? error : publicError
        }
        // The server accepted the key: keep it even if the rest of the response proves unusable,
        // so the next attempt renews with it instead of attesting again.
        registrationBackoff = nil
        pendingChallenge = nil
        self.keyID = keyID
        keyIDLoaded = true
        let persisted = Result { try store.setKeyID(keyID, for: clientID) }
        let newToken = try accept(data, keyID: keyID)
        // This process carries on with the key and token in memory; the caller still learns
        // that the next launch would have to attest again.
        if case .failure(let error) = persisted { throw AttestClientError.storeFailed(underlying: error) }
        return newToken
    }

    /// Stores the token (and any pre-issued challenge) from a successful register or token response.
    private func accept(_ data: Data, keyID: String) throws -> StoredToken {
        let grant = try Wire.parseTokenGrant(data)
        let received = now()
        let newToken = StoredToken(token: grant.accessToken, expiresAt: received.addingTimeInterval(grant.expiresIn))
        token = newToken
        tokenLoaded = true
        refreshBackoff = nil
        // The token is a cache: if it can't be persisted, the next process renews.
        try? store.setToken(newToken, for: clientID)
        if let next = grant.nextChallenge {
            pendingChallenge = PendingChallenge(keyID: keyID, bytes: next,
                                                expiresAt: received.addingTimeInterval(grant.nextChallengeExpiresIn ?? 0))
        }
        return newToken
    }

    // MARK: Challenges

    private struct PendingChallenge {
        let keyID: String
        let bytes: [UInt8]
        let expiresAt: Date
    }

    /// A pre-issued challenge is single-use: it is consumed here whether or not it is still usable.
    private func takePendingChallenge(for keyID: String) -> [UInt8]? {
        defer { pendingChallenge = nil }
        guard let pending = pendingChallenge, pending.keyID == keyID,
              pending.expiresAt.timeIntervalSince(now()) >= Self.minimumChallengeTTL else { return nil }
        return pending.bytes
    }

    private func fetchChallenge(keyID: String) async throws -> [UInt8] {
        let data = try await send(Wire.challengeRequest(baseURL: baseURL, clientID: clientID, keyID: keyID))
        return try Wire.parseChallenge(data).bytes
    }

    // MARK: HTTP

    /// A non-2xx answer, before it is mapped to an `AttestClientError` for its endpoint.
    private struct ServerReply: Error {
        let status: Int
        let code: String?
        let retryAfter: TimeInterval?

        func publicError(rateLimitDefault: TimeInterval) -> AttestClientError {
            switch status {
            case 404: return .endpointsNotDeployed
            case 429: return .rateLimited(retryAfter: retryAfter ?? rateLimitDefault)
            // invalid_client (unknown or revoked client) and rejected attestations or assertions.
            case 401: return .attestationFailed(underlying: AttestClientError.serverError(status: status, code: code))
            default: return .serverError(status: status, code: code)
            }
        }
    }

    private func send(_ request: URLRequest) async throws -> Data {
        let data: Data
        let response: HTTPURLResponse
        do {
            (data, response) = try await transport.send(request)
        } catch let error as AttestClientError {
            throw error
        } catch let error as CancellationError {
            throw error
        } catch {
            throw AttestClientError.network(underlying: error)
        }
        guard (200..<300).contains(response.statusCode) else {
            throw ServerReply(status: response.statusCode, code: Wire.errorCode(data),
                              retryAfter: Wire.retryAfter(response.value(forHTTPHeaderField: "Retry-After")))
        }
        return data
    }

    private struct Backoff {
        let until: Date
        let cause: AttestClientError

        /// The error to fail fast with while the backoff lasts.
        func error(at now: Date) -> AttestClientError? {
            let remaining = until.timeIntervalSince(now)
            guard remaining > 0 else { return nil }
            if case .rateLimited = cause { return .rateLimited(retryAfter: remaining) }
            return .backingOff(retryAfter: remaining, lastError: cause)
        }
    }
}
