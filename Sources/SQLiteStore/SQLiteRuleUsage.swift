import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: Policy rules: refused and would-refuse by day

    /// Adds a flush's rule counts, inside its transaction.
    static func recordRuleCounts(_ counts: [RuleDayKey: RuleCount], _ db: SQLiteConnection) throws {
        for (key, count) in counts {
            try db.run("""
                INSERT INTO policy_rule_days (client_id, rule, day, refused, would_refuse) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT (client_id, rule, day) DO UPDATE SET refused = refused + excluded.refused,
                  would_refuse = would_refuse + excluded.would_refuse
                """, [.text(key.clientID), .text(key.rule.rawValue), .int(key.day), .int(count.refused), .int(count.wouldRefuse)])
        }
    }

    public func ruleUsage(_ filter: UsageFilter) throws -> [RuleUsageRow] {
        let (conditions, values) = RuleUsageQuery.conditions(filter, placeholder: { _ in "?" })
        let parameters: [SQLValue] = values.map { value in
            switch value {
            case .int(let n): .int(n)
            case .text(let text): text.map { .text($0) } ?? .null
            }
        }
        return try read { db in
            var rows: [RuleUsageRow] = []
            try db.query(RuleUsageQuery.select + conditions, parameters) { row in
                if let decoded = try RuleUsageRow(row: row) { rows.append(decoded) }
            }
            return rows
        }
    }
}
