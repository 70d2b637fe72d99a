import AttestCrypto
import AppAttest
import Foundation
import TokenService

// The stores' shared vocabulary: rows read by column name, the columns of each record, the
// SQL both dialects build from them, and each record decoded once. The domain (TokenService)
// knows none of it.

/// A row of a store's result, read by column name: both databases decode every record with
/// the same code, from the same list of columns (`StoreColumns`), so a new column is one more
/// name in one list and one more line here, whatever the dialect.
public protocol StoreRow {
    func isNull(_ column: String) throws -> Bool
    func int(_ column: String) throws -> Int64
    /// A REAL (SQLite) or double precision (PostgreSQL) column.
    func double(_ column: String) throws -> Double
    func text(_ column: String) throws -> String
    func bytes(_ column: String) throws -> [UInt8]
}

extension StoreRow {
    /// Seconds since 1970, as every time is stored.
    public func date(_ column: String) throws -> Date { Date(timeIntervalSince1970: try double(column)) }

    /// `read(column)` unless the column is NULL.
    public func optional<T>(_ column: String, _ read: (String) throws -> T) throws -> T? {
        try isNull(column) ? nil : try read(column)
    }
}

/// What a column-by-name lookup found wrong: a query that does not select what its decoder reads.
public struct MissingColumn: Error, CustomStringConvertible {
    public let column: String
    public init(_ column: String) { self.column = column }
    public var description: String { "the query selects no column \(column)" }
}

/// A stored value its decoder cannot accept (a row written by hand or by a newer version): the
/// read fails with this, naming the column, rather than guessing.
public struct InvalidStoredValue: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// The columns each record is read from, by name, per capability. Both stores select exactly
/// these names (with `AS` where an expression or a join provides one).
public enum StoreColumns {
    // Organisation
    public static let workspace = ["id", "name"]
    public static let sealedKey = ["sealed_key", "last4", "set_at", "set_by", "kind", "settings"]
    // Integrations
    public static let policy = ["allowed_models", "max_tokens", "device_requests_per_minute", "monthly_token_budget", "allowed_server_tools",
                                "max_server_tool_uses", "allowed_betas", "profile_requests_per_minute", "profile_monthly_token_budget",
                                "monitored_rules", "monthly_budget_micro_usd", "daily_budget_micro_usd", "profile_monthly_budget_micro_usd",
                                "profile_daily_budget_micro_usd"]
    /// `workspace_name` from the workspace, `bundle_ids` newline-separated in their order.
    public static let devicePolicy = ["distribution_production", "distribution_development", "min_bundle_version", "require_extensions", "platforms",
                                       "risk_limit"]
    public static let integration = ["client_id", "workspace_id", "workspace_name", "name", "team_id", "environments", "created_at",
                                     "revoked_at", "bundle_ids"] + policy + devicePolicy
    // Exchange
    public static let device = ["key_id", "client_id", "public_key", "sign_counter", "environment", "app_id",
                                "platform", "validation_category", "bundle_version", "os_version", "registered_at", "last_refresh_at"]
        + risk
    /// The latest validated receipt's times and the metric (all NULL when receipts were unchecked).
    public static let risk = ["receipt_created_at", "receipt_not_before", "receipt_expires_at", "risk_metric", "risk_checked_at", "risk_over_limit_at"]
    /// The inventory's counts: one row per (dimension, value).
    public static let deviceCount = ["dimension", "value", "count"]
    /// The token check: the token, its workspace's key, the integration's policy and the usage
    /// recorded so far (`month_tokens`, `requests_this_minute`, `requests_last_minute`).
    public static let grant = ["client_id", "workspace_name", "issued_at", "expires_at", "token_hash", "workspace_id", "key_id"]
        + sealedKey + policy + ["month_tokens", "requests_this_minute", "requests_last_minute", "upstreams_version"] + grantMoney
    /// The ledger by upstream (`usage_hourly_by_upstream`).
    public static let upstreamUsage = ["client_id", "hour", "upstream", "requests", "input_tokens", "output_tokens", "cache_creation_input_tokens",
                                       "cache_read_input_tokens", "failovers", "cost_micro_usd"]
    /// The token check's money: the workspace's budgets, each budget's spend this month and day,
    /// and when the workspace's newest price override took effect (NULL: none).
    public static let grantMoney = ["workspace_monthly_budget_micro_usd", "workspace_daily_budget_micro_usd", "month_spend", "day_spend",
                                    "workspace_month_spend", "workspace_day_spend", "prices_at"]
    /// A rolling window: how many events, and the oldest one's time.
    public static let window = ["count", "oldest"]
    public static let challenge = ["challenge", "expires_at"]
    // Usage
    public static let usage = ["workspace_name", "client_id", "model", "hour", "profile", "requests", "input_tokens", "output_tokens",
                               "cache_creation_input_tokens", "cache_read_input_tokens", "incomplete", "abandoned", "cache_creation_1h_input_tokens",
                               "cost_micro_usd"]
    // Audit
    public static let audit = ["id", "at", "actor", "action", "client_id", "key_id", "reason", "detail", "count", "minute"]

    /// `a, b, c` (each name qualified by `table.` when given).
    /// An integration's SELECT (`… FROM integrations i …`) widened by the exchange's context: the
    /// challenge (`c`) and the device (`d`), whose joins the dialect appends.
    public static func exchangeContext(_ integrationSelect: String) -> String {
        let split = integrationSelect.components(separatedBy: "FROM integrations i")
        precondition(split.count == 2, "an integration SELECT reads FROM integrations i once")
        return split[0] + ", c.challenge AS challenge, "
            + device.map { "d.\($0) AS \($0 == "client_id" ? "device_client_id" : $0)" }.joined(separator: ", ")
            + "\nFROM integrations i" + split[1]
    }

    /// The token check (every relayed request), with each dialect's placeholders: the token, its
    /// workspace's key, the integration's policy and the usage recorded so far, each by its key.
    /// The day a daily budget counts is the minute's (`UsageClock.day`): no parameter of its own.
    public static func grantQuery(month: String, minute: String, previousMinute: String, hash: String, now: String) -> String {
        """
        SELECT t.client_id AS client_id, w.name AS workspace_name, t.issued_at AS issued_at, t.expires_at AS expires_at,
               t.token_hash AS token_hash, w.id AS workspace_id, t.key_id AS key_id,
               \(list(sealedKey, table: "k")), \(list(policy, table: "i")),
               coalesce(m.tokens, 0) AS month_tokens, coalesce(d0.requests, 0) AS requests_this_minute,
               coalesce(d1.requests, 0) AS requests_last_minute, w.upstreams_version AS upstreams_version,
               w.monthly_budget_micro_usd AS workspace_monthly_budget_micro_usd, w.daily_budget_micro_usd AS workspace_daily_budget_micro_usd,
               coalesce(sim.micro_usd, 0) AS month_spend, coalesce(sid.micro_usd, 0) AS day_spend,
               coalesce(swm.micro_usd, 0) AS workspace_month_spend, coalesce(swd.micro_usd, 0) AS workspace_day_spend,
               (SELECT max(p.effective_at) FROM price_tables p WHERE p.workspace_id = t.workspace_id) AS prices_at FROM tokens t
        JOIN integrations i ON i.client_id = t.client_id JOIN workspaces w ON w.id = t.workspace_id
        LEFT JOIN workspace_upstream_keys k ON k.workspace_id = t.workspace_id
        LEFT JOIN usage_monthly m ON m.client_id = t.client_id AND m.month = \(month)
        LEFT JOIN device_request_minutes d0 ON d0.key_id = t.key_id AND d0.client_id = t.client_id AND d0.minute = \(minute)
        LEFT JOIN device_request_minutes d1 ON d1.key_id = t.key_id AND d1.client_id = t.client_id AND d1.minute = \(previousMinute)
        LEFT JOIN usage_spend sim ON sim.scope = 'i:' || t.client_id AND sim.period = \(month)
        LEFT JOIN usage_spend sid ON sid.scope = 'i:' || t.client_id AND sid.period = (\(minute)) / 1440
        LEFT JOIN usage_spend swm ON swm.scope = 'w:' || t.workspace_id AND swm.period = \(month)
        LEFT JOIN usage_spend swd ON swd.scope = 'w:' || t.workspace_id AND swd.period = (\(minute)) / 1440
        WHERE t.token_hash = \(hash) AND t.revoked_at IS NULL AND t.expires_at > \(now) AND i.revoked_at IS NULL
        """
    }

    public static func list(_ names: [String], table: String? = nil) -> String {
        names.map { name in table.map { "\($0).\(name)" } ?? name }.joined(separator: ", ")
    }
}

extension Workspace {
    public init(row: some StoreRow) throws {
        self.init(id: try row.int("id"), name: try row.text("name"))
    }
}

extension SealedUpstreamKey {
    /// A row of `workspace_upstream_keys`, or of `workspace_upstreams` with its `label`.
    public init(row: some StoreRow, label: String? = nil) throws {
        let kindText = try row.text("kind")
        guard let kind = UpstreamKind(rawValue: kindText) else {
            throw InvalidStoredValue("workspace_upstream_keys.kind '\(kindText.prefix(40))' is none of "
                                     + UpstreamKind.allCases.map(\.rawValue).joined(separator: ", "))
        }
        let settings = try row.optional("settings", row.text).map { text in
            do { return try CloudUpstreamSettings.decode(text) } catch {
                throw InvalidStoredValue("workspace_upstream_keys.settings of a \(kind.rawValue) upstream is not its settings' JSON: \(error)")
            }
        }
        // The relay must never guess where a cloud workspace's requests go.
        guard (settings == nil) == (kind == .anthropic) else {
            throw InvalidStoredValue("workspace_upstream_keys.settings must be " + (kind == .anthropic ? "NULL" : "set") + " for a \(kind.rawValue) upstream")
        }
        self.init(sealed: try row.bytes("sealed_key"), last4: try row.text("last4"), setAt: try row.date("set_at"), setBy: try row.text("set_by"),
                  kind: kind, settings: settings, label: label)
    }

    /// The `settings` column's value (NULL for the Anthropic API).
    public var settingsColumn: String? { settings?.encoded() }
}

extension IntegrationPolicy {
    public init(row: some StoreRow) throws {
        self.init(models: IntegrationPolicy.models(fromColumn: try row.optional("allowed_models", row.text)),
                  maxTokens: Int(try row.int("max_tokens")), deviceRequestsPerMinute: Int(try row.int("device_requests_per_minute")),
                  monthlyTokenBudget: Int(try row.int("monthly_token_budget")),
                  serverTools: IntegrationPolicy.serverTools(fromColumn: try row.optional("allowed_server_tools", row.text)),
                  maxServerToolUses: Int(try row.int("max_server_tool_uses")),
                  betas: IntegrationPolicy.betas(fromColumn: try row.optional("allowed_betas", row.text)),
                  profileRequestsPerMinute: Int(try row.int("profile_requests_per_minute")),
                  profileMonthlyTokenBudget: Int(try row.int("profile_monthly_token_budget")))
        monitored = PolicyRule.rules(fromColumn: try row.text("monitored_rules"))
        monthlyBudgetMicroUSD = try row.int("monthly_budget_micro_usd")
        dailyBudgetMicroUSD = try row.int("daily_budget_micro_usd")
        profileMonthlyBudgetMicroUSD = try row.int("profile_monthly_budget_micro_usd")
        profileDailyBudgetMicroUSD = try row.int("profile_daily_budget_micro_usd")
    }

    /// The values for `StoreColumns.policy`, in its order (NULL as nil).
    public var columnValues: [ColumnValue] {
        [.text(modelsColumn), .int(Int64(maxTokens)), .int(Int64(deviceRequestsPerMinute)), .int(Int64(monthlyTokenBudget)),
         .text(serverToolsColumn), .int(Int64(maxServerToolUses)), .text(betasColumn), .int(Int64(profileRequestsPerMinute)),
         .int(Int64(profileMonthlyTokenBudget)), .text(PolicyRule.column(monitored)),
         .int(monthlyBudgetMicroUSD), .int(dailyBudgetMicroUSD), .int(profileMonthlyBudgetMicroUSD), .int(profileDailyBudgetMicroUSD)]
    }
}

/// A value for a column, in neither dialect's words: each store maps it to its own parameter type.
public enum ColumnValue: Sendable {
    case int(Int64)
    /// Text, NULL when nil.
    case text(String?)
}

extension Integration {
    public init(row: some StoreRow) throws {
        self.init(clientID: try row.text("client_id"), workspaceID: try row.int("workspace_id"), workspaceName: try row.text("workspace_name"),
                  name: try row.text("name"), teamID: try row.text("team_id"),
                  bundleIDs: (try row.optional("bundle_ids", row.text) ?? "").split(separator: "\n").map(String.init),
                  environments: Set(try row.text("environments").split(separator: ",").compactMap { AttestationEnvironment(rawValue: String($0)) }),
                  createdAt: try row.date("created_at"), revokedAt: try row.optional("revoked_at", row.date), policy: try IntegrationPolicy(row: row),
                  devicePolicy: try DevicePolicy(row: row))
    }
}

extension DevicePolicy {
    public init(row: some StoreRow) throws {
        self.init(distribution: [.production: DevicePolicy.distributions(fromColumn: try row.text("distribution_production")),
                                 .development: DevicePolicy.distributions(fromColumn: try row.text("distribution_development"))],
                  minBundleVersion: try row.optional("min_bundle_version", row.text).flatMap(BundleVersion.init),
                  requireExtensions: try row.int("require_extensions") != 0,
                  platforms: Set(try row.text("platforms").split(separator: ",").compactMap { DevicePlatform(rawValue: String($0)) }),
                  riskLimit: Int(try row.int("risk_limit")))
    }

    /// The values for `StoreColumns.devicePolicy`, in its order.
    public var columnValues: (production: String, development: String, minBundleVersion: String?, requireExtensions: Int64, platforms: String,
                              riskLimit: Int64) {
        (Self.column(admitted(.production)), Self.column(admitted(.development)), minBundleVersion?.description, requireExtensions ? 1 : 0,
         Self.describe(platforms), Int64(riskLimit))
    }
}

extension Device {
    public init(row: some StoreRow) throws {
        self.init(keyID: try row.bytes("key_id"), clientID: try row.text("client_id"), publicKey: try row.bytes("public_key"),
                  counter: UInt32(truncatingIfNeeded: try row.int("sign_counter")),
                  environment: AttestationEnvironment(rawValue: try row.text("environment")) ?? .production, appID: try row.text("app_id"),
                  platform: try row.optional("platform", row.text).flatMap(DevicePlatform.init(rawValue:)),
                  validationCategory: try row.optional("validation_category", row.int).map { UInt32(truncatingIfNeeded: $0) },
                  bundleVersion: try row.optional("bundle_version", row.text), osVersion: try row.optional("os_version", row.text),
                  registeredAt: try row.optional("registered_at", row.date), lastRefreshAt: try row.optional("last_refresh_at", row.date),
                  risk: try row.optional("receipt_created_at", row.date).map { created in
                      DeviceRisk(receiptCreatedAt: created, receiptNotBefore: try row.optional("receipt_not_before", row.date),
                                 receiptExpiresAt: try row.optional("receipt_expires_at", row.date),
                                 metric: try row.optional("risk_metric", row.int).map { Int($0) },
                                 checkedAt: try row.optional("risk_checked_at", row.date),
                                 overLimitAt: try row.optional("risk_over_limit_at", row.date))
                  })
    }
}

extension DeviceCounts {
    /// Adds one row of `StoreColumns.deviceCount` (`dimension` is platform, category or bundle_version).
    public mutating func add(row: some StoreRow) throws {
        let count = Int(try row.int("count"))
        let value = try row.optional("value", row.text)
        switch try row.text("dimension") {
        case "platform": byPlatform[value ?? "unknown", default: 0] += count
        case "category":
            let name = value.flatMap { UInt32($0) }.map { Distribution(category: $0).rawValue } ?? "none"
            byCategory[name, default: 0] += count
        case "risk": byRisk[DeviceRisk.band(value.flatMap { Int($0) }), default: 0] += count
        default: byBundleVersion[value ?? "none", default: 0] += count
        }
    }

    /// The query for one integration, in SQL both databases speak; `placeholder` names the client ID.
    public static func query(placeholder p: String) -> String {
        """
        SELECT 'platform' AS dimension, platform AS value, count(*) AS count FROM devices WHERE client_id = \(p) GROUP BY platform
        UNION ALL SELECT 'category', CAST(validation_category AS TEXT), count(*) FROM devices WHERE client_id = \(p) GROUP BY validation_category
        UNION ALL SELECT 'bundle_version', bundle_version, count(*) FROM devices WHERE client_id = \(p) GROUP BY bundle_version
        UNION ALL SELECT 'risk', CAST(risk_metric AS TEXT), count(*) FROM devices WHERE client_id = \(p) GROUP BY risk_metric
        """
    }
}

extension TokenGrant {
    /// The grant of a token row, when its hash is `hash` (confirmed in constant time: the index
    /// lookup found the row, this makes sure).
    public init?(row: some StoreRow, hash: [UInt8]) throws {
        guard constantTimeEquals(try row.bytes("token_hash"), hash) else { return nil }
        self.init(clientID: try row.text("client_id"), workspaceID: try row.int("workspace_id"), workspaceName: try row.text("workspace_name"),
                  issuedAt: try row.date("issued_at"), expiresAt: try row.date("expires_at"),
                  upstreamKey: try row.isNull("sealed_key") ? nil : try SealedUpstreamKey(row: row), keyID: try row.bytes("key_id"),
                  policy: try IntegrationPolicy(row: row),
                  recorded: try RecordedUsage(grantRow: row),
                  upstreamsVersion: try row.int("upstreams_version"))
        workspaceBudget = MoneyBudget(monthlyMicroUSD: try row.int("workspace_monthly_budget_micro_usd"),
                                      dailyMicroUSD: try row.int("workspace_daily_budget_micro_usd"))
        pricesAt = try row.optional("prices_at", row.double)
    }
}

extension RecordedUsage {
    /// The token check's counts: its tokens, its device's requests, and the money spent.
    init(grantRow row: some StoreRow) throws {
        self.init(monthTokens: try row.int("month_tokens"), deviceRequestsThisMinute: try row.int("requests_this_minute"),
                  deviceRequestsLastMinute: try row.int("requests_last_minute"))
        monthSpend = try row.int("month_spend")
        daySpend = try row.int("day_spend")
        workspaceMonthSpend = try row.int("workspace_month_spend")
        workspaceDaySpend = try row.int("workspace_day_spend")
    }
}

extension StoredPriceTable {
    public init(row: some StoreRow) throws {
        let table: PriceTable
        do { table = try PriceTable.decode(try row.text("prices")) } catch {
            throw InvalidStoredValue("price_tables.prices is not a price table: \(error)")
        }
        self.init(effectiveAt: try row.date("effective_at"), table: table, setBy: try row.text("set_by"))
    }
}

extension MoneyBudget {
    public init(row: some StoreRow) throws {
        self.init(monthlyMicroUSD: try row.int("monthly_budget_micro_usd"), dailyMicroUSD: try row.int("daily_budget_micro_usd"))
    }
}

extension IssuedChallenge {
    public init(row: some StoreRow) throws {
        self.init(bytes: try row.bytes("challenge"), expiresAt: try row.date("expires_at"))
    }
}

extension UsageKey {
    /// The key columns of a ledger row (`client_id`, `model`, `hour`, `profile`).
    public init(row: some StoreRow) throws {
        self.init(clientID: try row.text("client_id"), model: try row.text("model"), hour: try row.int("hour"), profile: try row.text("profile"))
    }
}

extension RecordedProfileUsage {
    public init(row: some StoreRow) throws {
        self.init(monthTokens: try row.int("month_tokens"), requestsThisMinute: try row.int("requests_this_minute"),
                  requestsLastMinute: try row.int("requests_last_minute"))
        monthSpend = try row.int("month_spend")
        daySpend = try row.int("day_spend")
    }

    /// One profile's recorded usage, with each dialect's placeholders (client ID, profile, month,
    /// minute, previous minute): three lookups by primary key.
    public static func query(clientID c: String, profile p: String, month: String, minute: String, previousMinute: String) -> String {
        """
        SELECT coalesce((SELECT tokens FROM usage_profile_monthly WHERE client_id = \(c) AND profile = \(p) AND month = \(month)), 0) AS month_tokens,
               coalesce((SELECT requests FROM profile_request_minutes WHERE client_id = \(c) AND profile = \(p) AND minute = \(minute)), 0)
                 AS requests_this_minute,
               coalesce((SELECT requests FROM profile_request_minutes WHERE client_id = \(c) AND profile = \(p) AND minute = \(previousMinute)), 0)
                 AS requests_last_minute,
               coalesce((SELECT micro_usd FROM usage_spend WHERE scope = 'p:' || \(c) || ':' || \(p) AND period = \(month)), 0) AS month_spend,
               coalesce((SELECT micro_usd FROM usage_spend WHERE scope = 'p:' || \(c) || ':' || \(p) AND period = (\(minute)) / 1440), 0) AS day_spend
        """
    }
}

extension WindowCount {
    public init(row: some StoreRow) throws {
        self.init(count: Int(try row.int("count")), oldest: try row.optional("oldest", row.date))
    }
}

extension UsageRow {
    /// A ledger row (its errors and refusals are read apart).
    public init(row: some StoreRow) throws {
        var counters = UsageCounters()
        counters.requests = try row.int("requests")
        counters.inputTokens = try row.int("input_tokens")
        counters.outputTokens = try row.int("output_tokens")
        counters.cacheCreationInputTokens = try row.int("cache_creation_input_tokens")
        counters.cacheReadInputTokens = try row.int("cache_read_input_tokens")
        counters.incomplete = try row.int("incomplete")
        counters.abandoned = try row.int("abandoned")
        counters.cacheCreation1hInputTokens = try row.int("cache_creation_1h_input_tokens")
        counters.costMicroUSD = try row.int("cost_micro_usd")
        self.init(workspace: try row.text("workspace_name"), key: try UsageKey(row: row), counters: counters)
    }
}

extension AuditEvent {
    public init(row: some StoreRow) throws {
        self.init(at: try row.date("at"), actor: try row.optional("actor", row.text), action: try row.text("action"),
                  clientID: try row.optional("client_id", row.text), keyID: try row.optional("key_id", row.bytes),
                  reason: try row.optional("reason", row.text), detail: try row.optional("detail", row.text))
        id = try row.int("id")
        count = try row.int("count")
        minute = try row.optional("minute", row.int)
    }
}

extension UpstreamUsageRow {
    public init(row: some StoreRow) throws {
        self.init(workspace: try row.text("workspace_name"),
                  key: UpstreamUsageKey(clientID: try row.text("client_id"), hour: try row.int("hour"), upstream: try row.text("upstream")),
                  counters: UpstreamUsageCounters(requests: try row.int("requests"), inputTokens: try row.int("input_tokens"),
                                                  outputTokens: try row.int("output_tokens"),
                                                  cacheCreationInputTokens: try row.int("cache_creation_input_tokens"),
                                                  cacheReadInputTokens: try row.int("cache_read_input_tokens"), failovers: try row.int("failovers"),
                                                  costMicroUSD: try row.int("cost_micro_usd")))
    }
}
