import AppAttest
import AttestCrypto
import CSQLite
import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: Audit

    public func appendAudit(_ events: [AuditEvent]) throws {
        try writeInBackground { db in
            try db.transaction {
                for event in events {
                    // A refusal minute's row gains the count; its first event's time, key and detail stay.
                    try db.run("""
                        INSERT INTO audit_log (at, actor, action, client_id, key_id, reason, detail, count, minute) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                        ON CONFLICT (action, client_id, reason, minute) WHERE minute IS NOT NULL DO UPDATE SET count = count + excluded.count
                        """, [.real(event.at.timeIntervalSince1970), event.actor.map { .text($0) } ?? .null, .text(event.action),
                              event.clientID.map { .text($0) } ?? .null, event.keyID.map { .blob($0) } ?? .null,
                              event.reason.map { .text($0) } ?? .null, event.detail.map { .text(String($0.prefix(1000))) } ?? .null,
                              .int(event.count), event.minute.map { .int($0) } ?? .null])
                }
            }
        }
    }

    public func auditEvents(clientID: String, actions: [String]) throws -> [AuditEvent] {
        try read { db in
            var events: [AuditEvent] = []
            let sql = "SELECT \(StoreColumns.list(StoreColumns.audit)) FROM audit_log WHERE client_id = ? AND action IN ("
                + actions.map { _ in "?" }.joined(separator: ", ") + ") ORDER BY id DESC"
            try db.query(sql, [.text(clientID)] + actions.map { .text($0) }) { row in events.append(try AuditEvent(row: row)) }
            return events
        }
    }

    /// The newest audit events, newest first, older than `beforeID` (the CLI, the console, tests).
    public func auditEvents(limit: Int, beforeID: Int64?, clientID: String?) throws -> [AuditEvent] {
        try read { db in
            var events: [AuditEvent] = []
            let sql = "SELECT \(StoreColumns.list(StoreColumns.audit)) FROM audit_log WHERE id < ?"
                + (clientID == nil ? "" : " AND client_id = ?") + " ORDER BY id DESC LIMIT ?"
            let values: [SQLValue] = [.int(beforeID ?? Int64.max)] + (clientID.map { [.text($0)] } ?? []) + [.int(Int64(limit))]
            try db.query(sql, values) { row in events.append(try AuditEvent(row: row)) }
            return events
        }
    }

    public func purgeAudit(before time: Date, limit: Int) throws -> Int {
        try writeInBackground { db in
            try db.run("DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE at < ? ORDER BY at LIMIT ?)",
                       [.real(time.timeIntervalSince1970), .int(Int64(limit))])
        }
    }
}
