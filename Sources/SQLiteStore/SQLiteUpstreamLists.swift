import Foundation
import StoreRecords
import TokenService

// MARK: A workspace's list of upstreams

extension SQLiteTokenStore {
    public func workspaceUpstreams(workspaceID: Int64) throws -> [WorkspaceUpstream] {
        try read { db in
            var upstreams: [WorkspaceUpstream] = []
            try db.query("SELECT priority, \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstream_keys WHERE workspace_id = ?",
                         [.int(workspaceID)]) {
                upstreams.append(WorkspaceUpstream(label: WorkspaceUpstream.defaultLabel, priority: Int(try $0.int("priority")),
                                                   key: try SealedUpstreamKey(row: $0)))
            }
            try db.query("SELECT label, priority, \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstreams WHERE workspace_id = ?",
                         [.int(workspaceID)]) {
                let label = try $0.text("label")
                upstreams.append(WorkspaceUpstream(label: label, priority: Int(try $0.int("priority")), key: try SealedUpstreamKey(row: $0, label: label)))
            }
            return WorkspaceUpstream.ordered(upstreams)
        }
    }

    public func setWorkspaceUpstream(workspaceID: Int64, label: String, priority: Int, _ key: SealedUpstreamKey) throws {
        try write { db in
            try db.transaction {
                _ = try db.run("""
                    INSERT INTO workspace_upstreams (workspace_id, label, priority, sealed_key, last4, set_at, set_by, kind, settings)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT (workspace_id, label) DO UPDATE SET priority = excluded.priority, sealed_key = excluded.sealed_key,
                      last4 = excluded.last4, set_at = excluded.set_at, set_by = excluded.set_by, kind = excluded.kind, settings = excluded.settings
                    """, [.int(workspaceID), .text(label), .int(Int64(priority)), .blob(key.sealed), .text(key.last4),
                          .real(key.setAt.timeIntervalSince1970), .text(key.setBy), .text(key.kind.rawValue), key.settingsColumn.map(SQLValue.text) ?? .null])
                try bumpUpstreamsVersion(db, workspaceID)
            }
        }
    }

    public func removeWorkspaceUpstream(workspaceID: Int64, label: String) throws -> Bool {
        try write { db in
            try db.transaction {
                let removed = label == WorkspaceUpstream.defaultLabel
                    ? try db.run("DELETE FROM workspace_upstream_keys WHERE workspace_id = ?", [.int(workspaceID)])
                    : try db.run("DELETE FROM workspace_upstreams WHERE workspace_id = ? AND label = ?", [.int(workspaceID), .text(label)])
                if removed > 0 { try bumpUpstreamsVersion(db, workspaceID) }
                return removed > 0
            }
        }
    }

    public func setWorkspaceUpstreamPriorities(workspaceID: Int64, _ priorities: [(label: String, priority: Int)]) throws -> Bool {
        do {
            return try reprioritise(workspaceID, priorities)
        } catch is SQLiteUpstreamListChanged {
            return false   // a label that went meanwhile rolled the transaction back
        }
    }

    private func reprioritise(_ workspaceID: Int64, _ priorities: [(label: String, priority: Int)]) throws -> Bool {
        try write { db in
            try db.transaction {
                for (label, priority) in priorities {
                    let changed = label == WorkspaceUpstream.defaultLabel
                        ? try db.run("UPDATE workspace_upstream_keys SET priority = ? WHERE workspace_id = ?", [.int(Int64(priority)), .int(workspaceID)])
                        : try db.run("UPDATE workspace_upstreams SET priority = ? WHERE workspace_id = ? AND label = ?",
                                     [.int(Int64(priority)), .int(workspaceID), .text(label)])
                    guard changed == 1 else { throw SQLiteUpstreamListChanged() }
                }
                try bumpUpstreamsVersion(db, workspaceID)
                return true
            }
        }
    }

    /// Every change to a workspace's list changes its version, which the token check reads.
    private func bumpUpstreamsVersion(_ db: SQLiteConnection, _ workspaceID: Int64) throws {
        _ = try db.run("UPDATE workspaces SET upstreams_version = upstreams_version + 1 WHERE id = ?", [.int(workspaceID)])
    }
}

/// A label named in an ordering is not in the list (any more): the transaction rolls back.
struct SQLiteUpstreamListChanged: Error, CustomStringConvertible {
    var description: String { "an upstream of the list changed meanwhile" }
}
