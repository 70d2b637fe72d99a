import CSQLite
import Foundation
@testable import SQLiteStore
import Testing
import TokenService

private typealias F = StoreFixture

/// The statements every exchange runs must not read more as a device mints more: their plans,
/// read from SQLite itself on a migrated database with a device that minted thousands of tokens.
struct SQLiteQueryPlanTests {
    /// `EXPLAIN QUERY PLAN` of `sql`, its detail lines.
    static func plan(_ path: String, _ sql: String) throws -> [String] {
        var db: OpaquePointer?
        guard sqlite3_open(path, &db) == SQLITE_OK else { throw FixtureError("cannot open \(path)") }
        defer { sqlite3_close(db) }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(db, "EXPLAIN QUERY PLAN " + sql, -1, &statement, nil) == SQLITE_OK else {
            throw FixtureError("prepare: \(String(cString: sqlite3_errmsg(db)))")
        }
        defer { sqlite3_finalize(statement) }
        var lines: [String] = []
        while sqlite3_step(statement) == SQLITE_ROW { lines.append(String(cString: sqlite3_column_text(statement, 3))) }
        return lines
    }

    @Test func revokingOlderTokensReadsOnlyTheLiveOnes() throws {
        let f = try StoreFixture(.sqlite)
        let app = try f.integration()
        let (device, _, _) = try f.registered(app)
        // Thousands of mints for one device: all but the newest two are revoked rows.
        for round in 1...3000 {
            let time = StoreFixture.t0 + Double(round)
            #expect(try f.store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: UInt32(round - 1), to: UInt32(round),
                                               token: F.token(app, keyID: device.keyID, at: time), nextChallenge: F.challenge(at: time), at: time))
        }
        try f.execute("ANALYZE")
        let lines = try Self.plan(try #require(f.sqlitePath), SQLiteTokenStore.revokeOlderTokensSQL)
        #expect(lines.count >= 2 && lines.filter { $0.contains("tokens") }.allSatisfy { $0.contains("tokens_live_by_device") }, "\(lines)")
        // And the behaviour: the device keeps its two newest tokens.
        #expect(try f.store.counts(clientID: app.clientID, at: StoreFixture.t0 + 3000).liveTokens == 2)
    }
}
