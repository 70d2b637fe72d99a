import Foundation
#if canImport(Glibc)
import Glibc
#endif
import RawHTTP
import Testing
@testable import HTTPServer

extension HTTPServerTests {
// The front door under attack (issue 10, the transport's part): framing, deadlines, slots,
// graceful shutdown and counters — over real loopback sockets, with deadlines shortened.
@Suite
struct FrontDoorTests {

    // MARK: Framing

    struct Malformed: CustomStringConvertible, Sendable {
        let name: String
        let request: String
        let status: Int
        /// The server must close the connection after answering.
        let closes: Bool
        var description: String { name }
    }

    static let malformedCases: [Malformed] = [
        Malformed(name: "Content-Length 2^64", request: "POST /v1/oauth/token HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n", status: 400, closes: true),
        Malformed(name: "Content-Length 10^20", request: "POST /v1/oauth/token HTTP/1.1\r\nHost: a\r\nContent-Length: 100000000000000000000\r\n\r\n", status: 400, closes: true),
        Malformed(name: "Content-Length list", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc", status: 400, closes: true),
        Malformed(name: "Content-Length negative", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", status: 400, closes: true),
        Malformed(name: "Content-Length signed", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc", status: 400, closes: true),
        Malformed(name: "two Content-Lengths", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde", status: 400, closes: true),
        Malformed(name: "two equal Content-Lengths", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", status: 400, closes: true),
        Malformed(name: "Transfer-Encoding gzip", request: "POST /v1/oauth/token HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nabc", status: 501, closes: true),
        Malformed(name: "Transfer-Encoding gzip, chunked", request: "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", status: 501, closes: true),
        // libmicrohttpd decodes chunks only for exactly "chunked" (leading blanks aside): anything
        // else would be taken as a body that never ends.
        Malformed(name: "Transfer-Encoding chunked and a space", request: "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked \r\n\r\n3\r\nabc\r\n0\r\n\r\n", status: 501, closes: true),
        Malformed(name: "Transfer-Encoding chunked and a tab", request: "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\t\r\n\r\n3\r\nabc\r\n0\r\n\r\n", status: 501, closes: true),
        Malformed(name: "two Transfer-Encodings", request: "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: 501, closes: true),
        Malformed(name: "chunked and Content-Length", request: "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n", status: 400, closes: true),
        Malformed(name: "bad chunk size", request: "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", status: 400, closes: true),
        Malformed(name: "space in a header name", request: "GET / HTTP/1.1\r\nHost: a\r\nBad Name: 1\r\n\r\n", status: 400, closes: true),
        Malformed(name: "header line without colon", request: "GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", status: 400, closes: true),
        Malformed(name: "HTTP/1.1 without Host", request: "GET / HTTP/1.1\r\n\r\n", status: 400, closes: true),
        Malformed(name: "two Hosts", request: "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", status: 400, closes: true),
        Malformed(name: "HTTP/2.0 request line", request: "GET / HTTP/2.0\r\nHost: a\r\n\r\n", status: 505, closes: true),
        Malformed(name: "HTTP/0.9 request line", request: "GET /\r\n\r\n", status: 400, closes: true),
        Malformed(name: "URI over 32 KiB", request: "GET /\(String(repeating: "u", count: 40_000)) HTTP/1.1\r\nHost: a\r\n\r\n", status: 414, closes: true),
        Malformed(name: "headers over 32 KiB", request: "GET / HTTP/1.1\r\nHost: a\r\nX: \(String(repeating: "h", count: 40_000))\r\n\r\n", status: 431, closes: true),
        Malformed(name: "body over the limit", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 65537\r\n\r\n", status: 413, closes: true),
        Malformed(name: "HTTP/1.0 without Host", request: "GET /ok HTTP/1.0\r\n\r\n", status: 200, closes: true),
        Malformed(name: "a valid POST", request: "POST /ok HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc", status: 200, closes: false),
        Malformed(name: "chunked POST", request: "POST /ok HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", status: 200, closes: false),
        Malformed(name: "chunked POST, blanks before the value", request: "POST /ok HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \t chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", status: 200, closes: false),
    ]

    @Test(arguments: malformedCases)
    func malformedRequestsGetExactlyOneAnswer(_ probe: Malformed) throws {
        let server = try startServer { request in
            HTTPResponse(status: 200, body: Array("\(request.method) \(request.path) \(request.body.count)".utf8))
        }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port, timeout: 2)
        let started = Date()
        _ = connection.sendAll(probe.request)
        if probe.closes {
            // Everything the server sends before it closes: exactly one response.
            let bytes = connection.readToEnd()
            #expect(connection.lastOutcome == .closed, "still open after \(Date().timeIntervalSince(started)) s")
            #expect(Date().timeIntervalSince(started) < 1, "answered after \(Date().timeIntervalSince(started)) s")
            let text = String(decoding: bytes, as: UTF8.self)
            #expect(text.components(separatedBy: "HTTP/1.").count - 1 == 1, "status lines in \(text.prefix(300))")
            #expect(text.hasPrefix("HTTP/1.1 \(probe.status) "), "got \(text.prefix(60))")
        } else {
            let response = try #require(connection.readResponse())
            #expect(response.status == probe.status)
            // The connection is still in step: a second request gets its own answer.
            #expect(connection.sendAll("GET /after HTTP/1.1\r\nHost: a\r\n\r\n"))
            #expect(connection.readResponse()?.text == "GET /after 0")
        }
        expectNoLeaks(server)
    }

    @Test func everyRefusalIsTheConfiguredOneForItsPathAndClosesTheConnection() throws {
        var config = loopbackConfig()
        config.refusalResponse = { status, path in
            HTTPResponse(status: status, headers: [(name: "content-type", value: "application/json")],
                         body: Array(#"{"refused":\#(status),"path":"\#(path)"}"#.utf8))
        }
        let server = try startServer(config) { _ in HTTPResponse(status: 200) }
        defer { server.stop() }
        let oversizeChunk = String(repeating: "c", count: 70_000)
        let refusals: [(name: String, request: String, status: Int)] = [
            ("two Content-Lengths", "POST /a/b HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
            // Answered from libmicrohttpd's log callback, on the socket directly.
            ("Content-Length 2^64", "POST /a/b HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n", 400),
            ("declared body over the limit", "POST /a/b?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 65537\r\n\r\n", 413),
            ("chunked body over the limit",
             "POST /a/b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\(String(oversizeChunk.utf8.count, radix: 16))\r\n\(oversizeChunk)\r\n0\r\n\r\n", 413),
            ("target over 8 KiB", "GET /a/b?\(String(repeating: "u", count: 8_200)) HTTP/1.1\r\nHost: a\r\n\r\n", 414),
            ("101 header fields", "GET /a/b HTTP/1.1\r\nHost: a\r\n" + (0..<100).map { "X-\($0): v\r\n" }.joined() + "\r\n", 431),
            ("head over 16 KiB", "GET /a/b HTTP/1.1\r\nHost: a\r\nX: \(String(repeating: "h", count: 17_000))\r\n\r\n", 431),
            ("Transfer-Encoding gzip", "POST /a/b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nabc", 501),
        ]
        for refusal in refusals {
            let connection = try RawConnection(port: server.port, timeout: 2)
            _ = connection.sendAll(refusal.request)
            let response = connection.readFramedResponse()
            #expect(connection.waitForClose() == .closed, "\(refusal.name): still open")
            #expect(connection.statusLinesReceived == 1, "\(refusal.name): \(String(decoding: connection.transcript.prefix(300), as: UTF8.self))")
            #expect(response?.status == refusal.status, "\(refusal.name)")
            #expect(response?.text == #"{"refused":\#(refusal.status),"path":"/a/b"}"#, "\(refusal.name): \(response?.text ?? "no answer")")
            #expect(response?.headers["content-type"] == "application/json", "\(refusal.name)")
            #expect(response?.headers["connection"]?.lowercased() == "close", "\(refusal.name)")
        }
        // Just under the limits, the same request is served.
        let fine = try RawConnection(port: server.port)
        #expect(fine.sendAll("GET /a/b?\(String(repeating: "u", count: 8_000)) HTTP/1.1\r\nHost: a\r\n"
                             + (0..<98).map { "X-\($0): v\r\n" }.joined() + "\r\n"))
        #expect(fine.readResponse()?.status == 200)
        #expect(server.stats().malformedRequests == 6)
        #expect(server.stats().tooLargeRequests == 2)
        expectNoLeaks(server)
    }

    @Test func pipelinedRequestsAreAnsweredInOrder() throws {
        let server = try startServer { request in HTTPResponse(status: 200, body: Array(request.path.utf8)) }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("GET /one HTTP/1.1\r\nHost: a\r\n\r\nPOST /two HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nxGET /three HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(connection.readResponse()?.text == "/one")
        #expect(connection.readResponse()?.text == "/two")
        #expect(connection.readResponse()?.text == "/three")
        let stats = server.stats()
        #expect(stats.malformedRequests == 0)
    }

    @Test func malformedRequestsAreCounted() throws {
        let server = try startServer { _ in HTTPResponse(status: 200) }
        defer { server.stop() }
        for request in ["POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
                        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"] {
            let connection = try RawConnection(port: server.port)
            _ = connection.sendAll(request)
            _ = connection.readToEnd()
        }
        #expect(server.stats().malformedRequests == 2)
    }

    // MARK: Deadlines

    @Test func aHeadTrickledByteByByteIsCutAtTheHeadDeadline() throws {
        var config = loopbackConfig()
        config.idleTimeoutSeconds = 10   // each byte arrives well inside the idle timeout…
        config.headDeadlineSeconds = 0.25 // …but the head as a whole must arrive within 0.25 s
        let server = try startServer(config) { _ in HTTPResponse(status: 200) }
        defer { server.stop() }

        // Once with the request line complete (after the URI callback), once inside it.
        for prefix in ["GET / HTTP/1.1\r\nHost: a\r\n", "GET /"] {
            let connection = try RawConnection(port: server.port, timeout: 3)
            let started = Date()
            #expect(connection.sendAll(prefix))
            var closed = false
            for _ in 0..<30 where !closed {
                usleep(50_000)
                closed = !connection.sendAll("x")
            }
            if !closed { closed = connection.waitForClose() == .closed }
            let elapsed = Date().timeIntervalSince(started)
            #expect(closed)
            #expect(elapsed > 0.2 && elapsed < 1, "closed after \(elapsed) s (prefix \(prefix.debugDescription))")
        }
        #expect(server.stats().reaped[.headTimeout] == 2)
        // A prompt request is unaffected.
        let prompt = try RawConnection(port: server.port)
        #expect(prompt.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(prompt.readResponse()?.status == 200)
        expectNoLeaks(server)
    }

    @Test func anIdleKeepAliveIsClosedAtTheHeadDeadline() throws {
        var config = loopbackConfig()
        config.headDeadlineSeconds = 0.3
        let server = try startServer(config) { _ in HTTPResponse(status: 200) }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port, timeout: 3)
        #expect(connection.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(connection.readResponse()?.status == 200)
        let started = Date()
        #expect(connection.waitForClose() == .closed)
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed > 0.2 && elapsed < 1, "closed after \(elapsed) s")
        #expect(server.stats().reaped[.idleTimeout] == 1)
    }

    @Test func aBodyBelowTheMinimumRateIsCut() throws {
        var config = loopbackConfig()
        config.minBodyBytesPerSecond = 2_000
        config.bodyGraceSeconds = 0.3
        let server = try startServer(config) { request in HTTPResponse(status: 200, body: Array("\(request.body.count)".utf8)) }
        defer { server.stop() }

        let slow = try RawConnection(port: server.port, timeout: 3)
        #expect(slow.sendAll("POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 50000\r\n\r\n"))
        let started = Date()
        var closed = false
        for _ in 0..<40 where !closed {
            usleep(50_000)
            closed = !slow.sendAll(String(repeating: "s", count: 20))  // 400 B/s
        }
        if !closed { closed = slow.waitForClose() == .closed }
        let elapsed = Date().timeIntervalSince(started)
        #expect(closed)
        #expect(elapsed > 0.25 && elapsed < 1.2, "cut after \(elapsed) s")
        #expect(server.stats().reaped[.bodyTooSlow] == 1)

        // A body sent promptly, even a large one, is not affected.
        let fast = try RawConnection(port: server.port)
        #expect(fast.sendAll(post(bodySize: 60_000)))
        #expect(fast.readResponse()?.text == "60000")
        expectNoLeaks(server)
    }

    @Test func aClientThatDoesNotReadIsCutAtTheWriteTimeout() throws {
        var config = loopbackConfig()
        config.writeTimeoutSeconds = 0.25
        config.idleTimeoutSeconds = 10
        let cancelled = Shared(false)
        let server = try startServer(config) { request, writer in
            if request.path == "/big" {
                return .response(HTTPResponse(status: 200, body: [UInt8](repeating: 0x62, count: 16 << 20)))
            }
            writer.onCancel { cancelled.set(true) }
            writer.startStream(status: 200, headers: [])
            onAnotherThread {
                let block = [UInt8](repeating: 0x73, count: 64 << 10)
                for _ in 0..<256 where writer.write(block) {}
            }
            return .deferred
        }
        defer { server.stop() }

        for path in ["/big", "/stream"] {
            let connection = try RawConnection(port: server.port, timeout: 3, receiveBuffer: 4096)
            #expect(connection.sendAll("GET \(path) HTTP/1.1\r\nHost: a\r\n\r\n"))
            #expect(waitUntil(timeout: 8) { server.stats().responding + server.stats().openStreams == 1 })
            let started = Date()
            #expect(waitUntil(timeout: 2) { server.stats().openConnections == 0 }, "\(path) still open")
            let elapsed = Date().timeIntervalSince(started)
            #expect(elapsed > 0.2 && elapsed < 1, "\(path) cut after \(elapsed) s")
        }
        #expect(server.stats().reaped[.writeTimeout] == 2)
        #expect(cancelled.get)
        expectNoLeaks(server)
    }

    // MARK: Slots

    @Test func nearTheLimitIdleKeepAlivesGoFirstThenTheOldestHeads() throws {
        var config = loopbackConfig()
        config.threads = 1
        config.maxConnections = 40          // one worker: evict above 36, down to 34
        config.maxConnectionsPerIP = 0
        config.headDeadlineSeconds = 30     // only eviction may close anything here
        let server = try startServer(config) { _ in HTTPResponse(status: 200) }
        defer { server.stop() }

        var idle: [RawConnection] = []
        for _ in 0..<20 {
            let connection = try RawConnection(port: server.port, timeout: 2)
            #expect(connection.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
            #expect(connection.readResponse()?.status == 200)
            idle.append(connection)
        }
        var heads: [RawConnection] = []
        for _ in 0..<16 {
            let connection = try RawConnection(port: server.port, timeout: 2)
            #expect(connection.sendAll("GET /slow HTTP/1.1\r\nHost: a\r\nX-Partial: "))
            heads.append(connection)
        }
        #expect(waitUntil(timeout: 8) { server.stats().openConnections == 36 })
        #expect(server.stats().reaped[.evictedIdle] == 0)

        // One more connection takes the worker over its high mark: the oldest idle keep-alives
        // are closed (down to 34 connections), no head is touched, and the newcomer is served.
        let newcomer = try RawConnection(port: server.port)
        #expect(newcomer.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(newcomer.readResponse()?.status == 200)
        #expect(waitUntil(timeout: 8) { server.stats().reaped[.evictedIdle] == 3 })
        #expect(server.stats().reaped[.evictedHead] == 0)
        idle[0].setTimeout(0.5)
        #expect(idle[0].waitForClose() == .closed, "the oldest idle connection was not the one closed")
        heads[0].setTimeout(0.2)
        #expect(heads[0].waitForClose() == .timedOut, "a head was closed while idle connections remained")

        // With no idle connections left, the oldest heads go.
        for connection in idle { connection.disconnect() }
        #expect(waitUntil(timeout: 8) { server.stats().openConnections == 17 })
        let more = try (0..<20).map { _ in try RawConnection(port: server.port, timeout: 2) }
        for connection in more { _ = connection.sendAll("GET /slow HTTP/1.1\r\nHost: a\r\n") }
        // 17 + 20 = 37 > 36: three go, the newcomer (now an idle keep-alive) first.
        #expect(waitUntil(timeout: 8) { server.stats().reaped[.evictedHead] == 2 })
        #expect(server.stats().reaped[.evictedIdle] == 4)
        heads[0].setTimeout(0.5)
        #expect(heads[0].waitForClose() == .closed, "the oldest head was not evicted")
        withExtendedLifetime((heads, more, newcomer)) {}
    }

    @Test func slowHeadsFromManyConnectionsDoNotStopLegitimateRequests() throws {
        var config = loopbackConfig()
        config.threads = 2
        config.maxConnections = 300
        config.maxConnectionsPerIP = 0
        config.headDeadlineSeconds = 0.5
        let server = try startServer(config) { _ in HTTPResponse(status: 200, body: Array("ok".utf8)) }
        defer { server.stop() }

        // 400 attackers (more than the limit) each send a partial head and then nothing.
        var attackers: [RawConnection] = []
        for _ in 0..<400 {
            guard let connection = try? RawConnection(port: server.port, timeout: 1) else { continue }
            _ = connection.sendAll("GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
            attackers.append(connection)
        }
        var served = 0
        var worst = 0.0
        for _ in 0..<20 {
            let started = Date()
            if let connection = try? RawConnection(port: server.port, timeout: 2),
               connection.sendAll("GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n"), connection.readResponse()?.text == "ok" {
                served += 1
            }
            worst = max(worst, Date().timeIntervalSince(started))
            usleep(20_000)
        }
        #expect(served == 20, "\(served)/20 served, worst \(worst) s")
        #expect(worst < 1, "worst \(worst) s")
        let stats = server.stats()
        #expect((stats.reaped[.evictedHead] ?? 0) + (stats.reaped[.headTimeout] ?? 0) > 0)
        withExtendedLifetime(attackers) {}
    }

    // MARK: Graceful shutdown

    @Test func gracefulShutdownFinishesWorkInFlightAndEndsTheRest() throws {
        var config = loopbackConfig()
        config.maxConnectionsPerIP = 0
        config.headDeadlineSeconds = 3   // during the shutdown a head is slow after 0.3 s
        let shutdownCalls = Counter()
        let shutdownStarted = Shared(false)
        let server = try startServer(config) { request, writer in
            switch request.path {
            case "/deferred":
                // Answered 0.2 s into the shutdown: a request in flight.
                onAnotherThread {
                    while !shutdownStarted.get { usleep(5_000) }
                    usleep(200_000)
                    writer.respond(HTTPResponse(status: 200, body: Array("late".utf8)))
                }
                return .deferred
            case "/stream":
                writer.onShutdown {
                    _ = shutdownCalls.next()
                    writer.write(Array("event: error\ndata: {\"type\":\"overloaded_error\"}\n\n".utf8))
                    writer.finish()
                }
                writer.startStream(status: 200, headers: [(name: "content-type", value: "text/event-stream")])
                writer.write(Array("event: ping\n\n".utf8))
                return .deferred
            default:
                return .response(HTTPResponse(status: 200, body: Array("ok".utf8)))
            }
        }
        let port = server.port
        let idle = try RawConnection(port: port, timeout: 3)
        #expect(idle.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(idle.readResponse()?.status == 200)
        let slowHead = try RawConnection(port: port, timeout: 3)
        #expect(slowHead.sendAll("GET / HTTP/1.1\r\nHost: a\r\n"))
        let stream = try RawConnection(port: port, timeout: 3)
        #expect(stream.sendAll("GET /stream HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(stream.readHead()?.status == 200)
        #expect(stream.readChunk() == Array("event: ping\n\n".utf8))
        let deferred = try RawConnection(port: port, timeout: 3)
        #expect(deferred.sendAll("GET /deferred HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(waitUntil(timeout: 8) { server.stats().handling == 1 })
        usleep(350_000)  // the partial head is now "slow"

        let done = Shared(false)
        let started = Date()
        onAnotherThread {
            shutdownStarted.set(true)
            server.shutdown(grace: 3)
            done.set(true)
        }
        // Idle and slow connections are ended at once.
        idle.setTimeout(0.5)
        #expect(idle.waitForClose() == .closed)
        slowHead.setTimeout(0.5)
        #expect(slowHead.waitForClose() == .closed)
        #expect(Date().timeIntervalSince(started) < 0.6)
        // The stream ends cleanly with the producer's last event.
        #expect(stream.readChunk().map { String(decoding: $0, as: UTF8.self) }
                == "event: error\ndata: {\"type\":\"overloaded_error\"}\n\n")
        #expect(stream.readChunk() == [])
        #expect(shutdownCalls.current == 1)
        // The request in flight gets its answer, with Connection: close.
        let answer = try #require(deferred.readResponse())
        #expect(answer.text == "late")
        #expect(answer.headers["connection"]?.lowercased() == "close")
        #expect(deferred.waitForClose() == .closed)
        // Everything finished well before the grace period.
        #expect(waitUntil(timeout: 8) { done.get })
        #expect(Date().timeIntervalSince(started) < 1.5, "shutdown took \(Date().timeIntervalSince(started)) s")
        #expect(throws: (any Error).self) { _ = try RawConnection(port: port) }
        expectNoLeaks(server)
    }

    @Test func gracefulShutdownEndsWhatIsLeftAtTheDeadline() throws {
        let cancelled = Shared(false)
        let server = try startServer { _, writer in
            writer.onCancel { cancelled.set(true) }
            writer.startStream(status: 200, headers: [])  // ignores onShutdown
            return .deferred
        }
        let port = server.port
        let stream = try RawConnection(port: server.port, timeout: 3)
        #expect(stream.sendAll("GET /stream HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(stream.readHead()?.status == 200)
        // New connections during the shutdown are closed unanswered.
        let started = Date()
        onAnotherThread(after: 0.1) {
            if let late = try? RawConnection(port: port, timeout: 1) {
                _ = late.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                if late.readResponse() != nil { Issue.record("a connection accepted during shutdown was served") }
            }
        }
        server.shutdown(grace: 0.5)
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed > 0.45 && elapsed < 1.5, "shutdown took \(elapsed) s")
        #expect(cancelled.get)
        #expect(stream.waitForClose() == .closed)
        expectNoLeaks(server)
    }

    // MARK: Counters

    @Test func statsCountConnectionsStreamsAndTotals() throws {
        let server = try startServer { request, writer in
            if request.path == "/stream" {
                writer.startStream(status: 200, headers: [])
                writer.write(Array("x".utf8))
                return .deferred
            }
            return .response(HTTPResponse(status: 200))
        }
        defer { server.stop() }
        let plain = try RawConnection(port: server.port)
        #expect(plain.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(plain.readResponse()?.status == 200)
        let stream = try RawConnection(port: server.port)
        #expect(stream.sendAll("GET /stream HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(stream.readHead()?.status == 200)
        // The plain request's completion is counted just after its response went out.
        #expect(waitUntil(timeout: 8) { server.stats().openStreams == 1 && server.stats().requestsCompleted == 1 })
        let stats = server.stats()
        #expect(stats.openConnections == 2)
        #expect(stats.waitingConnections == 1)
        #expect(stats.connectionsAccepted == 2)
        #expect(stats.requestsCompleted == 1)
        #expect(Set(stats.reaped.keys) == Set(HTTPReapReason.allCases))
        stream.disconnect()
        #expect(waitUntil(timeout: 8) { server.stats().cancelledAnswers == 1 })
        #expect(server.stats().openStreams == 0)
    }
}
}
