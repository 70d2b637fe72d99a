import AppAttest
import AttestCrypto
import CSQLite
import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: Integrations

    public func createIntegration(_ integration: Integration) throws {
        try write { db in
            try db.transaction {
                try db.run("""
                    INSERT INTO integrations (client_id, workspace_id, name, team_id, environments, created_at,
                                              \(StoreColumns.list(StoreColumns.policy)), \(StoreColumns.list(StoreColumns.devicePolicy)))
                    VALUES (?, ?, ?, ?, ?, ?, \(Array(repeating: "?", count: StoreColumns.policy.count + StoreColumns.devicePolicy.count).joined(separator: ", ")))
                    """, [.text(integration.clientID), .int(integration.workspaceID), .text(integration.name), .text(integration.teamID),
                          .text(integration.environments.map(\.rawValue).sorted().joined(separator: ",")),
                          .real(integration.createdAt.timeIntervalSince1970)] + Self.policyValues(integration.policy)
                        + Self.devicePolicyValues(integration.devicePolicy))
                for (position, bundleID) in integration.bundleIDs.enumerated() {
                    try db.run("INSERT INTO integration_bundle_ids (client_id, position, bundle_id) VALUES (?, ?, ?)",
                               [.text(integration.clientID), .int(Int64(position)), .text(bundleID)])
                }
            }
        }
    }

    /// `StoreColumns.integration`, in SQLite's words.
    static let integrationColumns = """
        SELECT i.client_id AS client_id, i.workspace_id AS workspace_id, w.name AS workspace_name, i.name AS name, i.team_id AS team_id,
               i.environments AS environments, i.created_at AS created_at, i.revoked_at AS revoked_at,
               (SELECT group_concat(bundle_id, char(10)) FROM (SELECT bundle_id FROM integration_bundle_ids b
                 WHERE b.client_id = i.client_id ORDER BY position)) AS bundle_ids,
               \(StoreColumns.list(StoreColumns.policy, table: "i")), \(StoreColumns.list(StoreColumns.devicePolicy, table: "i"))
        FROM integrations i JOIN workspaces w ON w.id = i.workspace_id
        """

    /// `StoreColumns.devicePolicy`, in its order.
    static func devicePolicyValues(_ policy: DevicePolicy) -> [SQLValue] {
        let v = policy.columnValues
        return [.text(v.production), .text(v.development), v.minBundleVersion.map { .text($0) } ?? .null, .int(v.requireExtensions), .text(v.platforms),
                .int(v.riskLimit)]
    }

    public func updateDevicePolicy(clientID: String, _ policy: DevicePolicy) throws -> Bool {
        try write { db in
            try db.run("""
                UPDATE integrations SET distribution_production = ?, distribution_development = ?, min_bundle_version = ?,
                       require_extensions = ?, platforms = ?, risk_limit = ? WHERE client_id = ?
                """, Self.devicePolicyValues(policy) + [.text(clientID)]) == 1
        }
    }

    // MARK: The device inventory

    public func devices(clientID: String, limit: Int, riskOver: Int?) throws -> [Device] {
        try read { db in
            var result: [Device] = []
            let sql = riskOver == nil
                ? "SELECT \(StoreColumns.list(StoreColumns.device)) FROM devices WHERE client_id = ?1 ORDER BY registered_at DESC, key_id LIMIT ?2"
                : "SELECT \(StoreColumns.list(StoreColumns.device)) FROM devices WHERE client_id = ?1 AND risk_metric > ?3 "
                    + "ORDER BY risk_metric DESC, registered_at DESC, key_id LIMIT ?2"
            try db.query(sql, [.text(clientID), .int(Int64(limit))] + (riskOver.map { [.int(Int64($0))] } ?? [])) { result.append(try Device(row: $0)) }
            return result
        }
    }

    public func device(keyID: [UInt8]) throws -> Device? {
        try read { try $0.first("SELECT \(StoreColumns.list(StoreColumns.device)) FROM devices WHERE key_id = ?", [.blob(keyID)], Device.init(row:)) }
    }

    public func deviceCounts(clientID: String) throws -> DeviceCounts {
        try read { db in
            var counts = DeviceCounts()
            try db.query(DeviceCounts.query(placeholder: "?1"), [.text(clientID)]) { try counts.add(row: $0) }
            return counts
        }
    }

    /// `StoreColumns.policy`, in its order.
    static func policyValues(_ policy: IntegrationPolicy) -> [SQLValue] {
        policy.columnValues.map { value in
            switch value {
            case .int(let n): .int(n)
            case .text(let text): text.map { .text($0) } ?? .null
            }
        }
    }

    public func integration(clientID: String) throws -> Integration? {
        try read { try $0.first(Self.integrationColumns + " WHERE i.client_id = ?", [.text(clientID)], Integration.init(row:)) }
    }

    public func integrations(workspaceID: Int64?) throws -> [Integration] {
        try read { db in
            var result: [Integration] = []
            if let workspaceID {
                try db.query(Self.integrationColumns + " WHERE i.workspace_id = ? ORDER BY i.created_at", [.int(workspaceID)]) { result.append(try Integration(row: $0)) }
            } else {
                try db.query(Self.integrationColumns + " ORDER BY i.created_at") { result.append(try Integration(row: $0)) }
            }
            return result
        }
    }

    public func revokeIntegration(clientID: String, at time: Date) throws -> Bool {
        try write { db in
            try db.transaction {
                let t = time.timeIntervalSince1970
                guard try db.run("UPDATE integrations SET revoked_at = ? WHERE client_id = ? AND revoked_at IS NULL", [.real(t), .text(clientID)]) == 1 else {
                    return false
                }
                try db.run("UPDATE tokens SET revoked_at = ? WHERE client_id = ? AND revoked_at IS NULL", [.real(t), .text(clientID)])
                try db.run("UPDATE challenges SET used = 1 WHERE client_id = ?", [.text(clientID)])
                return true
            }
        }
    }

    public func counts(clientID: String, at time: Date) throws -> (devices: Int, liveTokens: Int) {
        try read { db in
            let devices = try db.first("SELECT count(*) AS count FROM devices WHERE client_id = ?", [.text(clientID)]) { Int(try $0.int("count")) } ?? 0
            let tokens = try db.first("""
                SELECT count(*) AS count FROM tokens t JOIN integrations i ON i.client_id = t.client_id
                WHERE t.client_id = ? AND t.expires_at > ? AND t.revoked_at IS NULL AND i.revoked_at IS NULL
                """, [.text(clientID), .real(time.timeIntervalSince1970)]) { Int(try $0.int("count")) } ?? 0
            return (devices, tokens)
        }
    }
}
