import Foundation
import RawHTTP
import Testing

/// The front door on the shipped attestd, against clients that pipeline requests and never read
/// their answers (the slow-reader attack at a smaller scale): each gets a bounded share of the
/// work and is then held, a legitimate caller is served meanwhile, and the admin routes are not
/// on the public listener at all.
@Suite(.serialized) struct SlowReaderTests {
    static func metric(_ text: String, _ name: String) -> Double {
        text.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Double($0.split(separator: " ").last!) } ?? 0
    }

    /// Connections held for their unread answers, and those the write timeout closed after that
    /// (30 s: a test task that waited that long in its sleep finds them closed, not held).
    static func heldOrReaped(_ text: String) -> Double {
        metric(text, #"attestd_connections{state="held"}"#) + metric(text, #"attestd_connections_reaped_total{reason="unreadAnswers"}"#)
    }

    /// /metrics from the admin listener on a connection of its own, not through the tests' shared
    /// URLSession: with other suites running beside this one, a request there was seen to take
    /// 30 s, and the wait below ran out before it had looked once.
    static func rawMetrics(port: UInt16) throws -> String {
        let connection = try RawConnection(port: port, timeout: 10)
        guard connection.sendAll("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n"),
              let response = connection.readFramedResponse(), response.status == 200 else { return "" }
        return String(decoding: response.body, as: UTF8.self)
    }

    @Test func pipeliningNonReadersGetABoundedShareWhileALegitimateCallerIsServed() async throws {
        let (directory, db, clientID) = try DurabilityTests().makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(db: db)
        defer { server.stop() }
        // 300 connections from 30 addresses, 200 pipelined requests each, never read.
        let request = Array("GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n".utf8)
        var attackers: [RawConnection] = []
        for index in 0..<300 {
            let connection = try RawConnection(port: server.port, timeout: 5, receiveBuffer: 1024, source: "127.0.3.\(1 + index % 30)")
            #expect(connection.sendAll(Array([[UInt8]](repeating: request, count: 200).joined())))
            attackers.append(connection)
        }
        defer { attackers.forEach { $0.disconnect() } }
        // Every one of them ends up held: its answers wait unread, it costs nothing more. (Until
        // the count of answers stops moving: pipelined requests get at most half of each event
        // loop, so the last few connections take their share after the first 290 are held.)
        var text = ""
        var lastAnswered = -1.0
        var settled = false
        let deadline = Date() + 30
        repeat {
            text = try Self.rawMetrics(port: server.adminPort)
            let answeredNow = Self.metric(text, #"attestd_http_requests_total{route="/healthz",status="200"}"#)
            if Self.heldOrReaped(text) >= 290, answeredNow == lastAnswered {
                settled = true
                break
            }
            lastAnswered = answeredNow
            try await Task.sleep(for: .milliseconds(100))
        } while Date() < deadline
        // A last look: with other suites beside this one, this task was seen to wait past the
        // deadline in its sleep, and its last reading was then tens of seconds old.
        if !settled { text = try Self.rawMetrics(port: server.adminPort) }
        #expect(Self.heldOrReaped(text) >= 290, "\(text.split(separator: "\n").filter { $0.contains("attestd_connections") })")
        // Bounded work: about 8 KiB of answers each, not the 60,000 requests sent.
        let answered = Self.metric(text, #"attestd_http_requests_total{route="/healthz",status="200"}"#)
        #expect(answered > 0 && answered < 25_000, "\(answered) of 60,000 pipelined requests were answered")
        // Meanwhile a legitimate caller is served: a health check and a fresh install's exchange.
        let http = TestHTTP(baseURL: server.baseURL)
        let started = ContinuousClock.now
        #expect(try await http.send("GET", "/healthz").status == 200)
        let registered = try await http.registerFresh(try ManualDevice(clientID: clientID))
        #expect(registered.status == 200)
        #expect(ContinuousClock.now - started < .seconds(5))
        // And nothing more was handled for the attackers since.
        let after = try Self.rawMetrics(port: server.adminPort)
        #expect(Self.metric(after, #"attestd_http_requests_total{route="/healthz",status="200"}"#) <= answered + 2)
    }

    @Test func theAdminRoutesAreOnTheAdminListenerOnlyAndNowhereWithAdminListenNone() async throws {
        let (directory, db, _) = try DurabilityTests().makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(db: db, extraArguments: ["--admin-listen", "none"])
        defer { server.stop() }
        #expect(await server.waitForLog(containing: "no_admin_listener"))
        #expect(server.adminPort == 0)
        let http = TestHTTP(baseURL: server.baseURL)
        #expect(try await http.send("GET", "/metrics").status == 404)
        #expect(try await http.send("POST", "/v1/oauth/introspect", body: Data("token=x".utf8),
                                    contentType: "application/x-www-form-urlencoded").status == 404)
        #expect(try await http.send("GET", "/v1/authz/check").status == 404)
        #expect(try await http.send("GET", "/healthz").status == 200)
        #expect(try await http.send("GET", "/readyz").status == 200)
    }
}
