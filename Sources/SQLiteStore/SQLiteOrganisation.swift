import AppAttest
import AttestCrypto
import CSQLite
import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: Organisation

    public func workspace(named name: String) throws -> Workspace? {
        try read { try $0.first("SELECT \(StoreColumns.list(StoreColumns.workspace)) FROM workspaces WHERE name = ?", [.text(name)], Workspace.init(row:)) }
    }

    public func createWorkspace(name: String, at time: Date) throws -> Workspace {
        try write { db in
            try db.run("INSERT INTO workspaces (name, created_at) VALUES (?, ?)", [.text(name), .real(time.timeIntervalSince1970)])
            return try db.first("SELECT \(StoreColumns.list(StoreColumns.workspace)) FROM workspaces WHERE name = ?", [.text(name)], Workspace.init(row:))!
        }
    }

    public func role(of email: String, in workspaceID: Int64) throws -> Role? {
        try read { try $0.first("SELECT role FROM members WHERE workspace_id = ? AND email = ?", [.int(workspaceID), .text(email)]) { Role(rawValue: $0.text(0)) } ?? nil }
    }

    public func primaryOwner(workspaceID: Int64) throws -> String? {
        try read { try $0.first("SELECT email FROM members WHERE workspace_id = ? AND role = 'primary_owner'", [.int(workspaceID)]) { $0.text(0) } }
    }

    public func addMember(email: String, role: Role, workspaceID: Int64, at time: Date) throws {
        _ = try write { try $0.run("INSERT INTO members (workspace_id, email, role, created_at) VALUES (?, ?, ?, ?)",
                               [.int(workspaceID), .text(email), .text(role.rawValue), .real(time.timeIntervalSince1970)]) }
    }

    public func setUpstreamKey(workspaceID: Int64, _ key: SealedUpstreamKey) throws {
        _ = try write { try $0.run("""
            INSERT INTO workspace_upstream_keys (workspace_id, sealed_key, last4, set_at, set_by, kind, settings) VALUES (?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (workspace_id) DO UPDATE SET sealed_key = excluded.sealed_key, last4 = excluded.last4,
              set_at = excluded.set_at, set_by = excluded.set_by, kind = excluded.kind, settings = excluded.settings
            """, [.int(workspaceID), .blob(key.sealed), .text(key.last4), .real(key.setAt.timeIntervalSince1970), .text(key.setBy),
                  .text(key.kind.rawValue), key.settingsColumn.map(SQLValue.text) ?? .null]) }
    }

    public func upstreamKey(workspaceID: Int64) throws -> SealedUpstreamKey? {
        try read { try $0.first("SELECT \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstream_keys WHERE workspace_id = ?",
                                [.int(workspaceID)], SealedUpstreamKey.init(row:)) }
    }
}
