import AppAttest
import AttestCrypto
import AttestWire
import CPostgres
import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: Organisation

    public func workspace(named name: String) throws -> Workspace? {
        try run { db in
            try db.query("SELECT \(StoreColumns.list(StoreColumns.workspace)) FROM workspaces WHERE name = $1", [.text(name)]).first(Workspace.init(row:))
        }
    }

    public func createWorkspace(name: String, at time: Date) throws -> Workspace {
        try run { db in
            try Workspace(row: try db.query("INSERT INTO workspaces (name, created_at) VALUES ($1, $2) RETURNING \(StoreColumns.list(StoreColumns.workspace))",
                                            [.text(name), Self.seconds(time)])[0])
        }
    }

    public func role(of email: String, in workspaceID: Int64) throws -> Role? {
        try run { db in
            try db.query("SELECT role FROM members WHERE workspace_id = $1 AND email = $2", [.int(workspaceID), .text(email)])
                .first { Role(rawValue: try $0.text(0)) } ?? nil
        }
    }

    public func primaryOwner(workspaceID: Int64) throws -> String? {
        try run { db in
            try db.query("SELECT email FROM members WHERE workspace_id = $1 AND role = 'primary_owner'", [.int(workspaceID)]).first { try $0.text(0) }
        }
    }

    public func addMember(email: String, role: Role, workspaceID: Int64, at time: Date) throws {
        try run { db in
            _ = try db.query("INSERT INTO members (workspace_id, email, role, created_at) VALUES ($1, $2, $3, $4)",
                         [.int(workspaceID), .text(email), .text(role.rawValue), Self.seconds(time)])
        }
    }

    // MARK: Workspaces' upstream keys

    public func setUpstreamKey(workspaceID: Int64, _ key: SealedUpstreamKey) throws {
        try run { db in
            _ = try db.query("""
                INSERT INTO workspace_upstream_keys (workspace_id, sealed_key, last4, set_at, set_by, kind, settings) VALUES ($1, $2, $3, $4, $5, $6, $7)
                ON CONFLICT (workspace_id) DO UPDATE SET sealed_key = excluded.sealed_key, last4 = excluded.last4,
                  set_at = excluded.set_at, set_by = excluded.set_by, kind = excluded.kind, settings = excluded.settings
                """, [.int(workspaceID), .bytes(key.sealed), .text(key.last4), Self.seconds(key.setAt), .text(key.setBy),
                      .text(key.kind.rawValue), key.settingsColumn.map(PostgresValue.text) ?? .nullText])
        }
    }

    public func upstreamKey(workspaceID: Int64) throws -> SealedUpstreamKey? {
        try run { db in
            try db.query("SELECT \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstream_keys WHERE workspace_id = $1",
                         [.int(workspaceID)]).first { try SealedUpstreamKey(row: $0) }
        }
    }
}

// MARK: Sealed secrets (a key rotation)

extension PostgresTokenStore {
    public func sealedSecrets() throws -> [SealedSecret] {
        try run { db in
            try db.query("SELECT workspace_id, \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstream_keys ORDER BY workspace_id").rows.map {
                SealedSecret(workspaceID: try $0.int("workspace_id"), upstream: try SealedUpstreamKey(row: $0))
            } + db.query("SELECT workspace_id, label, \(StoreColumns.list(StoreColumns.sealedKey)) FROM workspace_upstreams ORDER BY workspace_id, label").rows.map {
                SealedSecret(workspaceID: try $0.int("workspace_id"), upstream: try SealedUpstreamKey(row: $0, label: try $0.text("label")))
            } + db.query("SELECT team_id, key_id, sealed_key FROM apple_keys ORDER BY team_id").rows.map {
                SealedSecret(owner: .appleKey(teamID: try $0.text("team_id"), keyID: try $0.text("key_id")), sealed: try $0.bytes("sealed_key"))
            } + db.query("SELECT id, workspace_id, url, sealed_secret FROM webhook_endpoints ORDER BY id").rows.map { try SealedSecret(webhookRow: $0) }
        }
    }

    public func replaceSealedSecret(_ owner: SealedSecret.Owner, old: [UInt8], new: [UInt8]) throws -> Bool {
        try run { db in
            switch owner {
            case .upstream(let workspaceID):
                try db.query("UPDATE workspace_upstream_keys SET sealed_key = $1 WHERE workspace_id = $2 AND sealed_key = $3",
                             [.bytes(new), .int(workspaceID), .bytes(old)]).affectedRows == 1
            case .labelledUpstream(let workspaceID, let label):
                try db.query("UPDATE workspace_upstreams SET sealed_key = $1 WHERE workspace_id = $2 AND label = $3 AND sealed_key = $4",
                             [.bytes(new), .int(workspaceID), .text(label), .bytes(old)]).affectedRows == 1
            case .appleKey(let teamID, let keyID):
                try db.query("UPDATE apple_keys SET sealed_key = $1 WHERE team_id = $2 AND key_id = $3 AND sealed_key = $4",
                             [.bytes(new), .text(teamID), .text(keyID), .bytes(old)]).affectedRows == 1
            case .webhook(let id, _, _):
                try db.query("UPDATE webhook_endpoints SET sealed_secret = $1 WHERE id = $2 AND sealed_secret = $3",
                             [.bytes(new), .int(id), .bytes(old)]).affectedRows == 1
            }
        }
    }
}

// MARK: The deployment's allowed cloud hosts

extension PostgresTokenStore {
    public func cloudEndpointPins() throws -> [String] {
        try run { db in
            try db.query("SELECT host FROM cloud_endpoint_pins ORDER BY host").rows.map { try $0.text("host") }
        }
    }

    public func setCloudEndpointPins(_ hosts: [String], at time: Date, by actor: String) throws {
        try run { db in
            try db.transaction {
                _ = try db.query("DELETE FROM cloud_endpoint_pins")
                for host in hosts {
                    _ = try db.query("INSERT INTO cloud_endpoint_pins (host, set_at, set_by) VALUES ($1, $2, $3)",
                                     [.text(host), Self.seconds(time), .text(actor)])
                }
            }
        }
    }
}
