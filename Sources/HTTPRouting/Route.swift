import EventLoops
import HTTPServer

/// Which listener a route is served on. The public listener faces the internet; the admin one
/// (`--admin-listen`) does not.
public enum Listener: String, Sendable, CaseIterable {
    case `public`, admin
}

/// Where a route's handler runs: on the event loop that took the request (cheap work, or work
/// that answers later without blocking), or on a worker thread (an attestation's verification, a
/// registration waiting for the database's fsync), queued by caller.
public enum Executor: Sendable {
    case loop, worker
}

/// A path pattern: literal segments, `{name}` parameters (one segment each, never empty) and, at
/// the end, `*` for any rest (possibly empty). `/v1/devices/{key_id}`, `/v1/authz/check/*`.
public struct PathPattern: Sendable, Hashable, CustomStringConvertible {
    enum Segment: Sendable, Hashable {
        case literal(String)
        case parameter(String)
        case rest
    }
    let segments: [Segment]
    public let description: String

    public init(_ text: String) {
        precondition(text.hasPrefix("/"), "a path pattern starts with /: \(text)")
        description = text
        var parsed: [Segment] = []
        let parts = text.dropFirst().split(separator: "/", omittingEmptySubsequences: false)
        for (index, part) in parts.enumerated() {
            if part == "*" {
                precondition(index == parts.count - 1, "* ends a path pattern: \(text)")
                parsed.append(.rest)
            } else if part.hasPrefix("{"), part.hasSuffix("}"), part.count > 2 {
                parsed.append(.parameter(String(part.dropFirst().dropLast())))
            } else {
                parsed.append(.literal(String(part)))
            }
        }
        segments = parsed
    }

    /// No parameters and no rest: matched by a dictionary lookup.
    public var isExact: Bool { segments.allSatisfy { if case .literal = $0 { true } else { false } } }

    /// The parameters when `path` matches, else nil. `/a/*` matches `/a` too.
    public func match(_ path: String) -> [String: String]? {
        var parameters: [String: String] = [:]
        let parts = path.dropFirst().split(separator: "/", omittingEmptySubsequences: false)
        var index = 0
        for segment in segments {
            switch segment {
            case .rest:
                return parameters
            case .literal(let literal):
                guard index < parts.count, parts[index] == literal else { return nil }
            case .parameter(let name):
                guard index < parts.count, !parts[index].isEmpty else { return nil }
                parameters[name] = String(parts[index])
            }
            index += 1
        }
        return index == parts.count ? parameters : nil
    }

    /// For ordering: more literal segments first, a rest last.
    var specificity: Int {
        segments.reduce(0) { total, segment in
            switch segment {
            case .literal: total + 100
            case .parameter: total + 10
            case .rest: total
            }
        }
    }
}

/// How a route answers what it refuses, in the error shape its clients read. The HTTP server's
/// own refusals (framing, oversize heads and bodies), the router's (405, 415), an overloaded
/// server and failures all take the route's shape, so a client never sees one it does not speak.
public struct ErrorShape: Sendable {
    public let name: String
    /// A refused request: 400, 405, 413, 414, 415, 431, 501.
    public let refusal: @Sendable (_ status: Int, _ requestID: String?) -> HTTPResponse
    /// The request body budget is spent: come back shortly.
    public let overloaded: @Sendable (_ requestID: String?) -> HTTPResponse
    /// The store is busy or gone (503, retry shortly).
    public let unavailable: @Sendable (_ requestID: String) -> HTTPResponse
    /// Anything else that went wrong (500).
    public let failed: @Sendable (_ requestID: String) -> HTTPResponse

    public init(name: String, refusal: @escaping @Sendable (Int, String?) -> HTTPResponse, overloaded: @escaping @Sendable (String?) -> HTTPResponse,
                unavailable: @escaping @Sendable (String) -> HTTPResponse, failed: @escaping @Sendable (String) -> HTTPResponse) {
        self.name = name
        self.refusal = refusal
        self.overloaded = overloaded
        self.unavailable = unavailable
        self.failed = failed
    }
}

/// What a route produced, and what the access log and the metrics say about it.
public struct RouteOutcome: Sendable {
    /// The answer, when the route gives it at once (nil for a deferred answer that has ended).
    public var response: HTTPResponse?
    /// The status the client got (the response's, or a deferred answer's).
    public var status: Int
    public var clientID: String?
    /// The exact reason of a refusal, for the log, the metrics and the audit trail (never the network).
    public var reason: String?
    /// A detail for the log only (a malformed field, an upstream error, …).
    public var detail: String?
    /// Body bytes sent, for answers that stream.
    public var bytes: Int?

    public init(_ response: HTTPResponse, clientID: String? = nil, reason: String? = nil, detail: String? = nil) {
        self.response = response
        status = response.status
        self.clientID = clientID
        self.reason = reason
        self.detail = detail
    }

    /// A deferred answer that has ended with `status`.
    public init(ended status: Int, clientID: String? = nil, reason: String? = nil, detail: String? = nil, bytes: Int? = nil) {
        response = nil
        self.status = status
        self.clientID = clientID
        self.reason = reason
        self.detail = detail
        self.bytes = bytes
    }
}

/// One request as a route sees it.
public struct RequestContext: Sendable {
    public let request: HTTPRequest
    /// `req_…`, on the response and in the log line.
    public let requestID: String
    /// The route's `{name}` parameters.
    public let parameters: [String: String]
    public let listener: Listener
    public let route: RouteInfo
    /// When the request was taken (uptime nanoseconds), for the log's duration.
    public let started: UInt64
    /// The event loop that took the request (nil off a loop, in tests): a handler that ran its
    /// database work on a worker comes back here to start what the loop drives (a relay transfer).
    public var loop: EventLoop? = nil
    /// Ends a deferred answer: the middleware's epilogue (access log, metrics) runs then. Call it
    /// once; later calls are ignored.
    public let finish: @Sendable (RouteOutcome) -> Void
    /// What middleware learnt of the caller (a token's grant, a console session), by key: the
    /// first value in a slot of its own (a request rarely carries more, and the relay pays for
    /// every allocation), any others in a table.
    var firstValue: (key: ObjectIdentifier, value: any Sendable)?
    var otherValues: [ObjectIdentifier: any Sendable] = [:]

    /// The value a middleware put in for `key` (nil when none did).
    public subscript<Key: ContextKey>(_ key: Key.Type) -> Key.Value? {
        get {
            let id = ObjectIdentifier(key)
            if let first = firstValue, first.key == id { return first.value as? Key.Value }
            return otherValues.isEmpty ? nil : otherValues[id] as? Key.Value
        }
        set {
            let id = ObjectIdentifier(key)
            if firstValue == nil || firstValue?.key == id {
                firstValue = newValue.map { (id, $0) }
            } else {
                otherValues[id] = newValue
            }
        }
    }
}

/// A kind of value middleware puts into a request's context for the handler after it: who is
/// calling, as the middleware established it.
public protocol ContextKey {
    associatedtype Value: Sendable
}

/// What a route is, without its handler: what the table, the metrics and the transport read.
public struct RouteInfo: Sendable {
    /// The metric label and the access log's route name (bounded: never the raw path).
    public let name: String
    public let methods: [String]
    public let pattern: PathPattern
    public let listeners: Set<Listener>
    public let bodyLimit: Int
    /// The body's media type (any other is refused with 415); nil: the route reads no body type.
    public let contentType: String?
    public let executor: Executor
    public let shape: ErrorShape
    /// The `endpoint` label of refusals counted by reason (the device exchange's), or nil.
    public let endpoint: String?
}

/// How a route answers.
public enum RouteHandler: Sendable {
    /// Now (on the loop or a worker, as the route says).
    case answer(@Sendable (RequestContext) throws -> RouteOutcome)
    /// Later, through the writer, possibly as a stream: return nil and call `context.finish`
    /// once the answer has ended; or return an outcome to answer at once after all. On a worker
    /// when the route says so (its database work), with `context.loop` to come back to.
    case deferred(@Sendable (RequestContext, HTTPResponseWriter) throws -> RouteOutcome?)
    /// On a worker when the route says so, answered through `answer` once, from any thread: the
    /// handler may return before it answers (the exchange hands its commit to the database's
    /// writer and its worker takes the next request meanwhile). A thrown error or a failure given
    /// to `answer` goes out as the route's 503 or 500.
    case later(@Sendable (RequestContext, _ answer: @escaping @Sendable (Result<RouteOutcome, any Error>) -> Void) throws -> Void)
}

/// One route: everything the server, the router, the metrics and the log need to know of it
/// comes from here.
public struct Route: Sendable {
    public let info: RouteInfo
    public let handler: RouteHandler
    /// Run around the handler, inside the router's own (authentication, CSRF).
    public let middleware: [any Middleware]
    /// The router's middleware, then the route's: set once by the router (not per request).
    var chain: [any Middleware] = []
    /// Whether any of `chain` may suspend (only then does a request pay for the bookkeeping).
    var suspends = false

    /// - Parameters:
    ///   - name: the metric label and access-log name; the pattern by default.
    ///   - methods: those answered (405 for the others, with `Allow`); empty: any method.
    public init(_ methods: [String], _ pattern: String, name: String? = nil, on listeners: Set<Listener> = [.public],
                bodyLimit: Int = 65_536, contentType: String? = nil, executor: Executor = .loop, shape: ErrorShape,
                endpoint: String? = nil, middleware: [any Middleware] = [], handler: RouteHandler) {
        info = RouteInfo(name: name ?? pattern, methods: methods, pattern: PathPattern(pattern), listeners: listeners, bodyLimit: bodyLimit,
                         contentType: contentType, executor: executor, shape: shape, endpoint: endpoint)
        self.handler = handler
        self.middleware = middleware
    }
}

/// Runs around every request (the router's list) or a route's requests (the route's list), on
/// the thread the route runs on, so that what it reads (a token's grant) leaves the loop with
/// the handler.
public protocol Middleware: Sendable {
    /// Around the rest of the chain: returns an outcome without calling `next` to answer instead
    /// (a refusal), or calls `next` with the context, to which it may have added what it learnt
    /// of the caller. Nil from `next` (a deferred answer) is passed back as it is.
    func respond(to context: RequestContext, next: (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome?
    /// As the answer goes out (an immediate response can still be changed) or, for a deferred
    /// one, when it has ended.
    func after(_ context: RequestContext, _ outcome: inout RouteOutcome)
}

extension Middleware {
    public func respond(to context: RequestContext, next: (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome? { try next(context) }
    public func after(_ context: RequestContext, _ outcome: inout RouteOutcome) {}
}

/// Middleware that can wait without holding its thread: a token check sent on the event loop's
/// own database connection, answered later on the same loop. The router lets it suspend the
/// chain and resumes the chain (the rest of the middleware and the handler) when it is told to.
/// The middleware outside it see nil from `next`, as for a deferred answer.
public protocol SuspendingMiddleware: Middleware {
    /// Starts the wait and returns true, having arranged to call `resume` exactly once, later
    /// (never before returning). Or returns false, and the router runs `respond(to:next:)`
    /// instead (off a loop, or for a request settled without waiting).
    func suspend(_ context: RequestContext, resume: @escaping @Sendable (Resumption) -> Void) -> Bool
    /// False when this instance never suspends (nothing to wait on without blocking): its routes
    /// then skip the per-request bookkeeping.
    var maySuspend: Bool { get }
}

extension SuspendingMiddleware {
    public var maySuspend: Bool { true }
}

/// How a suspended chain goes on.
public enum Resumption: Sendable {
    /// The rest of the chain and the handler, on the thread that resumes.
    case proceed(RequestContext)
    /// The rest on a worker: what follows reads a database across the network.
    case proceedOnWorker(RequestContext)
    /// Answered without the rest (a refusal).
    case answer(RouteOutcome)
    /// Failed: answered 503 or 500 as a thrown error would be.
    case failed(any Error)
}

/// Routes that share a path prefix, their listeners, their error shape, where they run and their
/// middleware (bearer authentication, a console session), each said once.
public struct RouteGroup: Sendable {
    public let prefix: String
    public let listeners: Set<Listener>
    public let shape: ErrorShape
    public let executor: Executor
    public let middleware: [any Middleware]

    public init(_ prefix: String, on listeners: Set<Listener> = [.public], shape: ErrorShape, executor: Executor = .loop,
                middleware: [any Middleware] = []) {
        self.prefix = prefix
        self.listeners = listeners
        self.shape = shape
        self.executor = executor
        self.middleware = middleware
    }

    /// A route of the group at `prefix + path`; the group's executor unless the route says.
    public func route(_ methods: [String], _ path: String, name: String? = nil, bodyLimit: Int = 65_536, contentType: String? = nil,
                      executor: Executor? = nil, endpoint: String? = nil, handler: RouteHandler) -> Route {
        Route(methods, prefix + path, name: name, on: listeners, bodyLimit: bodyLimit, contentType: contentType, executor: executor ?? self.executor,
              shape: shape, endpoint: endpoint, middleware: middleware, handler: handler)
    }
}
