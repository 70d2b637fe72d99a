import AttestWire
import AttestCrypto
import EventLoops
import Foundation
import HTTPServer
import Synchronization
import TokenService

/// Requests numbered since start-up (see `ServiceRouter.newRequestID`).
private let requestCounter = Atomic<UInt64>(0)

/// Maps HTTP to the token service and back. Each route decodes, calls one service method and
/// encodes; errors to the network are opaque, the exact reason goes to the log and metrics.
public final class ServiceRouter: Sendable {
    let service: DeviceTokenService
    let logger: Logger
    let metrics: Metrics
    /// SHA-256 of the introspection key; the key itself is never kept.
    let introspectionKeyHash: [UInt8]?
    /// The Messages API relay; without one, `/v1/messages` answers 503 after the token check.
    let relay: MessagesRelay?
    /// Usage and the per-integration policy for relayed requests; nil relays without either.
    let ledger: UsageLedger?
    /// Where the device exchange and introspection run, off the event loops: verifying an
    /// attestation takes milliseconds of CPU and a registration waits for the database's fsync,
    /// and on a loop either would hold up every other connection of that loop (relayed streams,
    /// health checks). Nil: they run on the loop that took the request.
    let exchangeWorkers: WorkerPool?
    static let offloadedPaths: Set<String> = [WireProtocol.challengePath, WireProtocol.registerPath, WireProtocol.tokenPath,
                                              "/v1/oauth/introspect"]
    /// Extra /metrics text from the transport (the server is made after the router).
    private let transportMetrics = Mutex<(@Sendable () -> String)?>(nil)

    /// Adds `source`'s text (the HTTP server's gauges and counters) to /metrics.
    public func reportTransport(_ source: @escaping @Sendable () -> String) {
        transportMetrics.withLock { $0 = source }
    }

    var metricsText: String { metrics.prometheusText() + (transportMetrics.withLock { $0 }?() ?? "") }

    /// /metrics as last rendered, and when (uptime nanoseconds): a page costs tens of
    /// microseconds to render and many kilobytes to send, so scrapes within `metricsMaxAge`
    /// of each other share one rendering.
    private let renderedMetrics = Mutex<(at: UInt64, body: [UInt8])?>(nil)
    /// How long one rendering of /metrics is served (0: every scrape renders).
    let metricsMaxAge: UInt64

    func metricsPage() -> [UInt8] {
        let now = DispatchTime.now().uptimeNanoseconds
        if metricsMaxAge > 0, let page = renderedMetrics.withLock({ $0 }), now - page.at < metricsMaxAge { return page.body }
        let body = Array(metricsText.utf8)
        renderedMetrics.withLock { $0 = (now, body) }
        return body
    }

    /// Who the caller is behind trusted proxies (`--trusted-proxy`).
    let callers: CallerResolver

    /// With an admin listener, the admin routes answer only there (the public listener says 404).
    let separateAdminListener: Bool
    static let adminPaths: Set<String> = ["/metrics", "/v1/oauth/introspect", "/healthz", "/readyz", authzCheckPath]
    /// The token check for a proxy in front (nginx `auth_request`, Envoy's HTTP `ext_authz`,
    /// which appends the original path to it).
    static let authzCheckPath = "/v1/authz/check"

    /// - Parameter metricsMaxAge: how long one rendering of /metrics is served (seconds).
    public init(service: DeviceTokenService, logger: Logger, introspectionKey: String? = nil, relay: MessagesRelay? = nil,
                ledger: UsageLedger? = nil, trustedProxies: [CIDR] = [], separateAdminListener: Bool = false,
                exchangeWorkers: WorkerPool? = nil, metricsMaxAge: Double = 0) {
        self.metricsMaxAge = UInt64(max(0, metricsMaxAge) * 1e9)
        self.ledger = ledger
        self.exchangeWorkers = exchangeWorkers
        callers = CallerResolver(trustedProxies: trustedProxies)
        self.separateAdminListener = separateAdminListener
        self.service = service
        self.logger = logger
        self.metrics = service.metrics
        self.relay = relay
        introspectionKeyHash = introspectionKey.map { sha256(Array($0.utf8)) }
        metrics.describe("attestd_http_requests_total", "HTTP requests, by route and status.")
        metrics.describe("attestd_rejections_total", "Refused device requests, by endpoint and exact reason.")
        metrics.describe("attestd_upstream_requests_total", "Relayed Messages API requests, by the status the client got (or cancelled, error).")
        metrics.describe("attestd_upstream_latency_seconds", "Relayed requests, from arrival to the reply's last byte.")
        metrics.describe("attestd_upstream_ttfb_seconds", "Relayed requests, from arrival to the upstream's first body byte.")
    }

    /// What a route produced, plus what the access log should say about it.
    struct Outcome {
        var response: HTTPResponse
        var clientID: String? = nil
        var reason: RejectionReason? = nil
        /// A detail for the log only (a malformed field, …).
        var detail: String? = nil
    }

    /// One route: its path, the methods it answers, the names metrics and logs use for it, and its
    /// handler. The table below is the only list of routes.
    struct Route: Sendable {
        let path: String
        let methods: [String]
        /// The `endpoint` label of `attestd_rejections_total` (device exchange routes), or nil.
        let endpoint: String?
        /// The media type of the body the route reads; any other is refused with 415.
        var contentType: String? = nil
        let handler: @Sendable (ServiceRouter, HTTPRequest, String) throws -> Outcome

        /// Whether the request's body is of the type the route reads (or it reads none).
        func reads(_ request: HTTPRequest) -> Bool {
            contentType.map { RequestParsing.hasMediaType(request.header("content-type"), $0) } ?? true
        }
    }

    static let routes: [String: Route] = {
        let json = "application/json", form = "application/x-www-form-urlencoded"
        let table: [Route] = [
            Route(path: WireProtocol.challengePath, methods: ["POST"], endpoint: "challenge", contentType: json) { router, request, id in try router.exchange { try router.challenge(request, id) } },
            Route(path: WireProtocol.registerPath, methods: ["POST"], endpoint: "register", contentType: json) { router, request, id in try router.exchange { try router.register(request, id) } },
            Route(path: WireProtocol.tokenPath, methods: ["POST"], endpoint: "token", contentType: form) { router, request, id in try router.exchange { try router.token(request, id) } },
            Route(path: "/v1/oauth/introspect", methods: ["POST"], endpoint: nil, contentType: form) { try $0.introspect($1, $2) },
            Route(path: WireProtocol.messagesPath, methods: ["POST"], endpoint: nil, contentType: json) { try $0.messages($1, $2) },
            Route(path: WireProtocol.countTokensPath, methods: ["POST"], endpoint: nil, contentType: json) { try $0.messages($1, $2) },
            // Liveness: cheap, no database (a load balancer restarts what fails it).
            Route(path: "/healthz", methods: ["GET"], endpoint: nil) { _, _, _ in Outcome(response: .json(200, #"{"status":"ok"}"#)) },
            // Readiness: can this instance serve? (a load balancer takes it out while not).
            Route(path: "/readyz", methods: ["GET"], endpoint: nil) { router, _, _ in
                guard let problem = router.service.store.readinessProblem() else { return Outcome(response: .json(200, #"{"status":"ready"}"#)) }
                return Outcome(response: .json(503, JSONText.object([("status", "unavailable"), ("reason", problem)])), detail: problem)
            },
            Route(path: "/metrics", methods: ["GET"], endpoint: nil) { router, _, _ in
                Outcome(response: HTTPResponse(status: 200, headers: [("content-type", "text/plain; version=0.0.4")],
                                               body: router.metricsPage()))
            },
        ]
        return Dictionary(uniqueKeysWithValues: table.map { ($0.path, $0) })
    }()

    /// Any other `/v1/…` path: an app token is refused with 403, a bad one with 401.
    static let otherAPI = Route(path: "/v1/other", methods: [], endpoint: nil) { try $0.otherAPI($1, $2) }

    /// The server's entry point: relayed Messages API calls answer later (their reply streams in
    /// as the upstream sends it), the device exchange answers from a worker thread, everything
    /// else answers at once.
    public func handle(_ request: HTTPRequest, _ writer: HTTPResponseWriter) -> HTTPHandlerResult {
        // A body of another type is refused by `handle(_:)` instead (415).
        if let relay, request.method == "POST", MessagesRelay.relayedPaths.contains(request.path),
           Self.routes[request.path]?.reads(request) != false {
            return relayMessages(request, writer, relay)
        }
        // Queued by caller, so that no caller's flood delays another's exchange.
        if let exchangeWorkers, Self.offloadedPaths.contains(request.path),
           exchangeWorkers.submit(key: callers.caller(peer: request.remoteAddress, headers: request.headers),
                                  { [self] in writer.respond(handle(request)) }) {
            return .deferred
        }
        return .response(handle(request))
    }

    /// The admin listener's entry point: its routes only.
    public func handleAdmin(_ request: HTTPRequest) -> HTTPResponse {
        if request.path == Self.authzCheckPath || request.path.hasPrefix(Self.authzCheckPath + "/") { return authzCheck(request) }
        guard Self.adminPaths.contains(request.path) else { return .json(404, #"{"error":"not_found"}"#) }
        return handle(request, admin: true)
    }

    /// `GET /v1/authz/check` (any method, any body, ignored): whether the request's bearer token
    /// may call the Messages API. 200 with `x-attest-workspace` and `x-attest-client-id` for a
    /// live token; otherwise 401, or 403 when the original request was for another API, in the
    /// relay's own shapes. The original path is what Envoy appends to this path, or nginx's
    /// `X-Original-URI` (or `X-Forwarded-Uri`); without either, the Messages API is assumed.
    func authzCheck(_ request: HTTPRequest) -> HTTPResponse {
        let start = DispatchTime.now().uptimeNanoseconds
        let requestID = Self.newRequestID()
        var outcome: Outcome
        do {
            if let grant = try authenticated(request) {
                if let original = Self.originalPath(request), !MessagesRelay.relayedPaths.contains(original) {
                    outcome = Outcome(response: Self.apiError(403, "permission_error", "this access token authorizes the Messages API only",
                                                              requestID: requestID), clientID: grant.clientID, reason: .outOfScope)
                } else {
                    outcome = Outcome(response: HTTPResponse(status: 200, headers: [
                        ("x-attest-workspace", grant.workspaceName), ("x-attest-client-id", grant.clientID), ("cache-control", "no-store"),
                    ], body: []), clientID: grant.clientID)
                }
            } else {
                outcome = Outcome(response: Self.unauthenticated(requestID), reason: .tokenRejected)
            }
        } catch {
            logger.error("store_unavailable", [("route", Self.authzCheckPath), ("request_id", requestID), ("error", String(describing: error))])
            outcome = Outcome(response: Self.apiError(503, "api_error", "the service is temporarily unavailable", requestID: requestID),
                              reason: .storeUnavailable)
        }
        outcome.response.headers.append(("request-id", requestID))
        logRequest(request, route: Self.authzCheckPath, status: outcome.response.status, requestID: requestID, start: start,
                   clientID: outcome.clientID, reason: outcome.reason, detail: outcome.detail)
        return outcome.response
    }

    /// The path of the request a proxy is asking about, when it says.
    static func originalPath(_ request: HTTPRequest) -> String? {
        if request.path.count > authzCheckPath.count { return String(request.path.dropFirst(authzCheckPath.count)) }
        guard let uri = request.header("x-original-uri") ?? request.header("x-forwarded-uri") else { return nil }
        return splitPath(uri)
    }

    /// The path of a request target (origin or absolute form), without its query.
    static func splitPath(_ target: String) -> String {
        var rest = Substring(target)
        if !rest.hasPrefix("/"), let scheme = rest.range(of: "://") {
            rest = rest[scheme.upperBound...]
            rest = rest.firstIndex(of: "/").map { rest[$0...] } ?? "/"
        }
        return String(rest.prefix { $0 != "?" && $0 != "#" })
    }

    public func handle(_ request: HTTPRequest) -> HTTPResponse { handle(request, admin: false) }

    func handle(_ request: HTTPRequest, admin: Bool) -> HTTPResponse {
        let start = DispatchTime.now().uptimeNanoseconds
        let requestID = Self.newRequestID()
        let adminOnly = separateAdminListener && !admin && (request.path == "/metrics" || request.path == "/v1/oauth/introspect"
                                                            || request.path == Self.authzCheckPath || request.path.hasPrefix(Self.authzCheckPath + "/"))
        let route = adminOnly ? nil : Self.routes[request.path] ?? (request.path.hasPrefix("/v1/") ? Self.otherAPI : nil)
        // A bounded set of route labels for metrics: never the raw path, which a caller controls.
        let routeName = route?.path ?? "other"
        var outcome: Outcome
        do {
            if let route {
                if !route.methods.isEmpty && !route.methods.contains(request.method) {
                    var refusal = Self.refusal(405, path: route.path, requestID: requestID)
                    refusal.headers.append(("allow", route.methods.joined(separator: ", ")))
                    outcome = Outcome(response: refusal, reason: .methodNotAllowed)
                } else if !route.reads(request) {
                    outcome = Outcome(response: Self.refusal(415, path: route.path, requestID: requestID), reason: .invalidRequest,
                                      detail: "content-type \(request.header("content-type")?.prefix(64) ?? "missing") is not \(route.contentType ?? "")")
                } else {
                    outcome = try route.handler(self, request, requestID)
                }
            } else {
                outcome = Outcome(response: .json(404, #"{"error":"not_found"}"#))
            }
        } catch let error as StoreAvailabilityError where error.isUnavailable {
            // The database is busy, locked or gone: 503 at once (nothing was half-done: every
            // write is one transaction), and the next request tries again.
            logger.error("store_unavailable", [("route", routeName), ("request_id", requestID), ("error", String(describing: error))])
            let body = MessagesRelay.relayedPaths.contains(routeName)
                ? APIErrorResponse(type: "api_error", message: "the service is temporarily unavailable", requestID: requestID).json
                : OAuthErrorResponse(.serverError).json
            outcome = Outcome(response: .json(503, body, headers: [("retry-after", "1")]), reason: .storeUnavailable)
        } catch {
            // Anything else: logged in full, answered with a bare 500.
            logger.error("internal_error", [("route", routeName), ("request_id", requestID), ("error", String(describing: error))])
            outcome = Outcome(response: .json(500, OAuthErrorResponse(.serverError).json), reason: .internalError)
        }
        outcome.response.headers.append(("request-id", requestID))
        // The one place rejections are counted.
        if let reason = outcome.reason, let endpoint = route?.endpoint {
            metrics.increment("attestd_rejections_total", labels: [("endpoint", endpoint), ("reason", reason.rawValue)])
        }
        logRequest(request, route: routeName, status: outcome.response.status, requestID: requestID, start: start,
                   clientID: outcome.clientID, reason: outcome.reason, detail: outcome.detail)
        return outcome.response
    }

    /// `req_` and 16 bytes, URL-safe: on every response (`request-id`), in error bodies of the
    /// Messages API's shape (`request_id`) and in the log, so a user's report can be found.
    ///
    /// An identifier, not a secret: 8 random bytes drawn once per process, then a counter
    /// scrambled by a bijection (unique within the process, unrelated-looking across requests).
    /// Drawing 16 bytes from OpenSSL's DRBG for every request cost about 7 µs, 3.5% of a relayed
    /// request's CPU.
    static func newRequestID() -> String {
        let count = requestCounter.wrappingAdd(1, ordering: .relaxed).newValue
        // Built in one string from two words on the stack: this runs on every request.
        let words = (requestIDPrefix, scrambled(count &+ requestIDOffset).bigEndian)
        return withUnsafeBytes(of: words) { Base64.encode($0, urlSafe: true, padded: false, after: "req_") }
    }

    /// Random bytes, kept as one word (its bytes in memory order are the ID's first 8).
    private static let requestIDPrefix = secureRandomBytes(8).withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) }
    private static let requestIDOffset = secureRandomBytes(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }

    /// SplitMix64's finalizer: a bijection on 64-bit values that spreads every input bit.
    static func scrambled(_ value: UInt64) -> UInt64 {
        var z = value
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    // MARK: Device token exchange

    /// Runs one exchange endpoint: malformed input → 400, service rejections → their opaque shape.
    func exchange(_ body: () throws -> Outcome) throws -> Outcome {
        do {
            return try body()
        } catch let bad as BadRequest {
            return Outcome(response: .json(400, OAuthErrorResponse(.invalidRequest).json), reason: .invalidRequest, detail: bad.detail)
        } catch let rejection as Rejection {
            let response: HTTPResponse
            switch rejection.kind {
            case .invalidRequest: response = .json(400, OAuthErrorResponse(.invalidRequest).json)
            case .invalidClient: response = .json(401, OAuthErrorResponse(.invalidClient).json)
            case .invalidGrant: response = .json(401, OAuthErrorResponse(.invalidGrant).json)
            case .rateLimited(let retryAfter):
                response = .json(429, OAuthErrorResponse(.rateLimited).json, headers: [("retry-after", String(retryAfter))])
            }
            return Outcome(response: response, reason: rejection.reason, detail: rejection.detail)
        }
    }

    func challenge(_ request: HTTPRequest, _ requestID: String) throws -> Outcome {
        let fields = try RequestParsing.jsonFields(request.body, [("client_id", FieldLimits.clientID), ("key_id", FieldLimits.keyID)])
        let clientID = fields["client_id"]!
        let keyID = try RequestParsing.requireBase64(fields, "key_id")
        do {
            let caller = callers.caller(peer: request.remoteAddress, headers: request.headers)
            let issued = try service.challenge(clientID: clientID, keyID: keyID, caller: caller)
            let body = JSONText.object([("challenge", Base64.encode(issued.challenge)), ("expires_in", issued.expiresIn)])
            return Outcome(response: .json(200, body, headers: [("cache-control", "no-store")]), clientID: clientID)
        }
    }

    func register(_ request: HTTPRequest, _ requestID: String) throws -> Outcome {
        let fields = try RequestParsing.jsonFields(request.body, [("client_id", FieldLimits.clientID), ("key_id", FieldLimits.keyID),
                                                                  ("attestation_object", FieldLimits.attestationObject)])
        let clientID = fields["client_id"]!
        let keyID = try RequestParsing.requireBase64(fields, "key_id")
        guard let object = RequestParsing.base64(fields["attestation_object"]!) else {
            throw attempt(clientID, keyID, "register", BadRequest("attestation_object is not base64"))
        }
        let response = try service.register(clientID: clientID, keyID: keyID, attestationObject: object)
        return Outcome(response: tokenResponse(response), clientID: clientID)
    }

    func token(_ request: HTTPRequest, _ requestID: String) throws -> Outcome {
        let fields = try RequestParsing.formFields(request.body)
        guard let clientID = fields["client_id"], clientID.utf8.count <= FieldLimits.clientID else { throw BadRequest("missing or long client_id") }
        guard let keyText = fields["key_id"], keyText.utf8.count <= FieldLimits.keyID else { throw BadRequest("missing or long key_id") }
        guard let keyID = RequestParsing.base64(keyText) else { throw BadRequest("key_id is not base64") }
        // From here on the request names a challenge: a malformed proof still uses it up.
        guard fields["grant_type"] == WireProtocol.grantType else {
            throw attempt(clientID, keyID, "token", BadRequest("grant_type is not \(WireProtocol.grantType)"))
        }
        guard let assertionText = fields["assertion"], assertionText.utf8.count <= FieldLimits.assertion,
              let assertion = RequestParsing.base64(assertionText) else {
            throw attempt(clientID, keyID, "token", BadRequest("assertion is missing, too long or not base64"))
        }
        let response = try service.refresh(clientID: clientID, keyID: keyID, assertion: assertion)
        return Outcome(response: tokenResponse(response), clientID: clientID)
    }

    /// Records a malformed attempt against its challenge and returns the error to throw.
    func attempt(_ clientID: String, _ keyID: [UInt8], _ action: String, _ error: BadRequest) -> BadRequest {
        service.rejectMalformedAttempt(clientID: clientID, keyID: keyID, action: action, detail: error.detail)
        return error
    }

    func tokenResponse(_ response: IssuedToken) -> HTTPResponse {
        let body = JSONText.object([
            ("access_token", response.accessToken), ("token_type", "Bearer"), ("expires_in", response.expiresIn),
            ("next_challenge", Base64.encode(response.nextChallenge)),
            ("next_challenge_expires_in", response.nextChallengeExpiresIn),
        ])
        return .json(200, body, headers: [("cache-control", "no-store"), ("pragma", "no-cache")])
    }

    // MARK: Using tokens

    /// An error in the Messages API's envelope, carrying the request ID as the real API does.
    static func apiError(_ status: Int, _ type: String, _ message: String, requestID: String) -> HTTPResponse {
        .json(status, APIErrorResponse(type: type, message: message, requestID: requestID).json)
    }

    static func unauthenticated(_ requestID: String) -> HTTPResponse {
        apiError(401, "authentication_error", "invalid, expired or revoked access token", requestID: requestID)
    }

    /// The grant for the request's bearer token; nil when it must be answered with `unauthenticated`.
    func authenticated(_ request: HTTPRequest, at time: Date? = nil) throws -> TokenGrant? {
        guard let token = RequestParsing.bearer(request.header("authorization")), token.utf8.count <= FieldLimits.token else { return nil }
        return try service.authenticate(bearer: token, at: time)
    }

    func messages(_ request: HTTPRequest, _ requestID: String) throws -> Outcome {
        guard let grant = try authenticated(request) else { return Outcome(response: Self.unauthenticated(requestID), reason: .tokenRejected) }
        return Outcome(response: Self.apiError(503, "api_error", "no upstream Messages API is configured on this service", requestID: requestID),
                       clientID: grant.clientID, reason: .noUpstream)
    }

    func otherAPI(_ request: HTTPRequest, _ requestID: String) throws -> Outcome {
        guard let grant = try authenticated(request) else { return Outcome(response: Self.unauthenticated(requestID), reason: .tokenRejected) }
        return Outcome(response: Self.apiError(403, "permission_error", "this access token authorizes the Messages API only", requestID: requestID),
                       clientID: grant.clientID, reason: .outOfScope)
    }

    // MARK: The Messages API relay

    func relayMessages(_ request: HTTPRequest, _ writer: HTTPResponseWriter, _ relay: MessagesRelay) -> HTTPHandlerResult {
        let start = DispatchTime.now().uptimeNanoseconds
        let requestID = Self.newRequestID()
        let route = request.path
        func answer(_ outcome: Outcome) -> HTTPHandlerResult {
            var response = outcome.response
            response.headers.append(("request-id", requestID))
            logRequest(request, route: route, status: response.status, requestID: requestID, start: start, clientID: outcome.clientID,
                       reason: outcome.reason, detail: outcome.detail)
            return .response(response)
        }
        let time = service.now()
        // Taken before the query: usage flushed while it runs is counted, never missed.
        let commitsBeforeRead = ledger?.commitCount ?? 0
        let grant: TokenGrant
        do {
            guard let live = try authenticated(request, at: time) else { return answer(Outcome(response: Self.unauthenticated(requestID), reason: .tokenRejected)) }
            grant = live
        } catch {
            logger.error("store_unavailable", [("route", route), ("request_id", requestID), ("error", String(describing: error))])
            return answer(Outcome(response: Self.apiError(503, "api_error", "the service is temporarily unavailable", requestID: requestID),
                                  reason: .storeUnavailable))
        }
        let key: String
        do {
            key = try relay.key(for: grant)
        } catch {
            switch error {
            case .none:
                return answer(Outcome(response: Self.apiError(503, "api_error", """
                no upstream API key is configured for this workspace: an operator sets one with \
                `attestctl workspaces set-upstream-key`, or starts attestd with --upstream-key-file
                """, requestID: requestID), clientID: grant.clientID, reason: .noUpstream))
            case .unopenable(let why):
                logger.error("upstream_key_unavailable", [("request_id", requestID), ("workspace", grant.workspaceName), ("error", why)])
                return answer(Outcome(response: Self.apiError(503, "api_error", "the upstream API key of this workspace is unavailable",
                                                              requestID: requestID), clientID: grant.clientID, reason: .noUpstream, detail: why))
            }
        }
        var ticket: UsageTicket?
        if let ledger {
            let input = MessagesRequestFields.policyInput(request.body, spendsTokens: route == WireProtocol.messagesPath)
            switch ledger.admit(grant, input, commitsBeforeRead: commitsBeforeRead, at: time) {
            case .success(let admitted): ticket = admitted
            case .failure(let refusal):
                var response = Self.policyResponse(refusal, requestID: requestID)
                response.headers.append(("request-id", requestID))
                logRequest(request, route: route, status: response.status, requestID: requestID, start: start, clientID: grant.clientID,
                           reason: .policyRefused, detail: refusal.reason)
                return .response(response)
            }
        }

        let clientID = grant.clientID
        let admitted = ticket
        let readsAbandoned = admitted != nil && route == WireProtocol.messagesPath && !MessagesRequestFields.asksForStream(request.body)
        let exchange = RelayedExchange(writer: writer, requestID: requestID, started: start, readsAbandonedReply: readsAbandoned) { [self] result in
            let label = result.error.map { $0.kind == .cancelled ? "cancelled" : "error" } ?? String(result.status)
            metrics.increment("attestd_upstream_requests_total", labels: [("status", label)])
            let now = DispatchTime.now().uptimeNanoseconds
            metrics.observe("attestd_upstream_latency_seconds", seconds: Double(now - start) / 1e9, buckets: Metrics.relayBuckets)
            if let firstByte = result.firstByteAt {
                metrics.observe("attestd_upstream_ttfb_seconds", seconds: Double(firstByte - start) / 1e9, buckets: Metrics.relayBuckets)
            }
            if let admitted {
                ledger?.finish(admitted, RelayOutcome(status: result.status, usage: result.usage, incomplete: result.incomplete,
                                                      abandoned: result.abandoned))
            }
            logRequest(request, route: route, status: result.status, requestID: requestID, start: start, clientID: clientID,
                       reason: nil, detail: result.error.map { "upstream \($0)" } ?? (result.abandoned ? "the client left; the reply was read for its usage" : nil),
                       bytes: result.bytes)
        }
        let transfer = relay.start(MessagesRelay.upstreamRequest(request, key: key), delegate: exchange)
        exchange.attach(transfer)
        writer.onWritable { transfer.resume() }
        // A stream is cancelled upstream with its client; a JSON reply is read to its end, for its usage.
        writer.onCancel { if exchange.clientLeft() { transfer.cancel() } }
        writer.onShutdown {
            if exchange.endForShutdown() { transfer.cancel() }
        }
        return .deferred
    }

    /// A policy refusal in the Messages API's error shape: 400 for what the request asks, 429 with
    /// `retry-after` for a limit (the published client maps that to `.rateLimited`).
    static func policyResponse(_ refusal: PolicyRefusal, requestID: String) -> HTTPResponse {
        switch refusal {
        case .unreadableBody(let problem):
            return apiError(400, "invalid_request_error", "the request could not be checked against this app's policy: \(problem)", requestID: requestID)
        case .modelNotAllowed(let model):
            let message = model.isEmpty ? "model: this app must name one of the models it may use"
                : "model: \(model.prefix(128)) is not available to this app"
            return apiError(400, "invalid_request_error", message, requestID: requestID)
        case .maxTokensOverLimit(let requested, let limit):
            return apiError(400, "invalid_request_error", "max_tokens: \(requested) is above this app's limit of \(limit)", requestID: requestID)
        case .deviceRateLimited(let limit, let retryAfter):
            var response = apiError(429, "rate_limit_error", "this device is over its limit of \(limit) requests a minute", requestID: requestID)
            response.headers.append(("retry-after", String(retryAfter)))
            return response
        case .monthlyBudgetSpent(let budget, let retryAfter):
            var response = apiError(429, "rate_limit_error", "this app has used its monthly budget of \(budget) tokens; it renews on the 1st (UTC)",
                                    requestID: requestID)
            response.headers.append(("retry-after", String(retryAfter)))
            return response
        }
    }

    /// The access log line and the request counter, for answers given now and relayed ones alike.
    func logRequest(_ request: HTTPRequest, route: String, status: Int, requestID: String, start: UInt64, clientID: String?,
                    reason: RejectionReason?, detail: String?, bytes: Int? = nil) {
        let microseconds = (DispatchTime.now().uptimeNanoseconds - start) / 1000
        metrics.increment("attestd_http_requests_total", labels: [("route", route), ("status", String(status))])
        // Rendered straight into the line rather than as a boxed field list: this runs once per request.
        logger.log("info", "request", capacity: 256) { fields in
            fields += ",\"method\":"
            JSONText.appendString(request.method.utf8.count <= 16 ? request.method : String(request.method.prefix(16)), to: &fields)
            fields += ",\"route\":"
            JSONText.appendString(route, to: &fields)
            fields += ",\"status\":"
            fields += String(status)
            fields += ",\"ms\":"
            fields += String(microseconds / 1000)
            fields += "."
            fields += String(microseconds % 1000 / 10 + 100).dropFirst()
            fields += ",\"remote\":"
            JSONText.appendString(callers.caller(peer: request.remoteAddress, headers: request.headers), to: &fields)
            fields += ",\"request_id\":"
            JSONText.appendString(requestID, to: &fields)
            if let clientID {
                fields += ",\"client_id\":"
                JSONText.appendString(clientID.utf8.count <= 64 ? clientID : String(clientID.prefix(64)), to: &fields)
            }
            if let reason {
                fields += ",\"reason\":"
                JSONText.appendString(reason.rawValue, to: &fields)
            }
            if let detail {
                fields += ",\"detail\":"
                JSONText.appendString(String(detail.prefix(300)), to: &fields)
            }
            if let bytes {
                fields += ",\"bytes\":"
                fields += String(bytes)
            }
        }
    }

    // MARK: Introspection (RFC 7662)

    func introspect(_ request: HTTPRequest, _ requestID: String) throws -> Outcome {
        guard let expected = introspectionKeyHash, let presented = RequestParsing.bearer(request.header("authorization")),
              constantTimeEquals(sha256(Array(presented.utf8)), expected) else {
            return Outcome(response: .json(401, #"{"error":"invalid_client"}"#, headers: [("www-authenticate", "Bearer")]),
                           reason: .introspectionUnauthorized)
        }
        let fields: [String: String]
        do { fields = try RequestParsing.formFields(request.body) } catch {
            return Outcome(response: .json(400, OAuthErrorResponse(.invalidRequest).json), reason: .invalidRequest)
        }
        guard let token = fields["token"] else { return Outcome(response: .json(400, OAuthErrorResponse(.invalidRequest).json), reason: .invalidRequest) }
        guard token.utf8.count <= FieldLimits.token, let grant = try service.authenticate(bearer: token) else {
            return Outcome(response: .json(200, #"{"active":false}"#, headers: [("cache-control", "no-store")]))
        }
        let body = JSONText.object([
            ("active", true), ("scope", "messages"), ("client_id", grant.clientID), ("workspace", grant.workspaceName),
            ("exp", Int(grant.expiresAt.timeIntervalSince1970)), ("iat", Int(grant.issuedAt.timeIntervalSince1970)), ("token_type", "Bearer"),
        ])
        return Outcome(response: .json(200, body, headers: [("cache-control", "no-store")]), clientID: grant.clientID)
    }
}
