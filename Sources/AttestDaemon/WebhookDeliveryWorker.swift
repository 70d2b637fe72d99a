import AttestCrypto
import AttestWire
import Foundation
import Lifecycle
import Synchronization
import TokenService
import UpstreamClient

/// Delivers the webhook outbox: claims due rows under a lease (so another instance, or this one
/// after a restart, never sends a row while it is held), POSTs each, signed, on a curl loop of
/// its own (never a relay loop), with a connect and a total timeout and a cap on the answer read,
/// and records the attempt: delivered on a 2xx, otherwise retried after a capped, doubling
/// backoff, and given up after `maxAttempts`. A row whose lease lapses (its instance died mid
/// attempt) is claimed again: a receiver may see a delivery twice only then, with the same
/// `X-Attestd-Delivery`, which is what it deduplicates on.
final class WebhookDeliveryWorker: Service {
    let name = "webhook-delivery"
    static let leaseSeconds: TimeInterval = 30
    static let totalTimeout: Duration = .seconds(10)
    static let maxAttempts = 16
    static let maxBackoff: TimeInterval = 600
    /// The most of an answer read: the receiver's body is never used.
    static let answerLimit = 64 * 1024
    static let batch = 16

    let store: any WebhookStore
    let secrets: SecretsKeySource?
    let metrics: Metrics
    let owner = "attestd-" + Base64.encode(secureRandomBytes(12), urlSafe: true, padded: false)
    private let client: UpstreamClient
    private let log: @Sendable (_ event: String, _ fields: [(String, Any)], _ isError: Bool) -> Void
    private let timer = Mutex<PeriodicTask?>(nil)

    init(store: any WebhookStore, secrets: SecretsKeySource?, metrics: Metrics, caFile: String?,
         log: @escaping @Sendable (_ event: String, _ fields: [(String, Any)], _ isError: Bool) -> Void) throws {
        self.store = store
        self.secrets = secrets
        self.metrics = metrics
        self.log = log
        client = try UpstreamClient(UpstreamConfiguration(baseURL: "https://localhost", caFile: caFile, connectTimeout: .seconds(5),
                                                          idleTimeout: .seconds(10), allowHTTP2: false, maxIdleConnections: 8))
        metrics.describe("attestd_webhook_deliveries_total", "Webhook delivery attempts, by outcome (delivered, retried, failed).")
    }

    /// The wait before attempt `n + 1` after `n` failed ones: 1 s, doubling, at most `maxBackoff`.
    static func backoff(afterAttempts attempts: Int) -> TimeInterval {
        min(maxBackoff, pow(2, Double(max(0, min(attempts - 1, 20)))))
    }

    /// One pass: every due row claimed (a batch at a time), sent at once, each attempt recorded.
    func deliverDue(now: Date = Date()) {
        let claimed: [WebhookDelivery]
        do {
            claimed = try store.claimWebhookDeliveries(owner: owner, now: now, leaseUntil: now + Self.leaseSeconds, limit: Self.batch)
        } catch {
            log("webhook_claim_failed", [("error", "\(error)")], true)
            return
        }
        guard !claimed.isEmpty else { return }
        let results = Mutex<[String: (status: Int?, error: String?)]>([:])
        let group = DispatchGroup()
        for delivery in claimed {
            group.enter()
            send(delivery) { status, error in
                results.withLock { $0[delivery.id] = (status, error) }
                group.leave()
            }
        }
        group.wait()
        let finished = Date()
        for delivery in claimed {
            let (status, error) = results.withLock { $0[delivery.id] } ?? (nil, "no answer")
            let delivered = status.map { (200...299).contains($0) } ?? false
            let attempts = delivery.attempts + 1
            let next: Date? = delivered || attempts >= Self.maxAttempts ? nil : finished + Self.backoff(afterAttempts: attempts)
            let outcome = delivered ? "delivered" : next == nil ? "failed" : "retried"
            metrics.increment("attestd_webhook_deliveries_total", labels: [("outcome", outcome)])
            if !delivered {
                log("webhook_delivery_failed", [("delivery", delivery.id), ("endpoint", delivery.endpointID), ("attempt", attempts),
                                                ("status", status.map { $0 as Any } ?? "none"), ("error", error ?? "-"), ("outcome", outcome)], next == nil)
            }
            do {
                try store.finishWebhookDelivery(id: delivery.id, owner: owner, at: finished, status: status, error: delivered ? nil : error ?? "status \(status ?? 0)",
                                                delivered: delivered, nextAttemptAt: next)
            } catch {
                // The lease lapses and the row is claimed again: sent twice, under one delivery ID.
                log("webhook_finish_failed", [("delivery", delivery.id), ("error", "\(error)")], true)
            }
        }
    }

    /// POSTs one delivery; `done` gets the status (nil: no answer) and why not.
    private func send(_ delivery: WebhookDelivery, done: @escaping @Sendable (Int?, String?) -> Void) {
        guard let (origin, path) = Self.split(delivery.url) else { return done(nil, "the stored URL is not one attestd accepts") }
        let secret: [UInt8]
        do {
            guard let secrets else { return done(nil, "no secrets key file: the signing secret cannot be opened") }
            secret = try secrets.open(delivery.sealedSecret, associatedData: WebhookEndpoint.associatedData(workspaceID: delivery.workspaceID,
                                                                                                            url: delivery.url))
        } catch {
            return done(nil, "the signing secret cannot be opened: \(error)")
        }
        let body = Array(delivery.body.utf8)
        let timestamp = Int64(Date().timeIntervalSince1970)
        let request = UpstreamRequest(method: "POST", path: path, headers: [
            ("content-type", "application/json"), ("user-agent", "attestd-webhooks"),
            ("x-attestd-event", delivery.event), ("x-attestd-delivery", delivery.id),
            ("x-attestd-signature", WebhookSignature.header(secret: secret, timestamp: timestamp, body: body)),
        ], body: body, origin: origin, totalTimeout: Self.totalTimeout)
        let collector = AnswerCollector(limit: Self.answerLimit, done: done)
        collector.transfer.withLock { $0 = client.start(request, delegate: collector) }
    }

    /// `https://host:port` and `/path` (at least `/`) of a URL `Validate.cloudURL` accepted.
    static func split(_ url: String) -> (origin: String, path: String)? {
        guard let schemeEnd = url.range(of: "://") else { return nil }
        let rest = url[schemeEnd.upperBound...]
        let authority = rest.prefix { $0 != "/" }
        let path = rest.dropFirst(authority.count)
        return (String(url[..<schemeEnd.upperBound]) + authority, path.isEmpty ? "/" : String(path))
    }

    // MARK: Service

    func start() throws {
        let task = PeriodicTask("webhook-delivery", every: 0.25) { [weak self] in self?.deliverDue() }
        timer.withLock { $0 = task }
        task.start()
    }

    func run() throws { try timer.withLock { $0 }?.run() }

    /// An attempt under way ends by its timeout; what is undelivered waits in the outbox.
    func stop(by deadline: ContinuousClock.Instant) {
        timer.withLock { $0 }?.stop(by: deadline)
        client.shutdown()
    }
}

/// A receiver's answer: its status, the body counted (not kept) up to a limit, then cut.
private final class AnswerCollector: UpstreamDelegate, Sendable {
    let limit: Int
    let transfer = Mutex<UpstreamTransfer?>(nil)
    private let state = Mutex<(status: Int?, read: Int, cut: Bool, done: (@Sendable (Int?, String?) -> Void)?)>((nil, 0, false, nil))

    init(limit: Int, done: @escaping @Sendable (Int?, String?) -> Void) {
        self.limit = limit
        state.withLock { $0.done = done }
    }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        state.withLock { $0.status = status }
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        let over = state.withLock { state -> Bool in
            state.read += chunk.count
            if state.read > limit, !state.cut { state.cut = true; return true }
            return false
        }
        if over { transfer.withLock { $0 }?.cancel() }
        return true
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        let (status, cut, done) = state.withLock { state in
            defer { state.done = nil }
            return (state.status, state.cut, state.done)
        }
        // An answer cut at the limit still answered with its status.
        done?(status, error == nil || cut ? nil : error.map { "\($0.kind.rawValue): \($0.detail.prefix(200))" })
    }
}
