import Foundation
@testable import PostgresStore
import Testing
import TokenService

private typealias F = StoreFixture

/// The plans PostgreSQL picks for the statements every exchange runs, read from the server on a
/// fresh database, as a new deployment's connections plan them: generic plans (what a prepared
/// statement settles on), tables never analysed.
struct PostgresQueryPlanTests {
    /// The generic plan of `sql`, each of its parameters NULL (the plan does not depend on them).
    static func genericPlan(_ store: PostgresTokenStore, _ sql: String) throws -> String {
        let parameters = sql.matches(of: /\$([0-9]+)/).map { Int($0.output.1)! }.max() ?? 0
        return try store.pool.withConnection { db in
            try db.execute("SET plan_cache_mode = force_generic_plan")
            // Apart: a failed PREPARE makes DEALLOCATE fail, and the pooled session must not keep the mode.
            defer {
                try? db.execute("RESET plan_cache_mode")
                try? db.execute("DEALLOCATE plan_probe")
            }
            try db.execute("PREPARE plan_probe AS " + sql)
            let arguments = parameters == 0 ? "" : "(" + Array(repeating: "NULL", count: parameters).joined(separator: ", ") + ")"
            return try db.query("EXPLAIN EXECUTE plan_probe" + arguments).rows.map { try $0.text(0) }.joined(separator: "\n")
        }
    }

    /// A fresh database with 64 devices of one client, as a new deployment has (no ANALYZE yet).
    static func sixtyFourDevices() throws -> PostgresTokenStore {
        let f = try StoreFixture(.postgres)
        let store = try requireValue(f.store as? PostgresTokenStore, "the PostgreSQL store")
        let app = try f.integration()
        for _ in 0..<64 { _ = try f.registered(app) }
        return store
    }

    /// With 64 devices of one client, an exchange's read and its counter update find the device by
    /// its primary key. Planned with the client's ID in the device condition, both scanned the
    /// index on the client's devices and read every one of them (245 rows per exchange at 256).
    @Test func exchangeStatementsFindTheDeviceByItsKey() throws {
        let store = try Self.sixtyFourDevices()
        for (name, sql) in [("exchange context", PostgresTokenStore.exchangeContextSQL), ("advance", PostgresTokenStore.advanceSQL)] {
            let plan = try Self.genericPlan(store, sql)
            #expect(plan.contains("devices_pkey on devices"), "\(name): \(plan)")
            #expect(!plan.contains("devices_client"), "\(name) reads the client's devices: \(plan)")
        }
    }

    /// Every relayed request's token check reads one token, and one row of each per-device and
    /// per-month usage table, by their primary keys.
    @Test func theTokenCheckReadsByPrimaryKeys() throws {
        let store = try Self.sixtyFourDevices()
        let plan = try Self.genericPlan(store, PostgresTokenStore.liveTokenSQL)
        for index in ["tokens_pkey", "device_request_minutes_pkey", "usage_monthly_pkey"] {
            #expect(plan.contains(index), "\(index): \(plan)")
        }
        #expect(!plan.contains("device_request_minutes_minute"), "reads a minute of every device: \(plan)")
        #expect(!plan.contains("Seq Scan on tokens"), "\(plan)")
    }

    /// The mint limit (on by default) counts one device's tokens of the last minute, not the
    /// client's.
    @Test func theMintLimitCountsOneDevicesTokens() throws {
        let store = try Self.sixtyFourDevices()
        let plan = try Self.genericPlan(store, PostgresTokenStore.mintsSinceSQL)
        #expect(plan.contains("tokens_by_device"), "\(plan)")
        #expect(!plan.contains("tokens_client_expiry") && !plan.contains("Seq Scan"), "\(plan)")
    }

    /// An exchange for a key registered under another client finds no device: the read drops a
    /// device row of another client (the statement no longer filters it).
    @Test func aKeyOfAnotherClientIsNotThisClientsDevice() throws {
        let f = try StoreFixture(.postgres)
        let app = try f.integration(), other = try f.integration("Other")
        let (device, _, _) = try f.registered(app)
        let mine = try f.store.exchangeContext(clientID: app.clientID, keyID: device.keyID, at: F.t0)
        #expect(mine.device?.keyID == device.keyID)
        let theirs = try f.store.exchangeContext(clientID: other.clientID, keyID: device.keyID, at: F.t0)
        #expect(theirs.integration?.clientID == other.clientID)
        #expect(theirs.device == nil)
        // Nor can the other client advance its counter.
        #expect(try !f.store.advanceCounter(clientID: other.clientID, keyID: device.keyID, from: 0, to: 1,
                                            token: F.token(other, keyID: device.keyID), nextChallenge: F.challenge(), at: F.t0))
        #expect(try f.store.device(clientID: app.clientID, keyID: device.keyID)?.counter == 0)
    }
}
