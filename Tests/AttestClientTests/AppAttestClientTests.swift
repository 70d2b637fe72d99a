import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing
@testable import AttestClient
import AttestWire

/// Short descriptions of errors, so expectations can compare them.
private func describe(_ error: Error?) -> String {
    guard let error else { return "nil" }
    guard let error = error as? AttestClientError else { return "\(error)" }
    switch error {
    case .attestationUnsupported: return "unsupported"
    case .attestationFailed(let underlying): return "attestationFailed(\(describe(underlying)))"
    case .missingCredential: return "missingCredential"
    case .endpointsNotDeployed: return "notDeployed"
    case .invalidResponse: return "invalidResponse"
    case .rateLimited(let delay): return "rateLimited(\(Int(delay.rounded())))"
    case .backingOff(let delay, let last): return "backingOff(\(Int(delay.rounded())), \(describe(last)))"
    case .serverError(let status, let code): return "server(\(status), \(code ?? "-"))"
    case .network(let underlying): return "network(\(describe(underlying)))"
    case .storeFailed: return "storeFailed"
    }
}

/// The error `body` throws, described; "no error" if it succeeds.
private func failure(_ body: () async throws -> some Any) async -> String {
    do {
        _ = try await body()
        return "no error"
    } catch {
        return describe(error)
    }
}

@Suite struct RegistrationTests {
    @Test func firstRunAttestsOnceAndStoresKeyOnlyAfterAcceptance() async throws {
        let h = Harness()
        let store = h.store, clientID = h.server.clientID
        h.server.onRegister = {
            // The server is deciding: the key must not be persisted yet.
            #expect(try! store.keyID(for: clientID) == nil)
        }
        let client = h.makeClient()
        #expect(try await client.authenticateIfNeeded() == .registered)

        #expect(h.server.requests.map(\.endpoint) == [.challenge, .register])
        let keyID = FakeAttester.keyID(number: 1)
        #expect(h.server.isRegistered(keyID))
        #expect(try h.store.keyID(for: clientID) == keyID)
        #expect(try h.store.token(for: clientID) == StoredToken(token: "tok-1", expiresAt: h.clock.now + 3600))
        #expect(await client.currentTokenExpiry() == h.clock.now + 3600)

        #expect(try await client.authenticateIfNeeded() == .cached)
        #expect(try await client.currentToken() == "tok-1")
        #expect(h.server.requests.count == 2)
        #expect(h.attester.attestCount == 1)
    }

    @Test func rejectedRegistrationStoresNothingAndBacksOff60Seconds() async throws {
        let h = Harness()
        h.server.enqueue(.register, status: 401, body: #"{"error":"invalid_grant"}"#)
        let client = h.makeClient()

        #expect(await failure { try await client.currentToken() } == "attestationFailed(server(401, invalid_grant))")
        #expect(try h.store.keyID(for: h.server.clientID) == nil)
        #expect(try h.store.token(for: h.server.clientID) == nil)

        h.clock.advance(30)
        #expect(await failure { try await client.authenticateIfNeeded() }
            == "backingOff(30, attestationFailed(server(401, invalid_grant)))")
        #expect(h.attester.attestCount == 1)
        #expect(h.attester.generatedKeys == 1)
        #expect(h.server.requests.count == 2)

        h.clock.advance(30)
        #expect(try await client.authenticateIfNeeded() == .registered)
        #expect(h.attester.attestCount == 2)
        #expect(try h.store.keyID(for: h.server.clientID) == FakeAttester.keyID(number: 2))
    }

    /// A challenge the server refuses (no attestation spent yet) still backs off, for as long as
    /// it asks or at least briefly, instead of asking again on every call.
    @Test func aRefusedRegistrationChallengeBacksOff() async throws {
        let h = Harness()
        h.server.enqueue(.challenge, status: 503, headers: ["Retry-After": "30"])
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == "server(503, -)")
        #expect(await failure { try await client.currentToken() } == "backingOff(30, server(503, -))")
        #expect(h.server.count(.challenge) == 1 && h.attester.attestCount == 0)
        h.clock.advance(30)
        #expect(try await client.currentToken() == "tok-1")
    }

    @Test func registrationBackoffHonoursRetryAfter() async throws {
        let h = Harness()
        h.server.enqueue(.register, status: 503, headers: ["Retry-After": "120"])
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == "server(503, -)")
        h.clock.advance(119)
        #expect(await failure { try await client.currentToken() } == "backingOff(1, server(503, -))")
        h.clock.advance(1)
        #expect(try await client.currentToken() == "tok-1")
    }

    @Test(arguments: [
        ([:], 900),                             // registration quota default
        (["Retry-After": "30"], 30),
        (["Retry-After": "172800"], 900),       // over a day: ignored
        (["Retry-After": "-5"], 900),
    ] as [([String: String], Int)])
    func rateLimitedRegistrationWaits(headers: [String: String], expected: Int) async throws {
        let h = Harness()
        h.server.enqueue(.register, status: 429, body: #"{"error":"rate_limit_error"}"#, headers: headers)
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == "rateLimited(\(expected))")
        h.clock.advance(TimeInterval(expected - 1))
        #expect(await failure { try await client.currentToken() } == "rateLimited(1)")
        #expect(h.attester.attestCount == 1)
        #expect(h.server.requests.count == 2)
        h.clock.advance(1)
        #expect(try await client.authenticateIfNeeded() == .registered)
    }

    @Test func attesterFailureIsAttachedAndBacksOff() async throws {
        let h = Harness()
        h.attester.attestError = TestFailure(message: "DCError.serverUnavailable")
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() }
            == #"attestationFailed(TestFailure(message: "DCError.serverUnavailable"))"#)
        #expect(h.server.count(.register) == 0)
        h.attester.attestError = nil
        #expect(await failure { try await client.currentToken() }.hasPrefix("backingOff(60,"))
        h.clock.advance(60)
        #expect(try await client.authenticateIfNeeded() == .registered)
    }

    @Test func keyGenerationFailureIsAttestationFailed() async throws {
        let h = Harness()
        h.attester.keyError = TestFailure(message: "no key")
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == #"attestationFailed(TestFailure(message: "no key"))"#)
        #expect(h.server.requests.isEmpty)
    }

    @Test func unsupportedDeviceNeverTouchesTheNetwork() async throws {
        let h = Harness()
        h.attester.isSupported = false
        let client = h.makeClient()
        #expect(await failure { try await client.authenticateIfNeeded() } == "unsupported")
        #expect(await failure { try await client.currentToken() } == "unsupported")
        #expect(h.server.requests.isEmpty)
        #expect(h.attester.generatedKeys == 0)
    }

    @Test func networkFailureBeforeAttestingDoesNotBackOff() async throws {
        struct Offline: HTTPTransport {
            func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) { throw URLError(.notConnectedToInternet) }
        }
        let h = Harness()
        let client = AppAttestClient(clientID: "clid_test", baseURL: Harness.baseURL, attester: h.attester,
                                     store: h.store, transport: Offline(), now: { h.clock.now })
        #expect(await failure { try await client.currentToken() }.hasPrefix("network("))
        #expect(await failure { try await client.currentToken() }.hasPrefix("network("))
        #expect(h.attester.attestCount == 0)
        #expect(h.attester.generatedKeys == 1)      // the unattested key is reused
    }

    @Test func acceptedRegistrationWithMalformedTokenStillKeepsTheKey() async throws {
        let h = Harness()
        h.server.tokenLifetime = 0
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == "invalidResponse")
        #expect(try h.store.keyID(for: h.server.clientID) == FakeAttester.keyID(number: 1))
        h.server.tokenLifetime = 3600
        // Renews with the accepted key instead of attesting again.
        #expect(try await client.authenticateIfNeeded() == .refreshed)
        #expect(h.attester.attestCount == 1)
    }

    @Test func keyThatCannotBePersistedIsReportedButKeptInMemory() async throws {
        final class ReadOnlyStore: CredentialStore, @unchecked Sendable {
            func keyID(for clientID: String) throws -> String? { nil }
            func setKeyID(_ keyID: String?, for clientID: String) throws { throw TestFailure(message: "read-only") }
            func token(for clientID: String) throws -> StoredToken? { nil }
            func setToken(_ token: StoredToken?, for clientID: String) throws { throw TestFailure(message: "read-only") }
        }
        let h = Harness()
        let client = AppAttestClient(clientID: h.server.clientID, baseURL: Harness.baseURL, attester: h.attester,
                                     store: ReadOnlyStore(), transport: h.server, now: { h.clock.now })
        #expect(await failure { try await client.authenticateIfNeeded() } == "storeFailed")
        #expect(try await client.authenticateIfNeeded() == .cached)
        h.clock.advance(3600)
        #expect(try await client.authenticateIfNeeded() == .refreshed)
        #expect(h.attester.attestCount == 1)
    }

    @Test func unreadableKeyStoreIsAnErrorNotAReasonToAttest() async throws {
        struct BrokenStore: CredentialStore {
            func keyID(for clientID: String) throws -> String? { throw TestFailure(message: "locked") }
            func setKeyID(_ keyID: String?, for clientID: String) throws {}
            func token(for clientID: String) throws -> StoredToken? { nil }
            func setToken(_ token: StoredToken?, for clientID: String) throws {}
        }
        let h = Harness()
        let client = AppAttestClient(clientID: h.server.clientID, baseURL: Harness.baseURL, attester: h.attester,
                                     store: BrokenStore(), transport: h.server, now: { h.clock.now })
        #expect(await failure { try await client.currentToken() } == "storeFailed")
        #expect(h.attester.generatedKeys == 0 && h.server.requests.isEmpty)
    }

    @Test func urlSafeUnpaddedChallengesAreAccepted() async throws {
        let h = Harness()
        h.server.urlSafeUnpadded = true
        h.server.nextChallengeTTL = 300
        h.server.tokenLifetime = 120
        let client = h.makeClient()
        #expect(try await client.authenticateIfNeeded() == .registered)
        h.clock.advance(70)
        #expect(try await client.authenticateIfNeeded() == .refreshed)
        // The pre-issued (URL-safe) challenge was used: no second challenge request.
        #expect(h.server.count(.challenge) == 1)
    }

    @Test func wrongLengthChallengeIsInvalidResponse() async throws {
        let h = Harness()
        h.server.enqueue(.challenge, status: 200, body: #"{"challenge":"AQID","expires_in":300}"#)
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == "invalidResponse")
        #expect(h.attester.attestCount == 0)
    }
}

@Suite struct RefreshTests {
    @Test func expiredTokenIsRenewedWithAnEscapedFormAssertion() async throws {
        let h = Harness()
        try h.seedRegisteredKey(tokenTTL: -10)
        let client = h.makeClient()
        #expect(try await client.authenticateIfNeeded() == .refreshed)
        #expect(h.server.requests.map(\.endpoint) == [.challenge, .token])
        let token = try #require(h.server.requests.last)
        #expect(token.contentType == "application/x-www-form-urlencoded")
        // Key ID and assertion contain + / = in base64; the fake parses `+` as a space, so escaping is required.
        #expect(token.body.contains("key_id=\(FormEncoding.percentEncode(FakeAttester.keyID(number: 99)))"))
        #expect(token.body.contains("%2B") && token.body.contains("%2F") && token.body.contains("%3D"))
        #expect(try h.store.token(for: h.server.clientID)?.token == "tok-1")
        #expect(h.attester.attestCount == 0)
    }

    @Test func storedTokenIsServedWithoutNetwork() async throws {
        let h = Harness()
        try h.seedRegisteredKey(tokenTTL: 61)
        let client = h.makeClient()
        #expect(try await client.authenticateIfNeeded() == .cached)
        #expect(try await client.currentToken() == "old-token")
        #expect(await client.currentTokenExpiry() == h.clock.now + 61)
        #expect(h.server.requests.isEmpty)
    }

    @Test func tokenWithinAMinuteOfExpiryIsRenewed() async throws {
        let h = Harness()
        try h.seedRegisteredKey(tokenTTL: 59)
        let client = h.makeClient()
        #expect(try await client.currentToken() == "tok-1")
    }

    @Test func failedRenewalServesTheUnexpiredOldToken() async throws {
        let h = Harness()
        try h.seedRegisteredKey(tokenTTL: 30)
        h.server.enqueue(.token, status: 500)
        h.server.enqueue(.token, status: 500)
        let client = h.makeClient()
        #expect(try await client.currentToken() == "old-token")
        // authenticateIfNeeded promises a token with a minute left, so it reports the failure —
        // without another round trip during the short pause after a failed renewal.
        #expect(await failure { try await client.authenticateIfNeeded() } == "backingOff(10, server(500, -))")
        #expect(h.server.count(.token) == 1)
        h.clock.advance(11)
        #expect(await failure { try await client.authenticateIfNeeded() } == "server(500, -)")
        #expect(h.server.count(.token) == 2)
        h.clock.advance(31)
        h.server.enqueue(.token, status: 500)
        #expect(await failure { try await client.currentToken() } == "server(500, -)")
    }

    @Test func rateLimitedRenewalBacksOffAndKeepsServingOldToken() async throws {
        let h = Harness()
        try h.seedRegisteredKey(tokenTTL: 50)
        h.server.enqueue(.token, status: 429, body: #"{"error":"rate_limit_error"}"#)
        let client = h.makeClient()
        #expect(try await client.currentToken() == "old-token")
        #expect(await failure { try await client.authenticateIfNeeded() } == "rateLimited(60)")
        #expect(h.server.count(.token) == 1)          // the second call failed fast
        h.clock.advance(51)
        #expect(await failure { try await client.currentToken() } == "rateLimited(9)")
        h.clock.advance(9)
        #expect(try await client.currentToken() == "tok-1")
        #expect(h.attester.attestCount == 0)
    }

    @Test func rateLimitOnTheTokenEndpointHonoursRetryAfter() async throws {
        let h = Harness()
        try h.seedRegisteredKey()
        h.server.enqueue(.token, status: 429, headers: ["Retry-After": "10"])
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == "rateLimited(10)")
        h.clock.advance(10)
        #expect(try await client.currentToken() == "tok-1")
    }

    @Test func rejectedAssertionIsRetriedOnceWithAFreshChallenge() async throws {
        let h = Harness()
        try h.seedRegisteredKey()
        h.server.enqueue(.token, status: 401, body: #"{"error":"invalid_grant"}"#)
        let client = h.makeClient()
        #expect(try await client.authenticateIfNeeded() == .refreshed)
        #expect(h.server.requests.map(\.endpoint) == [.challenge, .token, .challenge, .token])
        #expect(h.attester.attestCount == 0)
    }

    @Test func twiceRejectedKeyIsReplacedAtMostEveryTenMinutes() async throws {
        let h = Harness()
        let oldKey = FakeAttester.keyID(number: 99)
        try h.seedRegisteredKey(oldKey)
        h.server.tokenLifetime = 120
        for _ in 0..<2 { h.server.enqueue(.token, status: 401, body: #"{"error":"invalid_grant"}"#) }
        let client = h.makeClient()
        #expect(try await client.authenticateIfNeeded() == .registered)
        let newKey = FakeAttester.keyID(number: 1)
        #expect(try h.store.keyID(for: h.server.clientID) == newKey)
        #expect(h.attester.attestCount == 1)

        // Five minutes later the new key is rejected too: no second replacement yet.
        h.clock.advance(300)
        for _ in 0..<2 { h.server.enqueue(.token, status: 401, body: #"{"error":"invalid_grant"}"#) }
        #expect(await failure { try await client.authenticateIfNeeded() } == "attestationFailed(server(401, invalid_grant))")
        #expect(h.attester.attestCount == 1)
        #expect(try h.store.keyID(for: h.server.clientID) == newKey)
        // Until the window ends, calls fail at once rather than repeat challenge, assertion and POST.
        let tokenRequests = h.server.count(.token)
        #expect(await failure { try await client.authenticateIfNeeded() } == "backingOff(300, attestationFailed(server(401, invalid_grant)))")
        #expect(h.server.count(.token) == tokenRequests)

        h.clock.advance(300)
        for _ in 0..<2 { h.server.enqueue(.token, status: 401, body: #"{"error":"invalid_grant"}"#) }
        #expect(try await client.authenticateIfNeeded() == .registered)
        #expect(h.attester.attestCount == 2)
        #expect(try h.store.keyID(for: h.server.clientID) == FakeAttester.keyID(number: 2))
    }

    @Test func keyLostByTheAttesterIsReplaced() async throws {
        let h = Harness()
        try h.seedRegisteredKey()
        h.attester.loseKey(FakeAttester.keyID(number: 99))
        let client = h.makeClient()
        #expect(try await client.authenticateIfNeeded() == .registered)
        #expect(h.server.count(.token) == 0)
        #expect(try h.store.keyID(for: h.server.clientID) == FakeAttester.keyID(number: 1))
    }

    @Test func invalidClientIsNotRetried() async throws {
        let h = Harness()
        try h.seedRegisteredKey()
        h.server.enqueue(.token, status: 401, body: #"{"error":"invalid_client"}"#)
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == "attestationFailed(server(401, invalid_client))")
        #expect(h.server.count(.token) == 1)
        #expect(h.attester.attestCount == 0)
        #expect(try h.store.keyID(for: h.server.clientID) == FakeAttester.keyID(number: 99))
    }

    @Test(arguments: FakeServer.Endpoint.allCases)
    func notFoundMeansEndpointsNotDeployed(_ endpoint: FakeServer.Endpoint) async throws {
        let h = Harness()
        if endpoint == .token { try h.seedRegisteredKey() }
        h.server.enqueue(endpoint, status: 404)
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == "notDeployed")
    }

    @Test(arguments: [
        #"{"access_token":"t","expires_in":0}"#,
        #"{"access_token":"t","expires_in":-1}"#,
        #"{"access_token":"t","expires_in":86401}"#,
        #"{"access_token":"t"}"#,
    ])
    func tokenWithoutSaneExpiryIsMalformed(_ body: String) async throws {
        let h = Harness()
        try h.seedRegisteredKey()
        h.server.enqueue(.token, status: 200, body: body)
        let client = h.makeClient()
        #expect(await failure { try await client.currentToken() } == "invalidResponse")
        #expect(try h.store.token(for: h.server.clientID) == nil)
    }

    /// Registers with a pre-issued challenge of `ttl`, then renews after 70 s; returns challenge fetches for the renewal.
    private func challengeFetchesOnRenewal(nextChallengeTTL ttl: Double) async throws -> Int {
        let h = Harness()
        h.server.tokenLifetime = 120
        h.server.nextChallengeTTL = ttl
        let client = h.makeClient()
        #expect(try await client.authenticateIfNeeded() == .registered)
        let before = h.server.count(.challenge)
        h.clock.advance(70)
        #expect(try await client.authenticateIfNeeded() == .refreshed)
        return h.server.count(.challenge) - before
    }

    @Test func preissuedChallengeIsUsedWithEnoughTTL() async throws {
        #expect(try await challengeFetchesOnRenewal(nextChallengeTTL: 85) == 0)       // 15 s left
    }

    @Test func preissuedChallengeNearExpiryIsNotUsed() async throws {
        #expect(try await challengeFetchesOnRenewal(nextChallengeTTL: 84) == 1)       // 14 s left
    }

    @Test func preissuedChallengeWithInsaneTTLIsNotUsed() async throws {
        #expect(try await challengeFetchesOnRenewal(nextChallengeTTL: 172_800) == 1)
    }
}

@Suite struct ConcurrencyAndInvalidationTests {
    @Test func concurrentCallersShareOneRenewal() async throws {
        let h = Harness()
        try h.seedRegisteredKey(tokenTTL: -1)
        h.server.tokenDelay = 50_000_000
        let client = h.makeClient()
        let tokens = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<50 { group.addTask { try await client.currentToken() } }
            return try await group.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(tokens.count == 50 && Set(tokens) == ["tok-1"])
        #expect(h.server.count(.token) == 1)
        #expect(h.server.count(.challenge) == 1)
        #expect(h.attester.assertionCount == 1)
    }

    @Test func concurrentCallersShareOneRegistration() async throws {
        let h = Harness()
        h.server.tokenDelay = 50_000_000
        let client = h.makeClient()
        let sources = try await withThrowingTaskGroup(of: AuthenticationSource.self) { group in
            for _ in 0..<50 { group.addTask { try await client.authenticateIfNeeded() } }
            return try await group.reduce(into: [AuthenticationSource]()) { $0.append($1) }
        }
        #expect(sources.count == 50)
        #expect(sources.filter { $0 == .registered }.count >= 1)
        #expect(h.attester.generatedKeys == 1 && h.attester.attestCount == 1)
        #expect(h.server.count(.register) == 1)
    }

    @Test func invalidateDropsOnlyTheCurrentToken() async throws {
        let h = Harness()
        try h.seedRegisteredKey(tokenTTL: 3000)
        let client = h.makeClient()
        #expect(try await client.currentToken() == "old-token")

        await client.invalidateToken(usedToken: "some-older-token")
        #expect(try await client.currentToken() == "old-token")
        #expect(try h.store.token(for: h.server.clientID)?.token == "old-token")
        #expect(h.server.requests.isEmpty)

        await client.invalidateToken(usedToken: "old-token")
        #expect(try h.store.token(for: h.server.clientID) == nil)
        #expect(await client.currentTokenExpiry() == nil)
        #expect(try await client.currentToken() == "tok-1")
        #expect(h.server.count(.token) == 1)
    }

    @Test func invalidateBeforeFirstUseClearsTheStore() async throws {
        let h = Harness()
        try h.seedRegisteredKey(tokenTTL: 3000)
        let client = h.makeClient()
        await client.invalidateToken(usedToken: "old-token")
        #expect(try h.store.token(for: h.server.clientID) == nil)
        #expect(try await client.authenticateIfNeeded() == .refreshed)
    }
}
