import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: Policy rules: refused and would-refuse by day

    /// Adds a flush's rule counts, inside its transaction: one statement, rows in key order (two
    /// instances upserting the same rows must not lock them crosswise).
    static func recordRuleCounts(_ counts: [RuleDayKey: RuleCount], _ db: PostgresConnection) throws {
        guard !counts.isEmpty else { return }
        let rows = counts.sorted { ($0.key.clientID, $0.key.rule.rawValue, $0.key.day) < ($1.key.clientID, $1.key.rule.rawValue, $1.key.day) }
        _ = try db.query("""
            INSERT INTO policy_rule_days AS r (client_id, rule, day, refused, would_refuse)
            SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[])
            ON CONFLICT (client_id, rule, day) DO UPDATE SET refused = r.refused + excluded.refused,
              would_refuse = r.would_refuse + excluded.would_refuse
            """, [textArray(rows.map(\.key.clientID)), textArray(rows.map(\.key.rule.rawValue)), intArray(rows.map(\.key.day)),
                  intArray(rows.map(\.value.refused)), intArray(rows.map(\.value.wouldRefuse))])
    }

    public func ruleUsage(_ filter: UsageFilter) throws -> [RuleUsageRow] {
        let (conditions, values) = RuleUsageQuery.conditions(filter, placeholder: { "$\($0)" })
        let parameters: [PostgresValue] = values.map { value in
            switch value {
            case .int(let n): .int(n)
            case .text(let text): Self.optional(text)
            }
        }
        return try run { db in
            try db.query(RuleUsageQuery.select + conditions, parameters).rows.compactMap { try RuleUsageRow(row: $0) }
        }
    }
}
