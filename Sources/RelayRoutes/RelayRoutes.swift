import AttestWire
import Foundation
import HTTPRouting
import HTTPServer
import TokenAuthentication
import TokenService
import UpstreamClient
import CloudUpstreams

/// A request to a cloud upstream, prepared before anything is sent.
enum CloudPlan: Sendable {
    case bedrock(UpstreamRequest, api: CloudAPI)
    /// Bedrock's CountTokens, whose `{"inputTokens":N}` becomes the API's `{"input_tokens":N}`.
    case bedrockCountTokens(UpstreamRequest)
    /// The body as Vertex takes it; the request is made once the access token is there.
    case vertex(body: [UInt8], model: String, countsTokens: Bool, betas: [String], account: GoogleServiceAccount, settings: CloudUpstreamSettings,
                sealed: [UInt8])
}

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
    }

    public var routes: [Route] {
        let relayed = RouteHandler.deferred { context, writer in try relayMessages(context, writer) }
        // A network database's token check runs on the loop's own connection without blocking
        // it (or, without one, on a worker); a profile's limits, read by key, go to a worker.
        let ledger = self.ledger
        let remote = service.store.readsCrossTheNetwork
        let authentication = BearerTokenAuthentication(service: service, markBeforeCheck: { ledger?.commitCount ?? 0 }, nonBlocking: tokenChecks,
                                                       needsWorker: { grant in remote && grant.policy.readsProfileUsage })
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
        let target: MessagesRelay.Target
        do {
            target = try relay.target(for: grant)
        } catch {
            switch error {
            case .none:
                return RouteOutcome(MessagesAPIError.response(503, "api_error", """
                no upstream API key is configured for this workspace: an operator sets one with \
                `attestctl workspaces set-upstream-key`, or starts attestd with --upstream-key-file
                """, requestID: requestID), clientID: grant.clientID, reason: RejectionReason.noUpstream.rawValue)
            case .unopenable(let why):
                logger.error("upstream_key_unavailable", [("request_id", requestID), ("workspace", grant.workspaceName), ("error", why)])
                return RouteOutcome(MessagesAPIError.response(503, "api_error", "the upstream API key of this workspace is unavailable", requestID: requestID),
                                    clientID: grant.clientID, reason: RejectionReason.noUpstream.rawValue, detail: why)
            }
        }
        // A cloud upstream takes only the models mapped for it: anything else is refused here,
        // before anything is sent (and before the policy counts it).
        var cloud: CloudPlan?
        // The one scan of the body, when a cloud's mapping needs it before the policy does.
        var scanned: (input: PolicyInput, streams: Bool)?
        switch target {
        case .anthropic: break
        case .bedrock(_, let settings), .vertex(_, let settings, _):
            let api = CloudAPI(kind: grant.upstreamKey?.kind ?? .bedrock, settings: settings)
            let kind = grant.upstreamKey?.kind.rawValue ?? "cloud"
            func refuse(_ message: String, detail: String? = nil, reason: RejectionReason = .unmappedModel) -> RouteOutcome {
                RouteOutcome(MessagesAPIError.response(400, "invalid_request_error", message, requestID: requestID),
                             clientID: grant.clientID, reason: reason.rawValue, detail: detail)
            }
            let countsTokens = route != WireProtocol.messagesPath
            let (fields, cloudStreams) = MessagesRequestFields.read(request, spendsTokens: !countsTokens)
            scanned = (fields, cloudStreams)
            guard let model = fields.model, let mapped = settings.models[model] else {
                return refuse("\(fields.model.map { "model \($0) is" } ?? "a request without a model is") not available through this workspace's \(kind) upstream",
                              detail: fields.model)
            }
            if fields.fallbacks != .none { return refuse("fallbacks are not available through this workspace's \(kind) upstream") }
            // The cloud's table: a beta it does not take is refused here, by name, not by the cloud.
            if fields.malformed == nil, let beta = api.refusedBeta(fields.betas, extra: settings.extraBetas) {
                return refuse("anthropic-beta: \(beta.prefix(128)) is not available through this workspace's \(kind) upstream (\(api.name)); "
                              + "an owner can allow a beta the cloud has since accepted with --cloud-beta", detail: beta, reason: .policyRefused)
            }
            let betas = CloudAPI.sent(fields.betas)
            do {
                switch target {
                case .anthropic: break
                case .bedrock(let credentials, _) where countsTokens:
                    cloud = .bedrockCountTokens(try CloudRoute.bedrockCountTokens(request, modelID: mapped, hasMaxTokens: fields.maxTokens != nil,
                                                                                  settings: settings, betas: betas, credentials: credentials, at: Date()))
                case .bedrock(let credentials, _):
                    cloud = .bedrock(try CloudRoute.bedrock(request, api: api, modelID: mapped, streams: cloudStreams, settings: settings,
                                                            betas: betas, credentials: credentials, at: Date()), api: api)
                case .vertex(let account, _, let sealed):
                    cloud = .vertex(body: try CloudRoute.vertexBody(request, model: mapped, betas: betas, countsTokens: countsTokens), model: mapped,
                                    countsTokens: countsTokens, betas: betas, account: account, settings: settings, sealed: sealed)
                }
            } catch let refused as CloudRoute.Refused {
                return refuse("\(refused.what) is not available through this workspace's \(kind) upstream (\(api.name))", detail: refused.what,
                              reason: .invalidRequest)
            } catch {
                return RouteOutcome(MessagesAPIError.response(400, "invalid_request_error", "the request body is not a JSON object", requestID: requestID),
                                    clientID: grant.clientID, reason: RejectionReason.invalidRequest.rawValue, detail: "\(error)")
            }
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
        let (metrics, ledger, logger) = (self.metrics, self.ledger, self.logger)
        let upstreamKind = grant.upstreamKey?.kind.rawValue ?? "cloud", workspaceName = grant.workspaceName
        let exchange = RelayedExchange(writer: writer, requestID: requestID, started: start, readsAbandonedReply: readsAbandoned,
                                       requestStreams: streams) { result in
            let label = result.error.map { $0.kind == .cancelled ? "cancelled" : "error" } ?? String(result.status)
            metrics.increment("attestd_upstream_requests_total", labels: [("status", label)])
            let now = DispatchTime.now().uptimeNanoseconds
            metrics.observe("attestd_upstream_latency_seconds", seconds: Double(now - start) / 1e9, buckets: Metrics.relayBuckets)
            if let firstByte = result.firstByteAt {
                metrics.observe("attestd_upstream_ttfb_seconds", seconds: Double(firstByte - start) / 1e9, buckets: Metrics.relayBuckets)
            }
            if let admitted {
                ledger?.finish(admitted, RelayOutcome(status: result.status, usage: result.usage, incomplete: result.incomplete,
                                                      abandoned: result.abandoned, servingModel: result.servingModel))
            }
            if let cause = result.credentialFailure {
                UpstreamCredentialFailures.record(kind: upstreamKind, workspace: workspaceName, requestID: requestID, cause: cause,
                                                  metrics: metrics, logger: logger)
            }
            context.finish(RouteOutcome(ended: result.status, clientID: clientID,
                                        detail: result.logDetail,
                                        bytes: result.bytes))
        }
        let send: @Sendable (UpstreamRequest, any UpstreamDelegate) -> Void = { upstreamRequest, delegate in
            let transfer = relay.start(upstreamRequest, delegate: delegate)
            exchange.attach(transfer)
            (delegate as? BedrockReply)?.attach(transfer)
            writer.onWritable { transfer.resume() }
            // A stream is cancelled upstream with its client; a JSON reply is read to its end, for its usage.
            writer.onCancel { if exchange.clientLeft() { transfer.cancel() } }
            writer.onShutdown {
                if exchange.endForShutdown() { transfer.cancel() }
            }
        }
        let begin: @Sendable () -> Void
        switch cloud {
        case nil:
            guard case .anthropic(let key) = target else { return nil }
            let upstreamRequest = MessagesRelay.upstreamRequest(request, key: key)
            begin = { send(upstreamRequest, exchange) }
        case .bedrock(let upstreamRequest, .bedrockMessages):
            // The Messages API answers in the API's own shapes; its errors in AWS's.
            begin = { send(upstreamRequest, BedrockMessagesReply(exchange)) }
        case .bedrock(let upstreamRequest, _):
            begin = { send(upstreamRequest, BedrockReply(exchange, streams: streams)) }
        case .bedrockCountTokens(let upstreamRequest):
            begin = { send(upstreamRequest, BedrockMessagesReply(exchange, countsTokens: true)) }
        case .vertex(let body, let model, let countsTokens, let betas, let account, let settings, let sealed):
            let tokens = relay.vertexTokens, workspace = grant.workspaceID, workspaceName = grant.workspaceName
            let tokenURL = settings.tokenURL ?? account.tokenURI
            let loop = context.loop, logger = self.logger
            begin = {
                tokens.token(workspace: workspace, sealed: sealed, account: account, tokenURL: tokenURL,
                             start: { request, delegate in _ = relay.start(request, delegate: delegate) }) { result in
                    let go: @Sendable () -> Void = {
                        switch result {
                        case .success(let token):
                            send(CloudRoute.vertex(body: body, model: model, streams: streams, countsTokens: countsTokens, settings: settings,
                                                   betas: betas, accessToken: token),
                                 VertexReply(exchange))
                        case .failure(let why):
                            logger.error("vertex_token_unavailable", [("request_id", requestID), ("workspace", workspaceName), ("error", why.description)])
                            exchange.answerCredentialFailure(cause: "the access token grant failed: \(why)")
                        }
                    }
                    // The token may come on another loop (another request's fetch): the
                    // transfer is driven by the loop that holds this client's connection.
                    if let loop, !loop.inLoop, loop.execute(go) { return }
                    go()
                }
            }
        }
        // The checks above may have run on a worker (a network database); the transfer is driven
        // by the loop that holds the client's connection, so its chunks reach the writer on the
        // writer's own thread. A stopped loop: started here, where the upstream client ends it
        // at once as cancelled.
        if let loop = context.loop, !loop.inLoop, loop.execute(begin) { return nil }
        begin()
        return nil
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
