import Foundation
import StoreRecords
import TokenService

/// Webhooks on SQLite: numbered parameters (`?1`), so a statement may use one twice.
extension SQLiteTokenStore: WebhookStore {
    private static func p(_ n: Int) -> String { "?\(n)" }

    public func addWebhookEndpoint(workspaceID: Int64, url: String, events: [WebhookEvent], thresholds: [Int], sealedSecret: [UInt8],
                                   at time: Date, by actor: String) throws -> Int64 {
        try write { db in
            var id: Int64?
            try db.query(WebhookQueries.insertEndpoint(Self.p), [.int(workspaceID), .text(url), .text(WebhookEndpoint.column(events)),
                                                                 .text(WebhookEndpoint.column(thresholds)), .blob(sealedSecret),
                                                                 .real(time.timeIntervalSince1970), .text(actor)]) { id = try $0.int("id") }
            guard let id else { throw InvalidStoredValue("the webhook endpoint's insert returned no ID") }
            return id
        }
    }

    public func removeWebhookEndpoint(id: Int64, workspaceID: Int64, at time: Date) throws -> Bool {
        try write { db in
            try db.transaction {
                guard try db.run(WebhookQueries.removeEndpoint(Self.p), [.real(time.timeIntervalSince1970), .int(id), .int(workspaceID)]) == 1 else {
                    return false
                }
                _ = try db.run(WebhookQueries.failUndelivered(Self.p), [.real(time.timeIntervalSince1970), .int(id)])
                return true
            }
        }
    }

    public func webhookEndpoints(workspaceID: Int64?) throws -> [WebhookEndpoint] {
        try read { db in
            var endpoints: [WebhookEndpoint] = []
            try db.query(WebhookQueries.endpoints(workspace: workspaceID != nil, Self.p), workspaceID.map { [.int($0)] } ?? []) {
                endpoints.append(try WebhookEndpoint(row: $0))
            }
            return endpoints
        }
    }

    public func recordBudgetCrossing(_ crossing: BudgetCrossing) throws -> Bool {
        let at = crossing.at.timeIntervalSince1970
        return try write { db in
            try db.transaction {
                guard try db.run(WebhookQueries.insertFired(Self.p), [.text(crossing.budget), .int(crossing.periodKey), .int(Int64(crossing.threshold)),
                                                                     .real(at)]) == 1 else { return false }
                for row in crossing.deliveries {
                    _ = try db.run(WebhookQueries.insertOutbox(Self.p), [.text(row.id), .int(row.endpointID), .text(row.event.rawValue), .text(row.body),
                                                                         .real(at), .real(at)])
                }
                _ = try db.run(WebhookQueries.insertAudit(Self.p), [.real(at), crossing.clientID.map { .text($0) } ?? .null, .text(crossing.detail)])
                return true
            }
        }
    }

    public func claimWebhookDeliveries(owner: String, now: Date, leaseUntil: Date, limit: Int) throws -> [WebhookDelivery] {
        try write { db in
            try db.transaction {
                var ids: [String] = []
                try db.query("SELECT o.id AS id FROM webhook_outbox o WHERE " + WebhookQueries.dueCondition.replacingOccurrences(of: "%NOW%", with: "?1")
                             + " ORDER BY o.next_attempt_at LIMIT ?2", [.real(now.timeIntervalSince1970), .int(Int64(limit))]) { ids.append(try $0.text("id")) }
                var claimed: [WebhookDelivery] = []
                for id in ids {
                    _ = try db.run("UPDATE webhook_outbox SET lease_owner = ?1, lease_until = ?2 WHERE id = ?3",
                                   [.text(owner), .real(leaseUntil.timeIntervalSince1970), .text(id)])
                    try db.query("SELECT \(WebhookQueries.deliveryColumns) FROM webhook_outbox o JOIN webhook_endpoints e ON e.id = o.endpoint_id WHERE o.id = ?1",
                                 [.text(id)]) { claimed.append(try WebhookDelivery(row: $0)) }
                }
                return claimed
            }
        }
    }

    public func finishWebhookDelivery(id: String, owner: String, at time: Date, status: Int?, error: String?, delivered: Bool, nextAttemptAt: Date?) throws {
        let at = time.timeIntervalSince1970
        _ = try write { db in
            try db.run(WebhookQueries.finish(Self.p), [.real(at), status.map { .int(Int64($0)) } ?? .null, error.map { .text($0) } ?? .null,
                                                       delivered ? .real(at) : .null, nextAttemptAt.map { .real($0.timeIntervalSince1970) } ?? .null,
                                                       !delivered && nextAttemptAt == nil ? .real(at) : .null, .text(id), .text(owner)])
        }
    }
}
