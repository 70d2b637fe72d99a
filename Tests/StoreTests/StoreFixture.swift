import AppAttest
import AttestCrypto
import CSQLite
import Dispatch
import Foundation
import PostgresStore
import PostgresTestSupport
import SQLiteStore
import Synchronization
import TokenService

/// The two `Database` implementations every behaviour test runs on.
enum Backend: String, Sendable, CaseIterable, CustomStringConvertible {
    case sqlite, postgres
    var description: String { rawValue }
}

/// A fresh, migrated store: a SQLite file in a new temp directory, or a new database owned by
/// the non-superuser role on the shared test cluster (reached by URL, with a password).
final class StoreFixture: Sendable {
    let backend: Backend
    let store: any Database
    let directory: URL?
    let database: String?

    init(_ backend: Backend, poolSize: Int = 8, configuration: PostgresConfiguration? = nil, sqliteReaders: Int = 2) throws {
        self.backend = backend
        switch backend {
        case .sqlite:
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("store-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            self.directory = directory
            database = nil
            store = try SQLiteTokenStore(path: directory.appendingPathComponent("s.sqlite").path, readers: sqliteReaders)
        case .postgres:
            let cluster = try PostgresCluster.shared.get()
            let database = try cluster.createDatabase()
            self.database = database
            directory = nil
            store = try PostgresTokenStore(connectionString: PostgresConnectionString(cluster.url(database)),
                                           configuration: configuration ?? PostgresConfiguration(poolSize: poolSize))
        }
    }

    deinit { if let directory { try? FileManager.default.removeItem(at: directory) } }

    var sqlitePath: String? { directory?.appendingPathComponent("s.sqlite").path }

    /// Runs SQL on the store's database behind its back, on a connection of its own (schema
    /// changes a test needs: a trigger that refuses some rows, say).
    func execute(_ sql: String) throws {
        switch backend {
        case .sqlite:
            var db: OpaquePointer?
            guard sqlite3_open(sqlitePath!, &db) == SQLITE_OK else { throw FixtureError("cannot open \(sqlitePath!)") }
            defer { sqlite3_close(db) }
            var message: UnsafeMutablePointer<CChar>?
            guard sqlite3_exec(db, sql, nil, nil, &message) == SQLITE_OK else {
                defer { sqlite3_free(message) }
                throw FixtureError("sqlite: \(message.map { String(cString: $0) } ?? "error")")
            }
        case .postgres:
            let cluster = try PostgresCluster.shared.get()
            let connection = try PostgresConnection(PostgresConnectionString(cluster.url(database!)), deadline: .after(seconds: 30))
            defer { connection.close() }
            try connection.execute(sql)
        }
    }

    func auditEvents(limit: Int = 100, clientID: String? = nil) throws -> [AuditEvent] {
        switch store {
        case let sqlite as SQLiteTokenStore: return try sqlite.auditEvents(limit: limit, clientID: clientID)
        case let postgres as PostgresTokenStore: return try postgres.auditEvents(limit: limit, clientID: clientID)
        default: fatalError("unknown store")
        }
    }

    // MARK: Seed data

    /// A fixed time with a sub-microsecond fraction: dates must round-trip exactly.
    static let t0 = Date(timeIntervalSince1970: 1_750_000_000.123_456_789)

    var defaultWorkspace: Workspace { get throws { try requireValue(try store.workspace(named: "default"), "default workspace") } }

    @discardableResult
    func integration(_ name: String = "App", bundleIDs: [String] = ["com.example.app"], workspace: Workspace? = nil,
                     at time: Date = StoreFixture.t0) throws -> Integration {
        let workspace = try workspace ?? defaultWorkspace
        let integration = Integration(clientID: "clid_\(UUID().uuidString.prefix(24))", workspaceID: workspace.id, workspaceName: workspace.name,
                                      name: name, teamID: "ABCDE12345", bundleIDs: bundleIDs, environments: [.development, .production],
                                      createdAt: time, revokedAt: nil)
        try store.createIntegration(integration)
        return integration
    }

    static func bytes(_ count: Int = 32) -> [UInt8] { (0..<count).map { _ in UInt8.random(in: 0...255) } }

    static func device(_ integration: Integration, keyID: [UInt8] = bytes(), counter: UInt32 = 0) -> Device {
        Device(keyID: keyID, clientID: integration.clientID, publicKey: [4] + bytes(64), counter: counter, environment: .development,
               appID: "ABCDE12345.com.example.app")
    }

    /// `device` as the store returns it after registering at `registeredAt` (its last refresh is then too).
    static func device(_ integration: Integration, keyID: [UInt8], registeredAt: Date, like device: Device) -> Device {
        Device(keyID: keyID, clientID: integration.clientID, publicKey: device.publicKey, counter: device.counter, environment: device.environment,
               appID: device.appID, platform: device.platform, validationCategory: device.validationCategory, bundleVersion: device.bundleVersion,
               osVersion: device.osVersion, registeredAt: registeredAt, lastRefreshAt: registeredAt)
    }

    static func token(_ integration: Integration, keyID: [UInt8], at time: Date = t0, ttl: TimeInterval = 3600) -> TokenRecord {
        TokenRecord(tokenHash: bytes(), clientID: integration.clientID, workspaceID: integration.workspaceID, keyID: keyID,
                    issuedAt: time, expiresAt: time + ttl)
    }

    static func challenge(at time: Date = t0, ttl: TimeInterval = 300) -> IssuedChallenge {
        IssuedChallenge(bytes: bytes(), expiresAt: time + ttl)
    }

    /// A registered device (counter 0) with its first token; returns the next challenge stored.
    func registered(_ integration: Integration, keyID: [UInt8] = StoreFixture.bytes()) throws -> (Device, TokenRecord, IssuedChallenge) {
        let device = Self.device(integration, keyID: keyID)
        let token = Self.token(integration, keyID: keyID)
        let next = Self.challenge()
        let result = try store.registerDevice(device, receipt: [1, 2, 3], firstToken: token, redeeming: nil, nextChallenge: next, at: Self.t0)
        guard result == .committed else { throw FixtureError("registration: \(result)") }
        return (device, token, next)
    }
}

struct FixtureError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// `#require` for an optional outside a test function's body.
func requireValue<T>(_ value: T?, _ what: String = "value") throws -> T {
    guard let value else { throw FixtureError("\(what) is nil") }
    return value
}

/// Runs `body` on `count` threads released together; waits at most `timeout` seconds.
func concurrently<T: Sendable>(_ count: Int, timeout: Double = 60, _ body: @escaping @Sendable (Int) throws -> T) throws -> [Result<T, any Error>] {
    let results = Mutex<[Int: Result<T, any Error>]>([:])
    let ready = DispatchGroup(), done = DispatchGroup()
    let start = DispatchSemaphore(value: 0)
    for index in 0..<count {
        ready.enter()
        done.enter()
        let thread = Thread {
            ready.leave()
            start.wait()
            let result = Result { try body(index) }
            results.withLock { $0[index] = result }
            done.leave()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
    guard ready.wait(timeout: .now() + timeout) == .success else { throw FixtureError("threads did not start") }
    for _ in 0..<count { start.signal() }
    guard done.wait(timeout: .now() + timeout) == .success else { throw FixtureError("threads did not finish within \(timeout) s") }
    return results.withLock { r in (0..<count).map { r[$0]! } }
}
