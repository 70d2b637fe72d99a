import AttestWire
import AttestCrypto
import Foundation
import StoreRecords
import TokenService

extension Migration {
    /// The SQLite migrations compiled into this binary, in order.
    public static let sqlite: [Migration] = EmbeddedMigrations.all.map { Migration(name: $0.name, sql: $0.sql) }
}

public struct MigrationError: Error, CustomStringConvertible, Sendable {
    public let description: String
}

/// Applies numbered migrations in order, each exactly once, recording a checksum; refuses a
/// database whose applied migrations differ from the files, or that is newer than the binary.
enum Migrator {
    static func migrate(_ connection: SQLiteConnection, _ migrations: [Migration], mode: MigrationMode = .apply) throws {
        try connection.execute("""
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at REAL NOT NULL)
            """)
        try connection.transaction {
            var applied: [Int: (name: String, checksum: String)] = [:]
            try connection.query("SELECT version, name, checksum FROM schema_migrations") { row in
                applied[Int(try row.int("version"))] = (try row.text("name"), try row.text("checksum"))
            }
            let known = Dictionary(uniqueKeysWithValues: migrations.map { ($0.version, $0) })
            for (version, record) in applied.sorted(by: { $0.key < $1.key }) {
                guard let migration = known[version] else {
                    throw MigrationError(description: "database has migration \(record.name) which this binary does not know: it was written by a newer version")
                }
                guard migration.checksum == record.checksum else {
                    throw MigrationError(description: "migration \(migration.name) was applied with checksum \(record.checksum.prefix(12))… but the file now has \(migration.checksum.prefix(12))…: refusing to start on a schema that differs from Migrations/sqlite/")
                }
            }
            for migration in migrations.sorted(by: { $0.version < $1.version }) where applied[migration.version] == nil {
                guard mode == .apply else {
                    throw MigrationError(description: "migration \(migration.name) is not applied and --no-migrate was given: run attestctl migrate first")
                }
                do { try connection.execute(migration.sql) } catch {
                    throw MigrationError(description: "migration \(migration.name) failed: \(error)")
                }
                try connection.run("INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)",
                                   [.int(Int64(migration.version)), .text(migration.name), .text(migration.checksum),
                                    .real(Date().timeIntervalSince1970)])
            }
        }
    }
}
