import AttestCrypto
import AttestWire
import Foundation
import HTTPRouting
import HTTPServer
import Synchronization
import TokenAuthentication
import TokenService

/// What the operator's side asks: the probes (`/healthz`, `/readyz`, on both listeners),
/// `/metrics`, RFC 7662 introspection for gateways, and `/v1/authz/check`, the token check for a
/// proxy in front (nginx `auth_request`, Envoy's HTTP `ext_authz`). The last three are on the
/// admin listener only, which does not face the internet.
public struct AdminRoutes: Sendable {
    let service: DeviceTokenService
    /// SHA-256 of the introspection key; the key itself is never kept.
    let introspectionKeyHash: [UInt8]?
    let metricsPage: MetricsPage
    /// Where the admin-only routes are served: the admin listener, or, without one (embedded
    /// use, tests), the public listener too.
    let adminListeners: Set<Listener>
    /// The token check without blocking the loop (PostgreSQL), for `/v1/authz/check`.
    let tokenChecks: (any NonBlockingTokenChecks)?

    public static let authzCheckPath = "/v1/authz/check"

    public init(service: DeviceTokenService, introspectionKey: String?, metricsPage: MetricsPage, adminOnly: Bool,
                tokenChecks: (any NonBlockingTokenChecks)? = nil) {
        self.service = service
        self.tokenChecks = tokenChecks
        introspectionKeyHash = introspectionKey.map { sha256(Array($0.utf8)) }
        self.metricsPage = metricsPage
        adminListeners = adminOnly ? [.admin] : [.admin, .public]
    }

    public var routes: [Route] {
        let both: Set<Listener> = [.public, .admin]
        // Routes that read the database leave the loop when a read waits on the network.
        let reads: Executor = service.store.readsCrossTheNetwork ? .worker : .loop
        return [
            // Liveness: cheap, no database (a load balancer restarts what fails it).
            Route(["GET"], "/healthz", on: both, shape: .oauth, handler: .answer { _ in RouteOutcome(.json(200, #"{"status":"ok"}"#)) }),
            // Readiness: can this instance serve? (a load balancer takes it out while not). The
            // reason names paths, hosts and users: it goes to the log and the admin listener only,
            // never to the internet.
            Route(["GET"], "/readyz", on: both, executor: reads, shape: .oauth, handler: .answer { context in
                guard let problem = service.store.readinessProblem() else { return RouteOutcome(.json(200, #"{"status":"ready"}"#)) }
                let body = context.listener == .admin ? JSONText.object([("status", "unavailable"), ("reason", problem)]) : #"{"status":"unavailable"}"#
                return RouteOutcome(.json(503, body), detail: problem)
            }),
            Route(["GET"], "/metrics", on: adminListeners, shape: .oauth, handler: .answer { _ in
                RouteOutcome(HTTPResponse(status: 200, headers: [("content-type", "text/plain; version=0.0.4")], body: metricsPage.render()))
            }),
            Route(["POST"], "/v1/oauth/introspect", on: adminListeners, contentType: "application/x-www-form-urlencoded", executor: .worker,
                  shape: .oauth, handler: .answer { context in try introspect(context) }),
            // Any method, any body (ignored): Envoy sends the original method and appends the
            // original path; nginx sends a GET with the original headers.
            Route([], Self.authzCheckPath + "/*", name: Self.authzCheckPath, on: adminListeners, executor: tokenChecks == nil ? reads : .loop,
                  shape: .messagesAPI, middleware: [BearerTokenAuthentication(service: service, nonBlocking: tokenChecks)],
                  handler: .answer { context in try authzCheck(context) }),
        ]
    }

    // MARK: Introspection (RFC 7662)

    func introspect(_ context: RequestContext) throws -> RouteOutcome {
        let request = context.request
        guard let expected = introspectionKeyHash, let presented = RequestParsing.bearer(request.header("authorization")),
              constantTimeEquals(sha256(Array(presented.utf8)), expected) else {
            return RouteOutcome(.json(401, #"{"error":"invalid_client"}"#, headers: [("www-authenticate", "Bearer")]),
                                reason: RejectionReason.introspectionUnauthorized.rawValue)
        }
        let fields: [String: String]
        do { fields = try RequestParsing.formFields(request.body) } catch {
            return RouteOutcome(.json(400, OAuthErrorResponse(.invalidRequest).json), reason: RejectionReason.invalidRequest.rawValue)
        }
        guard let token = fields["token"] else {
            return RouteOutcome(.json(400, OAuthErrorResponse(.invalidRequest).json), reason: RejectionReason.invalidRequest.rawValue)
        }
        guard token.utf8.count <= FieldLimits.token, let grant = try service.authenticate(bearer: token) else {
            return RouteOutcome(.json(200, #"{"active":false}"#, headers: [("cache-control", "no-store")]))
        }
        let body = JSONText.object([
            ("active", true), ("scope", "messages"), ("client_id", grant.clientID), ("workspace", grant.workspaceName),
            ("exp", Int(grant.expiresAt.timeIntervalSince1970)), ("iat", Int(grant.issuedAt.timeIntervalSince1970)), ("token_type", "Bearer"),
        ])
        return RouteOutcome(.json(200, body, headers: [("cache-control", "no-store")]), clientID: grant.clientID)
    }

    // MARK: The token check for a proxy in front

    /// 200 with `x-attest-workspace` and `x-attest-client-id` for a live token; otherwise 401, or
    /// 403 when the original request was for another API, in the relay's own shapes. The original
    /// path is what Envoy appends to this path, or nginx's `X-Original-URI` (or
    /// `X-Forwarded-Uri`); without either the check fails closed with 403: a proxy configured
    /// without them would otherwise authorise every API behind it.
    func authzCheck(_ context: RequestContext) throws -> RouteOutcome {
        let request = context.request, requestID = context.requestID
        // The bearer middleware answered 401 for a token that is not live.
        guard let grant = context[AppToken.self]?.grant else {
            return RouteOutcome(MessagesAPIError.unauthenticated(requestID), reason: RejectionReason.tokenRejected.rawValue)
        }
        guard let original = Self.originalPath(request) else {
            return RouteOutcome(MessagesAPIError.response(403, "permission_error",
                                                          "the proxy did not say which request it asks about (X-Original-URI or X-Forwarded-Uri)",
                                                          requestID: requestID),
                                clientID: grant.clientID, reason: RejectionReason.outOfScope.rawValue, detail: "no original URI")
        }
        guard AppToken.scope.contains(original) else {
            return RouteOutcome(MessagesAPIError.outOfScope(requestID), clientID: grant.clientID, reason: RejectionReason.outOfScope.rawValue)
        }
        return RouteOutcome(HTTPResponse(status: 200, headers: [
            ("x-attest-workspace", grant.workspaceName), ("x-attest-client-id", grant.clientID), ("cache-control", "no-store"),
        ]), clientID: grant.clientID)
    }

    /// The path of the request a proxy is asking about, when it says.
    static func originalPath(_ request: HTTPRequest) -> String? {
        if request.path.count > authzCheckPath.count { return String(request.path.dropFirst(authzCheckPath.count)) }
        guard let uri = request.header("x-original-uri") ?? request.header("x-forwarded-uri") else { return nil }
        return splitPath(uri)
    }

    /// The path of a request target (origin or absolute form), without its query. A `#` is part
    /// of the path here: nginx's `$request_uri` is the target as the client sent it, and the
    /// upstream receives `/v1/messages#x` as that whole path, so it must not read as `/v1/messages`.
    static func splitPath(_ target: String) -> String {
        var rest = Substring(target)
        if !rest.hasPrefix("/"), let scheme = rest.range(of: "://") {
            rest = rest[scheme.upperBound...]
            rest = rest.firstIndex(of: "/").map { rest[$0...] } ?? "/"
        }
        return String(rest.prefix { $0 != "?" })
    }
}

/// /metrics: the service's counters and the transport's, rendered at most once per `maxAge`
/// (a page costs tens of microseconds to render and many kilobytes to send; scrapes within it
/// share one rendering).
public final class MetricsPage: Sendable {
    let metrics: Metrics
    private let transport = Mutex<(@Sendable () -> String)?>(nil)
    private let rendered = Mutex<(at: UInt64, body: [UInt8])?>(nil)
    let maxAge: UInt64

    public init(metrics: Metrics, maxAge: Double = 0) {
        self.metrics = metrics
        self.maxAge = UInt64(max(0, maxAge) * 1e9)
    }

    /// Adds `source`'s text (the HTTP servers' gauges and counters), known once they exist.
    public func reportTransport(_ source: @escaping @Sendable () -> String) {
        transport.withLock { $0 = source }
    }

    public var text: String { metrics.prometheusText() + (transport.withLock { $0 }?() ?? "") }

    func render() -> [UInt8] {
        let now = DispatchTime.now().uptimeNanoseconds
        if maxAge > 0, let page = rendered.withLock({ $0 }), now - page.at < maxAge { return page.body }
        let body = Array(text.utf8)
        rendered.withLock { $0 = (now, body) }
        return body
    }
}
