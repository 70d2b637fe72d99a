import AttestCrypto
import AttestWire
import Foundation
import Lifecycle
import Synchronization
// What the policy reads from a request and the usage the ledger records are read from the
// Messages JSON by MessagesBody, which defines them; they are this module's API too.
@_exported import enum MessagesBody.FallbacksInput
@_exported import struct MessagesBody.PolicyInput
@_exported import struct MessagesBody.ServerToolInput
@_exported import struct MessagesBody.TokenUsage

/// Why the policy refused a request before it went upstream.
public enum PolicyRefusal: Error, Sendable, Equatable {
    /// The request is malformed in a field the relay governs (`fallbacks`, `tools`, `max_uses`, the
    /// profile header): refused whatever the policy, since the relay cannot tell what it would spend.
    case malformed(String)
    /// The body's `model` or `max_tokens` could not be read (malformed, duplicated, not an integer).
    case unreadableBody(String)
    case modelNotAllowed(String)
    /// A `fallbacks[].model` not on the integration's list.
    case fallbackNotAllowed(String)
    /// `fallbacks: "default"` under a model list: nobody can say which model would serve.
    case defaultFallbackNotAllowed
    case maxTokensOverLimit(requested: Int, limit: Int)
    /// A server tool (its `type`) the integration does not allow.
    case serverToolNotAllowed(String)
    /// A server tool without `max_uses`, or with more than the integration's cap.
    case serverToolUsesOverLimit(type: String, requested: Int?, limit: Int)
    case betaNotAllowed(String)
    case deviceRateLimited(limit: Int, retryAfter: Int)
    case profileRateLimited(limit: Int, retryAfter: Int)
    case monthlyBudgetSpent(budget: Int, retryAfter: Int)
    case profileBudgetSpent(budget: Int, retryAfter: Int)
    /// The profile's recorded usage could not be read: its limits cannot be checked.
    case limitsUnavailable(String)
    /// A budget in money (the workspace's, the integration's or the profile's) is spent.
    case moneyBudgetSpent(MoneyBudgetRefusal)

    /// The `reason` in the ledger, the metrics and the log.
    public var reason: String {
        switch self {
        case .malformed: "malformed_request"
        case .unreadableBody: "unreadable_body"
        case .modelNotAllowed: "model_not_allowed"
        case .fallbackNotAllowed, .defaultFallbackNotAllowed: "fallback_not_allowed"
        case .maxTokensOverLimit: "max_tokens_over_limit"
        case .serverToolNotAllowed: "server_tool_not_allowed"
        case .serverToolUsesOverLimit: "server_tool_uses_over_limit"
        case .betaNotAllowed: "beta_not_allowed"
        case .deviceRateLimited: "device_rate_limited"
        case .profileRateLimited: "profile_rate_limited"
        case .monthlyBudgetSpent: "monthly_budget_spent"
        case .profileBudgetSpent: "profile_budget_spent"
        case .limitsUnavailable: "limits_unavailable"
        case .moneyBudgetSpent(let budget): budget.reason
        }
    }
}

extension ServerToolInput {
    /// The name on the policy's list (`web_search`), when the type is one of `IntegrationPolicy.serverToolNames`.
    public var name: String? { IntegrationPolicy.serverToolNames.first { type.utf8.starts(with: $0.utf8) } }
}

/// A relayed request the ledger admitted: where its usage goes when it ends.
public struct UsageTicket: Sendable {
    let clientID: String
    let hour: Int64
    public let month: MonthKey
    /// The model as sent, and whether the integration's list names it (then it may enter the
    /// ledger whatever the upstream answers; otherwise only as the model that served).
    let requestedModel: String?
    let requestedModelListed: Bool
    /// The profile as sent, and its ledger label (folded into `other` past the hour's cap).
    let profile: String?
    let profileLabel: String
    /// How its cost is priced and whose spend it counts in.
    var spending: Spending?
}

/// What the ledger needs to price a request and count its cost against every budget it falls
/// under: the table in force when it was admitted, and one slot per scope and period.
struct Spending: Sendable {
    struct Slot: Sendable {
        let scope: BudgetScope
        let period: BudgetPeriod
        let key: SpendKey
        let budget: Int64
        /// Flushed spend as the admission read it, and the commit count before that read.
        let recorded: Int64
        let commitsBeforeRead: Int
    }
    let workspaceID: Int64
    let workspaceName: String
    let table: PriceTable
    var slots: [Slot]
}

extension TokenUsage {
    /// Every kind of token: what a token budget counts (cache writes and reads are input too).
    public var totalTokens: Int64 {
        Int64.saturatingSum(Int64.saturatingSum(inputTokens, outputTokens), Int64.saturatingSum(cacheCreationInputTokens, cacheReadInputTokens))
    }
}

/// How a relayed request ended.
public struct RelayOutcome: Sendable {
    /// The status the client got (an upstream status, or 502/504 when it could not be reached).
    public var status: Int
    public var usage: TokenUsage
    /// Cut short (client gone, upstream interrupted, stream without `message_stop`): recorded with what was seen.
    public var incomplete: Bool
    /// A non-streamed reply the client left before it came, read to its end for its usage.
    public var abandoned: Bool
    /// The model that served, as the reply says (its `model`, or the last `fallback` block's `to.model`).
    public var servingModel: String?
    /// The label of the upstream of the workspace's list that answered (nil: none was tried),
    /// and whether an earlier one failed first.
    public var upstream: String?
    public var failedOver = false
    /// Whether the upstream that answered charges the regional uplift (`UsageLedger.regional`).
    public var regional: Bool

    public init(status: Int, usage: TokenUsage, incomplete: Bool, abandoned: Bool = false, servingModel: String? = nil,
                upstream: String? = nil, failedOver: Bool = false, regional: Bool = false) {
        self.upstream = upstream
        self.failedOver = failedOver
        self.regional = regional
        self.status = status
        self.usage = usage
        self.incomplete = incomplete
        self.abandoned = abandoned
        self.servingModel = servingModel
    }
}

/// The usage ledger and the per-integration policy. Requests are counted in memory and flushed
/// as one transaction every `flushInterval` (and at shutdown), so the hot path adds no commit;
/// a `kill -9` loses at most the last interval. The limits read what every instance has flushed
/// (from the token check's own query) plus what this one holds unflushed, so across instances
/// they are exact to within one flush interval, and within one instance exact.
public final class UsageLedger: Service {
    public let name = "usage-ledger"
    /// Distinct model names kept per integration and hour; more fold into `other`, so an app
    /// sending random model names cannot grow the ledger without bound.
    public static let modelsPerIntegrationHour = 64
    /// Distinct user profiles kept per integration and hour; more fold into `other`.
    public static let profilesPerIntegrationHour = 256
    /// Committed batches kept for requests whose database read spans them: one flush a second,
    /// so a read would have to take this many seconds to miss one.
    static let flushedBatchesKept = 8

    struct HourOfIntegration: Hashable {
        let clientID: String
        let hour: Int64
    }

    struct State {
        var pending = UsageBatch()
        /// The batch being written now (still counted by the limits until it is committed).
        var flushing: UsageBatch?
        /// The batches committed last, each with the count of commits it made (`commits`): a
        /// request whose database read began before a commit may not have seen it, so it counts
        /// every batch committed since. Several, for a read slow enough to span more than one flush.
        var recentlyFlushed: [(commit: Int, batch: UsageBatch)] = []
        var modelsSeen: [HourOfIntegration: Set<String>] = [:]
        var profilesSeen: [HourOfIntegration: Set<String>] = [:]

        /// What this instance counted for `key` that a database read made after `commits` commits
        /// may not have seen: the pending batch, the one being written, and those committed since.
        /// Empty tables are skipped before hashing: the keys hold a client ID and a key ID, and
        /// outside a flush only `pending` has entries.
        func unflushed<K: Hashable>(_ table: KeyPath<UsageBatch, [K: Int64]>, _ key: K, since commits: Int) -> Int64 {
            func count(_ batch: UsageBatch?) -> Int64 {
                guard let entries = batch?[keyPath: table], !entries.isEmpty else { return 0 }
                return entries[key, default: 0]
            }
            return recentlyFlushed.reduce(Int64.saturatingSum(count(pending), count(flushing))) {
                Int64.saturatingSum($0, $1.commit > commits ? count($1.batch) : 0)
            }
        }
    }

    let store: UsageStore
    let metrics: Metrics
    /// Refusals and would-be refusals by rule (the device exchange counts into it too); taken
    /// into each flush's batch.
    public let ruleTally: PolicyRuleTally
    /// The price tables in force, per workspace: each recorded request's cost comes from it.
    public let prices: PriceBook
    /// Told each budget's use after every recorded request that cost something (the threshold
    /// alerts); called outside the ledger's lock, on the thread that ended the request.
    /// In a class: a closure kept in a Mutex directly is re-thunked by every `withLock` that
    /// reads it through `inout`, and the chain of thunks grew with every request (measured:
    /// 20× the relay's CPU per request after a minute).
    private final class BudgetObserver: Sendable {
        let call: @Sendable ([BudgetUse]) -> Void
        init(_ call: @escaping @Sendable ([BudgetUse]) -> Void) { self.call = call }
    }
    private let budgetObserver = Mutex<BudgetObserver?>(nil)
    private let budgetObserved = Atomic<Bool>(false)

    /// Whole percent of `budget` that `spent` is (saturating; `budget` above 0).
    static func percent(_ spent: Int64, of budget: Int64) -> Int64 {
        let (scaled, overflow) = max(0, spent).multipliedReportingOverflow(by: 100)
        return overflow ? Int64.max / budget : scaled / budget
    }

    /// Sets the function told each budget's use (`BudgetUse`, budgets that are on only) after every
    /// recorded request that crossed a whole percent of it: the threshold alerts. Called outside the
    /// ledger's lock, on the thread that ended the request; it must not block.
    public func observeBudgets(_ observer: @escaping @Sendable ([BudgetUse]) -> Void) {
        budgetObserver.withLock { $0 = BudgetObserver(observer) }
        budgetObserved.store(true, ordering: .releasing)
    }
    let flushInterval: TimeInterval
    private let report: @Sendable (String) -> Void
    private let state = Mutex(State())
    /// Flushes committed so far; changed under `state`'s lock, read without it on every request.
    private let commits = Atomic<Int>(0)
    /// One flush at a time (the timer's and the final one).
    private let flushLock = Mutex(())
    /// The periodic flush, while it runs.
    private let timer = Mutex<PeriodicTask?>(nil)

    public init(store: UsageStore, metrics: Metrics, flushInterval: TimeInterval = 1, ruleTally: PolicyRuleTally = PolicyRuleTally(),
                prices: PriceBook = PriceBook(store: nil), report: @escaping @Sendable (String) -> Void = { _ in }) {
        self.store = store
        self.metrics = metrics
        self.ruleTally = ruleTally
        self.prices = prices
        self.flushInterval = flushInterval
        self.report = report
        metrics.describe("attestd_upstream_tokens_total", "Tokens the upstream reported in relayed replies, by kind.")
        metrics.describe("attestd_policy_refusals_total", "Messages requests the integration's policy refused, by reason.")
        metrics.describe("attestd_policy_would_refuse_total", "Messages requests a monitored rule of the integration's policy would have refused, by rule.")
        metrics.describe("attestd_usage_flush_failures_total", "Usage flushes the store refused (the batch is kept and retried).")
    }

    /// The commit count to read before the token check's database query (see `admit`).
    public var commitCount: Int { commits.load(ordering: .acquiring) }

    // MARK: Policy

    /// Applies the grant's policy to the request. When admitted, the request counts against the
    /// device's (and its profile's) per-minute limit at once, so concurrent requests cannot all
    /// slip under it.
    /// - Parameters:
    ///   - commitsBeforeRead: `commitCount` taken before the query that produced `grant`.
    public func admit(_ grant: TokenGrant, _ input: PolicyInput, commitsBeforeRead: Int, at time: Date) -> Result<UsageTicket, PolicyRefusal> {
        let policy = grant.policy
        var watched: [PolicyRefusal] = []
        defer { if !watched.isEmpty { wouldRefuse(watched, grant, at: time) } }
        if let refusal = Self.requestRefusal(policy, input, watched: &watched) { return refuse(refusal, grant, input, at: time) }
        // A profile's limits read what every instance flushed for it: one read by key, only when they are on.
        var recordedProfile = RecordedProfileUsage()
        var commitsBeforeProfileRead = commitsBeforeRead
        let month = MonthKey(clientID: grant.clientID, month: UsageClock.month(time))
        let minute = UsageClock.minute(time)
        if let profile = input.profile, policy.readsProfileUsage {
            commitsBeforeProfileRead = commitCount
            do {
                recordedProfile = try store.recordedProfileUsage(clientID: grant.clientID, profile: profile, month: month.month, minute: minute)
            } catch {
                report("a profile's recorded usage could not be read: \(error)")
                return refuse(.limitsUnavailable("\(error)"), grant, input, at: time)
            }
        }
        let spending = spending(grant, input, recordedProfile, commitsBeforeProfileRead: commitsBeforeProfileRead,
                                commitsBeforeRead: commitsBeforeRead, at: time)
        let hour = UsageClock.hour(time)
        let thisMinute = DeviceMinuteKey(clientID: grant.clientID, keyID: grant.keyID, minute: minute)
        let lastMinute = DeviceMinuteKey(clientID: grant.clientID, keyID: grant.keyID, minute: minute - 1)
        let outcome: Result<UsageTicket, PolicyRefusal> = state.withLock { state in
            if policy.deviceRequestsPerMinute > 0 {
                let current = grant.recorded.deviceRequestsThisMinute + state.unflushed(\.deviceMinutes, thisMinute, since: commitsBeforeRead)
                let previous = grant.recorded.deviceRequestsLastMinute + state.unflushed(\.deviceMinutes, lastMinute, since: commitsBeforeRead)
                if let retry = Self.slidingWindowRetry(current: current, previous: previous, limit: policy.deviceRequestsPerMinute, at: time),
                   let refusal = Self.enforced(.deviceRateLimited(limit: policy.deviceRequestsPerMinute, retryAfter: retry), policy, &watched) {
                    return .failure(refusal)
                }
            }
            let profileMinute = input.profile.map { ProfileMinuteKey(clientID: grant.clientID, profile: $0, minute: minute) }
            if let profileMinute, policy.profileRequestsPerMinute > 0 {
                let previousKey = ProfileMinuteKey(clientID: grant.clientID, profile: profileMinute.profile, minute: minute - 1)
                let current = recordedProfile.requestsThisMinute + state.unflushed(\.profileMinutes, profileMinute, since: commitsBeforeProfileRead)
                let previous = recordedProfile.requestsLastMinute + state.unflushed(\.profileMinutes, previousKey, since: commitsBeforeProfileRead)
                if let retry = Self.slidingWindowRetry(current: current, previous: previous, limit: policy.profileRequestsPerMinute, at: time),
                   let refusal = Self.enforced(.profileRateLimited(limit: policy.profileRequestsPerMinute, retryAfter: retry), policy, &watched) {
                    return .failure(refusal)
                }
            }
            if input.spendsTokens {
                let renews = { max(1, Int(UsageClock.nextMonthStart(after: time).timeIntervalSince(time).rounded(.up))) }
                if policy.monthlyTokenBudget > 0,
                   Int64.saturatingSum(grant.recorded.monthTokens, state.unflushed(\.monthTokens, month, since: commitsBeforeRead)) >= Int64(policy.monthlyTokenBudget),
                   let refusal = Self.enforced(.monthlyBudgetSpent(budget: policy.monthlyTokenBudget, retryAfter: renews()), policy, &watched) {
                    return .failure(refusal)
                }
                if let profile = input.profile, policy.profileMonthlyTokenBudget > 0 {
                    let key = ProfileMonthKey(clientID: grant.clientID, profile: profile, month: month.month)
                    if Int64.saturatingSum(recordedProfile.monthTokens, state.unflushed(\.profileMonthTokens, key, since: commitsBeforeProfileRead))
                        >= Int64(policy.profileMonthlyTokenBudget),
                       let refusal = Self.enforced(.profileBudgetSpent(budget: policy.profileMonthlyTokenBudget, retryAfter: renews()), policy, &watched) {
                        return .failure(refusal)
                    }
                }
            }
            if input.spendsTokens {
                for slot in spending.slots where slot.budget > 0 {
                    guard Int64.saturatingSum(slot.recorded, state.unflushed(\.spend, slot.key, since: slot.commitsBeforeRead)) >= slot.budget else { continue }
                    let refusal = PolicyRefusal.moneyBudgetSpent(MoneyBudgetRefusal(scope: slot.scope, period: slot.period, budgetMicroUSD: slot.budget,
                                                                                    retryAfter: slot.period.secondsToRenewal(from: time)))
                    if let enforced = Self.enforced(refusal, policy, &watched) { return .failure(enforced) }
                }
            }
            state.pending.deviceMinutes[thisMinute, default: 0] += 1
            if let profileMinute, policy.profileRequestsPerMinute > 0 { state.pending.profileMinutes[profileMinute, default: 0] += 1 }
            let profileLabel = Self.profileLabel(input.profile, clientID: grant.clientID, hour: hour, seen: &state.profilesSeen)
            return .success(UsageTicket(clientID: grant.clientID, hour: hour, month: month, requestedModel: input.model,
                                        requestedModelListed: input.model.map { policy.models?.contains($0) ?? false } ?? false,
                                        profile: input.profile, profileLabel: profileLabel, spending: spending))
        }
        if case .failure(let refusal) = outcome { return refuse(refusal, grant, input, at: time) }
        return outcome
    }

    /// The request's price table and budget slots: the workspace's, the integration's and (with
    /// a profile) the profile's, daily and monthly, each with the spend its read found.
    private func spending(_ grant: TokenGrant, _ input: PolicyInput, _ recordedProfile: RecordedProfileUsage, commitsBeforeProfileRead: Int,
                          commitsBeforeRead: Int, at time: Date) -> Spending {
        let policy = grant.policy
        let day = UsageClock.day(time), month = UsageClock.month(time)
        func slot(_ scope: BudgetScope, _ period: BudgetPeriod, _ name: String, _ budget: Int64, _ recorded: Int64, _ commits: Int) -> Spending.Slot {
            Spending.Slot(scope: scope, period: period, key: SpendKey(scope: name, period: period == .daily ? day : month), budget: budget,
                          recorded: recorded, commitsBeforeRead: commits)
        }
        let workspace = SpendKey.workspace(grant.workspaceID), integration = SpendKey.integration(grant.clientID)
        var slots = [slot(.workspace, .daily, workspace, grant.workspaceBudget.dailyMicroUSD, grant.recorded.workspaceDaySpend, commitsBeforeRead),
                     slot(.workspace, .monthly, workspace, grant.workspaceBudget.monthlyMicroUSD, grant.recorded.workspaceMonthSpend, commitsBeforeRead),
                     slot(.integration, .daily, integration, policy.dailyBudgetMicroUSD, grant.recorded.daySpend, commitsBeforeRead),
                     slot(.integration, .monthly, integration, policy.monthlyBudgetMicroUSD, grant.recorded.monthSpend, commitsBeforeRead)]
        if let profile = input.profile {
            let name = SpendKey.profile(grant.clientID, profile)
            slots.append(slot(.profile, .daily, name, policy.profileDailyBudgetMicroUSD, recordedProfile.daySpend, commitsBeforeProfileRead))
            slots.append(slot(.profile, .monthly, name, policy.profileMonthlyBudgetMicroUSD, recordedProfile.monthSpend, commitsBeforeProfileRead))
        }
        return Spending(workspaceID: grant.workspaceID, workspaceName: grant.workspaceName,
                        table: prices.table(workspaceID: grant.workspaceID, pricesAt: grant.pricesAt), slots: slots)
    }

    /// Whether an upstream serves the model from a regional endpoint, which costs more
    /// than the global one: Vertex AI at any location but `global`, Bedrock with any model ID
    /// that is not a `global.` inference profile. The Anthropic API has no such uplift.
    public static func regional(_ upstream: SealedUpstreamKey?, model: String?) -> Bool {
        guard let upstream, let settings = upstream.settings else { return false }
        switch upstream.kind {
        // Foundry, Claude Platform on AWS and Bedrock's compatible APIs publish no regional
        // uplift of their own in the table's source: priced as the Anthropic API.
        case .anthropic, .compatible: return false
        case .vertex: return settings.region != "global"
        case .bedrock: return !(model.flatMap { settings.models[$0] }?.hasPrefix("global.") ?? false)
        }
    }

    /// What the request itself asks that the policy refuses (its shape, models, fallbacks,
    /// max_tokens, server tools, betas), before any count is read. Nil: admitted so far.
    public static func requestRefusal(_ policy: IntegrationPolicy, _ input: PolicyInput) -> PolicyRefusal? {
        var watched: [PolicyRefusal] = []
        return requestRefusal(policy, input, watched: &watched)
    }

    /// The same, each monitored rule's refusal added to `watched` (at most one per rule) instead
    /// of returned: the request then goes on as if that rule were absent.
    public static func requestRefusal(_ policy: IntegrationPolicy, _ input: PolicyInput, watched: inout [PolicyRefusal]) -> PolicyRefusal? {
        if let malformed = input.malformed { return .malformed(malformed) }
        let readsBody = policy.models != nil || policy.maxTokens > 0 || policy.serverTools != nil || policy.maxServerToolUses > 0
        if readsBody, let problem = input.problem { return .unreadableBody(problem) }
        if let models = policy.models {
            let refusal: PolicyRefusal? = if let model = input.model, models.contains(model) {
                switch input.fallbacks {
                case .none: nil
                case .serverDefault: .defaultFallbackNotAllowed
                case .models(let fallbacks): fallbacks.first(where: { !models.contains($0) }).map { .fallbackNotAllowed($0) }
                }
            } else {
                .modelNotAllowed(input.model ?? "")
            }
            if let refusal, let enforced = enforced(refusal, policy, &watched) { return enforced }
        }
        if policy.maxTokens > 0, let requested = input.maxTokens, requested > policy.maxTokens,
           let enforced = enforced(.maxTokensOverLimit(requested: requested, limit: policy.maxTokens), policy, &watched) {
            return enforced
        }
        for tool in input.serverTools {
            if let allowed = policy.serverTools, !(tool.name.map(allowed.contains) ?? false),
               let enforced = enforced(.serverToolNotAllowed(tool.type), policy, &watched) {
                return enforced
            }
            if policy.maxServerToolUses > 0, (tool.maxUses ?? Int.max) > policy.maxServerToolUses,
               let enforced = enforced(.serverToolUsesOverLimit(type: tool.type, requested: tool.maxUses, limit: policy.maxServerToolUses), policy, &watched) {
                return enforced
            }
        }
        if let betas = policy.betas, let refused = input.betas.first(where: { !betas.contains($0) }),
           let enforced = enforced(.betaNotAllowed(refused), policy, &watched) {
            return enforced
        }
        return nil
    }

    /// The refusal when its rule is enforced; nil when the rule is monitored, the refusal then
    /// noted in `watched` (once per rule: a request is counted once by each rule it trips).
    static func enforced(_ refusal: PolicyRefusal, _ policy: IntegrationPolicy, _ watched: inout [PolicyRefusal]) -> PolicyRefusal? {
        guard !policy.monitored.isEmpty, let rule = PolicyRule(refusal), policy.monitored.contains(rule) else { return refusal }
        if !watched.contains(where: { PolicyRule($0) == rule }) { watched.append(refusal) }
        return nil
    }

    /// Counts what monitored rules would have refused (by rule and day) and in the metrics; the
    /// tally logs the first of each rule per flush.
    private func wouldRefuse(_ watched: [PolicyRefusal], _ grant: TokenGrant, at time: Date) {
        for refusal in watched {
            guard let rule = PolicyRule(refusal) else { continue }
            ruleTally.count(clientID: grant.clientID, rule: rule, monitored: true, reason: refusal.reason, detail: "\(refusal)", at: time)
            metrics.increment("attestd_policy_would_refuse_total", labels: [("rule", rule.rawValue)])
        }
    }

    /// Counts the refusal in the ledger (by reason, not as a request) and in the metrics. Its row's
    /// model is the one asked for only when the integration lists it, otherwise `refused`: a
    /// request that went nowhere mints no model name.
    private func refuse(_ refusal: PolicyRefusal, _ grant: TokenGrant, _ input: PolicyInput, at time: Date) -> Result<UsageTicket, PolicyRefusal> {
        let hour = UsageClock.hour(time)
        let model = input.model.flatMap { model in grant.policy.models?.contains(model) == true ? model : nil } ?? "refused"
        state.withLock { state in
            let profile = Self.profileLabel(input.profile, clientID: grant.clientID, hour: hour, seen: &state.profilesSeen)
            state.pending.usage[UsageKey(clientID: grant.clientID, model: model, hour: hour, profile: profile), default: UsageCounters()]
                .refusals[refusal.reason, default: 0] += 1
        }
        metrics.increment("attestd_policy_refusals_total", labels: [("reason", refusal.reason)])
        if let rule = PolicyRule(refusal) {
            ruleTally.count(clientID: grant.clientID, rule: rule, monitored: false, reason: refusal.reason, detail: "\(refusal)", at: time)
        }
        return .failure(refusal)
    }

    /// The ledger's name for a model the upstream confirmed (it served, or accepted the request):
    /// the ID as sent when it looks like one, `invalid` when it does not, `other` past the per-hour cap.
    static func modelLabel(_ model: String, clientID: String, hour: Int64, seen: inout [HourOfIntegration: Set<String>]) -> String {
        guard IntegrationPolicy.isValidModelID(model) else { return "invalid" }
        return capped(model, HourOfIntegration(clientID: clientID, hour: hour), modelsPerIntegrationHour, &seen)
    }

    /// The ledger's name for a profile: `""` for none, `other` past the per-hour cap.
    static func profileLabel(_ profile: String?, clientID: String, hour: Int64, seen: inout [HourOfIntegration: Set<String>]) -> String {
        guard let profile else { return "" }
        return capped(profile, HourOfIntegration(clientID: clientID, hour: hour), profilesPerIntegrationHour, &seen)
    }

    private static func capped(_ name: String, _ slot: HourOfIntegration, _ cap: Int, _ seen: inout [HourOfIntegration: Set<String>]) -> String {
        if seen[slot]?.contains(name) == true { return name }
        guard seen[slot, default: []].count < cap else { return "other" }
        seen[slot, default: []].insert(name)
        return name
    }

    /// Seconds until one more request fits a sliding one-minute window, or nil if it fits now. The
    /// window is estimated from two fixed minutes (constant memory per device): the last one's
    /// requests spread evenly over it, this one's over the part of it that has passed. Whether
    /// one more fits now is exact to that estimate, and never lets more than the limit into a
    /// fixed minute. The wait is at most 60 s: every request counted happened by now, so a minute
    /// from now the window holds none of them.
    public static func slidingWindowRetry(current: Int64, previous: Int64, limit: Int, at time: Date) -> Int? {
        let intoMinute = time.timeIntervalSince1970 - (time.timeIntervalSince1970 / 60).rounded(.down) * 60
        /// Requests still inside the window `wait` seconds from now.
        func estimate(after wait: Double) -> Double {
            // The window then starts `wait - (60 - intoMinute)` seconds into this minute.
            let intoThisMinute = wait - (60 - intoMinute)
            if intoThisMinute <= 0 { return Double(previous) * (-intoThisMinute / 60) + Double(current) }
            guard intoMinute > 0, intoThisMinute < intoMinute else { return 0 }
            return Double(current) * (intoMinute - intoThisMinute) / intoMinute
        }
        guard estimate(after: 0) + 1 > Double(limit) else { return nil }
        for wait in 1..<60 where estimate(after: Double(wait)) + 1 <= Double(limit) { return wait }
        return 60
    }

    // MARK: Recording

    /// Records how an admitted request ended: one request, its tokens and server-tool counts, its
    /// error status, whether it was cut short. The row's model is the one that served (the reply
    /// says which); a request the upstream refused or never answered is kept under the model asked
    /// for only when the integration lists it, otherwise under `unknown`.
    public func finish(_ ticket: UsageTicket, _ outcome: RelayOutcome) {
        let usage = outcome.usage
        let uses: [BudgetUse] = state.withLock { state in
            let confirmed = outcome.status < 400 ? (outcome.servingModel ?? ticket.requestedModel) : nil
            let model: String = if let confirmed, ticket.requestedModelListed, confirmed == ticket.requestedModel {
                confirmed   // a listed name needs no cap
            } else if let confirmed {
                Self.modelLabel(confirmed, clientID: ticket.clientID, hour: ticket.hour, seen: &state.modelsSeen)
            } else if ticket.requestedModelListed, let requested = ticket.requestedModel {
                requested
            } else {
                "unknown"
            }
            // Priced by the model that served, under its own name (the row's may be `other`).
            // The uplift is the served upstream's (after a failover, not the workspace's own).
            let cost = ticket.spending.map { $0.table.cost(model: confirmed ?? model, usage: usage, regional: outcome.regional) } ?? 0
            // Updated in place: one lookup of the key, and no copy of the counters' tables.
            func record(_ counters: inout UsageCounters) {
                counters.requests &+= 1
                counters.inputTokens.saturatingAdd(usage.inputTokens)
                counters.outputTokens.saturatingAdd(usage.outputTokens)
                counters.cacheCreationInputTokens.saturatingAdd(usage.cacheCreationInputTokens)
                counters.cacheReadInputTokens.saturatingAdd(usage.cacheReadInputTokens)
                counters.cacheCreation1hInputTokens.saturatingAdd(usage.cacheCreation1hInputTokens)
                counters.costMicroUSD.saturatingAdd(cost)
                for (name, count) in usage.serverToolUse where count > 0 { counters.serverToolUse[name, default: 0].saturatingAdd(count) }
                if outcome.incomplete { counters.incomplete += 1 }
                if outcome.abandoned { counters.abandoned += 1 }
                // 499: the client left before an answer; that is `incomplete`, not an upstream error.
                if outcome.status >= 400 && outcome.status != 499 { counters.errors[outcome.status, default: 0] += 1 }
            }
            record(&state.pending.usage[UsageKey(clientID: ticket.clientID, model: model, hour: ticket.hour, profile: ticket.profileLabel),
                                        default: UsageCounters()])
            if let upstream = outcome.upstream {
                state.pending.upstreams[UpstreamUsageKey(clientID: ticket.clientID, hour: ticket.hour, upstream: upstream), default: UpstreamUsageCounters()]
                    += UpstreamUsageCounters(requests: 1, inputTokens: usage.inputTokens, outputTokens: usage.outputTokens,
                                             cacheCreationInputTokens: usage.cacheCreationInputTokens, cacheReadInputTokens: usage.cacheReadInputTokens,
                                             failovers: outcome.failedOver ? 1 : 0, costMicroUSD: cost)
            }
            // Cache writes and reads are input too: counted apart by the API (and priced apart), but
            // leaving them out would let a request move its input out of the budget with `cache_control`.
            let spent = usage.totalTokens
            if spent > 0 {
                state.pending.monthTokens[ticket.month, default: 0].saturatingAdd(spent)
                // Only a profile the upstream billed gets a month row: an invented one never does.
                if let profile = ticket.profile {
                    state.pending.profileMonthTokens[ProfileMonthKey(clientID: ticket.clientID, profile: profile, month: ticket.month.month),
                                                     default: 0].saturatingAdd(spent)
                }
            }
            guard cost > 0, let spending = ticket.spending else { return [] }
            for slot in spending.slots { state.pending.spend[slot.key, default: 0].saturatingAdd(cost) }
            guard budgetObserved.load(ordering: .relaxed) else { return [] }
            return spending.slots.compactMap { slot -> BudgetUse? in
                guard slot.budget > 0 else { return nil }
                let spent = Int64.saturatingSum(slot.recorded, state.unflushed(\.spend, slot.key, since: slot.commitsBeforeRead))
                // Told only when the use crosses a whole percent of the budget (thresholds are
                // whole percents): the alerts see every crossing, and most requests cost nothing more.
                guard Self.percent(spent, of: slot.budget) != Self.percent(spent - cost, of: slot.budget) else { return nil }
                return BudgetUse(scope: slot.scope, period: slot.period, periodKey: slot.key.period, workspaceID: spending.workspaceID,
                                 workspaceName: spending.workspaceName, clientID: ticket.clientID,
                                 profile: slot.scope == .profile ? ticket.profile : nil, budgetMicroUSD: slot.budget, spentMicroUSD: spent)
            }
        }
        if !uses.isEmpty, let observer = budgetObserver.withLock({ $0 }) { observer.call(uses) }
        var counts: [(labels: [(String, String)], value: Double)] = []
        for (labels, value) in zip(Self.tokenKindLabels, [usage.inputTokens, usage.outputTokens, usage.cacheCreationInputTokens, usage.cacheReadInputTokens])
        where value > 0 {
            counts.append((labels, Double(value)))
        }
        if !counts.isEmpty { metrics.increment("attestd_upstream_tokens_total", each: counts) }
    }

    private static let tokenKindLabels: [[(String, String)]] = [[("kind", "input")], [("kind", "output")],
                                                                [("kind", "cache_creation_input")], [("kind", "cache_read_input")]]

    // MARK: Flushing

    /// Writes what is pending in one transaction. On failure the batch is kept, under its ID, and
    /// written again first on the next flush (none of it is lost, and a batch whose commit went
    /// through though its answer was lost is not counted twice); requests meanwhile go to pending.
    @discardableResult
    public func flush(at time: Date = Date()) -> Bool {
        flushLock.withLock { _ in
            let minute = UsageClock.minute(time)
            // At most two writes: a batch an earlier flush could not confirm, then what is pending.
            for _ in 0..<2 {
                let batch: UsageBatch? = state.withLock { state in
                    if let unconfirmed = state.flushing { return unconfirmed }
                    for (key, count) in ruleTally.drain() { state.pending.ruleCounts[key, default: RuleCount()] += count }
                    guard !state.pending.isEmpty else { return nil }
                    var batch = state.pending
                    batch.id = Self.newBatchID()
                    state.flushing = batch
                    state.pending = UsageBatch()
                    return batch
                }
                guard let batch else { return true }
                do {
                    try store.recordUsage(batch, purgeDeviceMinutesBefore: minute - 2)
                    state.withLock { state in
                        state.flushing = nil
                        let commit = commits.add(1, ordering: .releasing).newValue
                        state.recentlyFlushed.append((commit, batch))
                        if state.recentlyFlushed.count > Self.flushedBatchesKept { state.recentlyFlushed.removeFirst() }
                        let hour = UsageClock.hour(time)
                        state.modelsSeen = state.modelsSeen.filter { $0.key.hour >= hour - 3600 }
                        state.profilesSeen = state.profilesSeen.filter { $0.key.hour >= hour - 3600 }
                    }
                } catch {
                    state.withLock { state in
                        // Device minutes matter only for the limit's two-minute window.
                        state.flushing?.deviceMinutes = batch.deviceMinutes.filter { $0.key.minute >= minute - 1 }
                        state.flushing?.profileMinutes = batch.profileMinutes.filter { $0.key.minute >= minute - 1 }
                    }
                    metrics.increment("attestd_usage_flush_failures_total")
                    report("usage flush failed, kept for the next one: \(error)")
                    return false
                }
            }
            return true
        }
    }

    /// 16 random bytes, URL-safe base64: unique across instances and restarts.
    static func newBatchID() -> String { Base64.encode(secureRandomBytes(16), urlSafe: true, padded: false) }

    /// Lasts until stopped (the flush's task ends then).
    public func run() throws { try timer.withLock { $0 }?.run() }

    /// The last flush, after the last relayed request has ended, retried until `deadline`.
    public func stop(by deadline: ContinuousClock.Instant) { stop(until: deadline) }

    /// Flushes every `flushInterval` until `stop`.
    public func start() {
        let task = PeriodicTask("usage-flush", every: flushInterval) { [weak self] in self?.flush() }
        guard timer.withLock({ current -> Bool in
            guard current == nil else { return false }
            current = task
            return true
        }) else { return }
        task.start()
    }

    /// `stop(until:)` with a deadline `seconds` from now.
    @discardableResult
    public func stop(retryFor seconds: TimeInterval = 5) -> Bool {
        stop(until: .now + .milliseconds(Int(seconds * 1000)))
    }

    /// Stops the timer and flushes what is left (at shutdown, after the last relayed request ended).
    /// A flush the store refuses is tried again, with growing pauses, until `deadline`: the
    /// process exits next, so what is unwritten then is lost, and reported.
    @discardableResult
    public func stop(until deadline: ContinuousClock.Instant) -> Bool {
        // A flush under way ends first (by the deadline); no other starts.
        timer.withLock { $0 }?.stop(by: deadline)
        guard !retry(until: deadline, { flush() }) else { return true }
        let requests = state.withLock { state in
            (state.flushing?.usage.values.reduce(Int64(0)) { $0 + $1.requests } ?? 0)
                + state.pending.usage.values.reduce(Int64(0)) { $0 + $1.requests }
        }
        report("usage not written at shutdown, the store refused it until the deadline: \(requests) requests' counts lost")
        return false
    }
}
