import HTTPServer

/// The admin listener answers only requests addressed to it: a `Host` that is an IP address, or
/// `localhost`, or one of the names the operator gave (`attestd serve --base-url`). Any other
/// `Host` gets 421 before any route runs. A request without one (HTTP/1.0) is not a browser's. A page on another site that rebinds its own name to this
/// machine's address (DNS rebinding) sends that name as `Host`, so it cannot read /metrics or the
/// console from an operator's browser.
public struct AdminHostCheck: Middleware {
    /// Lowercased host names (no port) besides IP literals and `localhost`.
    let names: Set<String>

    public init(names: [String]) { self.names = Set(names.map { $0.lowercased() }) }

    public func respond(to context: RequestContext, next: (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome? {
        guard context.listener == .admin, let host = context.request.header("host"), !allows(host) else { return try next(context) }
        return RouteOutcome(context.route.shape.refusal(421, context.requestID), reason: "misdirected_request",
                            detail: "Host \(host.prefix(64)) is not this admin listener's")
    }

    /// Whether a `Host` header value names this listener.
    public func allows(_ host: String) -> Bool {
        let name = hostWithoutPort(host.trimmingSpaces).lowercased()
        guard !name.isEmpty else { return false }
        return name == "localhost" || IPAddress(name) != nil || names.contains(name)
    }
}
