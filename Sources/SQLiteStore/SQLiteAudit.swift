import AppAttest
import AttestCrypto
import CSQLite
import Foundation
import TokenService

extension SQLiteTokenStore {
    // MARK: Audit

    public func appendAudit(_ events: [AuditEvent]) throws {
        try writeInBackground { db in
            try db.transaction {
                for event in events {
                    try db.run("""
                        INSERT INTO audit_log (at, actor, action, client_id, key_id, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?)
                        """, [.real(event.at.timeIntervalSince1970), event.actor.map { .text($0) } ?? .null, .text(event.action),
                              event.clientID.map { .text($0) } ?? .null, event.keyID.map { .blob($0) } ?? .null,
                              event.reason.map { .text($0) } ?? .null, event.detail.map { .text(String($0.prefix(1000))) } ?? .null])
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

    /// The newest audit events, newest first, after the `offset` newest (the CLI, the console, tests).
    public func auditEvents(limit: Int, offset: Int, clientID: String?) throws -> [AuditEvent] {
        try read { db in
            var events: [AuditEvent] = []
            let sql = "SELECT \(StoreColumns.list(StoreColumns.audit)) FROM audit_log"
                + (clientID == nil ? "" : " WHERE client_id = ?") + " ORDER BY id DESC LIMIT ? OFFSET ?"
            let values: [SQLValue] = (clientID.map { [.text($0)] } ?? []) + [.int(Int64(limit)), .int(Int64(max(0, offset)))]
            try db.query(sql, values) { row in events.append(try AuditEvent(row: row)) }
            return events
        }
    }
}
