import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import RawHTTP
import Testing
@testable import HTTPServer

// All servers bind to loopback on port 0 and are exercised over real sockets.
// Serialized: the timing-based tests (idle timeout) should not compete for the CPU.
@Suite(.serialized)
struct HTTPServerTests {

    // MARK: Basic request/response

    @Test func getAndPostAreEchoedOverURLSession() async throws {
        let server = try startServer(handler: echoHandler)
        defer { server.stop() }

        var get = URLRequest(url: URL(string: "http://127.0.0.1:\(server.port)/v1/items/7?a=1&b=%20x")!)
        get.setValue("hello", forHTTPHeaderField: "X-Test")
        let (getBody, getResponse) = try await URLSession.shared.data(for: get)
        let getHTTP = try #require(getResponse as? HTTPURLResponse)
        #expect(getHTTP.statusCode == 200)
        #expect(getHTTP.value(forHTTPHeaderField: "Content-Type") == "text/plain")
        #expect(String(decoding: getBody, as: UTF8.self)
                == "GET|/v1/items/7|a=1&b=%20x|hello|127.0.0.1|")

        var post = URLRequest(url: URL(string: "http://127.0.0.1:\(server.port)/v1/oauth/token")!)
        post.httpMethod = "POST"
        post.httpBody = Data("grant_type=x&code=y".utf8)
        post.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        let (postBody, postResponse) = try await URLSession.shared.data(for: post)
        #expect((postResponse as? HTTPURLResponse)?.statusCode == 200)
        #expect(String(decoding: postBody, as: UTF8.self)
                == "POST|/v1/oauth/token|-|-|127.0.0.1|grant_type=x&code=y")
        expectNoLeaks(server)
    }

    @Test func headersAreLowercasedAndLookupIsCaseInsensitive() throws {
        let server = try startServer { request in
            let names = request.headers.map(\.name).joined(separator: ",")
            return .json(201, "{\"names\":\"\(names)\",\"custom\":\"\(request.header("X-CUSTOM-Thing") ?? "nil")\"}",
                         headers: [(name: "X-Extra", value: "1")])
        }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("GET / HTTP/1.1\r\nHost: a\r\nX-Custom-Thing: v1\r\n\r\n"))
        let response = try #require(connection.readResponse())
        #expect(response.status == 201)
        #expect(response.headers["content-type"] == "application/json")
        #expect(response.headers["x-extra"] == "1")
        #expect(response.text == "{\"names\":\"host,x-custom-thing\",\"custom\":\"v1\"}")
    }

    @Test func unknownMethodsReachTheHandler() throws {
        let server = try startServer(handler: echoHandler)
        defer { server.stop() }
        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("BREW /pot HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"))
        let response = try #require(connection.readResponse())
        #expect(response.status == 200)
        #expect(response.text == "BREW|/pot|-|-|127.0.0.1|abc")
    }

    @Test func invalidHandlerResponsesBecome500() throws {
        let server = try startServer { request in
            switch request.path {
            case "/bad-status": return HTTPResponse(status: 42)
            case "/bad-header": return HTTPResponse(status: 200, headers: [(name: "X-A", value: "1\r\nInjected: yes")])
            case "/bad-name": return HTTPResponse(status: 200, headers: [(name: "Bad Name", value: "1")])
            default: return HTTPResponse(status: 204, headers: [(name: "Content-Length", value: "999")])
            }
        }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port)
        for path in ["/bad-status", "/bad-header", "/bad-name"] {
            #expect(connection.sendAll("GET \(path) HTTP/1.1\r\nHost: a\r\n\r\n"))
            let response = try #require(connection.readResponse())
            #expect(response.status == 500, "path \(path)")
            #expect(response.headers["injected"] == nil)
        }
        // A handler-supplied content-length is ignored rather than duplicated.
        #expect(connection.sendAll("GET /ok HTTP/1.1\r\nHost: a\r\n\r\n"))
        let ok = try #require(connection.readResponse())
        #expect(ok.status == 204)
        #expect(ok.headers["content-length"] != "999")
        expectNoLeaks(server)
    }

    // MARK: Connections

    @Test func keepAliveServesTwoRequestsOnOneConnection() throws {
        let counter = Counter()
        let server = try startServer { _ in
            HTTPResponse(status: 200, body: Array("request \(counter.next())".utf8))
        }
        defer { server.stop() }
        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("GET /one HTTP/1.1\r\nHost: a\r\n\r\n"))
        let first = try #require(connection.readResponse())
        #expect(first.status == 200)
        #expect(first.text == "request 1")
        #expect(first.headers["connection"]?.lowercased() != "close")

        #expect(connection.sendAll("GET /two HTTP/1.1\r\nHost: a\r\n\r\n"))
        let second = try #require(connection.readResponse())
        #expect(second.status == 200)
        #expect(second.text == "request 2")
        expectNoLeaks(server)
    }

    @Test func idleConnectionIsClosedAfterTimeout() throws {
        var config = loopbackConfig()
        config.idleTimeoutSeconds = 1
        let server = try startServer(config) { _ in HTTPResponse(status: 200) }
        defer { server.stop() }

        let connection = try RawConnection(port: server.port, timeout: 6)
        let started = Date()
        let outcome = connection.waitForClose()
        let elapsed = Date().timeIntervalSince(started)
        #expect(outcome == .closed)
        #expect(elapsed >= 0.5 && elapsed < 4, "closed after \(elapsed) s")

        // A connection that keeps talking is not affected.
        let busy = try RawConnection(port: server.port)
        #expect(busy.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(busy.readResponse()?.status == 200)
    }

    @Test func tricklingBodyIsDroppedAtTheBodyDeadline() throws {
        var config = loopbackConfig()
        config.idleTimeoutSeconds = 5       // each byte arrives well inside the idle timeout…
        config.bodyDeadlineSeconds = 0.4    // …but the body as a whole must arrive within 0.4 s
        let server = try startServer(config) { _ in HTTPResponse(status: 200) }
        defer { server.stop() }

        let connection = try RawConnection(port: server.port, timeout: 6)
        #expect(connection.sendAll("POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n"))
        let started = Date()
        var closed = false
        for _ in 0..<40 where !closed {
            Thread.sleep(forTimeInterval: 0.2)
            closed = !connection.sendAll("x")
        }
        if !closed { closed = connection.waitForClose() == .closed }
        let elapsed = Date().timeIntervalSince(started)
        #expect(closed)
        #expect(elapsed < 4, "dropped after \(elapsed) s")
        // A prompt request on a new connection is unaffected.
        let prompt = try RawConnection(port: server.port)
        #expect(prompt.sendAll("POST /fast HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok"))
        #expect(prompt.readResponse()?.status == 200)
    }

    @Test func perIPConnectionLimitIsEnforced() throws {
        var config = loopbackConfig()
        config.maxConnectionsPerIP = 2
        let server = try startServer(config) { _ in HTTPResponse(status: 200) }
        defer { server.stop() }

        // Two connections are accepted and stay open (keep-alive).
        let first = try RawConnection(port: server.port)
        let second = try RawConnection(port: server.port)
        for connection in [first, second] {
            #expect(connection.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
            #expect(connection.readResponse()?.status == 200)
        }

        // The third is dropped without an answer.
        let third = try RawConnection(port: server.port)
        _ = third.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        #expect(third.readResponse() == nil)
        #expect(third.lastOutcome == .closed)

        // Closing one frees a slot.
        first.disconnect()
        var recovered = false
        for _ in 0..<40 where !recovered {
            let retry = try RawConnection(port: server.port)
            if retry.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), retry.readResponse()?.status == 200 {
                recovered = true
            } else {
                usleep(50_000)
            }
        }
        #expect(recovered)
        expectNoLeaks(server)
    }

    @Test func twoHundredConcurrentRequestsSucceed() throws {
        var config = loopbackConfig()
        config.maxConnectionsPerIP = 256
        let server = try startServer(config, handler: echoHandler)
        defer { server.stop() }

        // All 200 connections are open at the same time before any response is read.
        let connections = try (0..<200).map { _ in try RawConnection(port: server.port, timeout: 20) }
        for (index, connection) in connections.enumerated() {
            let body = "payload-\(index)"
            #expect(connection.sendAll("POST /c/\(index) HTTP/1.1\r\nHost: a\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"))
        }
        var succeeded = 0
        for (index, connection) in connections.enumerated() {
            if let response = connection.readResponse(), response.status == 200,
               response.text == "POST|/c/\(index)|-|-|127.0.0.1|payload-\(index)" {
                succeeded += 1
            }
        }
        #expect(succeeded == 200)
        expectNoLeaks(server)
    }

    // MARK: Limits

    @Test func bodyAtLimitIsAcceptedAndOneByteMoreIs413() throws {
        let server = try startServer { request in
            HTTPResponse(status: 200, body: Array("\(request.body.count):\(request.body.allSatisfy { $0 == 0x61 })".utf8))
        }
        defer { server.stop() }

        let atLimit = try RawConnection(port: server.port)
        #expect(atLimit.sendAll(post(bodySize: 65_536)))
        let accepted = try #require(atLimit.readResponse())
        #expect(accepted.status == 200)
        #expect(accepted.text == "65536:true")

        let overLimit = try RawConnection(port: server.port)
        _ = overLimit.sendAll(post(bodySize: 65_537))  // may fail part-way: the server stops reading
        let refused = try #require(overLimit.readResponse())
        #expect(refused.status == 413)
        #expect(refused.text == "request body too large\n")
        // The server closes the connection after refusing.
        #expect(overLimit.waitForClose() == .closed)

        // Declared size alone is enough: refused before any body byte is sent.
        let declaredOnly = try RawConnection(port: server.port)
        #expect(declaredOnly.sendAll("POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 10000000000\r\n\r\n"))
        #expect(declaredOnly.readResponse()?.status == 413)
        expectNoLeaks(server)
    }

    @Test func chunkedBodyOverLimitIs413() throws {
        var config = loopbackConfig()
        config.maxBodyBytes = 1_000
        let server = try startServer(config) { request in
            HTTPResponse(status: 200, body: Array("\(request.body.count)".utf8))
        }
        defer { server.stop() }

        func chunked(_ sizes: [Int]) -> String {
            sizes.map { String($0, radix: 16) + "\r\n" + String(repeating: "b", count: $0) + "\r\n" }.joined() + "0\r\n\r\n"
        }
        let head = "POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"

        let small = try RawConnection(port: server.port)
        #expect(small.sendAll(head + chunked([600, 400])))
        let ok = try #require(small.readResponse())
        #expect(ok.status == 200)
        #expect(ok.text == "1000")

        let large = try RawConnection(port: server.port)
        _ = large.sendAll(head + chunked([600, 401]))
        let refused = try #require(large.readResponse())
        #expect(refused.status == 413)
        #expect(refused.text == "request body too large\n")
        expectNoLeaks(server)
    }

    @Test func oversizedHeaderBlockIsRefusedWithoutCrashing() throws {
        let server = try startServer(handler: echoHandler)
        defer { server.stop() }

        let connection = try RawConnection(port: server.port)
        let huge = String(repeating: "h", count: 40_000)  // > 32 KiB connection memory
        _ = connection.sendAll("GET / HTTP/1.1\r\nHost: a\r\nX-Huge: \(huge)\r\n\r\n")
        let refused = try #require(connection.readResponse())
        #expect((400..<500).contains(refused.status), "status \(refused.status)")

        let longURL = try RawConnection(port: server.port)
        _ = longURL.sendAll("GET /\(huge) HTTP/1.1\r\nHost: a\r\n\r\n")
        let refusedURL = try #require(longURL.readResponse())
        #expect((400..<500).contains(refusedURL.status), "status \(refusedURL.status)")

        // The server is still healthy.
        let next = try RawConnection(port: server.port)
        #expect(next.sendAll("GET /after HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(next.readResponse()?.text == "GET|/after|-|-|127.0.0.1|")
        expectNoLeaks(server)
    }

    // MARK: Lifecycle and binding

    @Test func stopThenStartOnSamePortWorks() throws {
        let first = try startServer { _ in HTTPResponse(status: 200, body: Array("first".utf8)) }
        let port = first.port
        #expect(port != 0)
        let kept = try RawConnection(port: port)  // an open connection must not block stop()
        #expect(kept.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(kept.readResponse()?.text == "first")
        // A request stuck mid-upload is cleaned up by stop().
        let partial = try RawConnection(port: port)
        #expect(partial.sendAll("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789"))
        for _ in 0..<100 where first.liveRequestContexts == 0 { usleep(10_000) }
        #expect(first.liveRequestContexts == 1)
        first.stop()
        first.stop()  // idempotent
        #expect(first.port == 0)
        expectNoLeaks(first)
        #expect(throws: (any Error).self) { _ = try RawConnection(port: port) }

        var config = loopbackConfig()
        config.port = port
        let second = try startServer(config) { _ in HTTPResponse(status: 200, body: Array("second".utf8)) }
        defer { second.stop() }
        #expect(second.port == port)
        let connection = try RawConnection(port: port)
        #expect(connection.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(connection.readResponse()?.text == "second")

        // The port is now taken: a third server reports it clearly.
        let third = HTTPServer(configuration: config) { _ in HTTPResponse(status: 200) }
        do {
            try third.start()
            Issue.record("second listener on port \(port) unexpectedly started")
            third.stop()
        } catch {
            #expect("\(error)" == "cannot listen on 127.0.0.1:\(port): address in use")
        }
    }

    @Test func startTwiceThrowsAndRestartAfterStopWorks() throws {
        let server = try startServer { _ in HTTPResponse(status: 200) }
        defer { server.stop() }
        #expect(throws: HTTPServerError.self) { try server.start() }

        server.stop()
        try server.start()  // the same instance can run again
        #expect(server.port != 0)
        let connection = try RawConnection(port: server.port)
        #expect(connection.sendAll("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(connection.readResponse()?.status == 200)
    }

    @Test func invalidHostIsRejected() {
        var config = loopbackConfig()
        config.host = "localhost"  // names are not resolved
        let server = HTTPServer(configuration: config) { _ in HTTPResponse(status: 200) }
        #expect(throws: HTTPServerError.self) { try server.start() }
        #expect(server.port == 0)
    }

    @Test func ipv6LoopbackReportsClientAddress() throws {
        var config = loopbackConfig()
        config.host = "::1"
        let server = try startServer(config, handler: echoHandler)
        defer { server.stop() }
        let connection = try RawConnection(port: server.port, ipv6: true)
        #expect(connection.sendAll("GET /six HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(connection.readResponse()?.text == "GET|/six|-|-|::1|")
        // Bound to ::1 only: nothing listens on 127.0.0.1 at that port.
        #expect(throws: (any Error).self) { _ = try RawConnection(port: server.port) }
    }
}

/// Path and query from a request target, in origin and absolute form.
@Suite struct RequestTargetTests {
    @Test func originAndAbsoluteFormsSplitIntoPathAndQuery() {
        #expect(splitTarget("/v1/messages") == ("/v1/messages", nil))
        #expect(splitTarget("/v1/items/7?a=1&b=%20x") == ("/v1/items/7", "a=1&b=%20x"))
        #expect(splitTarget("/p?") == ("/p", ""))
        #expect(splitTarget("/p?q?r") == ("/p", "q?r"))
        #expect(splitTarget("http://example.com/v1/x?y=1") == ("/v1/x", "y=1"))
        #expect(splitTarget("http://example.com") == ("/", nil))
        #expect(splitTarget("http://example.com?y=1") == ("/", "y=1"))
        #expect(splitTarget("https://h:8443/a/b") == ("/a/b", nil))
        #expect(splitTarget("*") == ("*", nil))
        #expect(splitTarget("/é?ü") == ("/é", "ü"))
    }
}
