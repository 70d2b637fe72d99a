import AttestWire
import AttestCrypto
import Foundation
import StoreRecords
import TokenService

extension Migration {
    /// The PostgreSQL migrations compiled into this binary, in order.
    public static let postgres: [Migration] = EmbeddedMigrations.all.map { Migration(name: $0.name, sql: $0.sql) }
}

public struct PostgresMigrationError: Error, CustomStringConvertible, Sendable {
    public let description: String
}

/// Applies numbered migrations in order, each exactly once, recording a checksum; refuses a
/// database whose applied migrations differ from the files, or that is newer than the binary.
/// Everything happens in one transaction holding a transaction-level advisory lock, so instances
/// starting at once migrate exactly once (the others wait, then find nothing to do), and a failed
/// migration leaves no trace (PostgreSQL's DDL is transactional).
enum PostgresMigrator {
    /// `pg_advisory_xact_lock` key: "attestd1" in ASCII.
    static let lockKey: Int64 = 0x6174_7465_7374_6431

    static func migrate(_ pool: PostgresPool, _ migrations: [Migration], mode: MigrationMode) throws {
        let timeout = pool.configuration.migrationTimeout
        let milliseconds = Int(timeout * 1000)
        try pool.withConnection(timeout: timeout) { db in
            try db.transaction {
                // The session's short limits would cut a wait for another instance's migration.
                try db.execute("SET LOCAL statement_timeout = \(milliseconds); SET LOCAL lock_timeout = \(milliseconds)")
                try db.query("SELECT pg_advisory_xact_lock($1)", [.int(lockKey)])
                let exists = try db.query("SELECT to_regclass('schema_migrations') IS NOT NULL").first { try $0.bool(0) } ?? false
                if !exists {
                    guard mode == .apply else {
                        throw PostgresMigrationError(description: "the database has no schema_migrations table: run `attestctl migrate` first")
                    }
                    try db.execute("""
                        CREATE TABLE schema_migrations (
                            version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL, applied_at double precision NOT NULL)
                        """)
                }
                var applied: [Int: (name: String, checksum: String)] = [:]
                for row in try db.query("SELECT version, name, checksum FROM schema_migrations").rows {
                    applied[Int(try row.int("version"))] = (try row.text("name"), try row.text("checksum"))
                }
                let known = Dictionary(uniqueKeysWithValues: migrations.map { ($0.version, $0) })
                for (version, record) in applied.sorted(by: { $0.key < $1.key }) {
                    guard let migration = known[version] else {
                        throw PostgresMigrationError(description: "database has migration \(record.name) which this binary does not know: it was written by a newer version")
                    }
                    guard migration.checksum == record.checksum else {
                        throw PostgresMigrationError(description: "migration \(migration.name) was applied with checksum \(record.checksum.prefix(12))… but the file now has \(migration.checksum.prefix(12))…: refusing to start on a schema that differs from Migrations/postgres/")
                    }
                }
                let missing = migrations.sorted(by: { $0.version < $1.version }).filter { applied[$0.version] == nil }
                guard mode == .apply || missing.isEmpty else {
                    throw PostgresMigrationError(description: "database lacks migration\(missing.count == 1 ? "" : "s") \(missing.map(\.name).joined(separator: ", ")): run `attestctl migrate` first")
                }
                for migration in missing {
                    do { try db.execute(migration.sql) } catch {
                        throw PostgresMigrationError(description: "migration \(migration.name) failed: \(error)")
                    }
                    try db.query("INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES ($1, $2, $3, $4)",
                                 [.int(Int64(migration.version)), .text(migration.name), .text(migration.checksum),
                                  .double(Date().timeIntervalSince1970)])
                }
            }
        }
    }
}
