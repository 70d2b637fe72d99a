import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Testing
@testable import HTTPServer

extension HTTPServerTests {
// The front door under attack (issue 10, the transport's part): deadlines, slots and counters — over real loopback sockets, with deadlines shortened.
@Suite
struct FrontDoorTests {

    // MARK: Framing

    @Test func pipelinedRequestsAreAnsweredInOrder() throws {
        let server = try startServer { request in HTTPResponse(status: 200, body: Array(request.path.utf8)) }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("GET /one HTTP/1.1\r\nHost: a\r\n\r\nPOST /two HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nxGET /three HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(connection.readResponse()?.text == "/one")
        #expect(connection.readResponse()?.text == "/two")
        #expect(connection.readResponse()?.text == "/three")
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
            #expect(waitUntil(timeout: 1) { server.stats().responding + server.stats().openStreams == 1 })
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
        #expect(waitUntil(timeout: 2) { server.stats().openConnections == 36 })
        #expect(server.stats().reaped[.evictedIdle] == 0)

        // One more connection takes the worker over its high mark: the oldest idle keep-alives
        // are closed (down to 34 connections), no head is touched, and the newcomer is served.
        let newcomer = try RawConnection(port: server.port)
        #expect(newcomer.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(newcomer.readResponse()?.status == 200)
        #expect(waitUntil(timeout: 2) { server.stats().reaped[.evictedIdle] == 3 })
        #expect(server.stats().reaped[.evictedHead] == 0)
        idle[0].setTimeout(0.5)
        #expect(idle[0].waitForClose() == .closed, "the oldest idle connection was not the one closed")
        heads[0].setTimeout(0.2)
        #expect(heads[0].waitForClose() == .timedOut, "a head was closed while idle connections remained")

        // With no idle connections left, the oldest heads go.
        for connection in idle { connection.disconnect() }
        #expect(waitUntil(timeout: 2) { server.stats().openConnections == 17 })
        let more = try (0..<20).map { _ in try RawConnection(port: server.port, timeout: 2) }
        for connection in more { _ = connection.sendAll("GET /slow HTTP/1.1\r\nHost: a\r\n") }
        // 17 + 20 = 37 > 36: three go, the newcomer (now an idle keep-alive) first.
        #expect(waitUntil(timeout: 2) { server.stats().reaped[.evictedHead] == 2 })
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
        #expect(waitUntil(timeout: 1) { server.stats().openStreams == 1 })
        let stats = server.stats()
        #expect(stats.openConnections == 2)
        #expect(stats.waitingConnections == 1)
        #expect(stats.connectionsAccepted == 2)
        #expect(stats.requestsCompleted == 1)
        #expect(Set(stats.reaped.keys) == Set(HTTPReapReason.allCases))
        stream.disconnect()
        #expect(waitUntil(timeout: 1) { server.stats().cancelledAnswers == 1 })
        #expect(server.stats().openStreams == 0)
    }
}
}
