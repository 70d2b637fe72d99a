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

    /// Waits without holding its thread: on a loop it suspends the chain and resumes it from the
    /// loop's next turn, as the request's `x-mode` says; off a loop it declines and the router
    /// calls `respond` (which says so in the context).
    struct Pause: SuspendingMiddleware {
        struct Failure: Error {}
        func suspend(_ context: RequestContext, resume: @escaping @Sendable (Resumption) -> Void) -> Bool {
            guard let loop = EventLoop.current else { return false }
            var context = context
            context[Caller.self] = (context[Caller.self].map { $0 + ">" } ?? "") + "paused"
            let mode = context.request.header("x-mode") ?? "proceed"
            return loop.execute { [context] in
                switch mode {
                case "worker": resume(.proceedOnWorker(context))
                case "refuse": resume(.answer(RouteOutcome(.json(403, #"{"error":"paused"}"#), reason: "paused")))
                case "fail": resume(.failed(Failure()))
                default: resume(.proceed(context))
                }
            }
        }
        func respond(to context: RequestContext, next: (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome? {
            var context = context
            context[Caller.self] = (context[Caller.self].map { $0 + ">" } ?? "") + "inline"
            return try next(context)
        }
    }

    /// A suspended chain goes on where the middleware resumes it (the loop, or a worker), carries
    /// what the layers before it put in the context, and its answer, refusal or failure goes out
    /// through the writer with the epilogue run once, for each kind of handler.
    @Test func aSuspendedChainResumesWhereItIsToldAndAnswersOnce() async throws {
        let handled = Counter()
        let group = RouteGroup("/pause", shape: .oauth, executor: .loop, middleware: [Identify(name: "outer"), Pause(), Identify(name: "inner")])
        let body: @Sendable (RequestContext) -> String = { context in
            #"{"caller":"\#(context[Caller.self] ?? "nobody")","on":"\#(EventLoop.current == nil ? "worker" : "loop")"}"#
        }
        let routes = [
            group.route(["GET"], "/answer", handler: .answer { context in
                handled.add()
                return RouteOutcome(.json(200, body(context)))
            }),
            group.route(["GET"], "/deferred", handler: .deferred { context, writer in
                handled.add()
                writer.respond(.json(200, body(context)))
                context.finish(RouteOutcome(ended: 200))
                return nil
            }),
            group.route(["GET"], "/later", handler: .later { context, answer in
                handled.add()
                answer(.success(RouteOutcome(.json(200, body(context)))))
            }),
            // On a worker the middleware declines: the chain runs through `respond`.
            group.route(["GET"], "/worker", executor: .worker, handler: .answer { context in
                handled.add()
                return RouteOutcome(.json(200, body(context)))
            }),
        ]
        let service = try TestService(extraRoutes: routes)
        let http = TestHTTP(baseURL: service.baseURL)
        var expectedHandled = 0
        for path in ["/pause/answer", "/pause/deferred", "/pause/later"] {
            let proceeded = try await http.send("GET", path)
            #expect(proceeded.status == 200, "\(path)")
            #expect(proceeded.json["caller"] as? String == "outer>paused>inner", "\(path): \(proceeded.json)")
            #expect(proceeded.json["on"] as? String == "loop", "\(path) resumed on the loop")
            let onWorker = try await http.send("GET", path, headers: ["x-mode": "worker"])
            #expect(onWorker.status == 200 && onWorker.json["on"] as? String == "worker", "\(path) resumed on a worker: \(onWorker.json)")
            expectedHandled += 2
            let refused = try await http.send("GET", path, headers: ["x-mode": "refuse"])
            #expect(refused.status == 403 && refused.json["error"] as? String == "paused", "\(path)")
            let failed = try await http.send("GET", path, headers: ["x-mode": "fail"])
            #expect(failed.status == 500, "\(path): a failure to resume answers as a thrown error would")
            #expect(handled.count == expectedHandled, "\(path): the handler ran for the two that proceeded only")
        }
        let inline = try await http.send("GET", "/pause/worker")
        #expect(inline.json["caller"] as? String == "outer>inline>inner" && inline.json["on"] as? String == "worker", "\(inline.json)")
        // The epilogue ran once per request, with the middleware's reason for its refusal.
        let lines = service.logs.lines.withLock { $0 }
        for path in ["/pause/answer", "/pause/deferred", "/pause/later"] {
            let logged = lines.filter { $0.contains(#""event":"request""#) && $0.contains(#""route":"\#(path)""#) }
            #expect(logged.count == 4, "\(path): one access-log line per request, got \(logged.count)")
            #expect(logged.filter { $0.contains(#""reason":"paused""#) }.count == 1, "\(path)")
        }
    }
}
