import Foundation
import StoreRecords
import TokenService

// MARK: A workspace's list of upstreams

extension PostgresTokenStore {
    public func workspaceUpstreams(workspaceID: Int64) throws -> [WorkspaceUpstream] {
        try run { db in
            let own = try db.query("SELECT priority, \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstream_keys WHERE workspace_id = $1",
                                   [.int(workspaceID)]).rows.map {
                WorkspaceUpstream(label: WorkspaceUpstream.defaultLabel, priority: Int(try $0.int("priority")), key: try SealedUpstreamKey(row: $0))
            }
            let labelled = try db.query("SELECT label, priority, \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstreams WHERE workspace_id = $1",
                                        [.int(workspaceID)]).rows.map {
                let label = try $0.text("label")
                return WorkspaceUpstream(label: label, priority: Int(try $0.int("priority")), key: try SealedUpstreamKey(row: $0, label: label))
            }
            return WorkspaceUpstream.ordered(own + labelled)
        }
    }

    public func setWorkspaceUpstream(workspaceID: Int64, label: String, priority: Int, _ key: SealedUpstreamKey) throws {
        try run { db in
            try db.transaction {
                _ = try db.query("""
                    INSERT INTO workspace_upstreams (workspace_id, label, priority, sealed_key, last4, set_at, set_by, kind, settings)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                    ON CONFLICT (workspace_id, label) DO UPDATE SET priority = excluded.priority, sealed_key = excluded.sealed_key,
                      last4 = excluded.last4, set_at = excluded.set_at, set_by = excluded.set_by, kind = excluded.kind, settings = excluded.settings
                    """, [.int(workspaceID), .text(label), .int(Int64(priority)), .bytes(key.sealed), .text(key.last4), Self.seconds(key.setAt),
                          .text(key.setBy), .text(key.kind.rawValue), key.settingsColumn.map(PostgresValue.text) ?? .nullText])
                try Self.bumpUpstreamsVersion(db, workspaceID)
            }
        }
    }

    public func removeWorkspaceUpstream(workspaceID: Int64, label: String) throws -> Bool {
        try run { db in
            try db.transaction {
                let removed = label == WorkspaceUpstream.defaultLabel
                    ? try db.query("DELETE FROM workspace_upstream_keys WHERE workspace_id = $1", [.int(workspaceID)]).affectedRows
                    : try db.query("DELETE FROM workspace_upstreams WHERE workspace_id = $1 AND label = $2", [.int(workspaceID), .text(label)]).affectedRows
                if removed > 0 { try Self.bumpUpstreamsVersion(db, workspaceID) }
                return removed > 0
            }
        }
    }

    public func setWorkspaceUpstreamPriorities(workspaceID: Int64, _ priorities: [(label: String, priority: Int)]) throws -> Bool {
        do {
            return try run { db in
                try db.transaction {
                    for (label, priority) in priorities {
                        let changed = label == WorkspaceUpstream.defaultLabel
                            ? try db.query("UPDATE workspace_upstream_keys SET priority = $1 WHERE workspace_id = $2",
                                           [.int(Int64(priority)), .int(workspaceID)]).affectedRows
                            : try db.query("UPDATE workspace_upstreams SET priority = $1 WHERE workspace_id = $2 AND label = $3",
                                           [.int(Int64(priority)), .int(workspaceID), .text(label)]).affectedRows
                        guard changed == 1 else { throw PostgresUpstreamListChanged() }
                    }
                    try Self.bumpUpstreamsVersion(db, workspaceID)
                    return true
                }
            }
        } catch is PostgresUpstreamListChanged {
            return false   // a label that went meanwhile rolled the transaction back
        }
    }

    /// Every change to a workspace's list changes its version, which the token check reads.
    static func bumpUpstreamsVersion(_ db: PostgresConnection, _ workspaceID: Int64) throws {
        _ = try db.query("UPDATE workspaces SET upstreams_version = upstreams_version + 1 WHERE id = $1", [.int(workspaceID)])
    }
}

/// A label named in an ordering is not in the list (any more): the transaction rolls back.
struct PostgresUpstreamListChanged: Error, CustomStringConvertible {
    var description: String { "an upstream of the list changed meanwhile" }
}
