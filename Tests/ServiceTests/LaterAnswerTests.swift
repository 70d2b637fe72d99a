import EventLoops
import Foundation
import HTTPRouting
@testable import HTTPServer
import RawHTTP
import Synchronization
import Testing

/// A `.later` route answers from whichever thread calls `answer`, after its handler has returned:
/// the worker that ran the handler is free for the next request meanwhile (the exchange's commit
/// is answered by SQLite's writer, not by a worker held until then). Plain sockets and threads,
/// so nothing here waits on the test runner's own thread pool.
@Suite(.timeLimit(.minutes(1)))
struct LaterAnswerTests {
    /// Answers held until the test releases them, one per request, in arrival order.
    final class Held: Sendable {
        let answers = Mutex<[@Sendable (Result<RouteOutcome, any Error>) -> Void]>([])
        let arrived = DispatchSemaphore(value: 0)
        /// Once set, nothing is held: a failed test still lets every request end, so the server
        /// and the worker stop.
        let releasing = Atomic<Bool>(false)
        func hold(_ answer: @escaping @Sendable (Result<RouteOutcome, any Error>) -> Void) {
            guard !releasing.load(ordering: .sequentiallyConsistent) else { return answer(.success(RouteOutcome(.json(503, "{}")))) }
            answers.withLock { $0.append(answer) }
            arrived.signal()
        }
        func take() -> [@Sendable (Result<RouteOutcome, any Error>) -> Void] { answers.withLock { $0 } }
        func release() {
            releasing.store(true, ordering: .sequentiallyConsistent)
            for answer in take() { answer(.success(RouteOutcome(.json(503, "{}")))) }
        }
    }

    struct Broken: Error {}

    static func server(_ held: Held, workers: WorkerPool, loops: Int? = nil, more: [Route] = []) throws -> HTTPServer {
        let routes = more + [
            Route(["POST"], "/held", executor: .worker, shape: .oauth, handler: .later { _, answer in held.hold(answer) }),
            Route(["POST"], "/throws", executor: .worker, shape: .oauth, handler: .later { _, _ in throw Broken() }),
            Route(["POST"], "/fails-later", executor: .worker, shape: .oauth, handler: .later { _, answer in
                Thread { answer(.failure(Broken())) }.start()
            }),
        ]
        let router = Router(routes: routes, middleware: [RequestIDHeader()], fallbackShape: .oauth, workers: workers)
        var configuration = HTTPServerConfiguration()
        configuration.port = 0
        if let loops { configuration.threads = loops }
        let server = HTTPServer(configuration: configuration) { router.handle($0, $1, on: .public) }
        try server.start()
        return server
    }

    /// A connection with `POST path` sent on it.
    static func post(_ server: HTTPServer, _ path: String) throws -> RawConnection {
        let connection = try RawConnection(port: UInt16(server.port), timeout: 30)
        #expect(connection.sendAll("POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"))
        return connection
    }

    @Test func oneWorkerStartsEveryRequestWhileTheirAnswersAreHeldAndEachGetsItsOwn() throws {
        let held = Held()
        let workers = try WorkerPool(threads: 1, name: "later-test")
        defer { workers.shutdown() }
        let server = try Self.server(held, workers: workers)
        defer { server.stop() }
        defer { held.release() }   // first: answers anything still held (a no-op once answered)

        // Three requests at once on one worker: each handler returns before its answer, so all
        // three arrive although none has been answered (an `.answer` route would hold the worker).
        let connections = try (0..<3).map { _ in try Self.post(server, "/held") }
        for _ in 0..<3 { #expect(held.arrived.wait(timeout: .now() + 10) == .success) }
        let answers = held.take()
        try #require(answers.count == 3)
        // Answered from another thread, in reverse order; a second answer to one request is ignored.
        let answering = Thread {
            for (index, answer) in answers.enumerated().reversed() {
                answer(.success(RouteOutcome(.json(200, #"{"answer":\#(index)}"#))))
                answer(.success(RouteOutcome(.json(500, #"{"answer":"again"}"#))))
            }
        }
        answering.start()
        let responses = connections.map { $0.readResponse() }
        #expect(responses.map { $0?.status } == [200, 200, 200])
        #expect(Set(responses.compactMap { $0?.text }) == [#"{"answer":0}"#, #"{"answer":1}"#, #"{"answer":2}"#])
    }

    /// A `.later` answer (the exchange's) waits for a bounded commit and has nothing to cancel, so
    /// its connection never joins the hang-up watch, however long it waits; a `.deferred` one that
    /// waits over the watch's delay does. One loop looks at its suspensions in the order they
    /// began: once the deferred request (sent second) is watched, the held one has been looked at.
    @Test func aHeldLaterAnswerStaysOutOfTheHangUpWatch() throws {
        let held = Held()
        let waiting = Mutex<HTTPResponseWriter?>(nil)
        let workers = try WorkerPool(threads: 1, name: "later-test")
        defer { workers.shutdown() }
        let deferred = Route(["POST"], "/deferred", shape: .oauth, handler: .deferred { _, writer in
            waiting.withLock { $0 = writer }
            return nil
        })
        let server = try Self.server(held, workers: workers, loops: 1, more: [deferred])
        defer { server.stop() }
        defer { held.release() }
        defer { waiting.withLock { $0?.respond(HTTPResponse(status: 503, body: [])); $0 = nil } }

        let later = try Self.post(server, "/held")
        #expect(held.arrived.wait(timeout: .now() + 10) == .success)
        let other = try Self.post(server, "/deferred")
        func eventually(_ condition: () -> Bool) -> Bool {
            let deadline = Date() + 10
            while !condition() { if Date() > deadline { return false }; usleep(2_000) }
            return true
        }
        #expect(eventually { waiting.withLock { $0?.isHangUpWatched } == true })
        #expect(server.hangUpWatchCount == 1)

        for answer in held.take() { answer(.success(RouteOutcome(.json(200, #"{"answer":"later"}"#)))) }
        waiting.withLock { $0?.respond(HTTPResponse(status: 200, body: Array("deferred".utf8))); $0 = nil }
        #expect(later.readResponse()?.text == #"{"answer":"later"}"#)
        #expect(other.readResponse()?.text == "deferred")
        #expect(eventually { server.hangUpWatchCount == 0 })
    }

    @Test func aThrowingHandlerAndAFailureGivenLaterAnswerInTheRoutesShape() throws {
        let workers = try WorkerPool(threads: 1, name: "later-test")
        defer { workers.shutdown() }
        let server = try Self.server(Held(), workers: workers)
        defer { server.stop() }
        for path in ["/throws", "/fails-later"] {
            let response = try Self.post(server, path).readResponse()
            #expect(response?.status == 500, "\(path)")
            #expect(response?.text.contains("server_error") == true, "\(path): \(response?.text ?? "no answer")")
        }
    }
}
