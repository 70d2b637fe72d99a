import Foundation

/// The ledger by upstream: which of a workspace's upstreams served (its label), per integration
/// and hour (`usage_hourly_by_upstream`, `attestctl usage --by upstream`).
public struct UpstreamUsageKey: Sendable, Hashable {
    public let clientID: String
    public let hour: Int64
    public let upstream: String

    public init(clientID: String, hour: Int64, upstream: String) {
        self.clientID = clientID
        self.hour = hour
        self.upstream = upstream
    }
}

/// What one upstream served: requests, tokens, and how many of them came after a failover (an
/// earlier upstream of the list failed first).
public struct UpstreamUsageCounters: Sendable, Equatable {
    public var requests: Int64 = 0
    public var inputTokens: Int64 = 0
    public var outputTokens: Int64 = 0
    public var cacheCreationInputTokens: Int64 = 0
    public var cacheReadInputTokens: Int64 = 0
    public var failovers: Int64 = 0
    /// Micro-dollars, priced when recorded (`usage_hourly.cost_micro_usd`'s rule).
    public var costMicroUSD: Int64 = 0

    public init(requests: Int64 = 0, inputTokens: Int64 = 0, outputTokens: Int64 = 0, cacheCreationInputTokens: Int64 = 0,
                cacheReadInputTokens: Int64 = 0, failovers: Int64 = 0, costMicroUSD: Int64 = 0) {
        self.requests = requests
        self.inputTokens = inputTokens
        self.outputTokens = outputTokens
        self.cacheCreationInputTokens = cacheCreationInputTokens
        self.cacheReadInputTokens = cacheReadInputTokens
        self.failovers = failovers
        self.costMicroUSD = costMicroUSD
    }

    public static func += (a: inout UpstreamUsageCounters, b: UpstreamUsageCounters) {
        a.requests.saturatingAdd(b.requests)
        a.inputTokens.saturatingAdd(b.inputTokens)
        a.outputTokens.saturatingAdd(b.outputTokens)
        a.cacheCreationInputTokens.saturatingAdd(b.cacheCreationInputTokens)
        a.cacheReadInputTokens.saturatingAdd(b.cacheReadInputTokens)
        a.failovers.saturatingAdd(b.failovers)
        a.costMicroUSD.saturatingAdd(b.costMicroUSD)
    }
}

/// A row of the ledger by upstream, with its workspace.
public struct UpstreamUsageRow: Sendable, Equatable {
    public let workspace: String
    public let key: UpstreamUsageKey
    public var counters: UpstreamUsageCounters

    public init(workspace: String, key: UpstreamUsageKey, counters: UpstreamUsageCounters) {
        self.workspace = workspace
        self.key = key
        self.counters = counters
    }
}

/// The ledger's rows by upstream, as `attestctl usage` reads them.
public protocol UpstreamUsageStore: AnyObject, Sendable {
    func upstreamUsage(_ filter: UsageFilter) throws -> [UpstreamUsageRow]
}

extension AdminService {
    /// The ledger by upstream label, summed per workspace and label over the filter's hours.
    public func usageByUpstream(workspace: String?, clientID: String?, since: Date?, until: Date?) throws -> [UpstreamUsageRow] {
        guard let store = store as? any UpstreamUsageStore else { return [] }
        if let since, let until, until <= since { throw AdminError("--until must be after --since") }
        let filter = UsageFilter(workspaceID: try workspace.map { try existingWorkspace($0).id }, clientID: clientID, since: since.map(UsageClock.hour),
                                 until: until.map { UsageClock.hour($0.addingTimeInterval(3599)) })
        var summed: [String: UpstreamUsageRow] = [:]
        for row in try store.upstreamUsage(filter) {
            let id = row.workspace + "\u{0}" + row.key.upstream
            summed[id, default: UpstreamUsageRow(workspace: row.workspace, key: UpstreamUsageKey(clientID: "", hour: 0, upstream: row.key.upstream),
                                                 counters: UpstreamUsageCounters())].counters += row.counters
        }
        return summed.values.sorted { ($0.workspace, $0.key.upstream) < ($1.workspace, $1.key.upstream) }
    }
}
