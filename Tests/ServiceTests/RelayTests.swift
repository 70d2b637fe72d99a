import Foundation
import Testing
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// The Messages API relay on the shipped binaries: attestd in front of the stub upstream, devices
/// with real tokens, keys set with attestctl.
@Suite(.serialized) struct RelayTests {
    static let keyA = "test-key-workspace-default-0000-aaaa"
    static let keyB = "test-key-service-default-1111-bbbb"

    /// A database with two workspaces: `default` has its own key (A, set with attestctl), `second`
    /// has none and so uses attestd's --upstream-key-file (B). One integration and one registered
    /// device in each.
    final class Fixture {
        let directory: URL
        let db: String
        let stub: UpstreamStubServer
        var server: ServerProcess!
        let keyFileB: String
        var tokenA = ""
        var tokenB = ""
        var clientA = ""
        var clientB = ""

        init(stubConfiguration: UpstreamStubConfiguration? = nil, serverArguments: (Fixture) -> [String] = { _ in [] }) async throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-relay-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            db = directory.appendingPathComponent("attestd.sqlite").path
            stub = try UpstreamStubServer(stubConfiguration ?? UpstreamStubConfiguration(apiKeys: [RelayTests.keyA, RelayTests.keyB]))
            keyFileB = directory.appendingPathComponent("default-upstream.key").path
            try Data("\(RelayTests.keyB)\n".utf8).write(to: URL(fileURLWithPath: keyFileB))
            let keyFileA = directory.appendingPathComponent("a.key").path
            try Data("\(RelayTests.keyA)\n".utf8).write(to: URL(fileURLWithPath: keyFileA))
            func ctl(_ arguments: [String]) throws -> String {
                let (status, output) = try ServerProcess.attestctl(arguments + ["--db", db])
                guard status == 0 else { throw HTTPTestError("attestctl \(arguments.joined(separator: " ")) exited \(status)") }
                return output
            }
            _ = try ctl(["init", "--owner", "owner@example.com"])
            _ = try ctl(["workspaces", "create", "--actor", "owner@example.com", "--name", "second"])
            _ = try ctl(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", keyFileA])
            func integration(_ workspace: String) throws -> String {
                let output = try ctl(["integrations", "create", "--actor", "owner@example.com", "--workspace", workspace, "--name", "App",
                                      "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
                return try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
            }
            clientA = try integration("default")
            clientB = try integration("second")
            server = try ServerProcess(db: db, extraArguments: ["--upstream-url", stub.baseURL, "--upstream-key-file", keyFileB]
                                       + serverArguments(self))
            let http = TestHTTP(baseURL: server.baseURL)
            tokenA = try #require(try await http.registerFresh(try ManualDevice(clientID: clientA)).json["access_token"] as? String)
            tokenB = try #require(try await http.registerFresh(try ManualDevice(clientID: clientB)).json["access_token"] as? String)
        }

        func stop() {
            server?.stop()
            stub.stop()
            try? FileManager.default.removeItem(at: directory)
        }

        var http: TestHTTP { TestHTTP(baseURL: server.baseURL) }

        func post(_ path: String = "/v1/messages", token: String, body: String, headers: [String: String] = [:]) async throws -> HTTPResult {
            try await http.send("POST", path, body: Data(body.utf8), contentType: "application/json",
                                headers: ["authorization": "Bearer \(token)"].merging(headers) { $1 })
        }
    }

    static func request(model: String = "claude-test", stream: Bool = false, maxTokens: Int = 64) -> String {
        #"{"model":"\#(model)","max_tokens":\#(maxTokens),"stream":\#(stream),"messages":[{"role":"user","content":"Hello"}]}"#
    }

    @Test func aJSONReplyArrivesIntactAndTheUpstreamSawOnlyTheWorkspaceKey() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let reply = try await fixture.post(token: fixture.tokenA, body: Self.request(),
                                           headers: ["anthropic-beta": "tools-2024-04-04", "user-agent": "ClaudeForFoundationModels/1.0 (com.example.app/1; iOS/26)",
                                                     "x-api-key": "device-supplied-key", "x-forwarded-for": "198.51.100.7"])
        #expect(reply.status == 200)
        let record = try #require(fixture.stub.requests.last)
        // The body went through byte for byte; the reply came back as the stub sent it.
        #expect(record.body == Array(Self.request().utf8))
        #expect(reply.json["type"] as? String == "message")
        let usage = try #require(reply.json["usage"] as? [String: Any])
        #expect(usage["input_tokens"] as? Int == record.usage?.inputTokens)
        #expect(reply.header("request-id") == record.requestID)
        #expect(reply.header("content-type")?.hasPrefix("application/json") == true)
        // The workspace's own key, the default version, the client's beta and user agent; nothing
        // that identifies the device, and not its credentials.
        #expect(record.headerValues("x-api-key") == [Self.keyA])
        #expect(record.header("authorization") == nil)
        #expect(record.header("anthropic-version") == "2023-06-01")
        #expect(record.header("anthropic-beta") == "tools-2024-04-04")
        #expect(record.header("user-agent")?.hasPrefix("ClaudeForFoundationModels/") == true)
        #expect(record.header("x-forwarded-for") == nil && record.header("forwarded") == nil)
        // count_tokens goes the same way.
        #expect(try await fixture.post("/v1/messages/count_tokens", token: fixture.tokenA, body: Self.request()).status == 200)
        #expect(fixture.stub.requests.last?.path == "/v1/messages/count_tokens")
    }

    /// A JSON reply is held until its last byte (so it goes out with a content-length) up to
    /// 1 MiB, and streamed past that: both arrive whole, over many upstream chunks.
    @Test(arguments: [40_000, 300_000])
    func aLargeJSONReplyArrivesWhole(deltas: Int) async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let reply = try await fixture.post(token: fixture.tokenA, body: Self.request(model: "stub-deltas-\(deltas)", maxTokens: deltas))
        #expect(reply.status == 200)
        let content = try #require((reply.json["content"] as? [[String: Any]])?.first)
        let text = try #require(content["text"] as? String)
        #expect(text == StubReply.text(deltaCount: deltas), "reply of \(reply.body.count) bytes")
        #expect((reply.json["usage"] as? [String: Any])?["output_tokens"] as? Int == deltas)
    }

    @Test func aSimulatedDeviceSendsAndStreamsMessagesThroughTheService() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let state = fixture.directory.appendingPathComponent("device").path
        let base = ["simulate-device", "--base-url", fixture.server.baseURL.absoluteString, "--client-id", fixture.clientA,
                    "--state-dir", state, "--app-id", "ABCDE12345.com.example.app", "--messages", "--prompt", "Hi there", "--model", "claude-test"]
        let (status, output) = try ServerProcess.attestSim(base)
        #expect(status == 0)
        #expect(output.contains(StubReply.text(deltaCount: 5)), "the reply's text is printed: \(output)")
        #expect(output.contains(#""messages_status":200"#))
        let record = try #require(fixture.stub.requests.last)
        #expect(String(decoding: record.body ?? [], as: UTF8.self).contains("Hi there"))
        #expect(record.model == "claude-test" && !record.stream)

        let (streamStatus, streamed) = try ServerProcess.attestSim(base + ["--stream"])
        #expect(streamStatus == 0)
        #expect(streamed.contains(StubReply.text(deltaCount: 5)))
        #expect(streamed.contains(#""stop_reason":"end_turn""#) || streamed.contains(#""messages_status":200"#))
        #expect(fixture.stub.requests.last?.stream == true)
        #expect(!streamed.contains(Self.keyA) && !streamed.contains("aat_"))
    }

    @Test func twoWorkspacesReachTheUpstreamWithTheirOwnKeys() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        #expect(try await fixture.post(token: fixture.tokenB, body: Self.request()).status == 200)
        #expect(fixture.stub.requests.last?.headerValues("x-api-key") == [Self.keyB])
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.request()).status == 200)
        #expect(fixture.stub.requests.last?.headerValues("x-api-key") == [Self.keyA])
    }

    @Test func aStreamArrivesChunkByChunkAndIntact() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        // Four deltas 300 ms apart: the first must reach the client before the stub writes the second.
        let body = Self.request(model: "stub-deltas-4+delta-interval-300", stream: true)
        let stream = try RawStream(port: fixture.server.port, path: "/v1/messages", token: fixture.tokenA, body: body)
        defer { stream.close() }
        let firstDelta = try stream.read(until: "content_block_delta", timeout: 10)
        _ = try stream.read(until: "message_stop", timeout: 10)
        let record = try #require(fixture.stub.requests.last)
        try #require(record.deltaSentAt.count == 4)
        #expect(firstDelta < record.deltaSentAt[1], "the first delta waited for the second")
        #expect(firstDelta >= record.deltaSentAt[0])
        let text = stream.text
        #expect(text.hasPrefix("HTTP/1.1 200"))
        #expect(text.lowercased().contains("content-type: text/event-stream"))
        for event in ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"] {
            #expect(text.contains("event: \(event)"), "missing \(event)")
        }
        #expect(text.components(separatedBy: "event: content_block_delta").count - 1 == 4)
        for index in 0..<4 { #expect(text.contains(StubReply.delta(index))) }
        #expect(record.stream)
    }

    @Test(arguments: [400, 429, 500, 529])
    func upstreamErrorsReachTheClientWithStatusBodyAndHeaders(_ status: Int) async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let reply = try await fixture.post(token: fixture.tokenA, body: Self.request(model: "stub-error-\(status)"))
        #expect(reply.status == status)
        #expect(reply.json["type"] as? String == "error")
        let expected = [400: "invalid_request_error", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"][status]
        #expect((reply.json["error"] as? [String: Any])?["type"] as? String == expected)
        #expect(reply.header("request-id") == fixture.stub.requests.last?.requestID)
        if status == 429 { #expect(reply.header("retry-after") == "7") }
    }

    /// A stream the upstream cuts, between events or inside one, ends with whole events only and
    /// an error event of the relay's own that the client can parse (the half event is not passed on).
    @Test(arguments: ["stub-drop-mid-stream", "stub-drop-mid-event"])
    func aStreamCutUpstreamEndsWithWholeEventsAndAnErrorEvent(model: String) async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let reply = try await fixture.post(token: fixture.tokenA, body: Self.request(model: model, stream: true))
        #expect(reply.status == 200)
        let text = String(decoding: reply.body, as: UTF8.self)
        #expect(text.hasSuffix("\n\n") && !text.contains("content_block_del\""), "\(text)")
        var names: [String] = []
        for event in text.components(separatedBy: "\n\n").filter({ !$0.isEmpty }) {
            let lines = event.split(separator: "\n")
            let name = try #require(lines.first { $0.hasPrefix("event: ") }?.dropFirst(7), "\(event)")
            let data = try #require(lines.first { $0.hasPrefix("data: ") }?.dropFirst(6), "\(event)")
            #expect(try JSONSerialization.jsonObject(with: Data(data.utf8)) is [String: Any], "\(name): \(data)")
            names.append(String(name))
        }
        #expect(names == ["message_start", "content_block_start", "ping", "content_block_delta", "error"])
    }

    @Test func aClientThatHangsUpMidStreamCancelsTheUpstreamTransfer() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let stream = try RawStream(port: fixture.server.port, path: "/v1/messages", token: fixture.tokenA,
                                   body: Self.request(model: "stub-slow-stream-30", stream: true))
        _ = try stream.read(until: "content_block_delta", timeout: 10)
        let connection = try #require(fixture.stub.requests.last?.connectionID)
        stream.close()
        let closed = await fixture.stub.waitForConnectionClose(connection, timeout: .seconds(3))
        #expect(closed?.kind == .closed(byClient: true), "the upstream transfer was left running")
    }

    @Test func aGracefulStopEndsOpenStreamsWithAnOverloadedEventAndExitsInTime() async throws {
        let fixture = try await Fixture { _ in ["--shutdown-grace", "3"] }
        defer { fixture.stop() }
        let stream = try RawStream(port: fixture.server.port, path: "/v1/messages", token: fixture.tokenA,
                                   body: Self.request(model: "stub-slow-stream-30", stream: true))
        defer { stream.close() }
        _ = try stream.read(until: "content_block_delta", timeout: 10)
        let stopped = Date()
        kill(fixture.server.process.processIdentifier, SIGTERM)
        // The stream ends cleanly: an error event the client retries on, then the last chunk.
        _ = try stream.read(until: "overloaded_error", timeout: 5)
        _ = try stream.read(until: "\r\n0\r\n\r\n", timeout: 5)
        fixture.server.process.waitUntilExit()
        #expect(Date().timeIntervalSince(stopped) < 4, "attestd did not exit within its grace period")
        #expect(stream.text.contains("event: error"))
    }

    /// A JSON reply too large to hold is already going out when the stop begins: it cannot end
    /// early in any clean way, so it finishes within the grace period (the client was slow to read).
    @Test func aGracefulStopLetsALargeJSONReplyFinish() async throws {
        let fixture = try await Fixture { _ in ["--shutdown-grace", "5"] }
        defer { fixture.stop() }
        // About 19 MB: more than the socket buffers and the relay's high-water mark hold unread.
        let stream = try RawStream(port: fixture.server.port, path: "/v1/messages", token: fixture.tokenA,
                                   body: Self.request(model: "stub-deltas-4000000", maxTokens: 4_000_000))
        defer { stream.close() }
        _ = try stream.read(until: "\r\n\r\n", timeout: 20)  // the head: the reply is past the hold limit
        try await Task.sleep(for: .milliseconds(500))          // unread, so the relay pauses the transfer
        let stopped = Date()
        kill(fixture.server.process.processIdentifier, SIGTERM)
        _ = try stream.read(until: "\r\n0\r\n\r\n", timeout: 5)
        #expect(stream.received.count > 19_000_000)
        let tail = String(decoding: stream.received.suffix(400), as: UTF8.self)
        #expect(tail.contains(#""stop_reason":"end_turn""#) && tail.contains(#""output_tokens":4000000"#), "\(tail)")
        fixture.server.process.waitUntilExit()
        #expect(Date().timeIntervalSince(stopped) < 5, "attestd did not exit within its grace period")
    }

    @Test func revocationMakesTheNextRelayedRequest401() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.request()).status == 200)
        #expect(try ServerProcess.attestctl(["integrations", "revoke", fixture.clientA, "--db", fixture.db, "--actor", "owner@example.com", "--yes"]).0 == 0)
        let before = fixture.stub.requests.count
        let refused = try await fixture.post(token: fixture.tokenA, body: Self.request())
        #expect(refused.status == 401)
        #expect((refused.json["error"] as? [String: Any])?["type"] as? String == "authentication_error")
        #expect(fixture.stub.requests.count == before, "a revoked token reached the upstream")
    }

    @Test func noUpstreamKeyInClearInTheDatabaseOrTheLogs() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        for token in [fixture.tokenA, fixture.tokenB] { #expect(try await fixture.post(token: token, body: Self.request()).status == 200) }
        fixture.server.stop()
        var files = Data()
        for suffix in ["", "-wal", "-shm"] { files.append((try? Data(contentsOf: URL(fileURLWithPath: fixture.db + suffix))) ?? Data()) }
        for key in [Self.keyA, Self.keyB] {
            #expect(files.range(of: Data(key.utf8)) == nil, "an upstream key is stored in clear")
            #expect(!fixture.server.log.contains(key), "an upstream key reached the log")
        }
        #expect(fixture.server.log.contains(#""route":"/v1/messages","status":200"#))
    }

    @Test func anotherDeploymentsSecretsKeyCannotOpenTheWorkspaceKey() async throws {
        let fixture = try await Fixture { fixture in
            let other = fixture.directory.appendingPathComponent("other.key").path
            try? Data((0..<32).map { _ in UInt8.random(in: 0...255) }).write(to: URL(fileURLWithPath: other))
            // A key file others may read is refused at start: this one is its owner's alone.
            chmod(other, 0o600)
            return ["--secrets-key-file", other]
        }
        defer { fixture.stop() }
        let refused = try await fixture.post(token: fixture.tokenA, body: Self.request())
        #expect(refused.status == 503)
        #expect((refused.json["error"] as? [String: Any])?["type"] as? String == "api_error")
        #expect(await fixture.server.waitForLog(containing: "upstream_key_unavailable"))
        #expect(fixture.stub.requests.isEmpty)
        // The workspace without its own key still works with the service default.
        #expect(try await fixture.post(token: fixture.tokenB, body: Self.request()).status == 200)
    }

    @Test func anUnreachableUpstreamIsA502InTheAPIShape() async throws {
        let fixture = try await Fixture { _ in ["--upstream-url", "http://127.0.0.1:1"] }
        defer { fixture.stop() }
        let reply = try await fixture.post(token: fixture.tokenA, body: Self.request())
        #expect(reply.status == 502)
        #expect((reply.json["error"] as? [String: Any])?["type"] as? String == "api_error")
        #expect(reply.json["request_id"] as? String == reply.header("request-id"))
        #expect(await fixture.server.waitForLog(containing: "upstream connect"))
    }

    @Test func aTLSUpstreamWorksThroughTheCAFileAndFailsWithoutIt() async throws {
        let certificates = try StubCertificates.generate()
        defer { certificates.remove() }
        let configuration = UpstreamStubConfiguration(tls: certificates.tlsFiles, apiKeys: [Self.keyA, Self.keyB])
        let trusted = try await Fixture(stubConfiguration: configuration) { fixture in
            ["--upstream-url", fixture.stub.baseURL, "--upstream-ca-file", certificates.caPath]
        }
        defer { trusted.stop() }
        #expect(trusted.stub.baseURL.hasPrefix("https://"))
        #expect(try await trusted.post(token: trusted.tokenA, body: Self.request()).status == 200)

        let untrusted = try await Fixture(stubConfiguration: configuration)
        defer { untrusted.stop() }
        #expect(try await untrusted.post(token: untrusted.tokenA, body: Self.request()).status == 502)
        #expect(await untrusted.server.waitForLog(containing: "upstream tls"))
    }

    @Test func messagesBodiesUpTo32MBAreRelayedAndLargerOnesRefused() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        // A 20 MB request (an image as base64) goes through whole.
        let padding = String(repeating: "A", count: 20_000_000)
        let large = #"{"model":"claude-test","max_tokens":8,"messages":[{"role":"user","content":"\#(padding)"}]}"#
        #expect(try await fixture.post(token: fixture.tokenA, body: large).status == 200)
        #expect(fixture.stub.requests.last?.bodySize == large.utf8.count)
        // Over 32 MB: 413 without reaching the upstream; the device routes keep their 64 KiB.
        let before = fixture.stub.requests.count
        let tooLarge = try await fixture.post(token: fixture.tokenA, body: String(repeating: "B", count: 32_000_001))
        #expect(tooLarge.status == 413)
        #expect(fixture.stub.requests.count == before)
        let exchange = try await fixture.http.send("POST", "/v1/oauth/app-attest/challenge", body: Data(count: 65_537), contentType: "application/json")
        #expect(exchange.status == 413)
    }
}

/// A request on a raw socket whose response is read as it arrives, with the time each read
/// returned, so a test can tell when a chunk reached the client, and hang up mid-stream.
final class RawStream {
    private let fd: Int32
    private(set) var received: [UInt8] = []

    init(port: UInt16, path: String, token: String, body: String) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { throw HTTPTestError("connect failed") }
        let request = "POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(token)\r\nContent-Type: application/json\r\n"
            + "Content-Length: \(body.utf8.count)\r\n\r\n\(body)"
        guard send(fd, request, request.utf8.count, Int32(MSG_NOSIGNAL)) == request.utf8.count else { throw HTTPTestError("send failed") }
    }

    var text: String { String(decoding: received, as: UTF8.self) }

    /// Reads until `marker` has arrived; returns when it did.
    func read(until marker: String, timeout: TimeInterval) throws -> ContinuousClock.Instant {
        let deadline = Date() + timeout
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let wanted = Array(marker.utf8)
        // Only the bytes that arrived since the last look (and a marker's length before them) are
        // searched: a reply of many megabytes is read in linear time.
        var searchedUpTo = 0
        func arrived() -> Bool {
            let from = max(0, searchedUpTo - wanted.count)
            defer { searchedUpTo = received.count }
            return received[from...].firstRange(of: wanted) != nil
        }
        while !arrived() {
            guard Date() < deadline else { throw HTTPTestError("no \(marker) within \(timeout) s; got: \(text.prefix(400))") }
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 100) >= 0 else { throw HTTPTestError("poll failed") }
            guard poller.revents != 0 else { continue }
            let count = recv(fd, &chunk, chunk.count, 0)
            guard count > 0 else { throw HTTPTestError("connection closed before \(marker); got: \(text.prefix(400))") }
            received += chunk[0..<count]
        }
        return ContinuousClock.now
    }

    func close() { Glibc.close(fd) }
}
