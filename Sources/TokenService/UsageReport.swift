import Foundation

/// What `attestctl usage --by` folds the hourly ledger rows into.
public enum UsageGrouping: String, Sendable, CaseIterable {
    case hour, day, model, integration, profile
}

/// Ledger rows added up over the fields a grouping folds away (those are nil).
public struct UsageGroup: Sendable, Equatable {
    public var workspace: String?
    public var clientID: String?
    public var model: String?
    /// Unix time of the hour's start (no grouping, or `--by hour`).
    public var hour: Int64?
    /// `YYYY-MM-DD`, UTC (`--by day`).
    public var day: String?
    /// `--by profile`: the user profile, `""` for requests without one (nil when folded away).
    public var profile: String?
    public var counters = UsageCounters()
}

public enum UsageReport {
    /// Groups rows; with no grouping every row stays as it is (workspace, integration, model, hour).
    /// Totals are the same whatever the grouping: every row lands in exactly one group.
    public static func group(_ rows: [UsageRow], by groupings: Set<UsageGrouping>) -> [UsageGroup] {
        let all = groupings.isEmpty
        var groups: [UsageGroup] = []
        var index: [String: Int] = [:]
        for row in rows {
            var group = UsageGroup()
            if all || groupings.contains(.integration) {
                group.workspace = row.workspace
                group.clientID = row.key.clientID
            }
            if all || groupings.contains(.model) { group.model = row.key.model }
            if all || groupings.contains(.hour) { group.hour = row.key.hour }
            if groupings.contains(.day) && !groupings.contains(.hour) { group.day = UsageClock.dayText(row.key.hour) }
            if groupings.contains(.profile) { group.profile = row.key.profile }
            let key = [group.workspace ?? "", group.clientID ?? "", group.model ?? "", group.hour.map(String.init) ?? "", group.day ?? "",
                       group.profile.map { "p" + $0 } ?? ""]
                .joined(separator: "\u{1f}")
            if let at = index[key] {
                groups[at].counters += row.counters
            } else {
                group.counters = row.counters
                index[key] = groups.count
                groups.append(group)
            }
        }
        return groups.sorted { a, b in
            let left = (a.hour ?? 0, a.day ?? "", a.workspace ?? "", a.clientID ?? "", a.model ?? "", a.profile ?? "")
            let right = (b.hour ?? 0, b.day ?? "", b.workspace ?? "", b.clientID ?? "", b.model ?? "", b.profile ?? "")
            return left < right
        }
    }

    /// The sum of every group (a grouping changes how it is split, never the total).
    public static func total(_ groups: [UsageGroup]) -> UsageCounters {
        var total = UsageCounters()
        for group in groups { total += group.counters }
        return total
    }

}
