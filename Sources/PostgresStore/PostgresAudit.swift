import AppAttest
import AttestCrypto
import AttestWire
import CPostgres
import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: Audit

    /// Rows per INSERT: 9 parameters each, well under the protocol's 65,535.
    static let auditBatch = 500

    /// One multi-row INSERT (one round trip) for up to 500 events; larger batches in one transaction.
    public func appendAudit(_ events: [AuditEvent]) throws {
        guard !events.isEmpty else { return }
        try run { db in
            func insert(_ slice: ArraySlice<AuditEvent>) throws {
                var values: [PostgresValue] = []
                values.reserveCapacity(slice.count * 9)
                var rows: [String] = []
                // One statement cannot update a row twice: refusal rows of the same minute are merged first.
                var merged: [AuditEvent] = []
                var minuteRows: [String: Int] = [:]
                for event in slice {
                    if let minute = event.minute {
                        let key = "\(event.action)\u{1f}\(event.clientID ?? "")\u{1f}\(event.reason ?? "")\u{1f}\(minute)"
                        if let at = minuteRows[key] { merged[at].count += event.count; continue }
                        minuteRows[key] = merged.count
                    }
                    merged.append(event)
                }
                for event in merged {
                    let n = values.count
                    rows.append("(" + (1...9).map { "$\(n + $0)" }.joined(separator: ", ") + ")")
                    values += [Self.seconds(event.at), Self.optional(event.actor), .text(event.action), Self.optional(event.clientID),
                               Self.optional(event.keyID), Self.optional(event.reason), Self.optional(event.detail.map { String($0.prefix(1000)) }),
                               .int(event.count), event.minute.map { .int($0) } ?? .nullInt]
                }
                try db.query("INSERT INTO audit_log AS a (at, actor, action, client_id, key_id, reason, detail, count, minute) VALUES "
                             + rows.joined(separator: ", ")
                             + " ON CONFLICT (action, client_id, reason, minute) WHERE minute IS NOT NULL DO UPDATE SET count = a.count + excluded.count",
                             values)
            }
            if events.count <= Self.auditBatch {
                try insert(events[...])
            } else {
                try db.transaction {
                    for start in stride(from: 0, to: events.count, by: Self.auditBatch) {
                        try insert(events[start..<min(start + Self.auditBatch, events.count)])
                    }
                }
            }
        }
    }

    public func auditEvents(clientID: String, actions: [String]) throws -> [AuditEvent] {
        try run { db in
            let sql = "SELECT \(StoreColumns.list(StoreColumns.audit)) FROM audit_log WHERE client_id = $1 AND action = ANY(ARRAY["
                + actions.indices.map { "$\($0 + 2)" }.joined(separator: ", ") + "]::text[]) ORDER BY id DESC"
            return try db.query(sql, [.text(clientID)] + actions.map { .text($0) }).rows.map(AuditEvent.init(row:))
        }
    }

    /// The newest audit events, newest first, older than `beforeID` (the CLI, the console, tests).
    public func auditEvents(limit: Int, beforeID: Int64?, clientID: String?) throws -> [AuditEvent] {
        try run { db in
            let sql = "SELECT \(StoreColumns.list(StoreColumns.audit)) FROM audit_log WHERE id < $2"
                + (clientID == nil ? "" : " AND client_id = $3") + " ORDER BY id DESC LIMIT $1"
            let values: [PostgresValue] = [.int(Int64(limit)), .int(beforeID ?? Int64.max)] + (clientID.map { [.text($0)] } ?? [])
            return try db.query(sql, values).rows.map(AuditEvent.init(row:))
        }
    }

    public func purgeAudit(before time: Date, limit: Int) throws -> Int {
        try run { db in
            try db.query("""
                WITH gone AS (DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE at < $1 ORDER BY at LIMIT $2) RETURNING 1)
                SELECT count(*) FROM gone
                """, [Self.seconds(time), .int(Int64(limit))]).first { Int(try $0.int(0)) } ?? 0
        }
    }
}
