import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: What each instance read from its secrets key files

    /// On the background connection: a report never holds the request path's writer.
    public func recordSecretsKeyRead(_ read: SecretsKeyRead) throws {
        try writeInBackground { db in
            try db.run("""
                INSERT INTO secrets_key_reads (\(StoreColumns.list(StoreColumns.secretsKeyRead))) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (host, key_file) DO UPDATE SET current_key = excluded.current_key, previous_key = excluded.previous_key,
                    read_at = excluded.read_at, reported_at = excluded.reported_at, pid = excluded.pid, problem = excluded.problem
                """, [.text(read.host), .text(read.keyFile), Self.optional(read.currentKey), Self.optional(read.previousKey),
                      Self.optional(read.readAt), .real(read.reportedAt.timeIntervalSince1970), .int(read.processID),
                      Self.optional(read.problem.map { String($0.prefix(1000)) })])
        }
    }

    public func secretsKeyReads() throws -> [SecretsKeyRead] {
        try read { db in
            var reads: [SecretsKeyRead] = []
            try db.query("SELECT \(StoreColumns.list(StoreColumns.secretsKeyRead)) FROM secrets_key_reads ORDER BY host, key_file") { row in
                reads.append(try SecretsKeyRead(row: row))
            }
            return reads
        }
    }

    public func purgeSecretsKeyReads(before time: Date) throws -> Int {
        try writeInBackground { db in
            try db.run("DELETE FROM secrets_key_reads WHERE reported_at < ?", [.real(time.timeIntervalSince1970)])
        }
    }
}
