import AttestWire
import Foundation
import Lifecycle
import Synchronization

/// Alerts before the money runs out. The ledger tells it each budget's use after every
/// recorded request (`observe`, on the request's thread: one dictionary write under a lock);
/// every `interval` it sets `attestd_budget_used_ratio` and, for each threshold a budget has
/// reached this period, records the crossing once: the fired row, one outbox row per endpoint
/// that asked for that threshold, and an audit row, in one transaction. Another instance that
/// sees the same crossing finds the row there and writes nothing, so each threshold fires once
/// per budget and period across instances and restarts.
///
/// `attestd_budget_used_ratio{scope, period, workspace, client_id}`: spent / budget as this
/// instance last saw it (every instance's flushed spend plus its own since). `scope` is
/// `workspace`, `integration` or `profile`; `period` `daily` or `monthly`; `client_id` is empty
/// for a workspace's budget. Profiles are not a label (there can be millions): a profile budget's
/// series is the highest ratio among the integration's profiles this period.
public final class BudgetAlerts: Service {
    public let name = "budget-alerts"
    /// Thresholds watched for every budget (the gauge and the audit log) when no endpoint asks for others.
    public static let defaultThresholds = WebhookEndpoint.defaultThresholds
    /// How long the endpoints' thresholds are cached: a webhook added applies within this.
    static let endpointsMaxAge: TimeInterval = 2

    struct Budget: Hashable {
        let key: String
        let periodKey: Int64
    }

    struct State {
        /// The latest use of each budget since the last check.
        var pending: [Budget: BudgetUse] = [:]
        /// The highest threshold known fired per budget and period (this instance's, or found
        /// already fired by another).
        var fired: [Budget: Int] = [:]
        /// Profile budgets' highest ratio per (scope, period, integration, period key), for the gauge.
        var profileRatios: [String: (periodKey: Int64, ratio: Double)] = [:]
    }

    let store: any WebhookStore
    let metrics: Metrics
    let interval: TimeInterval
    private let log: @Sendable (_ event: String, _ fields: [(String, Any)]) -> Void
    private let state = Mutex(State())
    private let endpoints = Mutex<(read: Date, byWorkspace: [Int64: [WebhookEndpoint]])>((.distantPast, [:]))
    private let timer = Mutex<PeriodicTask?>(nil)

    public init(store: any WebhookStore, metrics: Metrics, interval: TimeInterval = 0.5,
                log: @escaping @Sendable (_ event: String, _ fields: [(String, Any)]) -> Void = { _, _ in }) {
        self.store = store
        self.metrics = metrics
        self.interval = interval
        self.log = log
        metrics.describe("attestd_budget_used_ratio",
                         "Spent over budget, per budget in money (scope workspace|integration|profile, period daily|monthly, workspace, client_id; "
                         + "a profile budget's series is the highest among the integration's profiles).")
        metrics.describe("attestd_budget_thresholds_fired_total", "Budget thresholds this instance recorded as reached (each fires once per budget and period).")
    }

    /// The ledger's budget observer: the hot path's whole cost is this.
    public func observe(_ uses: [BudgetUse]) {
        state.withLock { state in
            for use in uses {
                let budget = Budget(key: Self.key(use), periodKey: use.periodKey)
                if let seen = state.pending[budget], seen.spentMicroUSD >= use.spentMicroUSD { continue }
                state.pending[budget] = use
            }
        }
    }

    /// `scope/period/workspace ID/client ID/profile`.
    static func key(_ use: BudgetUse) -> String {
        "\(use.scope.rawValue)/\(use.period.rawValue)/\(use.workspaceID)/\(use.scope == .workspace ? "" : use.clientID)/\(use.profile ?? "")"
    }

    /// The percent thresholds `use` has reached, ascending (spent × 100 ≥ threshold × budget, without overflow).
    static func reached(_ use: BudgetUse, of thresholds: [Int]) -> [Int] {
        guard use.budgetMicroUSD > 0 else { return [] }
        return thresholds.filter { threshold in
            let (spent, o1) = use.spentMicroUSD.multipliedReportingOverflow(by: 100)
            let (limit, o2) = use.budgetMicroUSD.multipliedReportingOverflow(by: Int64(threshold))
            if o1 || o2 { return Double(use.spentMicroUSD) * 100 >= Double(use.budgetMicroUSD) * Double(threshold) }
            return spent >= limit
        }
    }

    /// One pass: the gauge for each budget seen, then every threshold newly reached recorded.
    /// A use whose crossing could not be written stays pending for the next pass.
    public func check(at time: Date = Date()) {
        let uses = state.withLock { state -> [Budget: BudgetUse] in
            defer { state.pending = [:] }
            return state.pending
        }
        guard !uses.isEmpty else { return }
        let byWorkspace = currentEndpoints(at: time)
        var unwritten: [Budget: BudgetUse] = [:]
        for (budget, use) in uses {
            // The gauge after the thresholds: once it shows a budget, that budget's crossings were tried.
            defer { setGauge(use) }
            let endpoints = (byWorkspace[use.workspaceID] ?? []).filter { $0.events.contains(.budgetThreshold) }
            let thresholds = Array(Set(Self.defaultThresholds + endpoints.flatMap(\.thresholds))).sorted()
            let already = state.withLock { $0.fired[budget] ?? 0 }
            for threshold in Self.reached(use, of: thresholds) where threshold > already {
                let crossing = Self.crossing(use, budget: budget, threshold: threshold, at: time,
                                             endpoints: endpoints.filter { $0.thresholds.contains(threshold) })
                do {
                    if try store.recordBudgetCrossing(crossing) {
                        metrics.increment("attestd_budget_thresholds_fired_total")
                        log("budget_threshold_reached", [("budget", budget.key), ("threshold", threshold), ("deliveries", crossing.deliveries.count)])
                    }
                    state.withLock { $0.fired[budget] = max($0.fired[budget] ?? 0, threshold) }
                } catch {
                    log("budget_threshold_write_failed", [("budget", budget.key), ("error", "\(error)")])
                    unwritten[budget] = use
                    break
                }
            }
        }
        state.withLock { state in
            for (budget, use) in unwritten where state.pending[budget] == nil { state.pending[budget] = use }
            // Periods that ended are forgotten: a budget's key repeats only with a newer period.
            let current = Set(uses.keys.map(\.periodKey))
            if state.fired.count > 10_000 { state.fired = state.fired.filter { current.contains($0.key.periodKey) } }
        }
    }

    private func setGauge(_ use: BudgetUse) {
        var ratio = use.usedRatio
        if use.scope == .profile {
            let series = "\(use.period.rawValue)/\(use.clientID)"
            ratio = state.withLock { state in
                let seen = state.profileRatios[series]
                let highest = seen.map { $0.periodKey == use.periodKey ? max($0.ratio, ratio) : ratio } ?? ratio
                state.profileRatios[series] = (use.periodKey, highest)
                return highest
            }
        }
        metrics.set("attestd_budget_used_ratio", ratio, labels: [("scope", use.scope.rawValue), ("period", use.period.rawValue),
                                                                 ("workspace", use.workspaceName), ("client_id", use.scope == .workspace ? "" : use.clientID)])
    }

    /// The crossing's rows: the event body each endpoint gets (the same for all, each its own ID).
    static func crossing(_ use: BudgetUse, budget: Budget, threshold: Int, at time: Date, endpoints: [WebhookEndpoint]) -> BudgetCrossing {
        let period = use.period == .daily ? UsageClock.dayText(use.periodKey * 86_400)
            : "\(use.periodKey / 100)-" + (use.periodKey % 100 < 10 ? "0" : "") + "\(use.periodKey % 100)"
        let deliveries = endpoints.map { endpoint -> WebhookOutboxRow in
            let id = WebhookOutboxRow.newID()
            let data: [(String, Any)] = [
                ("workspace", use.workspaceName), ("client_id", use.scope == .workspace ? NSNull() : use.clientID as Any),
                ("user_profile", use.profile.map { $0 as Any } ?? NSNull()), ("scope", use.scope.rawValue), ("period", use.period.rawValue),
                ("period_start", period), ("threshold_percent", threshold), ("budget_micro_usd", use.budgetMicroUSD),
                ("spent_micro_usd", use.spentMicroUSD), ("used_ratio", (use.usedRatio * 10_000).rounded() / 10_000),
            ]
            let body = JSONText.object([("id", id), ("type", WebhookEvent.budgetThreshold.rawValue),
                                        ("created_at", Int64(time.timeIntervalSince1970)), ("data", data)])
            return WebhookOutboxRow(id: id, endpointID: endpoint.id, event: .budgetThreshold, body: body)
        }
        let whose = switch use.scope {
        case .workspace: "workspace \(use.workspaceName)"
        case .integration: "integration \(use.clientID)"
        case .profile: "profile \(use.profile ?? "") of \(use.clientID)"
        }
        let detail = "\(whose) \(use.period.rawValue) budget \(MoneyText.usd(use.budgetMicroUSD)) for \(period): \(threshold)% reached "
            + "(\(MoneyText.usd(use.spentMicroUSD)) spent); \(deliveries.count) webhook deliveries"
        return BudgetCrossing(budget: budget.key, periodKey: budget.periodKey, threshold: threshold, at: time,
                              clientID: use.scope == .workspace ? nil : use.clientID, detail: detail, deliveries: deliveries)
    }

    /// The live endpoints by workspace, read again once `endpointsMaxAge` has passed (kept as they
    /// were when the read fails: alerts still fire, to the endpoints known).
    private func currentEndpoints(at time: Date) -> [Int64: [WebhookEndpoint]] {
        let cached = endpoints.withLock { $0 }
        guard time.timeIntervalSince(cached.read) >= Self.endpointsMaxAge else { return cached.byWorkspace }
        do {
            let fresh = Dictionary(grouping: try store.webhookEndpoints(workspaceID: nil), by: \.workspaceID)
            endpoints.withLock { $0 = (time, fresh) }
            return fresh
        } catch {
            log("webhook_endpoints_unreadable", [("error", "\(error)")])
            return cached.byWorkspace
        }
    }

    // MARK: Service

    public func start() throws {
        let task = PeriodicTask("budget-alerts", every: interval) { [weak self] in self?.check() }
        timer.withLock { $0 = task }
        task.start()
    }

    public func run() throws { try timer.withLock { $0 }?.run() }

    /// A last pass, so that a crossing seen just before the stop is recorded (its deliveries then
    /// wait in the outbox for the next start or another instance).
    public func stop(by deadline: ContinuousClock.Instant) {
        timer.withLock { $0 }?.stop(by: deadline)
        check()
    }
}
