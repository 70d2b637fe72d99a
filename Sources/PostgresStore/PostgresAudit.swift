import AppAttest
import AttestCrypto
import AttestWire
import CPostgres
import Foundation
import TokenService

extension PostgresTokenStore {
    // MARK: Audit

    /// Rows per INSERT: 7 parameters each, well under the protocol's 65,535.
    static let auditBatch = 500

    /// One multi-row INSERT (one round trip) for up to 500 events; larger batches in one transaction.
    public func appendAudit(_ events: [AuditEvent]) throws {
        guard !events.isEmpty else { return }
        try run { db in
            func insert(_ slice: ArraySlice<AuditEvent>) throws {
                var values: [PostgresValue] = []
                values.reserveCapacity(slice.count * 7)
                var rows: [String] = []
                for event in slice {
                    let n = values.count
                    rows.append("($\(n + 1), $\(n + 2), $\(n + 3), $\(n + 4), $\(n + 5), $\(n + 6), $\(n + 7))")
                    values += [Self.seconds(event.at), Self.optional(event.actor), .text(event.action), Self.optional(event.clientID),
                               Self.optional(event.keyID), Self.optional(event.reason), Self.optional(event.detail.map { String($0.prefix(1000)) })]
                }
                try db.query("INSERT INTO audit_log (at, actor, action, client_id, key_id, reason, detail) VALUES " + rows.joined(separator: ", "), values)
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

    /// The newest audit events, newest first, after the `offset` newest (the CLI, the console, tests).
    public func auditEvents(limit: Int, offset: Int, clientID: String?) throws -> [AuditEvent] {
        try run { db in
            let sql = "SELECT \(StoreColumns.list(StoreColumns.audit)) FROM audit_log"
                + (clientID == nil ? "" : " WHERE client_id = $3") + " ORDER BY id DESC LIMIT $1 OFFSET $2"
            let values: [PostgresValue] = [.int(Int64(limit)), .int(Int64(max(0, offset)))] + (clientID.map { [.text($0)] } ?? [])
            return try db.query(sql, values).rows.map(AuditEvent.init(row:))
        }
    }
}
