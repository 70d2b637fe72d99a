import EventLoops
import Foundation
import HTTPRouting
import HTTPServer
import Synchronization
import Testing

/// Middleware wraps the rest of the chain: it can answer instead, or pass on a context to which it
/// added who is calling; the chain runs where its route runs (a worker route's middleware too).
@Suite struct MiddlewareTests {
    enum Caller: ContextKey { typealias Value = String }

    /// Puts `name` into the context, after whatever an outer layer put there.
    struct Identify: Middleware {
        let name: String
        func respond(to context: RequestContext, next: (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome? {
            var context = context
            context[Caller.self] = (context[Caller.self].map { $0 + ">" } ?? "") + name
            return try next(context)
        }
    }

    /// Answers 401 unless the request carries `x-pass`; counts what it let through.
    final class Counter: Sendable {
        let value = Atomic<Int>(0)
        func add() { value.add(1, ordering: .relaxed) }
        var count: Int { value.load(ordering: .relaxed) }
    }

    struct Gate: Middleware {
        let passed: Counter
        func respond(to context: RequestContext, next: (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome? {
            guard context.request.header("x-pass") != nil else { return RouteOutcome(.json(401, #"{"error":"gate"}"#), reason: "gate") }
            passed.add()
            return try next(context)
        }
    }

    @Test func identityFlowsInwardAndARefusalStopsTheChain() async throws {
        let handled = Counter(), gated = Counter()
        let group = RouteGroup("/mw", shape: .oauth, executor: .worker, middleware: [Identify(name: "outer"), Gate(passed: gated), Identify(name: "inner")])
        let route = group.route(["GET"], "/who", handler: .answer { context in
            handled.add()
            let thread = EventLoop.current == nil ? "worker" : "loop"
            return RouteOutcome(.json(200, #"{"caller":"\#(context[Caller.self] ?? "nobody")","on":"\#(thread)"}"#))
        })
        let service = try TestService(extraRoutes: [route])
        let http = TestHTTP(baseURL: service.baseURL)
        let answer = try await http.send("GET", "/mw/who", headers: ["x-pass": "1"])
        #expect(answer.status == 200)
        #expect(answer.json["caller"] as? String == "outer>inner", "outer first, then inner: \(answer.json)")
        #expect(answer.json["on"] as? String == "worker", "a worker route's chain runs on the worker")
        let refused = try await http.send("GET", "/mw/who")
        #expect(refused.status == 401)
        #expect(handled.count == 1 && gated.count == 1, "the refused request never reached the handler")
        // The access log saw the gate's reason: the router's epilogue runs for a middleware's answer too.
        #expect(service.logs.lines.withLock { $0 }.contains { $0.contains(#""route":"/mw/who""#) && $0.contains(#""reason":"gate""#) })
    }
}
