import AppAttest
import AttestCrypto
import CSQLite
import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: Usage and policy

    public func updatePolicy(clientID: String, _ policy: IntegrationPolicy) throws -> Bool {
        try write { db in
            try db.run("UPDATE integrations SET " + StoreColumns.policy.map { "\($0) = ?" }.joined(separator: ", ") + " WHERE client_id = ?",
                       Self.policyValues(policy) + [.text(clientID)]) == 1
        }
    }

    public func recordUsage(_ batch: UsageBatch, purgeDeviceMinutesBefore: Int64) throws -> Bool {
        try writeInBackground { db in
            try db.transaction {
                if let id = batch.id {
                    let at = Double(purgeDeviceMinutesBefore * 60)
                    guard try db.run("INSERT INTO usage_flushes (batch_id, flushed_at) VALUES (?, ?) ON CONFLICT (batch_id) DO NOTHING",
                                     [.text(id), .real(at)]) == 1 else { return false }
                    // An ID matters only while its batch may still be retried: a day is ample.
                    try db.run("DELETE FROM usage_flushes WHERE flushed_at < ?", [.real(at - 86_400)])
                }
                for (key, c) in batch.usage {
                    let row: [SQLValue] = [.text(key.clientID), .text(key.model), .int(key.hour), .text(key.profile)]
                    try db.run("""
                        INSERT INTO usage_hourly (client_id, model, hour, profile, requests, input_tokens, output_tokens,
                                                  cache_creation_input_tokens, cache_read_input_tokens, incomplete, abandoned,
                                                  cache_creation_1h_input_tokens, cost_micro_usd)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                        ON CONFLICT (client_id, model, hour, profile) DO UPDATE SET requests = requests + excluded.requests,
                          input_tokens = input_tokens + excluded.input_tokens, output_tokens = output_tokens + excluded.output_tokens,
                          cache_creation_input_tokens = cache_creation_input_tokens + excluded.cache_creation_input_tokens,
                          cache_read_input_tokens = cache_read_input_tokens + excluded.cache_read_input_tokens,
                          incomplete = incomplete + excluded.incomplete, abandoned = abandoned + excluded.abandoned,
                          cache_creation_1h_input_tokens = cache_creation_1h_input_tokens + excluded.cache_creation_1h_input_tokens,
                          cost_micro_usd = min(cost_micro_usd + excluded.cost_micro_usd, 9223372036854775807)
                        """, row + [.int(c.requests), .int(c.inputTokens), .int(c.outputTokens), .int(c.cacheCreationInputTokens),
                                    .int(c.cacheReadInputTokens), .int(c.incomplete), .int(c.abandoned), .int(c.cacheCreation1hInputTokens),
                                    .int(c.costMicroUSD)])
                    for (status, count) in c.errors {
                        try db.run("""
                            INSERT INTO usage_errors (client_id, model, hour, profile, status, count) VALUES (?, ?, ?, ?, ?, ?)
                            ON CONFLICT (client_id, model, hour, profile, status) DO UPDATE SET count = count + excluded.count
                            """, row + [.int(Int64(status)), .int(count)])
                    }
                    for (reason, count) in c.refusals {
                        try db.run("""
                            INSERT INTO usage_refusals (client_id, model, hour, profile, reason, count) VALUES (?, ?, ?, ?, ?, ?)
                            ON CONFLICT (client_id, model, hour, profile, reason) DO UPDATE SET count = count + excluded.count
                            """, row + [.text(reason), .int(count)])
                    }
                    for (name, count) in c.serverToolUse {
                        try db.run("""
                            INSERT INTO usage_server_tools (client_id, model, hour, profile, name, count) VALUES (?, ?, ?, ?, ?, ?)
                            ON CONFLICT (client_id, model, hour, profile, name) DO UPDATE SET count = count + excluded.count
                            """, row + [.text(name), .int(count)])
                    }
                }
                for (key, c) in batch.upstreams {
                    try db.run("""
                        INSERT INTO usage_hourly_by_upstream (client_id, hour, upstream, requests, input_tokens, output_tokens,
                                                              cache_creation_input_tokens, cache_read_input_tokens, failovers, cost_micro_usd)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                        ON CONFLICT (client_id, hour, upstream) DO UPDATE SET requests = requests + excluded.requests,
                          input_tokens = input_tokens + excluded.input_tokens, output_tokens = output_tokens + excluded.output_tokens,
                          cache_creation_input_tokens = cache_creation_input_tokens + excluded.cache_creation_input_tokens,
                          cache_read_input_tokens = cache_read_input_tokens + excluded.cache_read_input_tokens, failovers = failovers + excluded.failovers,
                          cost_micro_usd = cost_micro_usd + excluded.cost_micro_usd
                        """, [.text(key.clientID), .int(key.hour), .text(key.upstream), .int(c.requests), .int(c.inputTokens), .int(c.outputTokens),
                              .int(c.cacheCreationInputTokens), .int(c.cacheReadInputTokens), .int(c.failovers), .int(c.costMicroUSD)])
                }
                for (key, tokens) in batch.profileMonthTokens {
                    try db.run("""
                        INSERT INTO usage_profile_monthly (client_id, profile, month, tokens) VALUES (?, ?, ?, ?)
                        ON CONFLICT (client_id, profile, month) DO UPDATE SET tokens = tokens + excluded.tokens
                        """, [.text(key.clientID), .text(key.profile), .int(key.month), .int(tokens)])
                }
                for (key, requests) in batch.profileMinutes {
                    try db.run("""
                        INSERT INTO profile_request_minutes (client_id, profile, minute, requests) VALUES (?, ?, ?, ?)
                        ON CONFLICT (client_id, profile, minute) DO UPDATE SET requests = requests + excluded.requests
                        """, [.text(key.clientID), .text(key.profile), .int(key.minute), .int(requests)])
                }
                try db.run("DELETE FROM profile_request_minutes WHERE minute < ?", [.int(purgeDeviceMinutesBefore)])
                for (key, tokens) in batch.monthTokens {
                    try db.run("""
                        INSERT INTO usage_monthly (client_id, month, tokens) VALUES (?, ?, ?)
                        ON CONFLICT (client_id, month) DO UPDATE SET tokens = tokens + excluded.tokens
                        """, [.text(key.clientID), .int(key.month), .int(tokens)])
                }
                for (key, microUSD) in batch.spend {
                    try db.run("""
                        INSERT INTO usage_spend (scope, period, micro_usd) VALUES (?, ?, ?)
                        ON CONFLICT (scope, period) DO UPDATE SET micro_usd = micro_usd + excluded.micro_usd
                        """, [.text(key.scope), .int(key.period), .int(microUSD)])
                }
                for (key, requests) in batch.deviceMinutes {
                    try db.run("""
                        INSERT INTO device_request_minutes (key_id, client_id, minute, requests) VALUES (?, ?, ?, ?)
                        ON CONFLICT (key_id, client_id, minute) DO UPDATE SET requests = requests + excluded.requests
                        """, [.blob(key.keyID), .text(key.clientID), .int(key.minute), .int(requests)])
                }
                try db.run("DELETE FROM device_request_minutes WHERE minute < ?", [.int(purgeDeviceMinutesBefore)])
                try Self.recordRuleCounts(batch.ruleCounts, db)
                return true
            }
        }
    }

    public func usage(_ filter: UsageFilter) throws -> [UsageRow] {
        var conditions: [String] = []
        var values: [SQLValue] = []
        if let workspaceID = filter.workspaceID { conditions.append("i.workspace_id = ?"); values.append(.int(workspaceID)) }
        if let clientID = filter.clientID { conditions.append("u.client_id = ?"); values.append(.text(clientID)) }
        if let since = filter.since { conditions.append("u.hour >= ?"); values.append(.int(since)) }
        if let until = filter.until { conditions.append("u.hour < ?"); values.append(.int(until)) }
        let filtered = " JOIN integrations i ON i.client_id = u.client_id JOIN workspaces w ON w.id = i.workspace_id"
            + (conditions.isEmpty ? "" : " WHERE " + conditions.joined(separator: " AND "))
        return try read { db in
            var rows: [UsageKey: UsageRow] = [:]
            try db.query("""
                SELECT w.name AS workspace_name, \(StoreColumns.list(Array(StoreColumns.usage.dropFirst()), table: "u")) FROM usage_hourly u
                """ + filtered, values) { row in
                    let usage = try UsageRow(row: row)
                    rows[usage.key] = usage
                }
            try db.query("SELECT u.client_id, u.model, u.hour, u.profile, u.status, u.count FROM usage_errors u " + filtered, values) { row in
                rows[try UsageKey(row: row)]?.counters.errors[Int(try row.int("status"))] = try row.int("count")
            }
            try db.query("SELECT u.client_id, u.model, u.hour, u.profile, u.reason, u.count FROM usage_refusals u " + filtered, values) { row in
                rows[try UsageKey(row: row)]?.counters.refusals[try row.text("reason")] = try row.int("count")
            }
            try db.query("SELECT u.client_id, u.model, u.hour, u.profile, u.name, u.count FROM usage_server_tools u " + filtered, values) { row in
                rows[try UsageKey(row: row)]?.counters.serverToolUse[try row.text("name")] = try row.int("count")
            }
            return Array(rows.values)
        }
    }

    /// Built once: the statement cache is keyed by the SQL text, hashed on every request that reads a profile.
    static let profileUsageSQL = RecordedProfileUsage.query(clientID: "?1", profile: "?2", month: "?3", minute: "?4", previousMinute: "?5")

    /// Every relayed request with a user profile whose limits are on asks this: kept by the reader
    /// as the token check's grants are, while `PRAGMA data_version` says nothing was committed since.
    public func recordedProfileUsage(clientID: String, profile: String, month: Int64, minute: Int64) throws -> RecordedProfileUsage {
        let key = GrantCache.ProfileKey(clientID: clientID, profile: profile, month: month, minute: minute)
        return try readWithCache { db, cache in
            // Read before the query: a commit in between makes the next call query again.
            let version = try db.dataVersion()
            if let usage = cache.profileUsage(key, version: version) { return usage }
            let usage = try db.first(Self.profileUsageSQL,
                                     [.text(clientID), .text(profile), .int(month), .int(minute), .int(minute - 1)], RecordedProfileUsage.init(row:))
                ?? RecordedProfileUsage()
            cache.keep(usage, for: key)
            return usage
        }
    }
}

extension SQLiteTokenStore: UpstreamUsageStore {
    public func upstreamUsage(_ filter: UsageFilter) throws -> [UpstreamUsageRow] {
        var conditions: [String] = []
        var values: [SQLValue] = []
        if let workspaceID = filter.workspaceID { conditions.append("i.workspace_id = ?"); values.append(.int(workspaceID)) }
        if let clientID = filter.clientID { conditions.append("u.client_id = ?"); values.append(.text(clientID)) }
        if let since = filter.since { conditions.append("u.hour >= ?"); values.append(.int(since)) }
        if let until = filter.until { conditions.append("u.hour < ?"); values.append(.int(until)) }
        return try read { db in
            var rows: [UpstreamUsageRow] = []
            try db.query("""
                SELECT w.name AS workspace_name, \(StoreColumns.list(StoreColumns.upstreamUsage, table: "u")) FROM usage_hourly_by_upstream u
                JOIN integrations i ON i.client_id = u.client_id JOIN workspaces w ON w.id = i.workspace_id
                """ + (conditions.isEmpty ? "" : " WHERE " + conditions.joined(separator: " AND ")), values) { rows.append(try UpstreamUsageRow(row: $0)) }
            return rows
        }
    }
}

extension SQLiteTokenStore {
    // MARK: Prices and workspace budgets

    public func priceTables(workspaceID: Int64) throws -> [StoredPriceTable] {
        try read { db in
            var tables: [StoredPriceTable] = []
            try db.query("SELECT effective_at, prices, set_by FROM price_tables WHERE workspace_id = ? ORDER BY effective_at DESC",
                         [.int(workspaceID)]) { row in tables.append(try StoredPriceTable(row: row)) }
            return tables
        }
    }

    public func addPriceTable(workspaceID: Int64, _ table: StoredPriceTable) throws {
        try write { db in
            try db.run("INSERT INTO price_tables (workspace_id, effective_at, prices, set_by) VALUES (?, ?, ?, ?)",
                       [.int(workspaceID), .real(table.effectiveAt.timeIntervalSince1970), .text(table.table.encoded()), .text(table.setBy)])
        }
    }

    public func setWorkspaceBudget(workspaceID: Int64, _ budget: MoneyBudget) throws -> Bool {
        try write { db in
            try db.run("UPDATE workspaces SET monthly_budget_micro_usd = ?, daily_budget_micro_usd = ? WHERE id = ?",
                       [.int(budget.monthlyMicroUSD), .int(budget.dailyMicroUSD), .int(workspaceID)]) == 1
        }
    }

    public func workspaceBudget(workspaceID: Int64) throws -> MoneyBudget {
        try read { db in
            try db.first("SELECT monthly_budget_micro_usd, daily_budget_micro_usd FROM workspaces WHERE id = ?", [.int(workspaceID)],
                         MoneyBudget.init(row:)) ?? MoneyBudget()
        }
    }
}
