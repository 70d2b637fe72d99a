import AttestWire
import Foundation
import HTTPRouting
import HTTPServer
import TokenAuthentication
import TokenService
import UpstreamClient
import CloudUpstreams

/// The Messages API for app tokens: `/v1/messages` and `/v1/messages/count_tokens` relayed to the
/// upstream with the workspace's key (after the token check and the integration's policy), and
/// every other `/v1/` path refused for an app token (the token authorizes the Messages API only).
/// The token check reads the database on the loop: SQLite locally, PostgreSQL on the loop's own
/// non-blocking connection (the request suspends meanwhile); a profile's limits, read by key
/// across the network, go to a worker. The transfer lives on the loop that took the request.
public struct RelayRoutes: Sendable {
    let service: DeviceTokenService
    /// Without one, `/v1/messages` answers 503 after the token check.
    let relay: MessagesRelay?
    /// Usage and the per-integration policy; nil relays without either.
    let ledger: UsageLedger?
    let metrics: Metrics
    let logger: Logger
    let tokenChecks: (any NonBlockingTokenChecks)?

    public init(service: DeviceTokenService, relay: MessagesRelay?, ledger: UsageLedger?, logger: Logger,
                tokenChecks: (any NonBlockingTokenChecks)? = nil) {
        self.service = service
        self.tokenChecks = tokenChecks
        self.relay = relay
        self.ledger = ledger
        self.metrics = service.metrics
        self.logger = logger
        metrics.describe("attestd_upstream_requests_total", "Relayed Messages API requests, by the status the client got (or cancelled, error).")
        metrics.describe("attestd_upstream_latency_seconds", "Relayed requests, from arrival to the reply's last byte.")
        metrics.describe("attestd_upstream_ttfb_seconds", "Relayed requests, from arrival to the upstream's first body byte.")
        UpstreamCredentialFailures.describe(metrics)
        UpstreamHealth.describe(metrics)
        metrics.describe("attestd_upstream_failovers_total", "Tries a workspace's upstream failed before anything reached the device, after which the next upstream of its list was tried.")
    }

    public var routes: [Route] {
        let relayed = RouteHandler.deferred { context, writer in try relayMessages(context, writer) }
        // A network database's token check runs on the loop's own connection without blocking
        // it (or, without one, on a worker); a profile's limits, read by key, go to a worker.
        let ledger = self.ledger
        let remote = service.store.readsCrossTheNetwork
        let lists = relay?.upstreamLists
        let authentication = BearerTokenAuthentication(service: service, markBeforeCheck: { ledger?.commitCount ?? 0 }, nonBlocking: tokenChecks,
                                                       needsWorker: { grant in
                                                           // A list of upstreams changed since this instance read it is read
                                                           // by key from a network database, on a worker too.
                                                           remote && (grant.policy.readsProfileUsage || lists?.isStale(grant) == true)
                                                       })
        let api = RouteGroup("/v1", shape: .messagesAPI, executor: remote && tokenChecks == nil ? .worker : .loop, middleware: [authentication])
        return [
            api.route(["POST"], "/messages", bodyLimit: MessagesRelay.maxBodyBytes, contentType: "application/json", handler: relayed),
            api.route(["POST"], "/messages/count_tokens", bodyLimit: MessagesRelay.maxBodyBytes, contentType: "application/json", handler: relayed),
            // Any other API: a live app token is refused with 403 (a bad one got 401 from the middleware).
            api.route([], "/*", name: "/v1/other", handler: .answer { context in
                RouteOutcome(MessagesAPIError.outOfScope(context.requestID), clientID: context[AppToken.self]?.grant.clientID,
                             reason: RejectionReason.outOfScope.rawValue)
            }),
        ]
    }

    /// The token check, the workspace's key and the policy, then the transfer: answered later,
    /// as the upstream's reply streams in (nil), or at once when refused.
    func relayMessages(_ context: RequestContext, _ writer: HTTPResponseWriter) throws -> RouteOutcome? {
        let request = context.request, requestID = context.requestID, route = request.path, start = context.started
        // The bearer middleware checked the token (and took the ledger's commit count before its
        // query: usage flushed while it ran is counted, never missed).
        guard let caller = context[AppToken.self] else { throw MissingAuthentication() }
        let grant = caller.grant, time = caller.checkedAt, commitsBeforeRead = caller.markBeforeCheck
        guard let relay else {
            return RouteOutcome(MessagesAPIError.response(503, "api_error", "no upstream Messages API is configured on this service", requestID: requestID),
                                clientID: grant.clientID, reason: RejectionReason.noUpstream.rawValue)
        }
        // The workspace's upstreams in the order they are tried (its list, when it has one, with
        // those cooling down after a failure last; else its own upstream alone). Each is prepared
        // now, before anything is sent: one that does not map the model, or whose service refuses
        // a member or beta, is passed over; the first that can serve the request is tried first.
        let candidates: [MessagesRelay.Candidate]
        do {
            candidates = try relay.candidates(for: grant, store: service.store as? any OrganisationStore)
        } catch {
            let why = "the workspace's list of upstreams cannot be read: \(error)"
            logger.error("upstream_key_unavailable", [("request_id", requestID), ("workspace", grant.workspaceName), ("error", why)])
            return RouteOutcome(MessagesAPIError.response(503, "api_error", "the upstream API key of this workspace is unavailable", requestID: requestID),
                                clientID: grant.clientID, reason: RejectionReason.noUpstream.rawValue, detail: why)
        }
        let countsTokens = route != WireProtocol.messagesPath
        // The one scan of the body, when a cloud's mapping needs it before the policy does.
        var scanned: (input: PolicyInput, streams: Bool)?
        var prepared: [FailoverRun.Prepared] = []
        var refusal: RouteOutcome?
        var unavailable: String?
        var noKey = false
        let health = relay.health, metrics = self.metrics, workspaceName = grant.workspaceName
        for candidate in candidates {
            let target: MessagesRelay.Target
            do {
                target = try relay.target(for: grant, upstream: .some(candidate.key))
            } catch {
                switch error {
                case .none:
                    noKey = true
                case .unopenable(let why):
                    logger.error("upstream_key_unavailable", [("request_id", requestID), ("workspace", grant.workspaceName), ("upstream", candidate.label),
                                                              ("error", why)])
                    if candidates.count > 1 {
                        health.failed(workspace: grant.workspaceID, workspaceName: workspaceName, label: candidate.label, unavailable: true)
                        health.publish(metrics, workspace: workspaceName, label: candidate.label, state: .unavailable)
                    }
                    unavailable = unavailable ?? why
                }
                continue
            }
            let kind = candidate.key?.kind ?? .anthropic
            if case .anthropic(let key) = target {
                let upstreamRequest = MessagesRelay.upstreamRequest(request, key: key)
                prepared.append(FailoverRun.Prepared(label: candidate.label, kind: kind.rawValue, regional: false) { gate in
                    Self.send(upstreamRequest, gate, relay: relay, writer: writer, exchange: gate.exchange)
                })
                continue
            }
            // A cloud upstream takes only the models mapped for it: anything else is refused
            // here, before anything is sent (and before the policy counts it).
            guard let settings = target.settings else { continue }
            let api = CloudAPI(kind: kind, settings: settings)
            func refuse(_ message: String, detail: String? = nil, reason: RejectionReason = .unmappedModel) -> RouteOutcome {
                RouteOutcome(MessagesAPIError.response(400, "invalid_request_error", message, requestID: requestID),
                             clientID: grant.clientID, reason: reason.rawValue, detail: detail)
            }
            let (fields, cloudStreams) = scanned ?? MessagesRequestFields.read(request, spendsTokens: !countsTokens)
            scanned = (fields, cloudStreams)
            guard let model = fields.model, let mapped = settings.models[model] else {
                refusal = refusal ?? refuse("\(fields.model.map { "model \($0) is" } ?? "a request without a model is") not available through this "
                                            + "workspace's \(kind.rawValue) upstream", detail: fields.model)
                continue
            }
            if fields.fallbacks != .none {
                refusal = refusal ?? refuse("fallbacks are not available through this workspace's \(kind.rawValue) upstream")
                continue
            }
            // The cloud's table: a beta it does not take is refused here, by name, not by the cloud.
            if fields.malformed == nil, let beta = api.refusedBeta(fields.betas, extra: settings.extraBetas) {
                refusal = refusal ?? refuse("anthropic-beta: \(beta.prefix(128)) is not available through this workspace's \(kind.rawValue) upstream "
                                            + "(\(api.name)); an owner can allow a beta the cloud has since accepted with --cloud-beta", detail: beta,
                                            reason: .policyRefused)
                continue
            }
            let betas = CloudAPI.sent(fields.betas)
            let plan: CloudPlan
            do {
                switch target {
                case .anthropic:
                    continue
                case .bedrock(let source, _, let identity) where countsTokens:
                    plan = CloudPlan(request: try CloudRoute.bedrockCountTokens(request, modelID: mapped, hasMaxTokens: fields.maxTokens != nil,
                                                                                settings: settings, betas: betas),
                                     reply: .bedrockCountTokens, signingService: "bedrock", region: settings.region, source: source, identity: identity)
                case .bedrock(let source, _, let identity):
                    plan = CloudPlan(request: try CloudRoute.bedrock(request, api: api, modelID: mapped, streams: cloudStreams, settings: settings,
                                                                     betas: betas),
                                     reply: api == .bedrockMessages ? .bedrockMessages : .bedrockInvoke, signingService: "bedrock",
                                     region: settings.region, source: source, identity: identity)
                case .vertex(let source, _, let identity):
                    let body = try CloudRoute.vertexBody(request, model: mapped, betas: betas, countsTokens: countsTokens)
                    plan = CloudPlan(request: CloudRoute.vertex(body: body, model: mapped, streams: cloudStreams, countsTokens: countsTokens,
                                                                settings: settings, betas: betas),
                                     reply: .vertex, signingService: "aiplatform", region: settings.region, source: source, identity: identity)
                case .compatible(let credential, _, let identity):
                    guard let compatible = settings.compatible else { continue }
                    var apiKey: String?
                    if case .apiKey(let key) = credential { apiKey = key }
                    let upstreamRequest = try CloudRoute.compatible(request, api: api, settings: settings, compatible: compatible, modelID: mapped,
                                                                    streams: cloudStreams, countsTokens: countsTokens, betas: betas, apiKey: apiKey)
                    guard case .source(let source) = credential else {
                        // An API key: sent as it is, nothing to fetch or renew.
                        prepared.append(FailoverRun.Prepared(label: candidate.label, kind: compatible.service.rawValue,
                                                             regional: UsageLedger.regional(candidate.key, model: model)) { gate in
                            Self.send(upstreamRequest, Self.reply(.compatible(api), gate: gate, streams: cloudStreams), relay: relay, writer: writer,
                                      exchange: gate.exchange)
                        })
                        continue
                    }
                    plan = CloudPlan(request: upstreamRequest, reply: .compatible(api), signingService: compatible.signingService ?? "",
                                     region: settings.region, source: source, identity: identity)
                }
            } catch let refused as CloudRoute.Refused {
                refusal = refusal ?? refuse("\(refused.what) is not available through this workspace's \(kind.rawValue) upstream (\(api.name))",
                                            detail: refused.what, reason: .invalidRequest)
                continue
            } catch {
                return RouteOutcome(MessagesAPIError.response(400, "invalid_request_error", "the request body is not a JSON object", requestID: requestID),
                                    clientID: grant.clientID, reason: RejectionReason.invalidRequest.rawValue, detail: "\(error)")
            }
            let loop = context.loop, logger = self.logger, label = candidate.label
            prepared.append(FailoverRun.Prepared(label: candidate.label, kind: kind.rawValue,
                                                 regional: UsageLedger.regional(candidate.key, model: model)) { gate in
                let attempt = CloudAttempt(plan: plan, credentials: relay.credentials, loop: loop,
                                           fetch: { request, delegate in _ = relay.start(request, delegate: delegate) },
                                           send: { request, delegate in Self.send(request, delegate, relay: relay, writer: writer, exchange: gate.exchange) },
                                           reply: { Self.reply(plan.reply, gate: gate, streams: cloudStreams) },
                                           unavailable: { why in
                                               logger.error("cloud_credentials_unavailable", [("request_id", requestID), ("workspace", workspaceName),
                                                                                              ("upstream", label), ("kind", kind.rawValue),
                                                                                              ("source", plan.source.name), ("error", why.description)])
                                               gate.answerCredentialFailure(cause: "no credential from \(plan.source.name): \(why)")
                                           },
                                           dropped: { refusal in
                                               logger.info("cloud_credentials_dropped", [("request_id", requestID), ("workspace", workspaceName),
                                                                                         ("upstream", label), ("kind", kind.rawValue),
                                                                                         ("source", plan.source.name), ("refusal", refusal)])
                                           })
                attempt.run()
            })
        }
        guard !prepared.isEmpty else {
            if let unavailable {
                return RouteOutcome(MessagesAPIError.response(503, "api_error", "the upstream API key of this workspace is unavailable", requestID: requestID),
                                    clientID: grant.clientID, reason: RejectionReason.noUpstream.rawValue, detail: unavailable)
            }
            if let refusal { return refusal }
            _ = noKey
            return RouteOutcome(MessagesAPIError.response(503, "api_error", """
            no upstream API key is configured for this workspace: an operator sets one with \
            `attestctl workspaces set-upstream-key`, or starts attestd with --upstream-key-file
            """, requestID: requestID), clientID: grant.clientID, reason: RejectionReason.noUpstream.rawValue)
        }
        var ticket: UsageTicket?
        var asksForStream: Bool?
        if let ledger {
            let (input, streams) = scanned ?? MessagesRequestFields.read(request, spendsTokens: route == WireProtocol.messagesPath)
            asksForStream = streams
            switch ledger.admit(grant, input, commitsBeforeRead: commitsBeforeRead, at: time) {
            case .success(let admitted): ticket = admitted
            case .failure(let refusal):
                return RouteOutcome(Self.policyResponse(refusal, requestID: requestID), clientID: grant.clientID,
                                    reason: RejectionReason.policyRefused.rawValue, detail: refusal.reason)
            }
        }

        let clientID = grant.clientID
        let admitted = ticket
        // Without a ledger the body was not scanned yet: `stream` is read here (the policy's scan
        // refuses a bad value itself).
        let streams: Bool
        if route != WireProtocol.messagesPath {
            streams = false
        } else if let asksForStream {
            streams = asksForStream
        } else if let asks = MessagesRequestFields.asksForStream(request.body) {
            streams = asks
        } else {
            return RouteOutcome(MessagesAPIError.response(400, "invalid_request_error", "stream: must be true or false", requestID: requestID),
                                clientID: grant.clientID, reason: RejectionReason.invalidRequest.rawValue)
        }
        let readsAbandoned = admitted != nil && route == WireProtocol.messagesPath && !streams
        let (ledger, logger) = (self.ledger, self.logger)
        let served = ServedUpstream()
        let exchange = RelayedExchange(writer: writer, requestID: requestID, started: start, readsAbandonedReply: readsAbandoned,
                                       requestStreams: streams) { result in
            let label = result.error.map { $0.kind == .cancelled ? "cancelled" : "error" } ?? String(result.status)
            metrics.increment("attestd_upstream_requests_total", labels: [("status", label)])
            let now = DispatchTime.now().uptimeNanoseconds
            metrics.observe("attestd_upstream_latency_seconds", seconds: Double(now - start) / 1e9, buckets: Metrics.relayBuckets)
            if let firstByte = result.firstByteAt {
                metrics.observe("attestd_upstream_ttfb_seconds", seconds: Double(firstByte - start) / 1e9, buckets: Metrics.relayBuckets)
            }
            let upstream = served.current
            if let admitted {
                ledger?.finish(admitted, RelayOutcome(status: result.status, usage: result.usage, incomplete: result.incomplete,
                                                      abandoned: result.abandoned, servingModel: result.servingModel,
                                                      upstream: upstream.label, failedOver: upstream.failedOver,
                                                      regional: upstream.regional ?? false))
            }
            if let cause = result.credentialFailure {
                UpstreamCredentialFailures.record(kind: upstream.kind ?? "cloud", workspace: workspaceName, requestID: requestID, cause: cause,
                                                  metrics: metrics, logger: logger)
            }
            context.finish(RouteOutcome(ended: result.status, clientID: clientID,
                                        detail: result.logDetail,
                                        bytes: result.bytes))
        }
        let run = FailoverRun(upstreams: prepared, exchange: exchange, health: health, metrics: metrics, logger: logger, requestID: requestID,
                              workspace: (grant.workspaceID, workspaceName), loop: context.loop, served: served)
        let begin: @Sendable () -> Void = { run.start() }
        // The checks above may have run on a worker (a network database); the transfer is driven
        // by the loop that holds the client's connection, so its chunks reach the writer on the
        // writer's own thread. A stopped loop: started here, where the upstream client ends it
        // at once as cancelled.
        if let loop = context.loop, !loop.inLoop, loop.execute(begin) { return nil }
        begin()
        return nil
    }

    /// Starts a try's transfer for the exchange: its chunks go to the client's writer as it
    /// can take them; a stream is cancelled upstream with its client (a JSON reply is read to its
    /// end, for its usage), and a server shutdown ends it. Each try of a failover replaces the
    /// writer's callbacks with its own transfer's.
    static func send(_ upstreamRequest: UpstreamRequest, _ delegate: any UpstreamDelegate, relay: MessagesRelay, writer: HTTPResponseWriter,
                     exchange: RelayedExchange) {
        let transfer = relay.start(upstreamRequest, delegate: delegate)
        exchange.attach(transfer)
        ((delegate as? RefusalCheck)?.inner as? BedrockReply ?? delegate as? BedrockReply)?.attach(transfer)
        writer.onWritable { transfer.resume() }
        writer.onCancel { if exchange.clientLeft() { transfer.cancel() } }
        writer.onShutdown {
            if exchange.endForShutdown() { transfer.cancel() }
        }
    }

    /// The delegate that reads a cloud's reply for a try (through its gate, to the exchange).
    static func reply(_ kind: CloudPlan.Reply, gate: AttemptGate, streams: Bool) -> any UpstreamDelegate {
        switch kind {
        case .bedrockMessages: BedrockMessagesReply(gate)
        case .bedrockInvoke: BedrockReply(gate, streams: streams)
        case .bedrockCountTokens: BedrockMessagesReply(gate, countsTokens: true)
        case .vertex: VertexReply(gate)
        case .compatible(let api):
            BedrockMessagesReply(gate, service: api.name, awsErrors: api == .bedrockMessages || api == .bedrockMantle || api == .claudePlatformAWS)
        }
    }

    /// A policy refusal in the Messages API's error shape: 400 for what the request asks, 429 with
    /// `retry-after` for a limit (the published client maps that to `.rateLimited`).
    public static func policyResponse(_ refusal: PolicyRefusal, requestID: String) -> HTTPResponse {
        switch refusal {
        case .unreadableBody(let problem):
            return MessagesAPIError.response(400, "invalid_request_error", "the request could not be checked against this app's policy: \(problem)", requestID: requestID)
        case .malformed(let problem):
            return MessagesAPIError.response(400, "invalid_request_error", problem, requestID: requestID)
        case .modelNotAllowed(let model):
            let message = model.isEmpty ? "model: this app must name one of the models it may use"
                : "model: \(model.prefix(128)) is not available to this app"
            return MessagesAPIError.response(400, "invalid_request_error", message, requestID: requestID)
        case .fallbackNotAllowed(let model):
            return MessagesAPIError.response(400, "invalid_request_error", "fallbacks: \(model.prefix(128)) is not available to this app", requestID: requestID)
        case .defaultFallbackNotAllowed:
            return MessagesAPIError.response(400, "invalid_request_error",
                            "fallbacks: \"default\" is not available to this app, which may use only the models it lists; name them instead",
                            requestID: requestID)
        case .serverToolNotAllowed(let type):
            return MessagesAPIError.response(400, "invalid_request_error", "tools: the server tool \(type.prefix(128)) is not available to this app", requestID: requestID)
        case .serverToolUsesOverLimit(let type, let requested, let limit):
            let message = requested.map { "tools: \(type.prefix(128)) asks for max_uses \($0), above this app's limit of \(limit)" }
                ?? "tools: \(type.prefix(128)) must set max_uses (at most \(limit)) for this app"
            return MessagesAPIError.response(400, "invalid_request_error", message, requestID: requestID)
        case .betaNotAllowed(let beta):
            return MessagesAPIError.response(400, "invalid_request_error", "anthropic-beta: \(beta.prefix(128)) is not available to this app", requestID: requestID)
        case .profileRateLimited(let limit, let retryAfter):
            var response = MessagesAPIError.response(429, "rate_limit_error", "this user profile is over its limit of \(limit) requests a minute", requestID: requestID)
            response.headers.append(("retry-after", String(retryAfter)))
            return response
        case .profileBudgetSpent(let budget, let retryAfter):
            var response = MessagesAPIError.response(429, "rate_limit_error",
                                    "this user profile has used its monthly budget of \(budget) tokens; it renews on the 1st (UTC)", requestID: requestID)
            response.headers.append(("retry-after", String(retryAfter)))
            return response
        case .moneyBudgetSpent(let budget):
            // The token budgets' wire shape: the published client's `rateLimited` reads the 429
            // and its retry-after, so the app can fall back to the on-device model until then.
            var response = MessagesAPIError.response(429, "rate_limit_error", budget.message, requestID: requestID)
            response.headers.append(("retry-after", String(budget.retryAfter)))
            return response
        case .limitsUnavailable:
            return MessagesAPIError.response(503, "api_error", "this app's limits cannot be checked right now; retry shortly", requestID: requestID)
        case .maxTokensOverLimit(let requested, let limit):
            return MessagesAPIError.response(400, "invalid_request_error", "max_tokens: \(requested) is above this app's limit of \(limit)", requestID: requestID)
        case .deviceRateLimited(let limit, let retryAfter):
            var response = MessagesAPIError.response(429, "rate_limit_error", "this device is over its limit of \(limit) requests a minute", requestID: requestID)
            response.headers.append(("retry-after", String(retryAfter)))
            return response
        case .monthlyBudgetSpent(let budget, let retryAfter):
            var response = MessagesAPIError.response(429, "rate_limit_error", "this app has used its monthly budget of \(budget) tokens; it renews on the 1st (UTC)",
                                    requestID: requestID)
            response.headers.append(("retry-after", String(retryAfter)))
            return response
        }
    }
}

/// A relay route without the bearer middleware in front (a wiring mistake): answered 500.
struct MissingAuthentication: Error, CustomStringConvertible {
    var description: String { "the relay ran without the bearer token middleware" }
}
