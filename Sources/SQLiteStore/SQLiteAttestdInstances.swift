import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: Where each attestd listens

    /// On the background connection, like the key-file reports: never on the request path's writer.
    public func recordInstance(_ instance: AttestdInstance) throws {
        _ = try writeInBackground { db in
            try db.run("""
                INSERT INTO attestd_instances (\(StoreColumns.list(StoreColumns.attestdInstance))) VALUES (?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (host, public_address) DO UPDATE SET admin_address = excluded.admin_address, base_urls = excluded.base_urls,
                    version = excluded.version, started_at = excluded.started_at, pid = excluded.pid
                """, [.text(instance.host), .text(instance.publicAddress), Self.optional(instance.adminAddress), .text(instance.storedBaseURLs),
                      .text(instance.version), .real(instance.startedAt.timeIntervalSince1970), .int(instance.processID)])
        }
    }

    public func attestdInstances() throws -> [AttestdInstance] {
        try read { db in
            var instances: [AttestdInstance] = []
            try db.query("SELECT \(StoreColumns.list(StoreColumns.attestdInstance)) FROM attestd_instances ORDER BY started_at DESC, host, public_address") { row in
                instances.append(try AttestdInstance(row: row))
            }
            return instances
        }
    }
}
