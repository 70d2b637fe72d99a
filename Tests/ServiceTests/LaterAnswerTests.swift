import EventLoops
import Foundation
import HTTPRouting
import HTTPServer
import Synchronization
import Testing

/// A `.later` route answers from whichever thread calls `answer`, after its handler has returned:
/// the worker that ran the handler is free for the next request meanwhile (the exchange's commit
/// is answered by SQLite's writer, not by a worker held until then).
@Suite(.timeLimit(.minutes(1)))
struct LaterAnswerTests {
    /// Answers held until the test releases them, one per request, in arrival order.
    final class Held: Sendable {
        let answers = Mutex<[@Sendable (Result<RouteOutcome, any Error>) -> Void]>([])
        let arrived = DispatchSemaphore(value: 0)
        func hold(_ answer: @escaping @Sendable (Result<RouteOutcome, any Error>) -> Void) {
            answers.withLock { $0.append(answer) }
            arrived.signal()
        }
        func take() -> [@Sendable (Result<RouteOutcome, any Error>) -> Void] { answers.withLock { $0 } }
    }

    struct Broken: Error {}

    static func server(_ held: Held, workers: WorkerPool) throws -> (HTTPServer, URL) {
        let routes = [
            Route(["POST"], "/held", executor: .worker, shape: .oauth, handler: .later { _, answer in held.hold(answer) }),
            Route(["POST"], "/throws", executor: .worker, shape: .oauth, handler: .later { _, _ in throw Broken() }),
            Route(["POST"], "/fails-later", executor: .worker, shape: .oauth, handler: .later { _, answer in
                Thread { answer(.failure(Broken())) }.start()
            }),
        ]
        let router = Router(routes: routes, middleware: [RequestIDHeader()], fallbackShape: .oauth, workers: workers)
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        let server = HTTPServer(configuration: configuration) { router.handle($0, $1, on: .public) }
        try server.start()
        return (server, URL(string: "http://127.0.0.1:\(server.port)")!)
    }

    static func post(_ url: URL, _ path: String) async throws -> (Int, String) {
        let answer = try await TestHTTP(baseURL: url).send("POST", path, body: Data())
        return (answer.status, String(decoding: answer.body, as: UTF8.self))
    }

    @Test func oneWorkerStartsEveryRequestWhileTheirAnswersAreHeldAndEachGetsItsOwn() async throws {
        let held = Held()
        let workers = try WorkerPool(threads: 1, name: "later-test")
        defer { workers.shutdown() }
        let (server, url) = try Self.server(held, workers: workers)
        defer { server.stop() }

        // Three requests at once on one worker: each handler returns before its answer, so all
        // three arrive although none has been answered (an `.answer` route would hold the worker).
        async let first = Self.post(url, "/held")
        async let second = Self.post(url, "/held")
        async let third = Self.post(url, "/held")
        for _ in 0..<3 { #expect(held.arrived.wait(timeout: .now() + 20) == .success) }
        let answers = held.take()
        #expect(answers.count == 3)
        // Answered from another thread, in reverse order; a second answer to one request is ignored.
        let answering = Thread {
            for (index, answer) in answers.enumerated().reversed() {
                answer(.success(RouteOutcome(.json(200, #"{"answer":\#(index)}"#))))
                answer(.success(RouteOutcome(.json(500, #"{"answer":"again"}"#))))
            }
        }
        answering.start()
        let results = try await [first, second, third]
        #expect(results.map(\.0) == [200, 200, 200])
        #expect(Set(results.map(\.1)) == [#"{"answer":0}"#, #"{"answer":1}"#, #"{"answer":2}"#])
    }

    @Test func aThrowingHandlerAndAFailureGivenLaterAnswerInTheRoutesShape() async throws {
        let workers = try WorkerPool(threads: 1, name: "later-test")
        defer { workers.shutdown() }
        let (server, url) = try Self.server(Held(), workers: workers)
        defer { server.stop() }
        for path in ["throws", "fails-later"] {
            let (status, body) = try await Self.post(url, "/" + path)
            #expect(status == 500, "\(path)")
            #expect(body.contains("server_error"), "\(path): \(body)")
        }
    }
}
