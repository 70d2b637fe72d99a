import Foundation
import Testing
import StoreRecords
import TokenService
@testable import SQLiteStore

/// A SQLite reader decodes each integration once per distinct row: every exchange reads its
/// integration, and the values, not a time or a version, decide whether the kept one still holds.
@Suite(.timeLimit(.minutes(2)))
struct SQLiteDecodedIntegrationsTests {
    typealias F = StoreFixture

    /// Rows the readers have decoded so far, all readers together.
    static func decoded(_ store: SQLiteTokenStore) -> Int {
        store.readers.idleConnections { $0.reduce(0) { $0 + $1.decodedIntegrations.decoded } }
    }

    @Test func theKeptColumnsAreTheIntegrationsOwn() throws {
        let f = try StoreFixture(.sqlite)
        let store = try #require(f.store as? SQLiteTokenStore)
        let app = try f.integration()
        let names = try store.readers.withConnection { db in
            try db.first(SQLiteTokenStore.exchangeContextSQL, [.blob(F.bytes()), .real(F.t0.timeIntervalSince1970), .blob(F.bytes()), .text(app.clientID)]) {
                $0.names(count: SQLiteTokenStore.integrationColumnCount + 1)
            }
        }
        // Exactly the integration's columns, and the next one is not an integration's.
        #expect(names.map { Array($0.prefix(StoreColumns.integration.count)) } == StoreColumns.integration)
        #expect(names?.last == "challenge")
    }

    @Test func oneIntegrationIsDecodedOnceForEveryDevice() throws {
        let f = try StoreFixture(.sqlite, sqliteReaders: 1)
        let store = try #require(f.store as? SQLiteTokenStore)
        let app = try f.integration()
        let other = try f.integration("Other", bundleIDs: ["com.example.other"])
        let devices = try (0..<6).map { _ in try f.registered(app).0 }
        let stored = try store.integration(clientID: app.clientID), storedOther = try store.integration(clientID: other.clientID)
        let before = Self.decoded(store)
        for device in devices {
            let context = try store.exchangeContext(clientID: app.clientID, keyID: device.keyID, at: F.t0)
            #expect(context.integration == stored && context.device?.keyID == device.keyID)
        }
        #expect(Self.decoded(store) == before + 1)
        #expect(try store.exchangeContext(clientID: other.clientID, keyID: devices[0].keyID, at: F.t0).integration == storedOther)
        #expect(Self.decoded(store) == before + 2)
    }

    /// Whatever changes in the row (a policy, a revocation, the workspace's name) is read at once.
    @Test func aChangedRowIsDecodedAfresh() throws {
        let f = try StoreFixture(.sqlite, sqliteReaders: 1)
        let store = try #require(f.store as? SQLiteTokenStore)
        let app = try f.integration()
        let (device, _, _) = try f.registered(app)
        func context() throws -> Integration? { try store.exchangeContext(clientID: app.clientID, keyID: device.keyID, at: F.t0).integration }
        #expect(try context() == (try store.integration(clientID: app.clientID)))

        #expect(try store.updateDevicePolicy(clientID: app.clientID, DevicePolicy(minBundleVersion: BundleVersion("2.1"), requireExtensions: true, riskLimit: 3)))
        let tightened = try #require(try context())
        #expect(tightened.devicePolicy.minBundleVersion == BundleVersion("2.1") && tightened.devicePolicy.requireExtensions
                && tightened.devicePolicy.riskLimit == 3)
        #expect(tightened == (try store.integration(clientID: app.clientID)))

        #expect(try store.updatePolicy(clientID: app.clientID, IntegrationPolicy(models: ["claude-x"], maxTokens: 512)))
        let limited = try #require(try context())
        #expect(limited.policy.models == ["claude-x"] && limited.policy.maxTokens == 512)
        #expect(limited.devicePolicy == tightened.devicePolicy)

        #expect(try store.revokeIntegration(clientID: app.clientID, at: F.t0 + 5))
        #expect(try context()?.isRevoked == true)
        #expect(try context() == (try store.integration(clientID: app.clientID)))
    }
}
