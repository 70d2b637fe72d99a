import Synchronization
import AttestWire
import AppAttest
import AttestCrypto
import EventLoops
import Foundation
@testable import HTTPRouting
import HTTPServer
import ServiceRoutes
import SQLiteStore
import TestAuthority
import TokenService
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A clock tests can move.
final class TestClock: @unchecked Sendable {
    private let lock = NSLock()
    private var current: Date
    /// Seconds the clock moves on right after its next reading (a request that takes that long).
    private var jumpAfterNextRead: TimeInterval?
    init(_ start: Date = Date()) { current = start }
    var now: Date {
        lock.lock(); defer { lock.unlock() }
        let reading = current
        if let jump = jumpAfterNextRead {
            jumpAfterNextRead = nil
            current += jump
        }
        return reading
    }
    func advance(_ seconds: TimeInterval) { lock.lock(); current += seconds; lock.unlock() }
    /// The next reading is the current time; every one after it is `seconds` later.
    func jump(_ seconds: TimeInterval, afterNextRead: Void = ()) { lock.lock(); jumpAfterNextRead = seconds; lock.unlock() }
}

/// A real attestd stack — SQLite in a temporary directory, the token service, the routes and
/// libmicrohttpd on a loopback port — with the test authority trusted and a movable clock.
final class TestService: @unchecked Sendable {
    let directory: URL
    let store: SQLiteTokenStore
    let service: DeviceTokenService
    let admin: AdminService
    let server: HTTPServer
    let router: ServiceRouter
    let workers: WorkerPool
    let clock: TestClock
    let audit: DirectAuditLog
    let baseURL: URL
    let owner = "owner@example.com"
    /// Every log line the router wrote.
    let logs = LogLines()

    init(configure: (inout ExchangeConfiguration) -> Void = { _ in }, trustTestAuthority: Bool = true, extraRoutes: [Route] = []) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        store = try SQLiteTokenStore(path: directory.appendingPathComponent("attestd.sqlite").path, synchronous: "NORMAL")
        let clock = TestClock()
        self.clock = clock
        var configuration = ExchangeConfiguration()
        configure(&configuration)
        audit = DirectAuditLog(store: store)
        let verifier = try AppAttestVerifier(additionalAnchors: trustTestAuthority ? [TestAuthority.shared.root] : [])
        service = DeviceTokenService(store: store, verifier: verifier, configuration: configuration, audit: audit, now: { clock.now })
        admin = AdminService(store: store, now: { clock.now })
        _ = try admin.initialize(owner: owner)
        let logs = self.logs
        // As in attestd: the exchange and introspection answer from worker threads.
        let workers = try WorkerPool(threads: 2, name: "test-exchange")
        self.workers = workers
        router = ServiceRouter(service: service, logger: Logger(write: { line in logs.lines.withLock { $0.append(line) } }),
                                   introspectionKey: TestService.introspectionKey, exchangeWorkers: workers, extraRoutes: extraRoutes)
        var http = HTTPServerConfiguration()
        http.port = 0
        http.maxConnectionsPerIP = 256
        let router = self.router
        server = HTTPServer(configuration: http) { router.handle($0, $1) }
        try server.start()
        baseURL = URL(string: "http://127.0.0.1:\(server.port)")!
    }

    static let introspectionKey = "introspection-key-0123456789abcdef0123456789"

    deinit {
        server.stop()
        workers.shutdown()
        try? FileManager.default.removeItem(at: directory)
    }

    func createIntegration(bundleIDs: [String] = ["com.example.app"], environments: Set<AttestationEnvironment> = [.development, .production]) throws -> Integration {
        try admin.createIntegration(actor: owner, name: "Test app", teamID: "ABCDE12345", bundleIDs: bundleIDs, environments: environments)
    }
}

/// A device driven by hand through the protocol with the test authority, so tests control every byte.
final class ManualDevice: @unchecked Sendable {
    let key: DeviceKey
    let appID: AppID
    let clientID: String
    var counter: UInt32 = 0
    var keyIDBase64: String { Data(key.keyID).base64EncodedString() }

    init(clientID: String, appID: AppID = AppID(teamID: "ABCDE12345", bundleID: "com.example.app")) throws {
        key = try DeviceKey.generate()
        self.appID = appID
        self.clientID = clientID
    }

    func attestation(challenge: [UInt8], at time: Date = Date(), options: TestAuthority.AttestationOptions = .init()) throws -> String {
        Data(try TestAuthority.shared.attestation(key: key, appID: appID, clientDataHash: sha256(challenge), at: time, options: options)).base64EncodedString()
    }

    func assertion(challenge: [UInt8], counter explicit: UInt32? = nil) throws -> String {
        if let explicit { counter = explicit } else { counter += 1 }
        let hash = WireProtocol.tokenClientDataHash(challenge: challenge, clientID: clientID, keyID: key.keyID, sha256: sha256)
        return Data(try TestAuthority.shared.assertion(key: key, appID: appID, clientDataHash: hash, counter: counter)).base64EncodedString()
    }
}

struct HTTPResult {
    let status: Int
    let body: Data
    let headers: [AnyHashable: Any]
    var json: [String: Any] { (try? JSONSerialization.jsonObject(with: body) as? [String: Any]) ?? [:] }
    var error: String? { json["error"] as? String }
    func header(_ name: String) -> String? {
        for (key, value) in headers where (key as? String)?.lowercased() == name.lowercased() { return value as? String }
        return nil
    }
}

/// Loopback HTTP for tests: real requests over real sockets.
struct TestHTTP {
    let baseURL: URL
    static let session: URLSession = {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = 128
        configuration.timeoutIntervalForRequest = 30
        return URLSession(configuration: configuration)
    }()

    func send(_ method: String, _ path: String, body: Data? = nil, contentType: String? = nil, headers: [String: String] = [:]) async throws -> HTTPResult {
        var request = URLRequest(url: baseURL.appendingPathComponent(path))
        request.httpMethod = method
        request.httpBody = body
        if let contentType { request.setValue(contentType, forHTTPHeaderField: "content-type") }
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        let (data, response) = try await Self.session.data(for: request)
        let http = response as! HTTPURLResponse
        return HTTPResult(status: http.statusCode, body: data, headers: http.allHeaderFields)
    }

    func postJSON(_ path: String, _ object: [String: Any]) async throws -> HTTPResult {
        try await send("POST", path, body: try JSONSerialization.data(withJSONObject: object), contentType: "application/json")
    }

    func postForm(_ path: String, _ fields: [(String, String)], headers: [String: String] = [:]) async throws -> HTTPResult {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        let body = fields.map { "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: allowed)!)" }.joined(separator: "&")
        return try await send("POST", path, body: Data(body.utf8), contentType: "application/x-www-form-urlencoded", headers: headers)
    }

    // The protocol's three calls.
    func challenge(_ device: ManualDevice) async throws -> HTTPResult {
        try await postJSON("/v1/oauth/app-attest/challenge", ["client_id": device.clientID, "key_id": device.keyIDBase64])
    }

    func challengeBytes(_ device: ManualDevice) async throws -> [UInt8] {
        let result = try await challenge(device)
        guard result.status == 200, let text = result.json["challenge"] as? String, let bytes = Data(base64Encoded: text) else {
            throw HTTPTestError("challenge failed: \(result.status) \(String(decoding: result.body, as: UTF8.self))")
        }
        return Array(bytes)
    }

    func register(_ device: ManualDevice, attestation: String) async throws -> HTTPResult {
        try await postJSON("/v1/oauth/app-attest/register", ["client_id": device.clientID, "key_id": device.keyIDBase64, "attestation_object": attestation])
    }

    func token(_ device: ManualDevice, assertion: String) async throws -> HTTPResult {
        try await postForm("/v1/oauth/token", [("assertion", assertion), ("client_id", device.clientID),
                                               ("grant_type", "urn:anthropic:params:oauth:grant-type:app-attest"), ("key_id", device.keyIDBase64)])
    }

    func messages(token: String) async throws -> HTTPResult {
        try await send("POST", "/v1/messages", body: Data(#"{"model":"claude","max_tokens":1,"messages":[]}"#.utf8),
                       contentType: "application/json", headers: ["authorization": "Bearer \(token)"])
    }

    /// Registers `device` and returns the first token response.
    func registerFresh(_ device: ManualDevice) async throws -> HTTPResult {
        let challenge = try await challengeBytes(device)
        return try await register(device, attestation: try device.attestation(challenge: challenge))
    }
}

struct HTTPTestError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Log lines written by a logger under test.
final class LogLines: Sendable {
    let lines = Mutex<[String]>([])
}
