import Foundation
import TokenService

/// The webhook tables' statements, in both dialects: `p(n)` spells the n-th parameter (`?` or `$n`).
public enum WebhookQueries {
    /// The live endpoints with their latest delivery; `workspace` adds `AND e.workspace_id = p(1)`.
    public static func endpoints(workspace: Bool, _ p: (Int) -> String) -> String {
        """
        SELECT e.id AS id, e.workspace_id AS workspace_id, w.name AS workspace_name, e.url AS url, e.events AS events,
               e.thresholds AS thresholds, e.sealed_secret AS sealed_secret, e.created_at AS created_at, e.created_by AS created_by,
               o.id AS delivery_id, o.event AS delivery_event, o.created_at AS delivery_created_at, o.attempts AS attempts,
               o.delivered_at AS delivered_at, o.failed_at AS failed_at, o.last_attempt_at AS last_attempt_at, o.last_status AS last_status,
               o.last_error AS last_error
        FROM webhook_endpoints e JOIN workspaces w ON w.id = e.workspace_id
        LEFT JOIN webhook_outbox o ON o.id = (SELECT x.id FROM webhook_outbox x WHERE x.endpoint_id = e.id
                                              ORDER BY x.created_at DESC, x.id DESC LIMIT 1)
        WHERE e.removed_at IS NULL\(workspace ? " AND e.workspace_id = \(p(1))" : "") ORDER BY e.id
        """
    }

    public static func insertEndpoint(_ p: (Int) -> String) -> String {
        """
        INSERT INTO webhook_endpoints (workspace_id, url, events, thresholds, sealed_secret, created_at, created_by)
        VALUES (\((1...7).map(p).joined(separator: ", "))) RETURNING id
        """
    }

    /// Marks the endpoint removed; its undelivered events are given up with it.
    public static func removeEndpoint(_ p: (Int) -> String) -> String {
        "UPDATE webhook_endpoints SET removed_at = \(p(1)) WHERE id = \(p(2)) AND workspace_id = \(p(3)) AND removed_at IS NULL"
    }

    public static func failUndelivered(_ p: (Int) -> String) -> String {
        """
        UPDATE webhook_outbox SET failed_at = \(p(1)), last_error = 'endpoint removed', lease_owner = NULL, lease_until = NULL
        WHERE endpoint_id = \(p(2)) AND delivered_at IS NULL AND failed_at IS NULL
        """
    }

    public static func insertFired(_ p: (Int) -> String) -> String {
        """
        INSERT INTO budget_thresholds_fired (budget, period_key, threshold, fired_at) VALUES (\(p(1)), \(p(2)), \(p(3)), \(p(4)))
        ON CONFLICT (budget, period_key, threshold) DO NOTHING
        """
    }

    public static func insertOutbox(_ p: (Int) -> String) -> String {
        """
        INSERT INTO webhook_outbox (id, endpoint_id, event, body, created_at, next_attempt_at) VALUES (\((1...6).map(p).joined(separator: ", ")))
        """
    }

    /// The crossing's audit row (no actor: the service itself).
    public static func insertAudit(_ p: (Int) -> String) -> String {
        "INSERT INTO audit_log (at, actor, action, client_id, detail, count) VALUES (\(p(1)), NULL, 'budget.threshold_reached', \(p(2)), \(p(3)), 1)"
    }

    /// What is due: undelivered, not given up, no live lease; oldest due first.
    public static let dueCondition = "o.delivered_at IS NULL AND o.failed_at IS NULL AND o.next_attempt_at <= %NOW% AND (o.lease_until IS NULL OR o.lease_until < %NOW%)"

    /// The claimed rows with their endpoint (`WebhookDelivery(row:)`).
    public static let deliveryColumns = """
        o.id AS id, o.endpoint_id AS endpoint_id, e.workspace_id AS workspace_id, e.url AS url, e.sealed_secret AS sealed_secret,
        o.event AS event, o.body AS body, o.attempts AS attempts
        """

    /// Ends an attempt, for the lease's holder only: p1 time, p2 status, p3 error, p4 delivered_at,
    /// p5 next attempt (NULL: unchanged), p6 failed_at, p7 ID, p8 owner.
    public static func finish(_ p: (Int) -> String) -> String {
        """
        UPDATE webhook_outbox SET attempts = attempts + 1, last_attempt_at = \(p(1)), last_status = \(p(2)), last_error = \(p(3)),
               delivered_at = \(p(4)), next_attempt_at = coalesce(\(p(5)), next_attempt_at), failed_at = \(p(6)),
               lease_owner = NULL, lease_until = NULL
        WHERE id = \(p(7)) AND lease_owner = \(p(8))
        """
    }
}

extension WebhookEndpoint {
    public init(row: some StoreRow) throws {
        var last: WebhookDeliveryStatus?
        if let id = try row.optional("delivery_id", row.text) {
            let state: WebhookDeliveryState = try !row.isNull("delivered_at") ? .delivered : try !row.isNull("failed_at") ? .failed : .pending
            last = WebhookDeliveryStatus(id: id, event: try row.text("delivery_event"), createdAt: try row.date("delivery_created_at"),
                                         attempts: Int(try row.int("attempts")), state: state,
                                         lastAttemptAt: try row.optional("last_attempt_at", row.date),
                                         lastStatus: try row.optional("last_status", row.int).map { Int($0) },
                                         lastError: try row.optional("last_error", row.text))
        }
        self.init(id: try row.int("id"), workspaceID: try row.int("workspace_id"), workspaceName: try row.text("workspace_name"),
                  url: try row.text("url"), events: WebhookEndpoint.events(fromColumn: try row.text("events")),
                  thresholds: WebhookEndpoint.thresholds(fromColumn: try row.text("thresholds")), sealedSecret: try row.bytes("sealed_secret"),
                  createdAt: try row.date("created_at"), createdBy: try row.text("created_by"), lastDelivery: last)
    }
}

extension WebhookDelivery {
    public init(row: some StoreRow) throws {
        self.init(id: try row.text("id"), endpointID: try row.int("endpoint_id"), workspaceID: try row.int("workspace_id"), url: try row.text("url"),
                  sealedSecret: try row.bytes("sealed_secret"), event: try row.text("event"), body: try row.text("body"),
                  attempts: Int(try row.int("attempts")))
    }
}

extension SealedSecret {
    /// A webhook endpoint's secret (`id, workspace_id, url, sealed_secret`), for a rotation. Removed
    /// endpoints too: their rows still hold a value sealed under the old key.
    public init(webhookRow row: some StoreRow) throws {
        self.init(owner: .webhook(endpointID: try row.int("id"), workspaceID: try row.int("workspace_id"), url: try row.text("url")),
                  sealed: try row.bytes("sealed_secret"))
    }
}
