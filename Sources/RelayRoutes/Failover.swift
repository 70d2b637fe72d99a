import CloudUpstreams
import Dispatch
import EventLoops
import Foundation
import HTTPRouting
import Synchronization
import TokenService
import UpstreamClient

/// What one try's reply does before the device sees anything: a 429, 529 or 5xx, a refusal of
/// this service's credentials (401, 403, or a cloud's credential failure) or a transfer that
/// failed before its head (a connect failure, a timeout) is held back and the next upstream of the
/// list is tried; anything else commits the try, and from then on every event goes to the
/// exchange as it comes (a stream that has begun is never replayed). The last try of the list
/// always commits. Sits between the cloud's reply reader and the exchange.
final class AttemptGate: UpstreamDelegate, CloudReplyExchange {
    enum Decision {
        case undecided
        case committed
        case failing(String)
    }

    private struct State {
        var decision = Decision.undecided
        /// Notes (the upstream's request ID, billed counts) held until the try commits.
        var notes: [@Sendable (any CloudReplyExchange) -> Void] = []
    }

    let exchange: RelayedExchange
    let isLast: Bool
    /// The try failed before anything reached the device: why, for the log; try the next one.
    let failover: @Sendable (String) -> Void
    /// The try answers the device (succeeded or not).
    let committed: @Sendable (Int) -> Void
    private let state = Mutex(State())

    init(exchange: RelayedExchange, isLast: Bool, failover: @escaping @Sendable (String) -> Void, committed: @escaping @Sendable (Int) -> Void) {
        self.exchange = exchange
        self.isLast = isLast
        self.failover = failover
        self.committed = committed
    }

    /// The statuses another upstream may answer better: rate limits, overload, server errors,
    /// and refusals of this service's credentials (the device's own token was checked here).
    static func triesNext(_ status: Int) -> Bool {
        status == 429 || status == 529 || status == 401 || status == 403 || (500...599).contains(status)
    }

    /// Decides on the first event of the reply; returns true when it goes to the exchange.
    private func decide(status: Int?, failure: String?) -> Bool {
        let (forward, notes, commit) = state.withLock { s -> (Bool, [@Sendable (any CloudReplyExchange) -> Void], Bool) in
            switch s.decision {
            case .committed: return (true, [], false)
            case .failing: return (false, [], false)
            case .undecided:
                if let failure, !isLast, exchange.mayTryAgain {
                    s.decision = .failing(failure)
                    return (false, [], false)
                }
                s.decision = .committed
                defer { s.notes = [] }
                return (true, s.notes, true)
            }
        }
        if commit {
            for note in notes { note(exchange) }
            committed(status ?? 0)
        }
        return forward
    }

    private func note(_ body: @escaping @Sendable (any CloudReplyExchange) -> Void) {
        let now = state.withLock { s -> Bool in
            if case .committed = s.decision { return true }
            s.notes.append(body)
            return false
        }
        if now { body(exchange) }
    }

    // MARK: UpstreamDelegate (the Anthropic API's reply, which goes to the exchange as it is)

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        guard decide(status: status, failure: Self.triesNext(status) ? "answered \(status)" : nil) else { return }
        exchange.upstreamDidReceiveHead(status: status, headers: headers)
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        let decision = state.withLock { $0.decision }
        switch decision {
        case .committed: return exchange.upstreamDidReceive(chunk)
        // A failed try's error body is read and dropped (the transfer ends soon after).
        case .failing: return true
        case .undecided: return decide(status: nil, failure: nil) ? exchange.upstreamDidReceive(chunk) : true
        }
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        let decision = state.withLock { $0.decision }
        switch decision {
        case .committed:
            exchange.upstreamDidFinish(error)
        case .failing(let why):
            failover(why)
        case .undecided:
            // Ended before any head: a connect failure or a timeout tries the next upstream; a
            // cancellation (the client left, the server stops) ends the exchange as it is.
            let why = error.flatMap { $0.kind == .cancelled ? nil : "failed before answering: \($0)" }
            if decide(status: nil, failure: why) { exchange.upstreamDidFinish(error) } else { failover(why ?? "failed") }
        }
    }

    // MARK: CloudReplyExchange (a cloud's reply reader, which hands on what the API would have sent)

    func answerCloudError(_ answer: CloudErrorAnswer, retryAfter: String?) {
        let failure = answer.isCredentialFailure ? "credentials refused: \(answer.detail.prefix(300))"
            : Self.triesNext(answer.status) ? "answered \(answer.status): \(answer.detail.prefix(300))" : nil
        if decide(status: answer.status, failure: failure) {
            exchange.answerCloudError(answer, retryAfter: retryAfter)
        } else if case .failing(let why) = state.withLock({ $0.decision }) {
            failover(why)
        }
    }

    /// No credential could be had for this try (the source failed): like a refusal of them.
    func answerCredentialFailure(cause: String) {
        answerCloudError(CloudErrorAnswer(status: 503, type: "api_error", message: CloudErrorAnswer.credentialsRefused, detail: cause), retryAfter: nil)
    }

    func noteCloudError(_ detail: String) { note { $0.noteCloudError(detail) } }
    func noteCloudRequestID(_ id: String) { note { $0.noteCloudRequestID(id) } }
    func noteBilledCounts(inBedrockHeaders headers: [(name: String, value: String)]) { note { $0.noteBilledCounts(inBedrockHeaders: headers) } }
}

/// One request's tries over its workspace's list: each prepared upstream in turn until one
/// commits. Each try is logged (`upstream_try`), a failed one cools its upstream down, the
/// served one's label goes to the ledger. The request ID is the same for every try.
final class FailoverRun: Sendable {
    /// One upstream, ready to be sent to: its label and how to start its try with a gate.
    struct Prepared: Sendable {
        let label: String
        let kind: String
        /// Whether this upstream charges the regional uplift for the request's model (`UsageLedger.regional`).
        let regional: Bool
        let begin: @Sendable (AttemptGate) -> Void
    }

    let upstreams: [Prepared]
    let exchange: RelayedExchange
    let health: UpstreamHealth
    let metrics: Metrics
    let logger: Logger
    let requestID: String
    let workspace: (id: Int64, name: String)
    let loop: EventLoop?
    let served: ServedUpstream

    init(upstreams: [Prepared], exchange: RelayedExchange, health: UpstreamHealth, metrics: Metrics, logger: Logger, requestID: String,
         workspace: (id: Int64, name: String), loop: EventLoop?, served: ServedUpstream) {
        self.served = served
        self.upstreams = upstreams
        self.exchange = exchange
        self.health = health
        self.metrics = metrics
        self.logger = logger
        self.requestID = requestID
        self.workspace = workspace
        self.loop = loop
    }

    func start(_ index: Int = 0) {
        let upstream = upstreams[index]
        let began = DispatchTime.now().uptimeNanoseconds
        let gate = AttemptGate(exchange: exchange, isLast: index == upstreams.count - 1, failover: { [self] why in
            let pause = health.failed(workspace: workspace.id, workspaceName: workspace.name, label: upstream.label)
            health.publish(metrics, workspace: workspace.name, label: upstream.label, state: .coolingDown)
            metrics.increment("attestd_upstream_failovers_total", labels: [("workspace", workspace.name), ("upstream", upstream.label)])
            logger.info("upstream_try", [("request_id", requestID), ("workspace", workspace.name), ("upstream", upstream.label),
                                         ("kind", upstream.kind), ("try", index + 1), ("outcome", "failed over"), ("why", why),
                                         ("ms", Self.milliseconds(since: began)), ("cooldown_s", Double(pause.components.seconds))])
            let next: @Sendable () -> Void = {
                // The client left meanwhile (or the server is stopping): nothing more is tried.
                guard self.exchange.mayTryAgain else {
                    self.exchange.upstreamDidFinish(UpstreamError(kind: .cancelled, detail: "the client left before another upstream was tried"))
                    return
                }
                self.start(index + 1)
            }
            // Every try is driven by the loop that holds the client's connection.
            if let loop, !loop.inLoop, loop.execute(next) { return }
            next()
        }, committed: { [self] status in
            served.set(label: upstream.label, kind: upstream.kind, failedOver: index > 0, regional: upstream.regional)
            if upstreams.count < 2 {
                // Nothing to fail over to: no cool-down (it would skip nothing) and no state to show.
            } else if AttemptGate.triesNext(status) {
                // The last of the list answered the failure itself: it cools down all the same.
                health.failed(workspace: workspace.id, workspaceName: workspace.name, label: upstream.label)
                health.publish(metrics, workspace: workspace.name, label: upstream.label, state: .coolingDown)
            } else if health.succeeded(workspace: workspace.id, label: upstream.label) {
                health.publish(metrics, workspace: workspace.name, label: upstream.label, state: .ready)
            }
            if upstreams.count > 1 {
                logger.info("upstream_try", [("request_id", requestID), ("workspace", workspace.name), ("upstream", upstream.label),
                                             ("kind", upstream.kind), ("try", index + 1), ("outcome", "answered \(status)"),
                                             ("ms", Self.milliseconds(since: began))])
            }
        })
        upstream.begin(gate)
    }

    static func milliseconds(since start: UInt64) -> Double {
        Double(DispatchTime.now().uptimeNanoseconds &- start) / 1e6
    }
}

/// Which upstream of the list answered a request, its kind, and whether an earlier one failed
/// first: for the ledger, the metrics and the log, read when the exchange ends.
final class ServedUpstream: Sendable {
    private let value = Mutex<(label: String?, kind: String?, failedOver: Bool, regional: Bool?)>((nil, nil, false, nil))

    func set(label: String, kind: String, failedOver: Bool, regional: Bool) { value.withLock { $0 = (label, kind, failedOver, regional) } }
    var current: (label: String?, kind: String?, failedOver: Bool, regional: Bool?) { value.withLock { $0 } }
}
