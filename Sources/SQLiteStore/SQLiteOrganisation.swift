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
                                [.int(workspaceID)]) { try SealedUpstreamKey(row: $0) } }
    }
}

// MARK: Sealed secrets (a key rotation)

extension SQLiteTokenStore {
    public func sealedSecrets() throws -> [SealedSecret] {
        try read { db in
            var secrets: [SealedSecret] = []
            try db.query("SELECT workspace_id, \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstream_keys ORDER BY workspace_id") {
                secrets.append(SealedSecret(workspaceID: try $0.int("workspace_id"), upstream: try SealedUpstreamKey(row: $0)))
            }
            try db.query("SELECT workspace_id, label, \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstreams ORDER BY workspace_id, label") {
                secrets.append(SealedSecret(workspaceID: try $0.int("workspace_id"), upstream: try SealedUpstreamKey(row: $0, label: try $0.text("label"))))
            }
            try db.query("SELECT team_id, key_id, sealed_key FROM apple_keys ORDER BY team_id") {
                secrets.append(SealedSecret(owner: .appleKey(teamID: try $0.text("team_id"), keyID: try $0.text("key_id")), sealed: try $0.bytes("sealed_key")))
            }
            try db.query("SELECT id, workspace_id, url, sealed_secret FROM webhook_endpoints ORDER BY id") {
                secrets.append(try SealedSecret(webhookRow: $0))
            }
            return secrets
        }
    }

    public func replaceSealedSecret(_ owner: SealedSecret.Owner, old: [UInt8], new: [UInt8]) throws -> Bool {
        try write { db in
            switch owner {
            case .upstream(let workspaceID):
                try db.run("UPDATE workspace_upstream_keys SET sealed_key = ? WHERE workspace_id = ? AND sealed_key = ?",
                           [.blob(new), .int(workspaceID), .blob(old)]) == 1
            case .labelledUpstream(let workspaceID, let label):
                try db.run("UPDATE workspace_upstreams SET sealed_key = ? WHERE workspace_id = ? AND label = ? AND sealed_key = ?",
                           [.blob(new), .int(workspaceID), .text(label), .blob(old)]) == 1
            case .appleKey(let teamID, let keyID):
                try db.run("UPDATE apple_keys SET sealed_key = ? WHERE team_id = ? AND key_id = ? AND sealed_key = ?",
                           [.blob(new), .text(teamID), .text(keyID), .blob(old)]) == 1
            case .webhook(let id, _, _):
                try db.run("UPDATE webhook_endpoints SET sealed_secret = ? WHERE id = ? AND sealed_secret = ?", [.blob(new), .int(id), .blob(old)]) == 1
            }
        }
    }
}

// MARK: The deployment's allowed cloud hosts

extension SQLiteTokenStore {
    public func cloudEndpointPins() throws -> [String] {
        try read { db in
            var hosts: [String] = []
            try db.query("SELECT host FROM cloud_endpoint_pins ORDER BY host") { hosts.append(try $0.text("host")) }
            return hosts
        }
    }

    public func setCloudEndpointPins(_ hosts: [String], at time: Date, by actor: String) throws {
        try write { db in
            try db.transaction {
                _ = try db.run("DELETE FROM cloud_endpoint_pins")
                for host in hosts {
                    _ = try db.run("INSERT INTO cloud_endpoint_pins (host, set_at, set_by) VALUES (?, ?, ?)",
                                   [.text(host), .real(time.timeIntervalSince1970), .text(actor)])
                }
            }
        }
    }
}
