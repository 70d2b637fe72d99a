import Foundation
import StoreRecords
import TokenService

/// Webhooks on PostgreSQL. Claims take due rows `FOR UPDATE SKIP LOCKED` and lease them in one
/// statement, so instances claiming at once each get other rows.
extension PostgresTokenStore: WebhookStore {
    private static func p(_ n: Int) -> String { "$\(n)" }
    private static let nullDouble = PostgresValue.null(.float8)

    public func addWebhookEndpoint(workspaceID: Int64, url: String, events: [WebhookEvent], thresholds: [Int], sealedSecret: [UInt8],
                                   at time: Date, by actor: String) throws -> Int64 {
        try run { db in
            guard let id = try db.query(WebhookQueries.insertEndpoint(Self.p),
                                        [.int(workspaceID), .text(url), .text(WebhookEndpoint.column(events)), .text(WebhookEndpoint.column(thresholds)),
                                         .bytes(sealedSecret), .double(time.timeIntervalSince1970), .text(actor)]).first({ try $0.int("id") }) else {
                throw InvalidStoredValue("the webhook endpoint's insert returned no ID")
            }
            return id
        }
    }

    public func removeWebhookEndpoint(id: Int64, workspaceID: Int64, at time: Date) throws -> Bool {
        try run { db in
            try db.transaction {
                guard try db.query(WebhookQueries.removeEndpoint(Self.p), [.double(time.timeIntervalSince1970), .int(id), .int(workspaceID)]).affectedRows == 1
                else { return false }
                _ = try db.query(WebhookQueries.failUndelivered(Self.p), [.double(time.timeIntervalSince1970), .int(id)])
                return true
            }
        }
    }

    public func webhookEndpoints(workspaceID: Int64?) throws -> [WebhookEndpoint] {
        try run { db in
            try db.query(WebhookQueries.endpoints(workspace: workspaceID != nil, Self.p), workspaceID.map { [.int($0)] } ?? []).rows
                .map { try WebhookEndpoint(row: $0) }
        }
    }

    public func recordBudgetCrossing(_ crossing: BudgetCrossing) throws -> Bool {
        let at = crossing.at.timeIntervalSince1970
        return try run { db in
            try db.transaction {
                guard try db.query(WebhookQueries.insertFired(Self.p), [.text(crossing.budget), .int(crossing.periodKey), .int(Int64(crossing.threshold)),
                                                                       .double(at)]).affectedRows == 1 else { return false }
                for row in crossing.deliveries {
                    _ = try db.query(WebhookQueries.insertOutbox(Self.p), [.text(row.id), .int(row.endpointID), .text(row.event.rawValue), .text(row.body),
                                                                           .double(at), .double(at)])
                }
                _ = try db.query(WebhookQueries.insertAudit(Self.p), [.double(at), Self.optional(crossing.clientID), .text(crossing.detail)])
                return true
            }
        }
    }

    public func claimWebhookDeliveries(owner: String, now: Date, leaseUntil: Date, limit: Int) throws -> [WebhookDelivery] {
        try run { db in
            try db.query("""
                WITH due AS (SELECT o.id FROM webhook_outbox o WHERE \(WebhookQueries.dueCondition.replacingOccurrences(of: "%NOW%", with: "$1"))
                             ORDER BY o.next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED)
                UPDATE webhook_outbox o SET lease_owner = $3, lease_until = $4 FROM due, webhook_endpoints e
                WHERE o.id = due.id AND e.id = o.endpoint_id
                RETURNING \(WebhookQueries.deliveryColumns)
                """, [.double(now.timeIntervalSince1970), .int(Int64(limit)), .text(owner), .double(leaseUntil.timeIntervalSince1970)]).rows
                .map { try WebhookDelivery(row: $0) }
        }
    }

    public func finishWebhookDelivery(id: String, owner: String, at time: Date, status: Int?, error: String?, delivered: Bool, nextAttemptAt: Date?) throws {
        let at = time.timeIntervalSince1970
        _ = try run { db in
            try db.query(WebhookQueries.finish(Self.p), [.double(at), status.map { .int(Int64($0)) } ?? .nullInt, Self.optional(error),
                                                         delivered ? .double(at) : Self.nullDouble,
                                                         nextAttemptAt.map { .double($0.timeIntervalSince1970) } ?? Self.nullDouble,
                                                         !delivered && nextAttemptAt == nil ? .double(at) : Self.nullDouble, .text(id), .text(owner)])
        }
    }
}
