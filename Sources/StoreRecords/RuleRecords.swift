import Foundation
import TokenService

/// `attestctl usage --by rule` and the console's Policy tab: `policy_rule_days` with the rule's
/// mode now (from the integration's `monitored_rules`), in both dialects.
public enum RuleUsageQuery {
    public static let select = """
        SELECT w.name AS workspace_name, r.client_id AS client_id, r.rule AS rule, r.day AS day, r.refused AS refused,
               r.would_refuse AS would_refuse, i.monitored_rules AS monitored_rules
        FROM policy_rule_days r JOIN integrations i ON i.client_id = r.client_id JOIN workspaces w ON w.id = i.workspace_id
        """

    /// The WHERE clause for the filter (days whose midnight is in [since, until), widened to the
    /// day holding `since`), and its values; `placeholder(n)` spells the n-th parameter.
    public static func conditions(_ filter: UsageFilter, placeholder: (Int) -> String) -> (String, [ColumnValue]) {
        var conditions: [String] = []
        var values: [ColumnValue] = []
        func add(_ condition: String, _ value: ColumnValue) {
            values.append(value)
            conditions.append(condition + placeholder(values.count))
        }
        if let workspaceID = filter.workspaceID { add("i.workspace_id = ", .int(workspaceID)) }
        if let clientID = filter.clientID { add("r.client_id = ", .text(clientID)) }
        if let since = filter.since { add("r.day >= ", .int(since - since % 86_400)) }
        if let until = filter.until { add("r.day < ", .int(until)) }
        return ((conditions.isEmpty ? "" : " WHERE " + conditions.joined(separator: " AND ")) + " ORDER BY r.day, r.client_id, r.rule", values)
    }
}

extension RuleUsageRow {
    /// Nil for a rule this version does not know (written by a newer one).
    public init?(row: some StoreRow) throws {
        guard let rule = PolicyRule(rawValue: try row.text("rule")) else { return nil }
        let monitored = PolicyRule.rules(fromColumn: try row.text("monitored_rules"))
        self.init(workspace: try row.text("workspace_name"), key: RuleDayKey(clientID: try row.text("client_id"), rule: rule, day: try row.int("day")),
                  mode: monitored.contains(rule) ? .monitor : .enforce,
                  count: RuleCount(refused: try row.int("refused"), wouldRefuse: try row.int("would_refuse")))
    }
}
