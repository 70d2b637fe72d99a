import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: Where each attestd listens

    public func recordInstance(_ instance: AttestdInstance) throws {
        _ = try run { db in
            try db.query("""
                INSERT INTO attestd_instances (\(StoreColumns.list(StoreColumns.attestdInstance))) VALUES ($1, $2, $3, $4, $5, $6, $7)
                ON CONFLICT (host, public_address) DO UPDATE SET admin_address = excluded.admin_address, base_urls = excluded.base_urls,
                    version = excluded.version, started_at = excluded.started_at, pid = excluded.pid
                """, [.text(instance.host), .text(instance.publicAddress), Self.optional(instance.adminAddress), .text(instance.storedBaseURLs),
                      .text(instance.version), Self.seconds(instance.startedAt), .int(instance.processID)])
        }
    }

    public func attestdInstances() throws -> [AttestdInstance] {
        try run { db in
            try db.query("SELECT \(StoreColumns.list(StoreColumns.attestdInstance)) FROM attestd_instances ORDER BY started_at DESC, host, public_address")
                .rows.map(AttestdInstance.init(row:))
        }
    }
}
