import Foundation

// Budgets in money: who a budget belongs to, over which period, and how much of it is used.
// The ledger checks them when it admits a request (`UsageLedger.admit`) and reports each one's
// use after every recorded request (`UsageLedger.budgetObserver`), for the threshold alerts.

/// Whose budget: the whole workspace's, one integration's, or one user profile's within an integration.
public enum BudgetScope: String, Sendable, CaseIterable {
    case workspace, integration, profile
}

/// A budget's period, UTC: it renews at midnight, or on the 1st.
public enum BudgetPeriod: String, Sendable, CaseIterable {
    case daily, monthly

    /// The period holding `time`: `UsageClock.day` or `UsageClock.month`.
    public func period(_ time: Date) -> Int64 { self == .daily ? UsageClock.day(time) : UsageClock.month(time) }

    /// Seconds from `time` until the period renews (at least 1): a refusal's `retry-after`.
    public func secondsToRenewal(from time: Date) -> Int {
        let end = self == .daily ? Date(timeIntervalSince1970: TimeInterval((UsageClock.day(time) + 1) * 86_400))
            : UsageClock.nextMonthStart(after: time)
        return max(1, Int(end.timeIntervalSince(time).rounded(.up)))
    }
}

/// A money budget that refused a request.
public struct MoneyBudgetRefusal: Sendable, Equatable {
    public let scope: BudgetScope
    public let period: BudgetPeriod
    public let budgetMicroUSD: Int64
    public let retryAfter: Int

    /// `integration_monthly_budget_usd_spent`, …: the ledger's and the metrics' reason.
    public var reason: String { "\(scope.rawValue)_\(period.rawValue)_budget_usd_spent" }

    /// The rule `--rule-mode` names: the integration's and its profiles' budgets are the
    /// integration's rules; the workspace's is its owner's, always enforced.
    public var rule: PolicyRule? {
        switch (scope, period) {
        case (.integration, .monthly): .monthlyBudgetUSD
        case (.integration, .daily): .dailyBudgetUSD
        case (.profile, .monthly): .profileMonthlyBudgetUSD
        case (.profile, .daily): .profileDailyBudgetUSD
        case (.workspace, _): nil
        }
    }

    /// The message the app gets (no amount spent, which is the operator's business).
    public var message: String {
        let whose = switch scope {
        case .workspace: "this app's workspace has"
        case .integration: "this app has"
        case .profile: "this user profile has"
        }
        let renews = period == .daily ? "it renews at midnight (UTC)" : "it renews on the 1st (UTC)"
        return "\(whose) used its \(period.rawValue) budget of \(MoneyText.usd(budgetMicroUSD)); \(renews)"
    }
}

/// One budget's use after a recorded request: what the threshold alerts watch.
public struct BudgetUse: Sendable, Equatable {
    public let scope: BudgetScope
    public let period: BudgetPeriod
    /// `UsageClock.day` or the month as YYYYMM: a threshold fires once per budget and period.
    public let periodKey: Int64
    public let workspaceID: Int64
    public let workspaceName: String
    public let clientID: String
    /// The profile, for a profile's budget.
    public let profile: String?
    public let budgetMicroUSD: Int64
    /// What this instance knows was spent in the period: every instance's flushed spend as the
    /// request's token check read it, plus what this one has recorded since.
    public let spentMicroUSD: Int64

    /// `spent / budget` (above 1 once overspent).
    public var usedRatio: Double { budgetMicroUSD > 0 ? Double(spentMicroUSD) / Double(budgetMicroUSD) : 0 }
}

/// Money as operators read and write it.
public enum MoneyText {
    /// `$2,000.00`-style text without the thousands separators: `$2000.00`, `$0.000123`.
    public static func usd(_ microUSD: Int64) -> String {
        let negative = microUSD < 0
        let magnitude = microUSD.magnitude
        let dollars = magnitude / 1_000_000
        let fraction = magnitude % 1_000_000
        var decimals = String(fraction)
        decimals = String(repeating: "0", count: 6 - decimals.count) + decimals
        // Cents always, further digits only when they are not zero.
        while decimals.count > 2 && decimals.hasSuffix("0") { decimals.removeLast() }
        return (negative ? "-$" : "$") + "\(dollars).\(decimals)"
    }

    /// A USD amount as an operator writes it (`2000`, `1.50`, `0.000001`) in micro-dollars; nil
    /// when it is not a plain decimal of at most 6 places from 0 to 1,000,000,000.
    public static func microUSD(_ text: String) -> Int64? {
        let parts = text.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        guard let whole = parts.first, !whole.isEmpty, whole.count <= 10, whole.allSatisfy(\.isASCIIDigit), let dollars = Int64(whole) else { return nil }
        var fraction: Int64 = 0
        if parts.count == 2 {
            let digits = parts[1]
            guard !digits.isEmpty, digits.count <= 6, digits.allSatisfy(\.isASCIIDigit) else { return nil }
            fraction = Int64(digits + String(repeating: "0", count: 6 - digits.count)) ?? 0
        }
        guard dollars <= 1_000_000_000 else { return nil }
        return dollars * 1_000_000 + fraction
    }
}

extension Character {
    var isASCIIDigit: Bool { isASCII && isNumber }
}

/// The month's spend so far and where it is heading: spend to date, scaled by the month's
/// length over the part of it that has passed (a straight line: enough to warn, not a model).
public struct SpendForecast: Sendable, Equatable {
    public let month: Int64
    public let monthToDateMicroUSD: Int64
    public let projectedMicroUSD: Int64

    public init(monthToDateMicroUSD: Int64, at time: Date) {
        self.month = UsageClock.month(time)
        self.monthToDateMicroUSD = monthToDateMicroUSD
        let start = UsageClock.monthStart(of: time)
        let end = UsageClock.nextMonthStart(after: time)
        let elapsed = max(3600, time.timeIntervalSince(start))   // an hour at least: the 1st's first minutes project nothing wild
        let scaled = Double(monthToDateMicroUSD) * end.timeIntervalSince(start) / elapsed
        projectedMicroUSD = scaled >= Double(Int64.max) ? .max : max(monthToDateMicroUSD, Int64(scaled.rounded()))
    }
}

extension UsageClock {
    /// The first instant of the calendar month holding `time`.
    public static func monthStart(of time: Date) -> Date {
        let date = civil(Int64((time.timeIntervalSince1970 / 86_400).rounded(.down)))
        return Date(timeIntervalSince1970: TimeInterval(daysFromCivil(year: date.year, month: date.month, day: 1) * 86_400))
    }
}
