import EventLoops
import Foundation
import HTTPServer
import Synchronization

/// Dispatches requests by one route table. Everything that depends on the route — its listener,
/// its body limit, where it runs, the shape of its refusals, its metric and log name — is read
/// from the route's description (`Route`), so adding a route is one entry in the table.
public final class Router: Sendable {
    /// What went wrong in a handler that threw, as the application classifies it.
    public enum Failure: Sendable {
        /// Not now: the store is busy or gone (503 in the route's shape).
        case unavailable
        /// Anything else (500).
        case failed
    }

    let routes: [Route]
    /// Exact paths per listener, for a dictionary lookup; then the patterns, most specific first.
    private let exact: [Listener: [String: Int]]
    private let patterns: [Listener: [Int]]
    let middleware: [any Middleware]
    let workers: WorkerPool?
    let workerKey: @Sendable (HTTPRequest) -> String
    let classify: @Sendable (any Error) -> Failure
    let onFailure: @Sendable (RequestContext, Failure, any Error) -> Void
    /// For paths no route takes (404), and what their transport refusals look like.
    let fallbackShape: ErrorShape
    public static let notFoundName = "other"

    /// - Parameters:
    ///   - workers: where `.worker` routes run (nil: on the loop).
    ///   - workerKey: the queue a request waits in on the workers (its caller).
    ///   - classify: which thrown errors mean "not now".
    ///   - onFailure: told of every handler that threw (the log).
    public init(routes: [Route], middleware: [any Middleware], fallbackShape: ErrorShape, workers: WorkerPool? = nil,
                workerKey: @escaping @Sendable (HTTPRequest) -> String = { $0.remoteAddress },
                classify: @escaping @Sendable (any Error) -> Failure = { _ in .failed },
                onFailure: @escaping @Sendable (RequestContext, Failure, any Error) -> Void = { _, _, _ in }) {
        var names = Set<String>()
        var exact: [Listener: [String: Int]] = [:]
        var patterns: [Listener: [Int]] = [:]
        for (index, route) in routes.enumerated() {
            precondition(names.insert(route.info.name).inserted, "two routes are named \(route.info.name)")
            for listener in route.info.listeners {
                if route.info.pattern.isExact {
                    precondition(exact[listener, default: [:]][route.info.pattern.description] == nil,
                                 "two routes for \(route.info.pattern) on the \(listener) listener")
                    exact[listener, default: [:]][route.info.pattern.description] = index
                } else {
                    patterns[listener, default: []].append(index)
                }
            }
        }
        for listener in Listener.allCases {
            patterns[listener]?.sort { routes[$0].info.pattern.specificity > routes[$1].info.pattern.specificity }
        }
        self.routes = routes.map { route in
            var route = route
            route.chain = middleware + route.middleware
            route.suspends = route.chain.contains { ($0 as? any SuspendingMiddleware)?.maySuspend == true }
            return route
        }
        self.exact = exact
        self.patterns = patterns
        self.middleware = middleware
        self.workers = workers
        self.workerKey = workerKey
        self.classify = classify
        self.onFailure = onFailure
        self.fallbackShape = fallbackShape
    }

    /// Every route's description, in table order.
    public var table: [RouteInfo] { routes.map(\.info) }

    /// The route `path` takes on `listener`, with its parameters. The most specific route for the
    /// path on any listener decides: when it is not served on this one, the path is not found
    /// here (an admin route is never taken by a wider public pattern such as `/v1/*`).
    public func route(for path: String, on listener: Listener) -> (route: Route, parameters: [String: String])? {
        if let index = exact[listener]?[path] { return (routes[index], [:]) }
        for other in Listener.allCases where other != listener {
            if exact[other]?[path] != nil { return nil }
        }
        var best: (index: Int, parameters: [String: String])?
        for candidate in Listener.allCases {
            for index in patterns[candidate] ?? [] {
                if let best, routes[best.index].info.pattern.specificity >= routes[index].info.pattern.specificity { break }
                if let parameters = routes[index].info.pattern.match(path) {
                    best = (index, parameters)
                    break
                }
            }
        }
        guard let best, routes[best.index].info.listeners.contains(listener) else { return nil }
        return (routes[best.index], best.parameters)
    }

    // MARK: The transport's questions

    /// The body limit of a request, from its route (64 KiB where none takes it).
    public func bodyLimit(path: String, on listener: Listener) -> Int {
        route(for: path, on: listener)?.route.info.bodyLimit ?? 65_536
    }

    /// The HTTP server's own refusal for `status`, in the shape of the route `path` takes.
    public func refusal(_ status: Int, path: String, on listener: Listener) -> HTTPResponse {
        (route(for: path, on: listener)?.route.info.shape ?? fallbackShape).refusal(status, nil)
    }

    /// The answer when the body budget is spent, in the route's shape.
    public func overloaded(path: String, on listener: Listener) -> HTTPResponse {
        (route(for: path, on: listener)?.route.info.shape ?? fallbackShape).overloaded(nil)
    }

    /// Every listener-dependent setting of an `HTTPServerConfiguration`, from the table.
    public func configure(_ configuration: inout HTTPServerConfiguration, for listener: Listener) {
        configuration.bodyLimit = { [self] _, path in bodyLimit(path: path, on: listener) }
        configuration.refusalResponse = { [self] status, path in refusal(status, path: path, on: listener) }
        configuration.overloadedResponse = { [self] path in overloaded(path: path, on: listener) }
    }

    // MARK: Requests

    private static let noFinish: @Sendable (RouteOutcome) -> Void = { _ in }
    private static let notFoundInfo = RouteInfo(name: notFoundName, methods: [], pattern: PathPattern("/*"), listeners: Set(Listener.allCases),
                                                bodyLimit: 65_536, contentType: nil, executor: .loop, shape: fallbackPlaceholder, endpoint: nil)
    private static let fallbackPlaceholder = ErrorShape(name: "none", refusal: { status, _ in .plainRefusal(status) },
                                                        overloaded: { _ in .plainRefusal(503) }, unavailable: { _ in .plainRefusal(503) },
                                                        failed: { _ in .plainRefusal(500) })

    /// The server's entry point for `listener`: answers now, or later from a worker or a stream.
    public func handle(_ request: HTTPRequest, _ writer: HTTPResponseWriter, on listener: Listener) -> HTTPHandlerResult {
        let started = DispatchTime.now().uptimeNanoseconds
        let requestID = RequestID.next()
        guard let (route, parameters) = route(for: request.path, on: listener) else {
            let context = RequestContext(request: request, requestID: requestID, parameters: [:], listener: listener,
                                         route: Self.notFoundInfo, started: started, finish: Self.noFinish)
            return answer(complete(context, route: nil, RouteOutcome(.json(404, #"{"error":"not_found"}"#))))
        }
        let info = route.info
        let isDeferred: Bool = if case .deferred = route.handler { true } else { false }
        var finish = Self.noFinish
        if isDeferred {
            // The epilogue runs once, when the answer has ended, with the request's own context.
            let once = Once()
            finish = { [self] outcome in
                guard once.first() else { return }
                let context = RequestContext(request: request, requestID: requestID, parameters: parameters, listener: listener,
                                             route: info, started: started, finish: Self.noFinish)
                complete(context, route: route, outcome)
            }
        }
        var context = RequestContext(request: request, requestID: requestID, parameters: parameters, listener: listener,
                                     route: info, started: started, finish: finish)
        context.loop = EventLoop.current
        return dispatch(route, context, writer)
    }

    private func dispatch(_ route: Route, _ context: RequestContext, _ writer: HTTPResponseWriter) -> HTTPHandlerResult {
        let info = route.info, request = context.request
        if !info.methods.isEmpty && !info.methods.contains(request.method) {
            var refusal = info.shape.refusal(405, context.requestID)
            refusal.headers.append(("allow", info.methods.joined(separator: ", ")))
            return answer(complete(context, route: route, RouteOutcome(refusal, reason: "methodNotAllowed")))
        }
        if let type = info.contentType, !RequestParsing.hasMediaType(request.header("content-type"), type) {
            return answer(complete(context, route: route, RouteOutcome(info.shape.refusal(415, context.requestID), reason: "invalidRequest",
                                                                       detail: "content-type \(request.header("content-type")?.prefix(64) ?? "missing") is not \(type)")))
        }
        // The handler inside the middleware (`route.chain`, the router's outermost): all of it
        // runs where the route runs, unless a middleware suspends it (then the rest runs where
        // the middleware resumes it, and the answer goes out through the writer).
        let suspension = route.suspends ? Suspension() : nil
        switch route.handler {
        case .answer(let answer):
            let respond: @Sendable (RouteOutcome) -> Void = { [self] outcome in writer.respond(complete(context, route: route, outcome).response ?? .plainRefusal(500)) }
            suspension?.settle = { [self] result in
                switch result {
                case .success(let outcome): respond(outcome ?? failure(MiddlewareError(), context))
                case .failure(let error): respond(failure(error, context))
                }
            }
            let run: @Sendable () -> RouteOutcome? = { [self] in
                let outcome: RouteOutcome
                do {
                    let produced = try runChain(route, from: 0, context, suspension) { try answer($0) }
                    if suspension?.happened == true { return nil }
                    outcome = produced ?? failure(MiddlewareError(), context)
                } catch { outcome = failure(error, context) }
                return complete(context, route: route, outcome)
            }
            if info.executor == .worker, let workers,
               workers.submit(key: workerKey(request), { if let now = run() { writer.respond(now.response ?? .plainRefusal(500)) } }) {
                return .deferred
            }
            guard let now = run() else { return .deferred }
            return .response(now.response ?? .plainRefusal(500))
        case .later(let start):
            // The exchange's answer waits for its batch's commit, a bounded wait with nothing to
            // cancel: the hang-up watch (two epoll_ctl calls and the monitor's lock, paid by every
            // exchange waiting over 20 ms at 256 devices) would change nothing for it.
            writer.skipHangUpWatch()
            let once = Once()
            let reply: @Sendable (Result<RouteOutcome, any Error>) -> Void = { [self] result in
                guard once.first() else { return }
                let outcome = switch result {
                case .success(let outcome): outcome
                case .failure(let error): failure(error, context)
                }
                writer.respond(complete(context, route: route, outcome).response ?? .plainRefusal(500))
            }
            suspension?.settle = { result in
                switch result {
                case .success(let early): if let early { reply(.success(early)) }
                case .failure(let error): reply(.failure(error))
                }
            }
            let task: @Sendable () -> Void = { [self] in
                do {
                    // A middleware's own answer goes out at once; the handler's comes through `reply`.
                    if let early = try runChain(route, from: 0, context, suspension, { try start($0, reply); return nil }) { reply(.success(early)) }
                } catch { reply(.failure(error)) }
            }
            if info.executor == .worker, let workers, workers.submit(key: workerKey(request), task) { return .deferred }
            task()   // the writer takes an answer given before the handler returns .deferred
            return .deferred
        case .deferred(let start):
            // An answer given at once after all goes out with the epilogue now (the handler
            // does not call `finish` then).
            suspension?.settle = { [self] result in
                switch result {
                case .success(let now): if let now { writer.respond(complete(context, route: route, now).response ?? .plainRefusal(500)) }
                case .failure(let error): writer.respond(complete(context, route: route, failure(error, context)).response ?? .plainRefusal(500))
                }
            }
            let run: @Sendable () -> RouteOutcome? = { [self] in
                do {
                    guard let now = try runChain(route, from: 0, context, suspension, { try start($0, writer) }) else { return nil }
                    return complete(context, route: route, now)
                } catch {
                    return complete(context, route: route, failure(error, context))
                }
            }
            if info.executor == .worker, let workers,
               workers.submit(key: workerKey(request), { if let now = run() { writer.respond(now.response ?? .plainRefusal(500)) } }) {
                return .deferred
            }
            guard let now = run() else { return .deferred }
            return answer(now)
        }
    }

    /// `route.chain[index...]` around `handler`, each layer given the rest as its `next`. A
    /// suspending layer (when `suspension` is given) may take the rest over: this returns nil
    /// then, with `suspension.happened` set, and the outcome reaches `suspension.settle` later.
    private func runChain(_ route: Route, from index: Int, _ context: RequestContext, _ suspension: Suspension?,
                     _ handler: @escaping @Sendable (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome? {
        let chain = route.chain
        guard index < chain.count else { return try handler(context) }
        if let suspension, let layer = chain[index] as? any SuspendingMiddleware {
            suspension.happened = true
            if layer.suspend(context, resume: { [self] in resume($0, route, after: index, suspension, handler) }) { return nil }
            suspension.happened = false
        }
        return try chain[index].respond(to: context) { context in try runChain(route, from: index + 1, context, suspension, handler) }
    }

    /// Goes on with a chain a middleware suspended at `index`.
    private func resume(_ resumption: Resumption, _ route: Route, after index: Int, _ suspension: Suspension,
                        _ handler: @escaping @Sendable (RequestContext) throws -> RouteOutcome?) {
        let settle = suspension.settle
        let rest: @Sendable (RequestContext) -> Void = { [self] context in
            // A fresh record: the rest may suspend again, and then settles by itself.
            let inner = Suspension()
            inner.settle = settle
            do {
                let outcome = try runChain(route, from: index + 1, context, inner, handler)
                if !inner.happened { settle(.success(outcome)) }
            } catch {
                settle(.failure(error))
            }
        }
        switch resumption {
        case .proceed(let context): rest(context)
        case .proceedOnWorker(let context):
            if let workers, workers.submit(key: workerKey(context.request), { rest(context) }) { return }
            rest(context)
        case .answer(let outcome): settle(.success(outcome))
        case .failed(let error): settle(.failure(error))
        }
    }

    private func answer(_ outcome: RouteOutcome) -> HTTPHandlerResult {
        .response(outcome.response ?? .plainRefusal(500))
    }

    private func run(_ answer: @Sendable (RequestContext) throws -> RouteOutcome, _ context: RequestContext) -> RouteOutcome {
        do { return try answer(context) } catch { return failure(error, context) }
    }

    /// A handler threw: 503 for "not now", 500 for the rest, in the route's shape.
    private func failure(_ error: any Error, _ context: RequestContext) -> RouteOutcome {
        let kind = classify(error)
        onFailure(context, kind, error)
        switch kind {
        case .unavailable: return RouteOutcome(context.route.shape.unavailable(context.requestID), reason: "storeUnavailable")
        case .failed: return RouteOutcome(context.route.shape.failed(context.requestID), reason: "internalError")
        }
    }

    /// The epilogue: the route's middleware, then the router's, see the outcome as it goes out.
    @discardableResult
    private func complete(_ context: RequestContext, route: Route?, _ outcome: RouteOutcome) -> RouteOutcome {
        var outcome = outcome
        if let route { for middleware in route.middleware.reversed() { middleware.after(context, &outcome) } }
        for middleware in middleware.reversed() { middleware.after(context, &outcome) }
        return outcome
    }
}

/// Adds `request-id` to every answer given at once (streams set their own).
public struct RequestIDHeader: Middleware {
    public init() {}
    public func after(_ context: RequestContext, _ outcome: inout RouteOutcome) {
        guard outcome.response != nil, !(outcome.response!.headers.contains { $0.name == "request-id" }) else { return }
        outcome.response!.headers.append(("request-id", context.requestID))
    }
}

/// A middleware answered nil for a route that answers at once (a bug in the middleware).
struct MiddlewareError: Error, CustomStringConvertible {
    var description: String { "a middleware gave no answer for a route that answers at once" }
}

/// A request's record of a suspended chain: whether a middleware took the rest over, and where
/// the outcome goes once it is there. Set up before the chain runs, read after it returns, on
/// the same thread; `settle` is called once, from wherever the chain resumed.
final class Suspension: @unchecked Sendable {
    // @unchecked: `happened` is written and read by the thread running the chain before it
    // returns; `settle` is set before the chain runs and only read after.
    var happened = false
    var settle: @Sendable (Result<RouteOutcome?, any Error>) -> Void = { _ in }
}

/// True the first time only.
final class Once: Sendable {
    private let done = Atomic<Bool>(false)
    func first() -> Bool { !done.exchange(true, ordering: .acquiringAndReleasing) }
}
