import Foundation

/// What an integration's installs may spend through the Messages relay. For the numbers, 0 means
/// no limit; `models == nil` allows any model (and so any fallback), `serverTools == nil` any
/// server tool, `betas == nil` any beta.
public struct IntegrationPolicy: Sendable, Equatable {
    public static let defaultDeviceRequestsPerMinute = 60
    /// The server tools the API bills beyond their tokens, by the prefix of their versioned `type`
    /// (`web_search_20260209`): per search, per fetched page, per container minute.
    public static let serverToolNames = ["web_search", "web_fetch", "code_execution"]

    /// The model IDs the app may call, as `model` and as every `fallbacks[].model`; nil: any.
    public var models: [String]?
    /// A ceiling on a request's `max_tokens`.
    public var maxTokens: Int
    /// Relayed requests per device key per minute.
    public var deviceRequestsPerMinute: Int
    /// Input plus output tokens per calendar month (UTC) for the whole integration.
    public var monthlyTokenBudget: Int
    /// The server tools (`serverToolNames`) a request may carry; nil: any, empty: none.
    public var serverTools: Set<String>?
    /// When above 0, every server tool must carry `max_uses` of at most this.
    public var maxServerToolUses: Int
    /// The `anthropic-beta` values a request may name; nil: any.
    public var betas: [String]?
    /// Relayed requests per user profile (`anthropic-user-profile-id`) per minute, within the integration.
    public var profileRequestsPerMinute: Int
    /// Tokens per user profile per calendar month (UTC), within the integration.
    public var profileMonthlyTokenBudget: Int
    /// Money, in micro-dollars at the prices in force when each request was recorded: the whole
    /// integration's per calendar month and per day (UTC), and each user profile's. 0: none.
    public var monthlyBudgetMicroUSD: Int64 = 0
    public var dailyBudgetMicroUSD: Int64 = 0
    public var profileMonthlyBudgetMicroUSD: Int64 = 0
    public var profileDailyBudgetMicroUSD: Int64 = 0
    /// The rules (relay and device posture alike) that only watch: counted as "would have been
    /// refused", never refusing. Every other rule is enforced. Kept with the policy because the
    /// token check reads the policy on every request, so a switch applies on the next one.
    public var monitored: Set<PolicyRule> = []

    public init(models: [String]? = nil, maxTokens: Int = 0, deviceRequestsPerMinute: Int = defaultDeviceRequestsPerMinute,
                monthlyTokenBudget: Int = 0, serverTools: Set<String>? = nil, maxServerToolUses: Int = 0, betas: [String]? = nil,
                profileRequestsPerMinute: Int = 0, profileMonthlyTokenBudget: Int = 0) {
        self.models = models
        self.maxTokens = maxTokens
        self.deviceRequestsPerMinute = deviceRequestsPerMinute
        self.monthlyTokenBudget = monthlyTokenBudget
        self.serverTools = serverTools
        self.maxServerToolUses = maxServerToolUses
        self.betas = betas
        self.profileRequestsPerMinute = profileRequestsPerMinute
        self.profileMonthlyTokenBudget = profileMonthlyTokenBudget
    }

    public func mode(_ rule: PolicyRule) -> RuleMode { monitored.contains(rule) ? .monitor : .enforce }

    /// Whether the policy reads a profile's recorded usage (the store, by key) to admit a request.
    public var readsProfileUsage: Bool {
        profileRequestsPerMinute > 0 || profileMonthlyTokenBudget > 0 || profileMonthlyBudgetMicroUSD > 0 || profileDailyBudgetMicroUSD > 0
    }

    /// A model ID as the Messages API spells them (`claude-sonnet-4-5`, `claude-3-5-haiku@20241022`):
    /// letters, digits and `._:@/-`, at most 128 bytes.
    public static func isValidModelID(_ id: String) -> Bool {
        !id.isEmpty && id.utf8.count <= 128 && id.utf8.allSatisfy { b in
            (0x41...0x5a).contains(b) || (0x61...0x7a).contains(b) || (0x30...0x39).contains(b)
                || b == 0x2e || b == 0x5f || b == 0x3a || b == 0x40 || b == 0x2f || b == 0x2d
        }
    }

    /// A beta name as the API spells them (`user-profiles-2026-08-18`): letters, digits, `.`, `_`
    /// and `-`, at most 128 bytes.
    public static func isValidBetaName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= 128 && name.utf8.allSatisfy { b in
            (0x41...0x5a).contains(b) || (0x61...0x7a).contains(b) || (0x30...0x39).contains(b) || b == 0x2e || b == 0x5f || b == 0x2d
        }
    }

    /// A user profile ID as the relay accepts it: `uprof_` then letters, digits, `_` or `-`, at most 128 bytes.
    public static func isValidProfileID(_ id: String) -> Bool {
        let bytes = id.utf8
        guard bytes.count > 6, bytes.count <= 128, id.hasPrefix("uprof_") else { return false }
        return bytes.dropFirst(6).allSatisfy { b in
            (0x41...0x5a).contains(b) || (0x61...0x7a).contains(b) || (0x30...0x39).contains(b) || b == 0x5f || b == 0x2d
        }
    }

    /// The `allowed_models` column: newline-separated IDs, NULL for any.
    public var modelsColumn: String? { models?.joined(separator: "\n") }

    public static func models(fromColumn column: String?) -> [String]? {
        column.map { $0.split(separator: "\n").map(String.init) }
    }

    /// The `allowed_server_tools` column: comma-separated names ('' for none), NULL for any.
    public var serverToolsColumn: String? { serverTools.map { $0.sorted().joined(separator: ",") } }

    public static func serverTools(fromColumn column: String?) -> Set<String>? {
        column.map { Set($0.split(separator: ",").map(String.init)) }
    }

    /// The `allowed_betas` column: newline-separated names, NULL for any.
    public var betasColumn: String? { betas?.joined(separator: "\n") }

    public static func betas(fromColumn column: String?) -> [String]? {
        column.map { $0.split(separator: "\n").map(String.init) }
    }
}

/// What every instance has flushed for one user profile: its tokens this month and its relayed
/// requests this minute and the last (read only when the profile's limits are on).
public struct RecordedProfileUsage: Sendable, Equatable {
    public var monthTokens: Int64
    public var requestsThisMinute: Int64
    public var requestsLastMinute: Int64
    /// Micro-dollars this calendar month and this day (UTC).
    public var monthSpend: Int64 = 0
    public var daySpend: Int64 = 0

    public init(monthTokens: Int64 = 0, requestsThisMinute: Int64 = 0, requestsLastMinute: Int64 = 0) {
        self.monthTokens = monthTokens
        self.requestsThisMinute = requestsThisMinute
        self.requestsLastMinute = requestsLastMinute
    }
}

/// The usage every instance has flushed to the database, as the token check reads it: the
/// integration's tokens this month and the device's relayed requests this minute and the last.
public struct RecordedUsage: Sendable, Equatable {
    public var monthTokens: Int64
    public var deviceRequestsThisMinute: Int64
    public var deviceRequestsLastMinute: Int64
    /// Micro-dollars spent this calendar month and this day (UTC): the integration's and its workspace's.
    public var monthSpend: Int64 = 0
    public var daySpend: Int64 = 0
    public var workspaceMonthSpend: Int64 = 0
    public var workspaceDaySpend: Int64 = 0

    public init(monthTokens: Int64 = 0, deviceRequestsThisMinute: Int64 = 0, deviceRequestsLastMinute: Int64 = 0) {
        self.monthTokens = monthTokens
        self.deviceRequestsThisMinute = deviceRequestsThisMinute
        self.deviceRequestsLastMinute = deviceRequestsLastMinute
    }
}

/// The time buckets usage is kept in, all UTC.
public enum UsageClock {
    /// Unix time of the hour's start.
    public static func hour(_ time: Date) -> Int64 { Int64((time.timeIntervalSince1970 / 3600).rounded(.down)) * 3600 }
    /// Unix time / 60.
    public static func minute(_ time: Date) -> Int64 { Int64((time.timeIntervalSince1970 / 60).rounded(.down)) }
    /// Unix time / 86,400: the day a daily budget counts (UTC). Below 100,000 for millennia, so
    /// never a month's YYYYMM, and the spend table keeps both under one key column.
    public static func day(_ time: Date) -> Int64 { Int64((time.timeIntervalSince1970 / 86_400).rounded(.down)) }

    /// The calendar month as YYYYMM. Integer arithmetic: the token check asks for it on every
    /// relayed request, and Foundation's Calendar costs microseconds each time on Linux.
    public static func month(_ time: Date) -> Int64 {
        let date = civil(days(time))
        return date.year * 100 + date.month
    }

    /// The start of the next calendar month (when a spent budget renews).
    public static func nextMonthStart(after time: Date) -> Date {
        let date = civil(days(time))
        let next = date.month == 12 ? (year: date.year + 1, month: Int64(1)) : (year: date.year, month: date.month + 1)
        return Date(timeIntervalSince1970: TimeInterval(daysFromCivil(year: next.year, month: next.month, day: 1) * 86_400))
    }

    /// `2026-12-01` for the day holding `seconds` (Unix time).
    public static func dayText(_ seconds: Int64) -> String {
        let date = civil(Int64((Double(seconds) / 86_400).rounded(.down)))
        func padded(_ value: Int64, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(padded(date.year, 4))-\(padded(date.month, 2))-\(padded(date.day, 2))"
    }

    private static func days(_ time: Date) -> Int64 { Int64((time.timeIntervalSince1970 / 86_400).rounded(.down)) }

    /// The proleptic Gregorian date of a day number (days since 1970-01-01), and back: the
    /// well-known era arithmetic (400-year cycles of 146,097 days, years starting in March).
    static func civil(_ days: Int64) -> (year: Int64, month: Int64, day: Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let shiftedMonth = (5 * dayOfYear + 2) / 153
        let month = shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, dayOfYear - (153 * shiftedMonth + 2) / 5 + 1)
    }

    static func daysFromCivil(year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
        return era * 146_097 + yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear - 719_468
    }
}

/// One row of the usage ledger: an integration's relayed requests to one model in one hour, for
/// one user profile (`""`: requests without one).
public struct UsageKey: Hashable, Sendable {
    public let clientID: String
    public let model: String
    public let hour: Int64
    public let profile: String

    public init(clientID: String, model: String, hour: Int64, profile: String = "") {
        self.clientID = clientID
        self.model = model
        self.hour = hour
        self.profile = profile
    }
}

/// What a ledger row counts.
public struct UsageCounters: Sendable, Equatable {
    public var requests: Int64 = 0
    public var inputTokens: Int64 = 0
    public var outputTokens: Int64 = 0
    public var cacheCreationInputTokens: Int64 = 0
    public var cacheReadInputTokens: Int64 = 0
    /// The part of `cacheCreationInputTokens` written for an hour.
    public var cacheCreation1hInputTokens: Int64 = 0
    /// What the row's requests cost, in micro-dollars, each priced when it was recorded.
    public var costMicroUSD: Int64 = 0
    /// Streams (and replies) cut short: recorded with what was seen.
    public var incomplete: Int64 = 0
    /// Non-streamed replies whose client left before they came: read to their end all the same,
    /// so their usage is what the upstream bills.
    public var abandoned: Int64 = 0
    /// Error answers, by status.
    public var errors: [Int: Int64] = [:]
    /// Requests the policy refused (never relayed), by reason.
    public var refusals: [String: Int64] = [:]
    /// The upstream's `usage.server_tool_use` counters, by their own names (`web_search_requests`, …).
    public var serverToolUse: [String: Int64] = [:]

    public init() {}

    /// Sums saturate at `Int64.max`: counts read back from a database are not trusted to be small.
    public static func += (lhs: inout UsageCounters, rhs: UsageCounters) {
        lhs.requests.saturatingAdd(rhs.requests)
        lhs.inputTokens.saturatingAdd(rhs.inputTokens)
        lhs.outputTokens.saturatingAdd(rhs.outputTokens)
        lhs.cacheCreationInputTokens.saturatingAdd(rhs.cacheCreationInputTokens)
        lhs.cacheReadInputTokens.saturatingAdd(rhs.cacheReadInputTokens)
        lhs.cacheCreation1hInputTokens.saturatingAdd(rhs.cacheCreation1hInputTokens)
        lhs.costMicroUSD.saturatingAdd(rhs.costMicroUSD)
        lhs.incomplete.saturatingAdd(rhs.incomplete)
        lhs.abandoned.saturatingAdd(rhs.abandoned)
        lhs.errors.merge(rhs.errors, uniquingKeysWith: Int64.saturatingSum)
        lhs.refusals.merge(rhs.refusals, uniquingKeysWith: Int64.saturatingSum)
        lhs.serverToolUse.merge(rhs.serverToolUse, uniquingKeysWith: Int64.saturatingSum)
    }

    /// Every kind of token: what a token budget counts.
    public var totalTokens: Int64 {
        Int64.saturatingSum(Int64.saturatingSum(inputTokens, outputTokens), Int64.saturatingSum(cacheCreationInputTokens, cacheReadInputTokens))
    }
}

extension Int64 {
    /// `a + b`, or the bound it passed: for counters, where a trap would stop every tenant.
    public static func saturatingSum(_ a: Int64, _ b: Int64) -> Int64 {
        let (sum, overflow) = a.addingReportingOverflow(b)
        return overflow ? (b > 0 ? .max : .min) : sum
    }

    public mutating func saturatingAdd(_ other: Int64) { self = Self.saturatingSum(self, other) }
}

/// A device's relayed requests in one minute.
public struct DeviceMinuteKey: Hashable, Sendable {
    public let clientID: String
    public let keyID: [UInt8]
    public let minute: Int64

    public init(clientID: String, keyID: [UInt8], minute: Int64) {
        self.clientID = clientID
        self.keyID = keyID
        self.minute = minute
    }

    /// The key ID is a SHA-256 digest, so its first 8 bytes spread as well as the whole key; the
    /// process-seeded Hasher still keeps collisions unchosen, and equality compares every field.
    /// Hashing all of it was 1% of a relayed request (the table is read and written per request).
    public func hash(into hasher: inout Hasher) {
        var prefix: UInt64 = 0
        for byte in keyID.prefix(8) { prefix = prefix << 8 | UInt64(byte) }
        hasher.combine(prefix)
        hasher.combine(minute)
    }
}

/// An integration's tokens in one calendar month.
public struct MonthKey: Hashable, Sendable {
    public let clientID: String
    public let month: Int64

    public init(clientID: String, month: Int64) {
        self.clientID = clientID
        self.month = month
    }
}

/// A user profile's relayed requests in one minute.
public struct ProfileMinuteKey: Hashable, Sendable {
    public let clientID: String
    public let profile: String
    public let minute: Int64

    public init(clientID: String, profile: String, minute: Int64) {
        self.clientID = clientID
        self.profile = profile
        self.minute = minute
    }
}

/// A user profile's tokens in one calendar month.
public struct ProfileMonthKey: Hashable, Sendable {
    public let clientID: String
    public let profile: String
    public let month: Int64

    public init(clientID: String, profile: String, month: Int64) {
        self.clientID = clientID
        self.profile = profile
        self.month = month
    }
}

/// Micro-dollars spent by one budget's scope in one period: `scope` is `w:<workspace id>`,
/// `i:<client ID>` or `p:<client ID>:<profile>`; `period` a month (YYYYMM) or a day (`UsageClock.day`).
public struct SpendKey: Hashable, Sendable {
    public let scope: String
    public let period: Int64

    public init(scope: String, period: Int64) {
        self.scope = scope
        self.period = period
    }

    public static func workspace(_ id: Int64) -> String { "w:" + String(id) }
    public static func integration(_ clientID: String) -> String { "i:" + clientID }
    public static func profile(_ clientID: String, _ profile: String) -> String { "p:" + clientID + ":" + profile }
}

/// What one flush writes, in one transaction: every count is an increment.
public struct UsageBatch: Sendable {
    /// Written with the batch in the same transaction, when set: a batch whose commit went through
    /// but whose answer was lost is retried under the same ID and adds nothing twice.
    public var id: String?
    public var usage: [UsageKey: UsageCounters] = [:]
    public var monthTokens: [MonthKey: Int64] = [:]
    public var deviceMinutes: [DeviceMinuteKey: Int64] = [:]
    public var profileMinutes: [ProfileMinuteKey: Int64] = [:]
    public var profileMonthTokens: [ProfileMonthKey: Int64] = [:]
    /// Which upstream of the workspace's list served (`usage_hourly_by_upstream`).
    public var upstreams: [UpstreamUsageKey: UpstreamUsageCounters] = [:]
    /// Micro-dollars per budget scope and period.
    public var spend: [SpendKey: Int64] = [:]
    /// Refusals and would-be refusals by rule and day (`PolicyRuleTally`).
    public var ruleCounts: [RuleDayKey: RuleCount] = [:]

    public init() {}

    public var isEmpty: Bool {
        usage.isEmpty && monthTokens.isEmpty && deviceMinutes.isEmpty && profileMinutes.isEmpty && profileMonthTokens.isEmpty && upstreams.isEmpty
            && spend.isEmpty && ruleCounts.isEmpty
    }

    public mutating func merge(_ other: UsageBatch) {
        for (key, counters) in other.usage { usage[key, default: UsageCounters()] += counters }
        monthTokens.merge(other.monthTokens, uniquingKeysWith: Int64.saturatingSum)
        deviceMinutes.merge(other.deviceMinutes, uniquingKeysWith: Int64.saturatingSum)
        profileMinutes.merge(other.profileMinutes, uniquingKeysWith: Int64.saturatingSum)
        profileMonthTokens.merge(other.profileMonthTokens, uniquingKeysWith: Int64.saturatingSum)
        for (key, counters) in other.upstreams { upstreams[key, default: UpstreamUsageCounters()] += counters }
        spend.merge(other.spend, uniquingKeysWith: Int64.saturatingSum)
        for (key, count) in other.ruleCounts { ruleCounts[key, default: RuleCount()] += count }
    }
}

/// Which ledger rows `attestctl usage` reads: hours whose start is in [since, until).
public struct UsageFilter: Sendable {
    public var workspaceID: Int64?
    public var clientID: String?
    public var since: Int64?
    public var until: Int64?

    public init(workspaceID: Int64? = nil, clientID: String? = nil, since: Int64? = nil, until: Int64? = nil) {
        self.workspaceID = workspaceID
        self.clientID = clientID
        self.since = since
        self.until = until
    }
}

/// A ledger row as read back.
public struct UsageRow: Sendable, Equatable {
    public let workspace: String
    public let key: UsageKey
    public var counters: UsageCounters

    public init(workspace: String, key: UsageKey, counters: UsageCounters) {
        self.workspace = workspace
        self.key = key
        self.counters = counters
    }
}
