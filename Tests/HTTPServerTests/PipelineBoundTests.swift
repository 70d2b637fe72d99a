import Foundation
import Glibc
import RawHTTP
import Synchronization
import Testing
@testable import HTTPServer

/// A client that pipelines requests and never reads its answers gets a bounded share of the
/// server's work, then costs nothing until it reads: the front door's answer to slow readers.
@Suite struct PipelineBoundTests {
    static func server(handled: HandledCount, maxUnread: Int = 8 << 10) throws -> HTTPServer {
        var config = loopbackConfig()
        config.threads = 2
        config.maxUnreadResponseBytes = maxUnread
        let body = Array(String(repeating: "x", count: 100).utf8)
        return try startServer(config) { _ in
            handled.value.add(1, ordering: .relaxed)
            return HTTPResponse(status: 200, headers: [(name: "content-type", value: "text/plain")], body: body)
        }
    }

    static let get = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n"

    @Test func aPipeliningNonReaderIsHeldAfterABoundedShareAndServedInFullOnceItReads() throws {
        let handled = HandledCount()
        let server = try Self.server(handled: handled)
        defer { server.stop() }
        // 400 requests at once, a tiny receive buffer, nothing read.
        let attacker = try RawConnection(port: server.port, timeout: 10, receiveBuffer: 1024)
        #expect(attacker.sendAll(String(repeating: Self.get, count: 400)))
        #expect(waitUntil(timeout: 10) { server.stats().held == 1 }, "the connection was never held")
        // About 8 KiB of answers (some 50 of ~200 bytes each) and what the client's buffer took.
        let share = handled.value.load(ordering: .relaxed)
        #expect(share < 120, "\(share) of 400 pipelined requests were handled for a client that reads nothing")
        #expect(server.stats().heldRequests >= 1)
        // It costs nothing while held: no more requests are handled.
        let other = try RawConnection(port: server.port)
        #expect(other.sendAll(Self.get))
        #expect(other.readFramedResponse()?.status == 200)
        #expect(handled.value.load(ordering: .relaxed) == share + 1)
        // Once it reads, it is served in full, in order.
        var answers = 0
        while answers < 400, let response = attacker.readFramedResponse() {
            #expect(response.status == 200)
            answers += 1
        }
        #expect(answers == 400)
        #expect(handled.value.load(ordering: .relaxed) == 401)
        expectNoLeaks(server)
    }

    /// A client that reads each answer before it asks again is never held, however many it asks.
    @Test func aClientThatReadsItsAnswersIsNeverHeld() throws {
        let handled = HandledCount()
        let server = try Self.server(handled: handled, maxUnread: 1024)
        defer { server.stop() }
        let client = try RawConnection(port: server.port)
        for _ in 0..<300 {
            #expect(client.sendAll(Self.get))
            #expect(client.readFramedResponse()?.status == 200)
        }
        #expect(server.stats().heldRequests == 0)
        #expect(handled.value.load(ordering: .relaxed) == 300)
    }

    /// A held client that never reads is closed at the write timeout, like any client that does
    /// not take its answers; one that hangs up while held is let go at once.
    @Test func aHeldClientIsClosedAtTheWriteTimeoutOrWhenItHangsUp() throws {
        let handled = HandledCount()
        var config = loopbackConfig()
        config.threads = 1
        config.writeTimeoutSeconds = 1
        let server = try startServer(config) { _ in
            handled.value.add(1, ordering: .relaxed)
            return HTTPResponse(status: 200, body: Array(String(repeating: "y", count: 500).utf8))
        }
        defer { server.stop() }
        let stuck = try RawConnection(port: server.port, timeout: 10, receiveBuffer: 1024)
        #expect(stuck.sendAll(String(repeating: Self.get, count: 200)))
        #expect(waitUntil(timeout: 10) { server.stats().held == 1 })
        #expect(waitUntil(timeout: 10) { (server.stats().reaped[.unreadAnswers] ?? 0) + (server.stats().reaped[.writeTimeout] ?? 0) == 1 })
        #expect(waitUntil(timeout: 10) { server.stats().openConnections == 0 })
        let leaving = try RawConnection(port: server.port, timeout: 10, receiveBuffer: 1024)
        #expect(leaving.sendAll(String(repeating: Self.get, count: 200)))
        #expect(waitUntil(timeout: 10) { server.stats().held == 1 })
        leaving.disconnect()
        #expect(waitUntil(timeout: 10) { server.stats().openConnections == 0 })
        expectNoLeaks(server)
    }
}

final class HandledCount: Sendable {
    let value = Atomic<Int>(0)
}
