import AppAttest
import AttestCrypto
import AttestWire
import CPostgres
import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: Usage and policy

    public func updatePolicy(clientID: String, _ policy: IntegrationPolicy) throws -> Bool {
        try run { db in
            let columns = StoreColumns.policy
            let assignments = columns.enumerated().map { "\($0.element) = $\($0.offset + 1)" }.joined(separator: ", ")
            return try db.query("""
                WITH u AS (UPDATE integrations SET \(assignments) WHERE client_id = $\(columns.count + 1) RETURNING 1)
                SELECT count(*) FROM u
                """, Self.policyValues(policy) + [.text(clientID)]).first { try $0.int(0) == 1 } ?? false
        }
    }

    /// One transaction; each table's increments go in one statement (arrays unnested), so a
    /// flush costs a handful of round trips however many rows it carries.
    ///
    /// Rows go in key order: two instances upserting the same rows in their own dictionary
    /// orders (each process hashes with its own seed) could lock them crosswise and deadlock.
    public func recordUsage(_ batch: UsageBatch, purgeDeviceMinutesBefore: Int64) throws -> Bool {
        let usage = batch.usage.sorted {
            ($0.key.clientID, $0.key.model, $0.key.hour, $0.key.profile) < ($1.key.clientID, $1.key.model, $1.key.hour, $1.key.profile)
        }
        let errors = usage.flatMap { key, c in c.errors.sorted { $0.key < $1.key }.map { (key, $0.key, $0.value) } }
        let refusals = usage.flatMap { key, c in c.refusals.sorted { $0.key < $1.key }.map { (key, $0.key, $0.value) } }
        let serverTools = usage.flatMap { key, c in c.serverToolUse.sorted { $0.key < $1.key }.map { (key, $0.key, $0.value) } }
        let profileMonths = batch.profileMonthTokens.sorted {
            ($0.key.clientID, $0.key.profile, $0.key.month) < ($1.key.clientID, $1.key.profile, $1.key.month)
        }
        let profileMinutes = batch.profileMinutes.sorted {
            ($0.key.clientID, $0.key.profile, $0.key.minute) < ($1.key.clientID, $1.key.profile, $1.key.minute)
        }
        let upstreams = batch.upstreams.sorted { ($0.key.clientID, $0.key.hour, $0.key.upstream) < ($1.key.clientID, $1.key.hour, $1.key.upstream) }
        return try run { db in
            try db.transaction {
                if let id = batch.id {
                    let at = Double(purgeDeviceMinutesBefore * 60)
                    // Written first: a retried batch whose earlier commit went through stops here.
                    guard try db.query("""
                        WITH added AS (INSERT INTO usage_flushes (batch_id, flushed_at) VALUES ($1, $2) ON CONFLICT (batch_id) DO NOTHING
                                       RETURNING 1),
                             forgotten AS (DELETE FROM usage_flushes WHERE flushed_at < $3)
                        SELECT count(*) FROM added
                        """, [.text(id), .double(at), .double(at - 86_400)]).first({ try $0.int(0) == 1 }) == true else { return false }
                }
                if !usage.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_hourly AS u (client_id, model, hour, requests, input_tokens, output_tokens,
                                                       cache_creation_input_tokens, cache_read_input_tokens, incomplete, abandoned, profile,
                                                       cache_creation_1h_input_tokens, cost_micro_usd)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
                                             $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::text[], $12::bigint[], $13::bigint[])
                        ON CONFLICT (client_id, model, hour, profile) DO UPDATE SET requests = u.requests + excluded.requests,
                          input_tokens = u.input_tokens + excluded.input_tokens, output_tokens = u.output_tokens + excluded.output_tokens,
                          cache_creation_input_tokens = u.cache_creation_input_tokens + excluded.cache_creation_input_tokens,
                          cache_read_input_tokens = u.cache_read_input_tokens + excluded.cache_read_input_tokens,
                          incomplete = u.incomplete + excluded.incomplete, abandoned = u.abandoned + excluded.abandoned,
                          cache_creation_1h_input_tokens = u.cache_creation_1h_input_tokens + excluded.cache_creation_1h_input_tokens,
                          cost_micro_usd = u.cost_micro_usd + excluded.cost_micro_usd
                        """, [Self.textArray(usage.map(\.key.clientID)), Self.textArray(usage.map(\.key.model)),
                              Self.intArray(usage.map(\.key.hour)), Self.intArray(usage.map(\.value.requests)),
                              Self.intArray(usage.map(\.value.inputTokens)), Self.intArray(usage.map(\.value.outputTokens)),
                              Self.intArray(usage.map(\.value.cacheCreationInputTokens)), Self.intArray(usage.map(\.value.cacheReadInputTokens)),
                              Self.intArray(usage.map(\.value.incomplete)), Self.intArray(usage.map(\.value.abandoned)),
                              Self.textArray(usage.map(\.key.profile)), Self.intArray(usage.map(\.value.cacheCreation1hInputTokens)),
                              Self.intArray(usage.map(\.value.costMicroUSD))])
                }
                if !errors.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_errors AS e (client_id, model, hour, status, count, profile)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[])
                        ON CONFLICT (client_id, model, hour, profile, status) DO UPDATE SET count = e.count + excluded.count
                        """, [Self.textArray(errors.map(\.0.clientID)), Self.textArray(errors.map(\.0.model)), Self.intArray(errors.map(\.0.hour)),
                              Self.intArray(errors.map { Int64($0.1) }), Self.intArray(errors.map(\.2)), Self.textArray(errors.map(\.0.profile))])
                }
                if !refusals.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_refusals AS r (client_id, model, hour, reason, count, profile)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[])
                        ON CONFLICT (client_id, model, hour, profile, reason) DO UPDATE SET count = r.count + excluded.count
                        """, [Self.textArray(refusals.map(\.0.clientID)), Self.textArray(refusals.map(\.0.model)),
                              Self.intArray(refusals.map(\.0.hour)), Self.textArray(refusals.map(\.1)), Self.intArray(refusals.map(\.2)),
                              Self.textArray(refusals.map(\.0.profile))])
                }
                if !serverTools.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_server_tools AS s (client_id, model, hour, name, count, profile)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[])
                        ON CONFLICT (client_id, model, hour, profile, name) DO UPDATE SET count = s.count + excluded.count
                        """, [Self.textArray(serverTools.map(\.0.clientID)), Self.textArray(serverTools.map(\.0.model)),
                              Self.intArray(serverTools.map(\.0.hour)), Self.textArray(serverTools.map(\.1)), Self.intArray(serverTools.map(\.2)),
                              Self.textArray(serverTools.map(\.0.profile))])
                }
                if !upstreams.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_hourly_by_upstream AS u (client_id, hour, upstream, requests, input_tokens, output_tokens,
                                                                   cache_creation_input_tokens, cache_read_input_tokens, failovers, cost_micro_usd)
                        SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[],
                                             $8::bigint[], $9::bigint[], $10::bigint[])
                        ON CONFLICT (client_id, hour, upstream) DO UPDATE SET requests = u.requests + excluded.requests,
                          input_tokens = u.input_tokens + excluded.input_tokens, output_tokens = u.output_tokens + excluded.output_tokens,
                          cache_creation_input_tokens = u.cache_creation_input_tokens + excluded.cache_creation_input_tokens,
                          cache_read_input_tokens = u.cache_read_input_tokens + excluded.cache_read_input_tokens, failovers = u.failovers + excluded.failovers,
                          cost_micro_usd = u.cost_micro_usd + excluded.cost_micro_usd
                        """, [Self.textArray(upstreams.map(\.key.clientID)), Self.intArray(upstreams.map(\.key.hour)), Self.textArray(upstreams.map(\.key.upstream)),
                              Self.intArray(upstreams.map(\.value.requests)), Self.intArray(upstreams.map(\.value.inputTokens)),
                              Self.intArray(upstreams.map(\.value.outputTokens)), Self.intArray(upstreams.map(\.value.cacheCreationInputTokens)),
                              Self.intArray(upstreams.map(\.value.cacheReadInputTokens)), Self.intArray(upstreams.map(\.value.failovers)),
                              Self.intArray(upstreams.map(\.value.costMicroUSD))])
                }
                if !profileMonths.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_profile_monthly AS m (client_id, profile, month, tokens)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])
                        ON CONFLICT (client_id, profile, month) DO UPDATE SET tokens = m.tokens + excluded.tokens
                        """, [Self.textArray(profileMonths.map(\.key.clientID)), Self.textArray(profileMonths.map(\.key.profile)),
                              Self.intArray(profileMonths.map(\.key.month)), Self.intArray(profileMonths.map(\.value))])
                }
                if !profileMinutes.isEmpty {
                    _ = try db.query("""
                        INSERT INTO profile_request_minutes AS p (client_id, profile, minute, requests)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])
                        ON CONFLICT (client_id, profile, minute) DO UPDATE SET requests = p.requests + excluded.requests
                        """, [Self.textArray(profileMinutes.map(\.key.clientID)), Self.textArray(profileMinutes.map(\.key.profile)),
                              Self.intArray(profileMinutes.map(\.key.minute)), Self.intArray(profileMinutes.map(\.value))])
                }
                _ = try db.query("DELETE FROM profile_request_minutes WHERE minute < $1", [.int(purgeDeviceMinutesBefore)])
                let months = batch.monthTokens.sorted { ($0.key.clientID, $0.key.month) < ($1.key.clientID, $1.key.month) }
                if !months.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_monthly AS m (client_id, month, tokens)
                        SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
                        ON CONFLICT (client_id, month) DO UPDATE SET tokens = m.tokens + excluded.tokens
                        """, [Self.textArray(months.map(\.key.clientID)), Self.intArray(months.map(\.key.month)), Self.intArray(months.map(\.value))])
                }
                let spend = batch.spend.sorted { ($0.key.scope, $0.key.period) < ($1.key.scope, $1.key.period) }
                if !spend.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_spend AS s (scope, period, micro_usd)
                        SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
                        ON CONFLICT (scope, period) DO UPDATE SET micro_usd = s.micro_usd + excluded.micro_usd
                        """, [Self.textArray(spend.map(\.key.scope)), Self.intArray(spend.map(\.key.period)), Self.intArray(spend.map(\.value))])
                }
                let minutes = batch.deviceMinutes.map { (hex: hexString($0.key.keyID), key: $0.key, value: $0.value) }
                    .sorted { ($0.hex, $0.key.clientID, $0.key.minute) < ($1.hex, $1.key.clientID, $1.key.minute) }
                if !minutes.isEmpty {
                    _ = try db.query("""
                        INSERT INTO device_request_minutes AS d (key_id, client_id, minute, requests)
                        SELECT decode(k, 'hex'), c, m, n FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS x (k, c, m, n)
                        ON CONFLICT (key_id, client_id, minute) DO UPDATE SET requests = d.requests + excluded.requests
                        """, [Self.textArray(minutes.map(\.hex)), Self.textArray(minutes.map(\.key.clientID)),
                              Self.intArray(minutes.map(\.key.minute)), Self.intArray(minutes.map(\.value))])
                }
                _ = try db.query("DELETE FROM device_request_minutes WHERE minute < $1", [.int(purgeDeviceMinutesBefore)])
                try Self.recordRuleCounts(batch.ruleCounts, db)
                return true
            }
        }
    }

    /// A text[] parameter in PostgreSQL's array literal syntax (every element quoted and escaped).
    static func textArray(_ items: [String]) -> PostgresValue {
        .text("{" + items.map { "\"" + $0.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\"" }
            .joined(separator: ",") + "}")
    }

    static func intArray(_ items: [Int64]) -> PostgresValue {
        .text("{" + items.map(String.init).joined(separator: ",") + "}")
    }

    public func usage(_ filter: UsageFilter) throws -> [UsageRow] {
        var conditions: [String] = []
        var values: [PostgresValue] = []
        if let workspaceID = filter.workspaceID { values.append(.int(workspaceID)); conditions.append("i.workspace_id = $\(values.count)") }
        if let clientID = filter.clientID { values.append(.text(clientID)); conditions.append("u.client_id = $\(values.count)") }
        if let since = filter.since { values.append(.int(since)); conditions.append("u.hour >= $\(values.count)") }
        if let until = filter.until { values.append(.int(until)); conditions.append("u.hour < $\(values.count)") }
        let filtered = " JOIN integrations i ON i.client_id = u.client_id JOIN workspaces w ON w.id = i.workspace_id"
            + (conditions.isEmpty ? "" : " WHERE " + conditions.joined(separator: " AND "))
        return try run { db in
            var rows: [UsageKey: UsageRow] = [:]
            for row in try db.query("""
                SELECT w.name AS workspace_name, \(StoreColumns.list(Array(StoreColumns.usage.dropFirst()), table: "u")) FROM usage_hourly u
                """ + filtered, values).rows {
                let usage = try UsageRow(row: row)
                rows[usage.key] = usage
            }
            for row in try db.query("SELECT u.client_id, u.model, u.hour, u.profile, u.status, u.count FROM usage_errors u" + filtered, values).rows {
                rows[try UsageKey(row: row)]?.counters.errors[Int(try row.int("status"))] = try row.int("count")
            }
            for row in try db.query("SELECT u.client_id, u.model, u.hour, u.profile, u.reason, u.count FROM usage_refusals u" + filtered, values).rows {
                rows[try UsageKey(row: row)]?.counters.refusals[try row.text("reason")] = try row.int("count")
            }
            for row in try db.query("SELECT u.client_id, u.model, u.hour, u.profile, u.name, u.count FROM usage_server_tools u" + filtered, values).rows {
                rows[try UsageKey(row: row)]?.counters.serverToolUse[try row.text("name")] = try row.int("count")
            }
            return Array(rows.values)
        }
    }

    /// Built once, not per request that reads a profile.
    static let profileUsageSQL = RecordedProfileUsage.query(clientID: "$1", profile: "$2", month: "$3", minute: "$4", previousMinute: "$5")

    public func recordedProfileUsage(clientID: String, profile: String, month: Int64, minute: Int64) throws -> RecordedProfileUsage {
        try run { db in
            try db.query(Self.profileUsageSQL,
                         [.text(clientID), .text(profile), .int(month), .int(minute), .int(minute - 1)]).first(RecordedProfileUsage.init(row:))
                ?? RecordedProfileUsage()
        }
    }

    /// Every read is a round trip to the server: routes that read run on a worker.
    public var readsCrossTheNetwork: Bool { true }

    public func readinessProblem() -> String? {
        do { _ = try run { db in try db.query("SELECT 1", []) } } catch { return "the database does not answer: \(error)" }
        return nil
    }
}

extension PostgresTokenStore: UpstreamUsageStore {
    public func upstreamUsage(_ filter: UsageFilter) throws -> [UpstreamUsageRow] {
        var conditions: [String] = []
        var values: [PostgresValue] = []
        if let workspaceID = filter.workspaceID { values.append(.int(workspaceID)); conditions.append("i.workspace_id = $\(values.count)") }
        if let clientID = filter.clientID { values.append(.text(clientID)); conditions.append("u.client_id = $\(values.count)") }
        if let since = filter.since { values.append(.int(since)); conditions.append("u.hour >= $\(values.count)") }
        if let until = filter.until { values.append(.int(until)); conditions.append("u.hour < $\(values.count)") }
        return try run { db in
            try db.query("""
                SELECT w.name AS workspace_name, \(StoreColumns.list(StoreColumns.upstreamUsage, table: "u")) FROM usage_hourly_by_upstream u
                JOIN integrations i ON i.client_id = u.client_id JOIN workspaces w ON w.id = i.workspace_id
                """ + (conditions.isEmpty ? "" : " WHERE " + conditions.joined(separator: " AND ")), values).rows.map { try UpstreamUsageRow(row: $0) }
        }
    }
}

extension PostgresTokenStore {
    // MARK: Prices and workspace budgets

    public func priceTables(workspaceID: Int64) throws -> [StoredPriceTable] {
        try run { db in
            try db.query("SELECT effective_at, prices, set_by FROM price_tables WHERE workspace_id = $1 ORDER BY effective_at DESC",
                         [.int(workspaceID)]).rows.map(StoredPriceTable.init(row:))
        }
    }

    public func addPriceTable(workspaceID: Int64, _ table: StoredPriceTable) throws {
        _ = try run { db in
            try db.query("INSERT INTO price_tables (workspace_id, effective_at, prices, set_by) VALUES ($1, $2, $3, $4)",
                         [.int(workspaceID), .double(table.effectiveAt.timeIntervalSince1970), .text(table.table.encoded()), .text(table.setBy)])
        }
    }

    public func setWorkspaceBudget(workspaceID: Int64, _ budget: MoneyBudget) throws -> Bool {
        try run { db in
            try db.query("""
                WITH u AS (UPDATE workspaces SET monthly_budget_micro_usd = $1, daily_budget_micro_usd = $2 WHERE id = $3 RETURNING 1)
                SELECT count(*) FROM u
                """, [.int(budget.monthlyMicroUSD), .int(budget.dailyMicroUSD), .int(workspaceID)]).first { try $0.int(0) == 1 } ?? false
        }
    }

    public func workspaceBudget(workspaceID: Int64) throws -> MoneyBudget {
        try run { db in
            try db.query("SELECT monthly_budget_micro_usd, daily_budget_micro_usd FROM workspaces WHERE id = $1", [.int(workspaceID)])
                .first(MoneyBudget.init(row:)) ?? MoneyBudget()
        }
    }
}
