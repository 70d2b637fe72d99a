import AppAttest
import AttestCrypto
import AttestWire
import CPostgres
import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: Integrations

    /// The integration and its bundle IDs in one statement (so one transaction).
    public func createIntegration(_ integration: Integration) throws {
        var values: [PostgresValue] = [.text(integration.clientID), .int(integration.workspaceID), .text(integration.name), .text(integration.teamID),
                                       .text(integration.environments.map(\.rawValue).sorted().joined(separator: ",")),
                                       Self.seconds(integration.createdAt)] + Self.policyValues(integration.policy)
            + Self.devicePolicyValues(integration.devicePolicy)
        var sql = """
            WITH i AS (
                INSERT INTO integrations (client_id, workspace_id, name, team_id, environments, created_at,
                                          \(StoreColumns.list(StoreColumns.policy)), \(StoreColumns.list(StoreColumns.devicePolicy)))
                VALUES (\((1...values.count).map { "$\($0)" }.joined(separator: ", "))) RETURNING client_id)
            """
        if integration.bundleIDs.isEmpty {
            sql += " SELECT count(*) FROM i"
        } else {
            let rows = integration.bundleIDs.enumerated().map { position, bundleID -> String in
                values.append(.text(bundleID))
                return "($\(values.count), \(position))"
            }
            sql += """

                INSERT INTO integration_bundle_ids (client_id, position, bundle_id)
                SELECT i.client_id, b.position, b.bundle_id FROM i CROSS JOIN (VALUES \(rows.joined(separator: ", "))) AS b (bundle_id, position)
                """
        }
        try run { db in _ = try db.query(sql, values) }
    }

    /// `StoreColumns.integration`, in PostgreSQL's words.
    static let integrationColumns = """
        SELECT i.client_id AS client_id, i.workspace_id AS workspace_id, w.name AS workspace_name, i.name AS name, i.team_id AS team_id,
               i.environments AS environments, i.created_at AS created_at, i.revoked_at AS revoked_at,
               (SELECT string_agg(b.bundle_id, E'\\n' ORDER BY b.position) FROM integration_bundle_ids b WHERE b.client_id = i.client_id) AS bundle_ids,
               \(StoreColumns.list(StoreColumns.policy, table: "i")), \(StoreColumns.list(StoreColumns.devicePolicy, table: "i"))
        FROM integrations i JOIN workspaces w ON w.id = i.workspace_id
        """

    /// `StoreColumns.policy`, in its order.
    static func policyValues(_ policy: IntegrationPolicy) -> [PostgresValue] {
        policy.columnValues.map { value in
            switch value {
            case .int(let n): .int(n)
            case .text(let text): optional(text)
            }
        }
    }

    /// `StoreColumns.devicePolicy`, in its order.
    static func devicePolicyValues(_ policy: DevicePolicy) -> [PostgresValue] {
        let v = policy.columnValues
        return [.text(v.production), .text(v.development), optional(v.minBundleVersion), .int(v.requireExtensions), .text(v.platforms), .int(v.riskLimit)]
    }

    public func updateDevicePolicy(clientID: String, _ policy: DevicePolicy) throws -> Bool {
        try run { db in
            try db.query("""
                WITH u AS (UPDATE integrations SET distribution_production = $1, distribution_development = $2, min_bundle_version = $3,
                           require_extensions = $4, platforms = $5, risk_limit = $6 WHERE client_id = $7 RETURNING 1)
                SELECT count(*) FROM u
                """, Self.devicePolicyValues(policy) + [.text(clientID)]).first { try $0.int(0) == 1 } ?? false
        }
    }

    // MARK: The device inventory

    public func devices(clientID: String, limit: Int, riskOver: Int?) throws -> [Device] {
        try run { db in
            let sql = riskOver == nil
                ? "SELECT \(StoreColumns.list(StoreColumns.device)) FROM devices WHERE client_id = $1 ORDER BY registered_at DESC, key_id LIMIT $2"
                : "SELECT \(StoreColumns.list(StoreColumns.device)) FROM devices WHERE client_id = $1 AND risk_metric > $3 "
                    + "ORDER BY risk_metric DESC, registered_at DESC, key_id LIMIT $2"
            return try db.query(sql, [.text(clientID), .int(Int64(limit))] + (riskOver.map { [.int(Int64($0))] } ?? [])).rows.map(Device.init(row:))
        }
    }

    public func device(keyID: [UInt8]) throws -> Device? {
        try run { db in
            try db.query("SELECT \(StoreColumns.list(StoreColumns.device)) FROM devices WHERE key_id = $1", [.bytes(keyID)]).first(Device.init(row:))
        }
    }

    public func deviceCounts(clientID: String) throws -> DeviceCounts {
        try run { db in
            var counts = DeviceCounts()
            for row in try db.query(DeviceCounts.query(placeholder: "$1"), [.text(clientID)]).rows { try counts.add(row: row) }
            return counts
        }
    }

    public func integration(clientID: String) throws -> Integration? {
        try run { db in try db.query(Self.integrationColumns + " WHERE i.client_id = $1", [.text(clientID)]).first(Integration.init(row:)) }
    }

    public func integrations(workspaceID: Int64?) throws -> [Integration] {
        try run { db in
            let result = if let workspaceID {
                try db.query(Self.integrationColumns + " WHERE i.workspace_id = $1 ORDER BY i.created_at, i.client_id", [.int(workspaceID)])
            } else {
                try db.query(Self.integrationColumns + " ORDER BY i.created_at, i.client_id")
            }
            return try result.rows.map(Integration.init(row:))
        }
    }

    /// The integration, its live tokens and its challenges in one statement.
    public func revokeIntegration(clientID: String, at time: Date) throws -> Bool {
        try run { db in
            try db.query("""
                WITH i AS (UPDATE integrations SET revoked_at = $2 WHERE client_id = $1 AND revoked_at IS NULL RETURNING client_id),
                     t AS (UPDATE tokens SET revoked_at = $2 WHERE client_id IN (SELECT client_id FROM i) AND revoked_at IS NULL),
                     c AS (UPDATE challenges SET used = true WHERE client_id IN (SELECT client_id FROM i))
                SELECT count(*) FROM i
                """, [.text(clientID), Self.seconds(time)]).first { try $0.int(0) == 1 } ?? false
        }
    }

    public func counts(clientID: String, at time: Date) throws -> (devices: Int, liveTokens: Int) {
        try run { db in
            let row = try db.query("""
                SELECT (SELECT count(*) FROM devices WHERE client_id = $1) AS devices,
                       (SELECT count(*) FROM tokens t JOIN integrations i ON i.client_id = t.client_id
                        WHERE t.client_id = $1 AND t.expires_at > $2 AND t.revoked_at IS NULL AND i.revoked_at IS NULL) AS live_tokens
                """, [.text(clientID), Self.seconds(time)])[0]
            return (Int(try row.int("devices")), Int(try row.int("live_tokens")))
        }
    }
}
