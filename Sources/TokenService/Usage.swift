import Foundation

/// What an integration's installs may spend through the Messages relay. For the numbers, 0 means
/// no limit; `models == nil` allows any model.
public struct IntegrationPolicy: Sendable, Equatable {
    public static let defaultDeviceRequestsPerMinute = 60

    /// The model IDs the app may call; nil: any.
    public var models: [String]?
    /// A ceiling on a request's `max_tokens`.
    public var maxTokens: Int
    /// Relayed requests per device key per minute.
    public var deviceRequestsPerMinute: Int
    /// Input plus output tokens per calendar month (UTC) for the whole integration.
    public var monthlyTokenBudget: Int

    public init(models: [String]? = nil, maxTokens: Int = 0, deviceRequestsPerMinute: Int = defaultDeviceRequestsPerMinute,
                monthlyTokenBudget: Int = 0) {
        self.models = models
        self.maxTokens = maxTokens
        self.deviceRequestsPerMinute = deviceRequestsPerMinute
        self.monthlyTokenBudget = monthlyTokenBudget
    }

    /// A model ID as the Messages API spells them (`claude-sonnet-4-5`, `claude-3-5-haiku@20241022`):
    /// letters, digits and `._:@/-`, at most 128 bytes.
    public static func isValidModelID(_ id: String) -> Bool {
        !id.isEmpty && id.utf8.count <= 128 && id.utf8.allSatisfy { b in
            (0x41...0x5a).contains(b) || (0x61...0x7a).contains(b) || (0x30...0x39).contains(b)
                || b == 0x2e || b == 0x5f || b == 0x3a || b == 0x40 || b == 0x2f || b == 0x2d
        }
    }

    /// The `allowed_models` column: newline-separated IDs, NULL for any.
    public var modelsColumn: String? { models?.joined(separator: "\n") }

    public static func models(fromColumn column: String?) -> [String]? {
        column.map { $0.split(separator: "\n").map(String.init) }
    }
}

/// The usage every instance has flushed to the database, as the token check reads it: the
/// integration's tokens this month and the device's relayed requests this minute and the last.
public struct RecordedUsage: Sendable, Equatable {
    public var monthTokens: Int64
    public var deviceRequestsThisMinute: Int64
    public var deviceRequestsLastMinute: Int64

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

    private static let utc: Calendar = {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar
    }()

    /// The calendar month as YYYYMM.
    public static func month(_ time: Date) -> Int64 {
        let parts = utc.dateComponents([.year, .month], from: time)
        return Int64(parts.year! * 100 + parts.month!)
    }

    /// The start of the next calendar month (when a spent budget renews).
    public static func nextMonthStart(after time: Date) -> Date {
        let parts = utc.dateComponents([.year, .month], from: time)
        let start = utc.date(from: DateComponents(year: parts.year, month: parts.month, day: 1))!
        return utc.date(byAdding: .month, value: 1, to: start)!
    }
}

/// One row of the usage ledger: an integration's relayed requests to one model in one hour.
public struct UsageKey: Hashable, Sendable {
    public let clientID: String
    public let model: String
    public let hour: Int64

    public init(clientID: String, model: String, hour: Int64) {
        self.clientID = clientID
        self.model = model
        self.hour = hour
    }
}

/// What a ledger row counts.
public struct UsageCounters: Sendable, Equatable {
    public var requests: Int64 = 0
    public var inputTokens: Int64 = 0
    public var outputTokens: Int64 = 0
    public var cacheCreationInputTokens: Int64 = 0
    public var cacheReadInputTokens: Int64 = 0
    /// Streams (and replies) cut short: recorded with what was seen.
    public var incomplete: Int64 = 0
    /// Error answers, by status.
    public var errors: [Int: Int64] = [:]
    /// Requests the policy refused (never relayed), by reason.
    public var refusals: [String: Int64] = [:]

    public init() {}

    public static func += (lhs: inout UsageCounters, rhs: UsageCounters) {
        lhs.requests += rhs.requests
        lhs.inputTokens += rhs.inputTokens
        lhs.outputTokens += rhs.outputTokens
        lhs.cacheCreationInputTokens += rhs.cacheCreationInputTokens
        lhs.cacheReadInputTokens += rhs.cacheReadInputTokens
        lhs.incomplete += rhs.incomplete
        lhs.errors.merge(rhs.errors, uniquingKeysWith: +)
        lhs.refusals.merge(rhs.refusals, uniquingKeysWith: +)
    }
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

/// What one flush writes, in one transaction: every count is an increment.
public struct UsageBatch: Sendable {
    public var usage: [UsageKey: UsageCounters] = [:]
    public var monthTokens: [MonthKey: Int64] = [:]
    public var deviceMinutes: [DeviceMinuteKey: Int64] = [:]

    public init() {}

    public var isEmpty: Bool { usage.isEmpty && monthTokens.isEmpty && deviceMinutes.isEmpty }

    public mutating func merge(_ other: UsageBatch) {
        for (key, counters) in other.usage { usage[key, default: UsageCounters()] += counters }
        monthTokens.merge(other.monthTokens, uniquingKeysWith: +)
        deviceMinutes.merge(other.deviceMinutes, uniquingKeysWith: +)
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
