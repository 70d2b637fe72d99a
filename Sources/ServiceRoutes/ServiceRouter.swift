import AdminRoutes
import AttestWire
import EventLoops
import ExchangeRoutes
import Foundation
import HTTPRouting
import HTTPServer
import RelayRoutes
import TokenService

/// The service's HTTP API: one route table, assembled from the route groups (the device
/// exchange, the Messages relay, the operator's routes), with the middleware every request goes
/// through (request ID, metrics, access log). The groups decode, call one service method and
/// encode; the table says for each route where it is served, what body it takes, where it runs
/// and in which shape it refuses.
public final class ServiceRouter: Sendable {
    public let router: Router
    public let metricsPage: MetricsPage
    let logger: Logger

    /// - Parameters:
    ///   - separateAdminListener: the admin routes (/metrics, introspection, the token check)
    ///     answer on the admin listener only; without it they answer on the public one too.
    ///   - exchangeWorkers: where the device exchange and introspection run (nil: the loops).
    ///   - metricsMaxAge: how long one rendering of /metrics is served (seconds).
    ///   - tokenChecks: the token check without blocking the loops (PostgreSQL), for the relay
    ///     and the proxy's token check; without it they read the store where they run.
    public init(service: DeviceTokenService, logger: Logger, introspectionKey: String? = nil, relay: MessagesRelay? = nil,
                ledger: UsageLedger? = nil, trustedProxies: [CIDR] = [], trustedProxyHeader: ForwardingHeader = .xForwardedFor,
                ipv6PrefixLength: Int = CallerResolver.defaultIPv6PrefixLength, separateAdminListener: Bool = false, adminHostNames: [String] = [],
                exchangeWorkers: WorkerPool? = nil, metricsMaxAge: Double = 0, tokenChecks: (any NonBlockingTokenChecks)? = nil,
                extraRoutes: [Route] = []) {
        self.logger = logger
        let metrics = service.metrics
        let callers = CallerResolver(trustedProxies: trustedProxies, header: trustedProxyHeader, ipv6PrefixLength: ipv6PrefixLength)
        metricsPage = MetricsPage(metrics: metrics, maxAge: metricsMaxAge)
        metrics.describe("attestd_http_requests_total", "HTTP requests, by route and status.")
        metrics.describe("attestd_rejections_total", "Refused device requests, by endpoint and exact reason.")
        let routes = ExchangeRoutes(service: service, callers: callers).routes
            + RelayRoutes(service: service, relay: relay, ledger: ledger, logger: logger, tokenChecks: tokenChecks).routes
            + AdminRoutes(service: service, introspectionKey: introspectionKey, metricsPage: metricsPage, adminOnly: separateAdminListener,
                          tokenChecks: tokenChecks).routes
            + extraRoutes
        router = Router(routes: routes, middleware: [RequestIDHeader(), RequestMetrics(metrics: metrics), AccessLog(logger: logger, callers: callers),
                                                     AdminHostCheck(names: adminHostNames)],
                        fallbackShape: .oauth, workers: exchangeWorkers,
                        // Queued by caller, so that no caller's flood delays another's exchange.
                        workerKey: { request in callers.limitKey(peer: request.remoteAddress, headers: request.headers) },
                        classify: { error in (error as? any StoreAvailabilityError)?.isUnavailable == true ? .unavailable : .failed },
                        onFailure: { context, failure, error in
                            // The database is busy, locked or gone: 503 at once (nothing was half-done:
                            // every write is one transaction), and the next request tries again.
                            logger.error(failure == .unavailable ? "store_unavailable" : "internal_error",
                                         [("route", context.route.name), ("request_id", context.requestID), ("error", String(describing: error))])
                        })
    }

    /// The public listener's entry point.
    public func handle(_ request: HTTPRequest, _ writer: HTTPResponseWriter) -> HTTPHandlerResult {
        router.handle(request, writer, on: .public)
    }

    /// Every listener-dependent setting of a listener's `HTTPServerConfiguration` (body limits,
    /// refusal and overload shapes), from the route table.
    public func configure(_ configuration: inout HTTPServerConfiguration, for listener: Listener) {
        router.configure(&configuration, for: listener)
    }

    /// Adds `source`'s text (the HTTP servers' gauges and counters) to /metrics.
    public func reportTransport(_ source: @escaping @Sendable () -> String) { metricsPage.reportTransport(source) }

    static func newRequestID() -> String { RequestID.next() }
    static func scrambled(_ value: UInt64) -> UInt64 { RequestID.scrambled(value) }
}

/// `attestd_http_requests_total{route,status}` for every request, and the device exchange's
/// refusals by endpoint and exact reason: the one place both are counted.
struct RequestMetrics: Middleware {
    let metrics: Metrics

    func after(_ context: RequestContext, _ outcome: inout RouteOutcome) {
        if let reason = outcome.reason, let endpoint = context.route.endpoint {
            metrics.increment("attestd_rejections_total", labels: [("endpoint", endpoint), ("reason", reason)])
        }
        metrics.increment("attestd_http_requests_total", labels: [("route", context.route.name), ("status", String(outcome.status))])
    }
}

/// One access log line a request, as its answer goes out (or, streamed, when it has ended).
struct AccessLog: Middleware {
    let logger: Logger
    let callers: CallerResolver

    func after(_ context: RequestContext, _ outcome: inout RouteOutcome) {
        let request = context.request, detail = outcome.detail, reason = outcome.reason, clientID = outcome.clientID
        let status = outcome.status, bytes = outcome.bytes
        let microseconds = (DispatchTime.now().uptimeNanoseconds - context.started) / 1000
        // Rendered straight into the line rather than as a boxed field list: this runs once per request.
        logger.log("info", "request", capacity: 256) { fields in
            fields += ",\"method\":"
            JSONText.appendString(request.method.utf8.count <= 16 ? request.method : String(request.method.prefix(16)), to: &fields)
            fields += ",\"route\":"
            JSONText.appendString(context.route.name, to: &fields)
            fields += ",\"status\":"
            fields += String(status)
            fields += ",\"ms\":"
            fields += String(microseconds / 1000)
            fields += "."
            fields += String(microseconds % 1000 / 10 + 100).dropFirst()
            fields += ",\"remote\":"
            JSONText.appendString(callers.caller(peer: request.remoteAddress, headers: request.headers), to: &fields)
            fields += ",\"request_id\":"
            JSONText.appendString(context.requestID, to: &fields)
            if let clientID {
                fields += ",\"client_id\":"
                JSONText.appendString(clientID.utf8.count <= 64 ? clientID : String(clientID.prefix(64)), to: &fields)
            }
            if let reason {
                fields += ",\"reason\":"
                JSONText.appendString(reason, to: &fields)
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
}
