import CSQLite
import Foundation
@testable import SQLiteStore
import Testing
import StoreRecords
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

/// Migration 0011 rebuilt `devices` with the receipt last, and 0012 moved the receipt and the
/// credential certificate to `device_receipts`: `devices` is WITHOUT ROWID, and SQLite compares a
/// key that spills into overflow pages by reading all of it, so a device row with its receipt made
/// every search for a device (two per exchange) read the row's overflow pages. A database migrated
/// from 0010 keeps every value of every row.
struct SQLiteDeviceLayoutTests {
    /// The column names of `table`, in their stored order.
    static func columns(_ path: String, _ table: String) throws -> [String] {
        var db: OpaquePointer?
        guard sqlite3_open(path, &db) == SQLITE_OK else { throw FixtureError("cannot open \(path)") }
        defer { sqlite3_close(db) }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info('\(table)') ORDER BY cid", -1, &statement, nil) == SQLITE_OK else {
            throw FixtureError("prepare: \(String(cString: sqlite3_errmsg(db)))")
        }
        defer { sqlite3_finalize(statement) }
        var names: [String] = []
        while sqlite3_step(statement) == SQLITE_ROW { names.append(String(cString: sqlite3_column_text(statement, 0))) }
        return names
    }

    @Test func aDeviceRowHoldsEveryColumnAnExchangeTouchesAndNoReceipt() throws {
        let f = try StoreFixture(.sqlite)
        let names = try Self.columns(try #require(f.sqlitePath), "devices")
        for column in StoreColumns.device + ["risk_refresh_due_at", "risk_claimed_until", "risk_claim"] {
            #expect(names.contains(column), "devices has no \(column)")
        }
        #expect(!names.contains("receipt") && !names.contains("credential_certificate"), "\(names)")
        #expect(try Self.columns(try #require(f.sqlitePath), "device_receipts") == ["key_id", "receipt", "credential_certificate"])
    }

    /// Devices registered with receipts of a real size: the `devices` b-tree has no overflow page
    /// (SQLite's dbstat table counts them), the receipts are kept whole beside it, and a device is
    /// found and read back as before.
    @Test func devicesWithThreeKilobyteReceiptsStayOffOverflowPages() throws {
        let f = try StoreFixture(.sqlite)
        let path = try #require(f.sqlitePath)
        let app = try f.integration()
        let receipt = (0..<3000).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        let certificate = (0..<700).map { UInt8(truncatingIfNeeded: $0 &* 5) }
        var devices: [Device] = []
        for _ in 0..<200 {
            let device = StoreFixture.device(app)
            let result = try f.store.registerDevice(device, receipt: DeviceReceipt(der: receipt, credentialCertificate: certificate),
                                                    firstToken: StoreFixture.token(app, keyID: device.keyID), redeeming: nil,
                                                    nextChallenge: StoreFixture.challenge(), quota: nil, at: StoreFixture.t0,
                                                    commitTime: { StoreFixture.t0 })
            #expect(result == .committed)
            devices.append(device)
        }
        #expect(try Self.rows(path, "SELECT count(*) FROM dbstat WHERE name = 'devices' AND pagetype = 'overflow'") == [["0"]])
        #expect(try Self.rows(path, "SELECT count(*), sum(length(receipt) = 3000 AND length(credential_certificate) = 700) FROM device_receipts")
                == [["200", "200"]])
        let stored = try #require(try f.store.device(clientID: app.clientID, keyID: devices[17].keyID))
        #expect(stored.publicKey == devices[17].publicKey && stored.counter == 0)
    }

    @Test func aDatabaseMigratedFrom0010KeepsEveryDevice() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("layout-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("s.sqlite").path
        let before = try #require(Migration.sqlite.firstIndex { $0.name.hasPrefix("0011_") })
        _ = try SQLiteTokenStore(path: path, readers: 1, migrations: Array(Migration.sqlite.prefix(before)))
        // Rows as 0010 stored them: one with every column set, one with the optional ones NULL.
        let receipt = (0..<3000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        try Self.exec(path, """
            INSERT INTO workspaces (id, name, created_at) VALUES (7, 'w', 1);
            INSERT INTO integrations (client_id, workspace_id, name, team_id, environments, created_at)
              VALUES ('clid_layout', 7, 'App', 'ABCDE12345', 'production', 1);
            INSERT INTO devices (key_id, client_id, public_key, sign_counter, environment, app_id, receipt, registered_at, platform,
                                 validation_category, bundle_version, os_version, last_refresh_at, credential_certificate,
                                 receipt_created_at, receipt_not_before, receipt_expires_at, risk_metric, risk_checked_at,
                                 risk_refresh_due_at, risk_claimed_until, risk_claim, risk_over_limit_at)
              VALUES (zeroblob(32), 'clid_layout', x'04AB', 41, 'production', 'ABCDE12345.com.example.app', x'\(Self.hex(receipt))', 100.5,
                      'macos', 3, '27.1', '27.0.1', 200.25, x'C0FFEE', 10, 11, 12, 5, 13, 14, 15, 'claim', 16);
            INSERT INTO devices (key_id, client_id, public_key, sign_counter, environment, app_id, receipt, registered_at)
              VALUES (randomblob(32), 'clid_layout', x'04CD', 0, 'development', 'ABCDE12345.com.example.app', x'00', 101);
            """)
        let query = "SELECT " + Self.allColumns + " FROM devices ORDER BY registered_at"
        let old = try Self.rows(path, query)
        _ = try SQLiteTokenStore(path: path, readers: 1)   // applies 0011 and 0012
        // The same values, the receipt and the certificate now read beside the row.
        let joined = "SELECT " + Self.allColumns + " FROM devices JOIN device_receipts USING (key_id) ORDER BY registered_at"
        #expect(try Self.rows(path, joined) == old)
        #expect(old.count == 2 && old[0].contains("41") && old[0].contains("claim"))
        #expect(try Self.rows(path, "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'devices' ORDER BY name")
                == [["devices_client"], ["devices_client_registered"], ["devices_risk_due"]])
    }

    static let allColumns = """
        hex(key_id), client_id, hex(public_key), sign_counter, environment, app_id, hex(receipt), registered_at, platform,
        validation_category, bundle_version, os_version, last_refresh_at, hex(credential_certificate), receipt_created_at,
        receipt_not_before, receipt_expires_at, risk_metric, risk_checked_at, risk_refresh_due_at, risk_claimed_until, risk_claim,
        risk_over_limit_at
        """

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    static func exec(_ path: String, _ sql: String) throws {
        var db: OpaquePointer?
        guard sqlite3_open(path, &db) == SQLITE_OK else { throw FixtureError("cannot open \(path)") }
        defer { sqlite3_close(db) }
        var message: UnsafeMutablePointer<CChar>?
        guard sqlite3_exec(db, sql, nil, nil, &message) == SQLITE_OK else {
            defer { sqlite3_free(message) }
            throw FixtureError("sqlite: \(message.map { String(cString: $0) } ?? "error")")
        }
    }

    /// Every row of `sql` as text (NULL as "NULL").
    static func rows(_ path: String, _ sql: String) throws -> [[String]] {
        var db: OpaquePointer?
        guard sqlite3_open(path, &db) == SQLITE_OK else { throw FixtureError("cannot open \(path)") }
        defer { sqlite3_close(db) }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK else { throw FixtureError("prepare: \(String(cString: sqlite3_errmsg(db)))") }
        defer { sqlite3_finalize(statement) }
        var rows: [[String]] = []
        while sqlite3_step(statement) == SQLITE_ROW {
            rows.append((0..<sqlite3_column_count(statement)).map { index in
                sqlite3_column_type(statement, index) == SQLITE_NULL ? "NULL" : String(cString: sqlite3_column_text(statement, index))
            })
        }
        return rows
    }
}
