import Foundation
import Synchronization

/// One rule of an integration's policy, named as its `integrations update` flag without the
/// dashes. Each rule is enforced (it refuses) or monitored (the request or registration goes
/// through as if the rule were absent, and is counted as "would have been refused"), so an
/// operator can tighten a rule on a shipped app and first see whom it would refuse.
public enum PolicyRule: String, Sendable, CaseIterable, Comparable {
    // The Messages relay (`IntegrationPolicy`).
    case models, maxTokens = "max-tokens", deviceRequestsPerMinute = "device-requests-per-minute"
    case monthlyTokenBudget = "monthly-token-budget", serverTools = "server-tools", maxServerToolUses = "max-server-tool-uses", betas
    case profileRequestsPerMinute = "profile-requests-per-minute", profileMonthlyTokenBudget = "profile-monthly-token-budget"
    // Budgets in money (their refusals name these rules where they are checked).
    case monthlyBudgetUSD = "monthly-budget-usd", dailyBudgetUSD = "daily-budget-usd"
    case profileMonthlyBudgetUSD = "profile-monthly-budget-usd", profileDailyBudgetUSD = "profile-daily-budget-usd"
    // Device posture (`DevicePolicy`), at registration and refresh.
    case distribution, minBundleVersion = "min-bundle-version", requireExtensions = "require-extensions", platforms, riskLimit = "risk-limit"

    public static func < (a: PolicyRule, b: PolicyRule) -> Bool { a.rawValue < b.rawValue }

    /// The rule a relay refusal applies, or nil when it is no rule of the operator's (a malformed
    /// request, an unreadable body, usage that could not be read): those are always refused.
    public init?(_ refusal: PolicyRefusal) {
        switch refusal {
        case .modelNotAllowed, .fallbackNotAllowed, .defaultFallbackNotAllowed: self = .models
        case .maxTokensOverLimit: self = .maxTokens
        case .serverToolNotAllowed: self = .serverTools
        case .serverToolUsesOverLimit: self = .maxServerToolUses
        case .betaNotAllowed: self = .betas
        case .deviceRateLimited: self = .deviceRequestsPerMinute
        case .profileRateLimited: self = .profileRequestsPerMinute
        case .monthlyBudgetSpent: self = .monthlyTokenBudget
        case .profileBudgetSpent: self = .profileMonthlyTokenBudget
        case .moneyBudgetSpent(let budget):
            guard let rule = budget.rule else { return nil }
            self = rule
        case .malformed, .unreadableBody, .limitsUnavailable: return nil
        }
    }

    /// The rule a device-policy rejection applies (nil: a category change, never a rule to watch).
    public init?(_ reason: RejectionReason) {
        switch reason {
        case .distributionNotAllowed: self = .distribution
        case .bundleVersionTooOld: self = .minBundleVersion
        case .extensionsMissing: self = .requireExtensions
        case .platformNotAllowed: self = .platforms
        case .riskMetricTooHigh: self = .riskLimit
        default: return nil
        }
    }

    /// The `monitored_rules` column: comma-separated names, sorted ('' when every rule is enforced).
    public static func column(_ rules: Set<PolicyRule>) -> String { rules.sorted().map(\.rawValue).joined(separator: ",") }

    /// Unknown names (written by a newer version) are dropped: such a rule is then enforced, the safe side.
    public static func rules(fromColumn text: String) -> Set<PolicyRule> {
        Set(text.split(separator: ",").compactMap { PolicyRule(rawValue: String($0)) })
    }
}

/// How a rule is applied.
public enum RuleMode: String, Sendable {
    case enforce, monitor
}

/// A rule's count for one integration and UTC day (`day`: Unix time of its midnight).
public struct RuleDayKey: Hashable, Sendable {
    public let clientID: String
    public let rule: PolicyRule
    public let day: Int64

    public init(clientID: String, rule: PolicyRule, day: Int64) {
        self.clientID = clientID
        self.rule = rule
        self.day = day
    }
}

/// What a rule did in a day: requests or registrations it refused (enforced) and those it would
/// have refused (monitored).
public struct RuleCount: Sendable, Equatable {
    public var refused: Int64 = 0
    public var wouldRefuse: Int64 = 0

    public init(refused: Int64 = 0, wouldRefuse: Int64 = 0) {
        self.refused = refused
        self.wouldRefuse = wouldRefuse
    }

    public static func += (lhs: inout RuleCount, rhs: RuleCount) {
        lhs.refused.saturatingAdd(rhs.refused)
        lhs.wouldRefuse.saturatingAdd(rhs.wouldRefuse)
    }
}

/// A row of `attestctl usage --by rule`: a rule of one integration on one day, with its mode now.
public struct RuleUsageRow: Sendable, Equatable {
    public let workspace: String
    public let key: RuleDayKey
    public let mode: RuleMode
    public let count: RuleCount

    public init(workspace: String, key: RuleDayKey, mode: RuleMode, count: RuleCount) {
        self.workspace = workspace
        self.key = key
        self.mode = mode
        self.count = count
    }
}

/// Refusals and would-be refusals by rule, counted in memory and written with the usage ledger's
/// next flush (in its transaction), so neither the relay nor a registration pays a write for them.
/// Shared by the relay's ledger and the device exchange. Touched only when a rule trips.
public final class PolicyRuleTally: Sendable {
    private let pending = Mutex<[RuleDayKey: RuleCount]>([:])
    /// Told the first time a monitored rule trips for an integration and day since the last flush
    /// (at most one line per key and flush interval): the log of "would have been refused".
    private let log: @Sendable (_ clientID: String, _ rule: PolicyRule, _ reason: String, _ detail: String) -> Void

    public init(log: @escaping @Sendable (_ clientID: String, _ rule: PolicyRule, _ reason: String, _ detail: String) -> Void = { _, _, _, _ in }) {
        self.log = log
    }

    /// The UTC day holding `time`, as Unix time of its midnight.
    public static func day(_ time: Date) -> Int64 { Int64((time.timeIntervalSince1970 / 86_400).rounded(.down)) * 86_400 }

    /// Counts one refusal (`monitored == false`) or would-be refusal of `rule`.
    public func count(clientID: String, rule: PolicyRule, monitored: Bool, reason: String, detail: @autoclosure () -> String, at time: Date) {
        let key = RuleDayKey(clientID: clientID, rule: rule, day: Self.day(time))
        let first = pending.withLock { pending -> Bool in
            var first = false
            if monitored {
                first = pending[key]?.wouldRefuse ?? 0 == 0
                pending[key, default: RuleCount()].wouldRefuse.saturatingAdd(1)
            } else {
                pending[key, default: RuleCount()].refused.saturatingAdd(1)
            }
            return first
        }
        if first { log(clientID, rule, reason, detail()) }
    }

    /// What is counted so far, emptied (the ledger's flush takes it into its batch).
    public func drain() -> [RuleDayKey: RuleCount] {
        pending.withLock { pending in
            defer { pending = [:] }
            return pending
        }
    }

    /// Counts not yet taken, for tests and the final flush.
    public var isEmpty: Bool { pending.withLock { $0.isEmpty } }
}
