import AttestCrypto
import AttestWire
import Foundation

// Webhooks: where a workspace's budget alerts go. An endpoint is added with a signing secret
// shown once and stored sealed; each event becomes one row of a durable outbox per endpoint,
// written in the same transaction as what caused it, and delivered (signed, retried with
// capped backoff, claimed under a lease) by a background worker of some attestd.

/// The events an endpoint may subscribe to.
public enum WebhookEvent: String, Sendable, CaseIterable {
    /// A budget reached one of the endpoint's thresholds (percent of the budget), once per period.
    case budgetThreshold = "budget.threshold"
}

/// How an outbox row ended, or that it has not yet.
public enum WebhookDeliveryState: String, Sendable {
    case pending, delivered, failed
}

/// The latest delivery of an endpoint, as `webhooks list` and the console show it.
public struct WebhookDeliveryStatus: Sendable, Equatable {
    public let id: String
    public let event: String
    public let createdAt: Date
    public let attempts: Int
    public let state: WebhookDeliveryState
    public let lastAttemptAt: Date?
    /// The receiver's HTTP status at the last attempt (nil: it did not answer).
    public let lastStatus: Int?
    public let lastError: String?

    public init(id: String, event: String, createdAt: Date, attempts: Int, state: WebhookDeliveryState, lastAttemptAt: Date?, lastStatus: Int?,
                lastError: String?) {
        self.id = id
        self.event = event
        self.createdAt = createdAt
        self.attempts = attempts
        self.state = state
        self.lastAttemptAt = lastAttemptAt
        self.lastStatus = lastStatus
        self.lastError = lastError
    }
}

/// A workspace's webhook endpoint.
public struct WebhookEndpoint: Sendable, Equatable {
    public static let defaultThresholds = [50, 80, 100]

    public let id: Int64
    public let workspaceID: Int64
    public let workspaceName: String
    public let url: String
    public let events: [WebhookEvent]
    public let thresholds: [Int]
    /// The signing secret, sealed under the secrets key (bound to the workspace and URL).
    public let sealedSecret: [UInt8]
    public let createdAt: Date
    public let createdBy: String
    public var lastDelivery: WebhookDeliveryStatus?

    public init(id: Int64, workspaceID: Int64, workspaceName: String, url: String, events: [WebhookEvent], thresholds: [Int], sealedSecret: [UInt8],
                createdAt: Date, createdBy: String, lastDelivery: WebhookDeliveryStatus? = nil) {
        self.id = id
        self.workspaceID = workspaceID
        self.workspaceName = workspaceName
        self.url = url
        self.events = events
        self.thresholds = thresholds
        self.sealedSecret = sealedSecret
        self.createdAt = createdAt
        self.createdBy = createdBy
        self.lastDelivery = lastDelivery
    }

    /// The sealed secret's associated data: a secret copied to another workspace or URL in the
    /// database alone does not open.
    public static func associatedData(workspaceID: Int64, url: String) -> [UInt8] {
        Array("attestd webhook secret\u{0}\(workspaceID)\u{0}\(url)".utf8)
    }

    /// The column forms: comma-separated.
    public static func column(_ events: [WebhookEvent]) -> String { events.map(\.rawValue).joined(separator: ",") }
    public static func column(_ thresholds: [Int]) -> String { thresholds.map(String.init).joined(separator: ",") }
    public static func events(fromColumn text: String) -> [WebhookEvent] { text.split(separator: ",").compactMap { WebhookEvent(rawValue: String($0)) } }
    public static func thresholds(fromColumn text: String) -> [Int] { text.split(separator: ",").compactMap { Int($0) } }
}

/// One outbox row to write: the event's body, built once (every retry sends the same bytes).
public struct WebhookOutboxRow: Sendable, Equatable {
    /// `dlv_` and 22 random characters: the idempotency ID (`X-Attestd-Delivery`).
    public let id: String
    public let endpointID: Int64
    public let event: WebhookEvent
    public let body: String

    public init(id: String = WebhookOutboxRow.newID(), endpointID: Int64, event: WebhookEvent, body: String) {
        self.id = id
        self.endpointID = endpointID
        self.event = event
        self.body = body
    }

    public static func newID() -> String { "dlv_" + Base64.encode(secureRandomBytes(16), urlSafe: true, padded: false) }
}

/// A claimed outbox row, with what sending it needs.
public struct WebhookDelivery: Sendable, Equatable {
    public let id: String
    public let endpointID: Int64
    public let workspaceID: Int64
    public let url: String
    public let sealedSecret: [UInt8]
    public let event: String
    public let body: String
    /// Attempts made before this one.
    public let attempts: Int

    public init(id: String, endpointID: Int64, workspaceID: Int64, url: String, sealedSecret: [UInt8], event: String, body: String, attempts: Int) {
        self.id = id
        self.endpointID = endpointID
        self.workspaceID = workspaceID
        self.url = url
        self.sealedSecret = sealedSecret
        self.event = event
        self.body = body
        self.attempts = attempts
    }
}

/// A budget reaching a threshold in a period: recorded once (the first writer wins), with its
/// deliveries and its audit row, in one transaction.
public struct BudgetCrossing: Sendable, Equatable {
    /// `scope/period/workspace ID/client ID/profile`: whose budget.
    public let budget: String
    public let periodKey: Int64
    public let threshold: Int
    public let at: Date
    public let clientID: String?
    /// The audit row's detail.
    public let detail: String
    public let deliveries: [WebhookOutboxRow]

    public init(budget: String, periodKey: Int64, threshold: Int, at: Date, clientID: String?, detail: String, deliveries: [WebhookOutboxRow]) {
        self.budget = budget
        self.periodKey = periodKey
        self.threshold = threshold
        self.at = at
        self.clientID = clientID
        self.detail = detail
        self.deliveries = deliveries
    }
}

/// Endpoints, the thresholds fired and the outbox.
public protocol WebhookStore: AnyObject, Sendable {
    /// Inserts an endpoint; its ID.
    func addWebhookEndpoint(workspaceID: Int64, url: String, events: [WebhookEvent], thresholds: [Int], sealedSecret: [UInt8],
                            at: Date, by actor: String) throws -> Int64
    /// Marks it removed (its pending deliveries are dropped); false when there is no such live endpoint.
    func removeWebhookEndpoint(id: Int64, workspaceID: Int64, at: Date) throws -> Bool
    /// The live endpoints (of one workspace, or all), each with its latest delivery.
    func webhookEndpoints(workspaceID: Int64?) throws -> [WebhookEndpoint]
    /// Inserts the threshold's row and, only when this call inserted it, the deliveries and the
    /// audit row, in one transaction. False: the threshold had fired already (this period).
    func recordBudgetCrossing(_ crossing: BudgetCrossing) throws -> Bool
    /// Claims up to `limit` due deliveries (not delivered, not given up, not leased by a live
    /// lease) for `owner` until `leaseUntil`; rows another claimer holds are skipped.
    func claimWebhookDeliveries(owner: String, now: Date, leaseUntil: Date, limit: Int) throws -> [WebhookDelivery]
    /// Ends an attempt of a delivery this owner holds: delivered, or retried at `nextAttemptAt`,
    /// or given up (both nil). Nothing changes when the lease was lost meanwhile.
    func finishWebhookDelivery(id: String, owner: String, at: Date, status: Int?, error: String?, delivered: Bool, nextAttemptAt: Date?) throws
}

/// `X-Attestd-Signature: t=UNIX,v1=HEX`: HMAC-SHA256 with the endpoint's secret over `UNIX.`
/// followed by the body. The timestamp lets the receiver refuse old replays.
public enum WebhookSignature {
    public static func header(secret: [UInt8], timestamp: Int64, body: [UInt8]) -> String {
        "t=\(timestamp),v1=" + hexString(hmacSHA256(key: secret, message: Array("\(timestamp).".utf8) + body))
    }

    /// `whsec_` and 32 random bytes, URL-safe base64: what the operator copies into the receiver.
    public static func newSecret() -> String { "whsec_" + Base64.encode(secureRandomBytes(32), urlSafe: true, padded: false) }
}

extension AdminService {
    /// Adds a workspace's endpoint: owners and admins; the URL https (http only to loopback);
    /// audited without the secret, which is returned to be shown once and stored sealed.
    public func addWebhook(actor: String, workspace name: String, url: String, events: [WebhookEvent], thresholds: [Int],
                           secrets: SecretBox) throws -> (endpoint: WebhookEndpoint, secret: String) {
        let workspace = try existingWorkspace(name)
        _ = try requireRole(actor, in: workspace, "add webhooks") { $0.managesIntegrations }
        let url = try Validate.cloudURL(url, what: "--url", path: true)
        guard !events.isEmpty else { throw AdminError("--events needs at least one of " + WebhookEvent.allCases.map(\.rawValue).joined(separator: ", ")) }
        let thresholds = try Validate.thresholds(thresholds)
        let secret = WebhookSignature.newSecret()
        let sealed = try secrets.seal(Array(secret.utf8), associatedData: WebhookEndpoint.associatedData(workspaceID: workspace.id, url: url))
        let id = try webhookStore.addWebhookEndpoint(workspaceID: workspace.id, url: url, events: events, thresholds: thresholds,
                                                     sealedSecret: sealed, at: now(), by: actor)
        try audit(actor: actor, "webhook.added", detail: "\(workspace.name): #\(id) \(url) events \(WebhookEndpoint.column(events)) "
                  + "thresholds \(WebhookEndpoint.column(thresholds))")
        guard let endpoint = try webhookStore.webhookEndpoints(workspaceID: workspace.id).first(where: { $0.id == id }) else {
            throw AdminError("the webhook was added but cannot be read back")
        }
        return (endpoint, secret)
    }

    /// Removes an endpoint (its undelivered events with it); audited.
    public func removeWebhook(actor: String, workspace name: String, id: Int64) throws {
        let workspace = try existingWorkspace(name)
        _ = try requireRole(actor, in: workspace, "remove webhooks") { $0.managesIntegrations }
        guard try webhookStore.removeWebhookEndpoint(id: id, workspaceID: workspace.id, at: now()) else {
            throw AdminError("no webhook #\(id) in \(workspace.name)", kind: .notFound)
        }
        try audit(actor: actor, "webhook.removed", detail: "\(workspace.name): #\(id)")
    }

    /// The live endpoints with their latest delivery (never their secrets).
    public func webhooks(workspace name: String? = nil) throws -> [WebhookEndpoint] {
        try webhookStore.webhookEndpoints(workspaceID: try name.map { try existingWorkspace($0).id })
    }

    var webhookStore: any WebhookStore {
        get throws {
            guard let store = store as? any WebhookStore else { throw AdminError("this store keeps no webhooks") }
            return store
        }
    }
}

extension Validate {
    /// Percents of a budget, 1 to 1000, each once, ascending.
    public static func thresholds(_ values: [Int]) throws -> [Int] {
        guard !values.isEmpty, values.count <= 10 else { throw AdminError("--thresholds takes 1 to 10 percents, such as 50,80,100") }
        for value in values where !(1...1000).contains(value) { throw AdminError("--thresholds \(value): each is a percent from 1 to 1000") }
        return Array(Set(values)).sorted()
    }
}
