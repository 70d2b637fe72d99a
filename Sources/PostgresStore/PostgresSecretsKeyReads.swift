import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: What each instance read from its secrets key files

    public func recordSecretsKeyRead(_ read: SecretsKeyRead) throws {
        _ = try run { db in
            try db.query("""
                INSERT INTO secrets_key_reads (\(StoreColumns.list(StoreColumns.secretsKeyRead))) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                ON CONFLICT (host, key_file) DO UPDATE SET current_key = excluded.current_key, previous_key = excluded.previous_key,
                    read_at = excluded.read_at, reported_at = excluded.reported_at, pid = excluded.pid, problem = excluded.problem
                """, [.text(read.host), .text(read.keyFile), Self.optional(read.currentKey), Self.optional(read.previousKey),
                      Self.optional(read.readAt), Self.seconds(read.reportedAt), .int(read.processID),
                      Self.optional(read.problem.map { String($0.prefix(1000)) })])
        }
    }

    public func secretsKeyReads() throws -> [SecretsKeyRead] {
        try run { db in
            try db.query("SELECT \(StoreColumns.list(StoreColumns.secretsKeyRead)) FROM secrets_key_reads ORDER BY host, key_file")
                .rows.map(SecretsKeyRead.init(row:))
        }
    }

    public func purgeSecretsKeyReads(before time: Date) throws -> Int {
        try run { db in
            try db.query("DELETE FROM secrets_key_reads WHERE reported_at < $1", [Self.seconds(time)]).affectedRows
        }
    }
}
