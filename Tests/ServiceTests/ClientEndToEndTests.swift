import AppAttest
import AttestClient
import AttestCrypto
import Foundation
import SimulatedDevice
import Testing
import TestAuthority
import TokenService
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Counts requests per endpoint and can answer some paths itself (to simulate a missing deployment).
final class CountingTransport: HTTPTransport, @unchecked Sendable {
    private let inner = URLSessionTransport(session: TestHTTP.session)
    private let lock = NSLock()
    private var counts: [String: Int] = [:]

    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let path = request.url?.path ?? ""
        lock.withLock { counts[path, default: 0] += 1 }
        return try await inner.send(request)
    }

    func count(_ suffix: String) -> Int {
        lock.withLock { counts.filter { $0.key.hasSuffix(suffix) }.values.reduce(0, +) }
    }
    var total: Int { lock.withLock { counts.values.reduce(0, +) } }
}

/// Counts attestations and assertions of a software attester.
final class CountingAttester: DeviceAttester, @unchecked Sendable {
    let inner: SoftwareAttester
    private let lock = NSLock()
    private(set) var attestations = 0
    private(set) var assertions = 0
    private(set) var keys = 0
    init(_ inner: SoftwareAttester) { self.inner = inner }
    var isSupported: Bool { true }
    func generateKey() async throws -> String { lock.withLock { keys += 1 }; return try await inner.generateKey() }
    func attestKey(_ keyID: String, clientDataHash: Data) async throws -> Data {
        lock.withLock { attestations += 1 }
        return try await inner.attestKey(keyID, clientDataHash: clientDataHash)
    }
    func generateAssertion(_ keyID: String, clientDataHash: Data) async throws -> Data {
        lock.withLock { assertions += 1 }
        return try await inner.generateAssertion(keyID, clientDataHash: clientDataHash)
    }
}

/// A clock the client sees; the server keeps real time.
final class ClientClock: @unchecked Sendable {
    private let lock = NSLock()
    private var offset: TimeInterval = 0
    func advance(_ seconds: TimeInterval) { lock.lock(); offset += seconds; lock.unlock() }
    var now: Date { lock.lock(); defer { lock.unlock() }; return Date() + offset }
}

/// AttestClient against the real service over loopback, with a simulated device.
@Suite struct ClientEndToEndTests {
    let appID = AppID(teamID: "ABCDE12345", bundleID: "com.example.app")

    struct Install {
        let attester: CountingAttester
        let store: InMemoryCredentialStore
        let transport: CountingTransport
        let clock: ClientClock
        let client: AppAttestClient
    }

    func install(_ service: TestService, clientID: String, attester: CountingAttester? = nil, store: InMemoryCredentialStore? = nil,
                 baseURL: URL? = nil) -> Install {
        let attester = attester ?? CountingAttester(SoftwareAttester(appID: appID, keyDirectory: nil))
        let store = store ?? InMemoryCredentialStore()
        let transport = CountingTransport()
        let clock = ClientClock()
        let client = AppAttestClient(clientID: clientID, baseURL: baseURL ?? service.baseURL, attester: attester, store: store,
                                     transport: transport, now: { clock.now })
        return Install(attester: attester, store: store, transport: transport, clock: clock, client: client)
    }

    @Test func installRelaunchExpiryConcurrencyAndRevocation() async throws {
        let service = try TestService { $0.mintLimitPerMinute = 0 }
        let integration = try service.createIntegration()

        // A fresh install registers (attests once).
        let first = install(service, clientID: integration.clientID)
        #expect(try await first.client.authenticateIfNeeded() == .registered)
        #expect(first.attester.attestations == 1)
        let firstToken = try await first.client.currentToken()
        #expect(try await TestHTTP(baseURL: service.baseURL).messages(token: firstToken).status == 503)
        #expect(try first.store.keyID(for: integration.clientID) != nil)

        // A relaunch — a new client object on the same store and attester — uses the stored token,
        // then refreshes by assertion without attesting when it nears expiry.
        let relaunch = install(service, clientID: integration.clientID, attester: first.attester, store: first.store)
        #expect(try await relaunch.client.authenticateIfNeeded() == .cached)
        #expect(relaunch.transport.total == 0)
        relaunch.clock.advance(3600 - 30)   // less than 60 s left: must refresh
        #expect(try await relaunch.client.authenticateIfNeeded() == .refreshed)
        #expect(first.attester.attestations == 1)
        #expect(first.attester.assertions == 1)
        // The relaunched process never saw the registration's next_challenge: one challenge, one token request.
        #expect(relaunch.transport.count("/challenge") == 1)
        #expect(relaunch.transport.count("/oauth/token") == 1)

        // An expired token is refreshed.
        relaunch.clock.advance(3600 + 5)
        let refreshed = try await relaunch.client.currentToken()
        #expect(refreshed != firstToken)
        #expect(try await TestHTTP(baseURL: service.baseURL).messages(token: refreshed).status == 503)

        // 50 concurrent currentToken() calls make exactly one network exchange.
        relaunch.clock.advance(3600 + 5)
        let before = (relaunch.transport.count("/challenge"), relaunch.transport.count("/oauth/token"))
        let tokens = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<50 { group.addTask { try await relaunch.client.currentToken() } }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(tokens.count == 1)
        // One exchange: one token request, signed over the pre-issued challenge (no challenge round trip).
        #expect(relaunch.transport.count("/challenge") - before.0 == 0)
        #expect(relaunch.transport.count("/oauth/token") - before.1 == 1)

        // Revocation makes the next refresh fail with attestationFailed.
        try service.admin.revokeIntegration(actor: service.owner, clientID: integration.clientID)
        relaunch.clock.advance(3600 + 5)
        do {
            _ = try await relaunch.client.currentToken()
            Issue.record("a revoked integration still minted")
        } catch AttestClientError.attestationFailed {
        } catch {
            Issue.record("expected attestationFailed, got \(error)")
        }
    }

    @Test func concurrentFirstCallsShareOneRegistration() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let device = install(service, clientID: integration.clientID)
        let tokens = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<50 { group.addTask { try await device.client.currentToken() } }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(tokens.count == 1)
        #expect(device.attester.attestations == 1)
        #expect(device.transport.count("/register") == 1)
    }

    @Test func rejectedAssertionIsRetriedOnceThenTheKeyIsReplaced() async throws {
        let service = try TestService { $0.mintLimitPerMinute = 0 }
        let integration = try service.createIntegration()
        let device = install(service, clientID: integration.clientID)
        try await device.client.authenticateIfNeeded()
        let keyID = try #require(try device.store.keyID(for: integration.clientID))

        // The server forgets the device's counter position: make every assertion a replay by
        // moving the stored counter far ahead.
        let raw = try #require(Data(base64Encoded: keyID))
        let stored = try #require(try service.store.device(clientID: integration.clientID, keyID: Array(raw)))
        let record = TokenRecord(tokenHash: sha256(Array("x".utf8)), clientID: integration.clientID, workspaceID: integration.workspaceID,
                                 keyID: Array(raw), issuedAt: Date(), expiresAt: Date())
        #expect(try service.store.advanceCounter(clientID: integration.clientID, keyID: Array(raw), from: stored.counter, to: 1_000_000,
                                                 token: record, nextChallenge: IssuedChallenge(bytes: [UInt8](repeating: 0, count: 32), expiresAt: Date() + 300), at: Date()))

        device.clock.advance(3600)
        _ = try await device.client.currentToken()
        // One assertion with the pre-issued challenge, one retry with a fresh one, then a new key.
        #expect(device.attester.assertions == 2)
        #expect(device.attester.attestations == 2)
        #expect(try device.store.keyID(for: integration.clientID) != keyID)
        #expect(device.transport.count("/register") == 2)
    }

    @Test func failedRegistrationBacksOffInsteadOfAttestingAgain() async throws {
        let service = try TestService(trustTestAuthority: false)   // every attestation is refused
        let integration = try service.createIntegration()
        let device = install(service, clientID: integration.clientID)
        await #expect(throws: AttestClientError.self) { try await device.client.authenticateIfNeeded() }
        #expect(device.attester.attestations == 1)
        await #expect(throws: AttestClientError.self) { try await device.client.authenticateIfNeeded() }
        #expect(device.attester.attestations == 1)   // backing off: no second attestation
        #expect(try device.store.keyID(for: integration.clientID) == nil)   // never stored: the server refused it
        device.clock.advance(61)
        await #expect(throws: AttestClientError.self) { try await device.client.authenticateIfNeeded() }
        #expect(device.attester.attestations == 2)
    }

    @Test func refreshFailureWhileTheOldTokenIsValidServesTheOldToken() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let device = install(service, clientID: integration.clientID)
        let token = try await device.client.currentToken()
        service.server.stop()   // the service goes away
        device.clock.advance(3600 - 30)   // refresh due, token still valid for 30 s
        #expect(try await device.client.currentToken() == token)
    }

    @Test func freshNextChallengeSavesARoundTrip() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let device = install(service, clientID: integration.clientID)
        try await device.client.authenticateIfNeeded()
        device.clock.advance(100)   // 200 s of the pre-issued challenge left
        try await device.client.invalidateToken(usedToken: device.client.currentToken())
        _ = try await device.client.currentToken()
        #expect(device.transport.count("/challenge") == 1)   // only the registration's
        #expect(device.transport.count("/oauth/token") == 1)
    }

    @Test func staleNextChallengeIsNotUsed() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let device = install(service, clientID: integration.clientID)
        try await device.client.authenticateIfNeeded()
        // The pre-issued challenge lives token TTL + 300 s = 3900 s; after 3890 s it has less than 15 s left.
        device.clock.advance(3890)
        try await device.client.invalidateToken(usedToken: device.client.currentToken())
        _ = try await device.client.currentToken()
        #expect(device.transport.count("/challenge") == 2)   // one for registration, one fresh for the refresh
    }

    @Test func a404MeansTheEndpointsAreNotDeployed() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let device = install(service, clientID: integration.clientID, baseURL: service.baseURL.appendingPathComponent("elsewhere"))
        do {
            try await device.client.authenticateIfNeeded()
            Issue.record("expected endpointsNotDeployed")
        } catch AttestClientError.endpointsNotDeployed {
        }
        #expect(device.attester.attestations == 0)
    }
}
