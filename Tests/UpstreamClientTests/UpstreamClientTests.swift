import Foundation
import Testing
import UpstreamClient
import UpstreamStub

// Every test runs a real stub on loopback and a real client; waits are bounded.
// Serialized: the timing assertions (chunk order, timeouts) should not compete for 2 cores.
@Suite(.serialized, .timeLimit(.minutes(1)))
struct UpstreamClientTests {

    @Test func jsonReplyArrivesWithHeadersAndUsage() async throws {
        let stub = try UpstreamStubServer()
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }

        let request = messagesRequest(model: "claude-test", prompt: "Tell me something")
        let recorder = Recorder()
        client.start(request, delegate: recorder)
        #expect(await recorder.waitForFinish())

        let state = recorder.snapshot
        #expect(state.error == nil)
        #expect(state.status == 200)
        #expect(state.calls.first == "head" && state.calls.last == "finish" && state.heads == 1 && state.finishes == 1)
        #expect(recorder.header("content-type") == "application/json")
        #expect(recorder.header("request-id")?.hasPrefix("req_") == true)
        #expect(recorder.header("anthropic-ratelimit-requests-limit") == "4000")
        // Repeated names are kept, in order; names are lowercased.
        #expect(state.headers.filter { $0.name == "vary" }.map(\.value) == ["accept-encoding", "origin"])
        #expect(state.headers.allSatisfy { $0.name == $0.name.lowercased() })

        let reply = try #require(jsonObject(recorder.text))
        #expect(reply["type"] as? String == "message")
        #expect(reply["model"] as? String == "claude-test")
        let content = try #require((reply["content"] as? [[String: Any]])?.first)
        #expect(content["text"] as? String == StubReply.text(deltaCount: 5))
        let usage = try #require(reply["usage"] as? [String: Int])
        let expected = StubUsage.input(forBody: request.body)
        #expect(usage["input_tokens"] == expected.inputTokens)
        #expect(usage["output_tokens"] == 5)

        // The stub saw exactly our headers, plus only Host and Content-Length from curl.
        let record = try #require(stub.requests.first)
        #expect(record.usage == StubUsage(inputTokens: expected.inputTokens, outputTokens: 5,
                                          cacheCreationInputTokens: 0, cacheReadInputTokens: 0))
        #expect(record.header("x-api-key") == "sk-test-workspace")
        #expect(record.header("authorization") == nil)
        #expect(record.headers.map(\.name).sorted()
                == ["anthropic-version", "content-length", "content-type", "host", "x-api-key"])
        #expect(record.body == request.body)
        #expect(client.activeTransfers == 0)
    }

    @Test func streamChunksArriveOneByOne() async throws {
        let stub = try UpstreamStubServer(.init(deltaCount: 4, deltaInterval: .milliseconds(150)))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }

        let recorder = Recorder()
        client.start(messagesRequest(stream: true, maxTokens: 50), delegate: recorder)
        #expect(await recorder.waitForFinish())
        let state = recorder.snapshot
        #expect(state.error == nil)
        #expect(recorder.header("content-type") == "text/event-stream; charset=utf-8")

        let names = events(in: recorder.text).map(\.event)
        #expect(names == ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
                          "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"])
        // The chunk that carried the first delta reached the delegate before the stub even
        // wrote the second one.
        let record = try #require(stub.requests.first)
        #expect(record.deltaSentAt.count == 4)
        let firstDelta = try #require(state.chunks.first { String(decoding: $0.bytes, as: UTF8.self).contains("\"text\":\"Hello\"") })
        #expect(firstDelta.at < record.deltaSentAt[1])
        // And each later delta came after the stub sent it, not batched at the end.
        let deltaChunks = state.chunks.filter { String(decoding: $0.bytes, as: UTF8.self).contains("content_block_delta") }
        #expect(deltaChunks.count == 4)

        let delta = try #require(jsonObject(events(in: recorder.text).first { $0.event == "message_delta" }!.data))
        #expect((delta["usage"] as? [String: Int])?["output_tokens"] == 4)
        // The stub marks its record complete after its last write, which the client may have
        // read before that: wait for the mark, not for a time.
        #expect(await stub.waitUntil(timeout: .seconds(10)) { $0.requests.first?.outcome == .completed })
    }

    @Test func pausedTransferDeliversNothingUntilResumed() async throws {
        let stub = try UpstreamStubServer(.init(deltaCount: 4, deltaInterval: .milliseconds(20)))
        defer { stub.stop() }
        // A short idle timeout: a paused transfer must be exempt from it.
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL, idleTimeout: .milliseconds(250)))
        defer { client.shutdown() }

        // Pause at the first chunk that holds a delta.
        let recorder = Recorder { chunks in
            !String(decoding: chunks.last!.bytes, as: UTF8.self).contains("content_block_delta")
                || chunks.filter { String(decoding: $0.bytes, as: UTF8.self).contains("content_block_delta") }.count > 1
        }
        let transfer = client.start(messagesRequest(stream: true), delegate: recorder)
        #expect(await waitFor(timeout: .seconds(5)) { recorder.text.contains("content_block_delta") })
        // The stub finishes writing the whole stream; none of it is delivered while paused.
        #expect(await stub.waitUntil(timeout: .seconds(5)) { $0.requests.first?.outcome == .completed })
        let countWhilePaused = recorder.snapshot.chunks.count
        try await Task.sleep(for: .milliseconds(400))
        #expect(recorder.snapshot.chunks.count == countWhilePaused)
        #expect(!recorder.finished)

        transfer.resume()
        #expect(await recorder.waitForFinish())
        #expect(recorder.snapshot.error == nil)
        #expect(events(in: recorder.text).map(\.event).last == "message_stop")
        #expect(events(in: recorder.text).filter { $0.event == "content_block_delta" }.count == 4)
    }

    @Test func cancelMidStreamClosesTheUpstreamConnection() async throws {
        let stub = try UpstreamStubServer(.init(deltaCount: 10, deltaInterval: .milliseconds(300)))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }

        let recorder = Recorder()
        let transfer = client.start(messagesRequest(stream: true), delegate: recorder)
        #expect(await waitFor(timeout: .seconds(5)) { recorder.text.contains("content_block_delta") })
        #expect(stub.openStreams == 1)
        let cancelledAt = ContinuousClock.now
        transfer.cancel()
        let chunksAtCancel = recorder.snapshot.chunks.count

        let closed = try #require(await stub.waitForConnectionClose(timeout: .seconds(2)))
        #expect(closed.kind == .closed(byClient: true))
        #expect(cancelledAt.duration(to: closed.at) < .milliseconds(500))
        #expect(await recorder.waitForFinish(timeout: .seconds(2)))
        #expect(recorder.snapshot.error?.kind == .cancelled)
        #expect(recorder.snapshot.chunks.count == chunksAtCancel)
        #expect(await stub.waitUntil(timeout: .seconds(2)) { $0.requests.first?.outcome == .clientClosed && $0.openStreams == 0 })
        #expect(client.activeTransfers == 0)

        // Cancelling again, or resuming, does nothing more.
        transfer.cancel()
        transfer.resume()
        try await Task.sleep(for: .milliseconds(50))
        #expect(recorder.snapshot.finishes == 1)
    }

    @Test func connectionRefusedFailsFastAsConnect() async throws {
        // Bound but not listening: the kernel answers a SYN with a reset.
        let socket = try #require(LoopbackSocket.bound())
        defer { socket.close() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: "http://127.0.0.1:\(socket.port)"))
        defer { client.shutdown() }
        let recorder = Recorder()
        let started = ContinuousClock.now
        client.start(messagesRequest(), delegate: recorder)
        #expect(await recorder.waitForFinish(timeout: .seconds(3)))
        let error = try #require(recorder.snapshot.error)
        #expect(error.kind == .connect)
        #expect(error.curlCode == 7)
        #expect(error.detail.contains("\(socket.port)"))
        #expect(started.duration(to: recorder.snapshot.finishedAt!) < .seconds(1))
        #expect(recorder.snapshot.heads == 0)
    }

    @Test func connectTimeoutOnAFullListenBacklog() async throws {
        // A listener that never accepts, with its queue (backlog 0) filled by two pending
        // connects: Linux drops further SYNs, so a connect neither succeeds nor fails.
        let listener = try #require(LoopbackSocket.bound(listenBacklog: 0))
        let fillers = (0..<2).map { _ in LoopbackSocket.connecting(to: listener.port) }
        defer {
            fillers.forEach { close($0) }
            listener.close()
        }
        try await Task.sleep(for: .milliseconds(50))

        let client = try UpstreamClient(UpstreamConfiguration(baseURL: "http://127.0.0.1:\(listener.port)",
                                                              connectTimeout: .milliseconds(300)))
        defer { client.shutdown() }
        let recorder = Recorder()
        let started = ContinuousClock.now
        client.start(messagesRequest(), delegate: recorder)
        #expect(await recorder.waitForFinish(timeout: .seconds(5)))
        let error = try #require(recorder.snapshot.error)
        #expect(error.kind == .timeout)
        #expect(error.curlCode == 28)
        let elapsed = started.duration(to: recorder.snapshot.finishedAt!)
        #expect(elapsed >= .milliseconds(280) && elapsed < .seconds(2))
    }

    @Test func idleTimeoutEndsASilentTransfer() async throws {
        let stub = try UpstreamStubServer()
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL, idleTimeout: .milliseconds(300)))
        defer { client.shutdown() }

        // The stub waits 3 s before its head, then streams deltas 100 ms apart: the first
        // transfer times out, the second (always under the limit) does not.
        let silent = Recorder()
        let started = ContinuousClock.now
        client.start(messagesRequest(stream: true, extraHeaders: [("x-stub-behavior", "latency-3000")]), delegate: silent)
        let steady = Recorder()
        client.start(messagesRequest(stream: true, extraHeaders: [("x-stub-behavior", "deltas-8,delta-interval-100")]), delegate: steady)

        #expect(await silent.waitForFinish(timeout: .seconds(3)))
        let error = try #require(silent.snapshot.error)
        #expect(error.kind == .idleTimeout)
        let elapsed = started.duration(to: silent.snapshot.finishedAt!)
        #expect(elapsed >= .milliseconds(300) && elapsed < .milliseconds(1000))
        // The stub sees that connection close.
        #expect(await stub.waitUntil(timeout: .seconds(2)) { $0.connectionEvents.contains { $0.kind == .closed(byClient: true) } })

        #expect(await steady.waitForFinish(timeout: .seconds(5)))
        #expect(steady.snapshot.error == nil)
        #expect(events(in: steady.text).filter { $0.event == "content_block_delta" }.count == 8)
    }

    /// A request with its own total timeout (a token fetch that requests wait on) ends by then
    /// even while bytes keep trickling in under the idle timeout; the next transfer on the same
    /// kept handle has no such limit.
    @Test func aTotalTimeoutEndsATransferThatKeepsTrickling() async throws {
        let stub = try UpstreamStubServer()
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL, idleTimeout: .seconds(5)))
        defer { client.shutdown() }
        var bounded = messagesRequest(stream: true, extraHeaders: [("x-stub-behavior", "deltas-40,delta-interval-100")])
        bounded.origin = stub.baseURL
        bounded.totalTimeout = .milliseconds(400)
        let cut = Recorder()
        let started = ContinuousClock.now
        client.start(bounded, delegate: cut)
        #expect(await cut.waitForFinish(timeout: .seconds(5)))
        #expect(cut.snapshot.error?.kind == .timeout)
        let elapsed = started.duration(to: cut.snapshot.finishedAt!)
        #expect(elapsed >= .milliseconds(380) && elapsed < .seconds(3))
        var unbounded = messagesRequest(stream: true, extraHeaders: [("x-stub-behavior", "deltas-8,delta-interval-100")])
        unbounded.origin = stub.baseURL
        let whole = Recorder()
        client.start(unbounded, delegate: whole)
        #expect(await whole.waitForFinish(timeout: .seconds(5)))
        #expect(whole.snapshot.error == nil)
        #expect(events(in: whole.text).filter { $0.event == "content_block_delta" }.count == 8)
    }

    @Test func tlsUpstreamNeedsTheExtraRoot() async throws {
        let certificates = try StubCertificates.generate()
        defer { certificates.remove() }
        let stub = try UpstreamStubServer(.init(tls: certificates.tlsFiles))
        defer { stub.stop() }
        #expect(stub.baseURL.hasPrefix("https://127.0.0.1:"))

        let trusting = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL, caFile: certificates.caPath))
        defer { trusting.shutdown() }
        let ok = Recorder()
        trusting.start(messagesRequest(stream: true), delegate: ok)
        #expect(await ok.waitForFinish())
        #expect(ok.snapshot.error == nil)
        #expect(ok.snapshot.status == 200)
        #expect(events(in: ok.text).map(\.event).last == "message_stop")

        // The same by name: the certificate also covers localhost.
        let byName = try UpstreamClient(UpstreamConfiguration(baseURL: "https://localhost:\(stub.port)", caFile: certificates.caPath))
        defer { byName.shutdown() }
        let named = Recorder()
        byName.start(messagesRequest(), delegate: named)
        #expect(await named.waitForFinish())
        #expect(named.snapshot.error == nil && named.snapshot.status == 200)

        // System roots alone do not trust the test CA.
        let plain = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { plain.shutdown() }
        let refused = Recorder()
        plain.start(messagesRequest(), delegate: refused)
        #expect(await refused.waitForFinish())
        let error = try #require(refused.snapshot.error)
        #expect(error.kind == .tls)
        #expect(error.curlCode == 60)
        #expect(refused.snapshot.heads == 0)

        // A CA file that is not one is refused when the client is made.
        #expect(throws: UpstreamClientError.self) {
            _ = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL, caFile: certificates.keyPath + ".missing"))
        }
    }

    @Test func twoHundredConcurrentStreamsOnOneThread() async throws {
        // Streams of about 2 s, so that all 200 are open at once even on a loaded machine.
        let stub = try UpstreamStubServer(.init(deltaCount: 3, deltaInterval: .milliseconds(700)))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }
        // The suite is serialized and every earlier client joined its thread: this one is alone.
        #expect(await waitFor(timeout: .seconds(2)) { threadCount(named: "upstream-curl-0") == 1 })

        let recorders = (0..<200).map { _ in Recorder() }
        for recorder in recorders { client.start(messagesRequest(stream: true), delegate: recorder) }
        // All 200 are open upstream at the same time.
        #expect(await stub.waitUntil(timeout: .seconds(10)) { $0.openStreams == 200 })
        #expect(client.activeTransfers == 200)
        #expect(threadCount(named: "upstream-curl-0") == 1)

        #expect(await waitFor(timeout: .seconds(10)) { recorders.allSatisfy(\.finished) })
        for recorder in recorders {
            #expect(recorder.snapshot.error == nil)
            #expect(events(in: recorder.text).filter { $0.event == "content_block_delta" }.count == 3)
        }
        #expect(client.activeTransfers == 0)
        #expect(stub.requests.count == 200)
    }

    @Test func sequentialRequestsReuseOneConnection() async throws {
        let stub = try UpstreamStubServer(.init(deltaCount: 2, deltaInterval: .milliseconds(1)))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }
        for index in 0..<6 {
            let recorder = Recorder()
            client.start(messagesRequest(stream: index % 2 == 0), delegate: recorder)
            #expect(await recorder.waitForFinish())
            #expect(recorder.snapshot.error == nil && recorder.snapshot.status == 200)
        }
        #expect(stub.connectionsOpened == 1)
        #expect(Set(stub.requests.map(\.connectionID)).count == 1)
        #expect(stub.requests.count == 6)
    }

    @Test func upstreamErrorsAreResponsesAndDropsAreResets() async throws {
        let stub = try UpstreamStubServer(.init(retryAfterSeconds: 9))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }

        for (status, type) in [(400, "invalid_request_error"), (429, "rate_limit_error"), (500, "api_error"), (529, "overloaded_error")] {
            stub.enqueue(.error(status))
            let recorder = Recorder()
            client.start(messagesRequest(), delegate: recorder)
            #expect(await recorder.waitForFinish())
            #expect(recorder.snapshot.error == nil)
            #expect(recorder.snapshot.status == status)
            let envelope = try #require(jsonObject(recorder.text))
            #expect(envelope["type"] as? String == "error")
            #expect((envelope["error"] as? [String: Any])?["type"] as? String == type)
            #expect((envelope["request_id"] as? String) == recorder.header("request-id"))
            #expect(recorder.header("retry-after") == (status == 429 ? "9" : nil))
        }

        // Chosen by model name, as a relay that forwards only known headers would pass it.
        for stream in [true, false] {
            let dropped = Recorder()
            client.start(messagesRequest(model: "stub-drop-mid-stream", stream: stream), delegate: dropped)
            #expect(await dropped.waitForFinish())
            #expect(dropped.snapshot.status == 200)
            let error = try #require(dropped.snapshot.error)
            #expect(error.kind == .reset)
            #expect(error.curlCode == 18)
            if stream {
                #expect(events(in: dropped.text).map(\.event) == ["message_start", "content_block_start", "ping", "content_block_delta"])
            }
        }

        let midStreamError = Recorder()
        client.start(messagesRequest(stream: true, extraHeaders: [("x-stub-behavior", "stream-error")]), delegate: midStreamError)
        #expect(await midStreamError.waitForFinish())
        #expect(midStreamError.snapshot.error == nil)
        #expect(events(in: midStreamError.text).last?.event == "error")
    }

    @Test func stubRefusesMissingKeysAndDeviceCredentials() async throws {
        let stub = try UpstreamStubServer(.init(apiKeys: ["sk-good"]))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }

        func send(_ request: UpstreamRequest) async -> (Int?, String?) {
            let recorder = Recorder()
            client.start(request, delegate: recorder)
            _ = await recorder.waitForFinish()
            let type = (jsonObject(recorder.text)?["error"] as? [String: Any])?["type"] as? String
            return (recorder.snapshot.status, type)
        }
        var noKey = messagesRequest(apiKey: "sk-good")
        noKey.headers.removeAll { $0.name == "x-api-key" }
        #expect(await send(noKey) == (401, "authentication_error"))
        #expect(await send(messagesRequest(apiKey: "sk-other")) == (401, "authentication_error"))
        #expect(await send(messagesRequest(apiKey: "sk-good", extraHeaders: [("authorization", "Bearer device-token")])) == (400, "invalid_request_error"))
        #expect(await send(messagesRequest(apiKey: "sk-good")) == (200, nil))

        var count = messagesRequest(prompt: "count me", apiKey: "sk-good")
        count.path = "/v1/messages/count_tokens"
        let recorder = Recorder()
        client.start(count, delegate: recorder)
        #expect(await recorder.waitForFinish())
        #expect(jsonObject(recorder.text)?["input_tokens"] as? Int == max(1, count.body.count / 4))
        #expect(stub.requests.last?.usage?.inputTokens == max(1, count.body.count / 4))
    }

    @Test func largeBodiesAndChunkedUploads() async throws {
        let stub = try UpstreamStubServer()
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }

        // 32 MB, the relay's limit for image input, through the client's read callback.
        // (Built as bytes: a 32 MB string interpolation takes seconds in a debug build.)
        var big = messagesRequest(prompt: "")
        let quote = try #require(big.body.lastIndex(of: UInt8(ascii: "\"")).map { big.body.index(before: $0) })
        big.body.insert(contentsOf: [UInt8](repeating: UInt8(ascii: "a"), count: (32 << 20) - big.body.count), at: quote + 1)
        #expect(big.body.count == 32 << 20)
        let recorder = Recorder()
        client.start(big, delegate: recorder)
        #expect(await recorder.waitForFinish(timeout: .seconds(20)))
        #expect(recorder.snapshot.error == nil && recorder.snapshot.status == 200)
        #expect(stub.requests.last?.bodySize == big.body.count)
        #expect(stub.requests.last?.body == nil)  // too big to keep

        // Either side of the size up to which the body is handed to curl whole (sent with the
        // head) rather than read through the callback: both arrive byte for byte.
        let recording = try UpstreamStubServer(.init(recordBodyLimit: 1 << 20))
        defer { recording.stop() }
        let recordingClient = try UpstreamClient(UpstreamConfiguration(baseURL: recording.baseURL))
        defer { recordingClient.shutdown() }
        for size in [64 << 10, (64 << 10) + 1] {
            var request = messagesRequest(prompt: "")
            let at = try #require(request.body.lastIndex(of: UInt8(ascii: "\"")).map { request.body.index(before: $0) })
            let filler = (0..<(size - request.body.count)).map { UInt8(ascii: "a") + UInt8($0 % 26) }
            request.body.insert(contentsOf: filler, at: at + 1)
            #expect(request.body.count == size)
            let sized = Recorder()
            recordingClient.start(request, delegate: sized)
            #expect(await sized.waitForFinish(timeout: .seconds(10)))
            #expect(sized.snapshot.error == nil && sized.snapshot.status == 200)
            let intact = recording.requests.last?.body == request.body
            #expect(intact, "a \(size)-byte body changed on the way")
        }

        // A chunked request body, and cache usage from "cache_control".
        let json = "{\"model\":\"m\",\"max_tokens\":3,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\",\"cache_control\":{\"type\":\"ephemeral\"}}]}]}"
        let bytes = Array(json.utf8)
        let half = bytes.count / 2
        let head = "POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: k\r\nanthropic-version: 2023-06-01\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        var framed: [UInt8] = Array(head.utf8)
        for part in [bytes[0..<half], bytes[half...]] {
            framed += Array("\(String(part.count, radix: 16))\r\n".utf8)
            framed += part
            framed += Array("\r\n".utf8)
        }
        framed += Array("0\r\n\r\n".utf8)
        let response = rawExchange(port: stub.port, framed)
        #expect(response.hasPrefix("HTTP/1.1 200 OK"))
        let record = try #require(stub.requests.last)
        #expect(record.body == bytes)
        let expected = StubUsage.input(forBody: bytes)
        #expect(expected.cacheReadInputTokens > 0 && expected.cacheCreationInputTokens > 0)
        #expect(record.usage == StubUsage(inputTokens: expected.inputTokens, outputTokens: 3,
                                          cacheCreationInputTokens: expected.cacheCreationInputTokens,
                                          cacheReadInputTokens: expected.cacheReadInputTokens))
    }

    /// One loop keeps a finished inline POST's easy handle without resetting it; whatever runs
    /// next on that handle (a streamed body, a GET, a POST after a closed connection) must carry
    /// nothing over from the one before: not its body, method, headers or closed connection.
    @Test func aKeptHandleCarriesNothingIntoTheNextRequest() async throws {
        let stub = try UpstreamStubServer(.init(deltaCount: 10, deltaInterval: .milliseconds(100), recordBodyLimit: 1 << 20))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }
        func send(_ request: UpstreamRequest) async -> Int? {
            let recorder = Recorder()
            client.start(request, delegate: recorder)
            guard await recorder.waitForFinish(timeout: .seconds(10)) else { return nil }
            return recorder.snapshot.status
        }
        var small = messagesRequest(prompt: "first")
        small.headers.append(("anthropic-beta", "first-only"))
        var large = messagesRequest(prompt: String(repeating: "b", count: 70_000))
        large.headers.removeAll { $0.name == "content-type" }
        let get = UpstreamRequest(method: "GET", path: "/v1/messages", headers: [("x-api-key", "sk-test-workspace")])
        let plan: [(request: UpstreamRequest, status: Int)] = [
            (small, 200), (large, 200), (messagesRequest(prompt: "third"), 200), (get, 405), (messagesRequest(prompt: "fifth"), 200),
        ]
        for (index, step) in plan.enumerated() {
            #expect(await send(step.request) == step.status, "request \(index + 1)")
            let seen = try #require(stub.requests.last)
            #expect(seen.method == step.request.method, "request \(index + 1)")
            let sameBody = (seen.body ?? []) == step.request.body
            #expect(sameBody, "request \(index + 1): body")
            #expect(seen.headers.contains { $0.name == "anthropic-beta" } == (index == 0), "request \(index + 1): headers")
        }
        #expect(stub.requests.count == plan.count)

        // A transfer cancelled mid-stream closes its connection; the next request opens another.
        let opened = stub.connectionsOpened
        let streaming = Recorder()
        let transfer = client.start(messagesRequest(stream: true, prompt: "cut"), delegate: streaming)
        #expect(await waitFor(timeout: .seconds(5)) { streaming.text.contains("content_block_delta") })
        transfer.cancel()
        #expect(await streaming.waitForFinish())
        #expect(await send(messagesRequest(prompt: "after")) == 200)
        #expect(stub.requests.last.map { String(decoding: $0.body ?? [], as: UTF8.self).contains("after") } == true)
        #expect(stub.connectionsOpened == opened + 1)
    }

    /// A kept handle reuses its header list only for exactly the same headers: a changed key, a
    /// header added or dropped, another path, and a request refused for a bad header each reach
    /// the upstream (or not) as asked, whatever ran on the handle before.
    @Test func aKeptHeaderListServesOnlyTheSameHeaders() async throws {
        let stub = try UpstreamStubServer(.init(apiKeys: ["sk-one", "sk-two"]))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }
        func send(_ request: UpstreamRequest) async -> (status: Int?, error: UpstreamError?) {
            let recorder = Recorder()
            client.start(request, delegate: recorder)
            guard await recorder.waitForFinish(timeout: .seconds(10)) else { return (nil, nil) }
            return (recorder.snapshot.status, recorder.snapshot.error)
        }
        var countTokens = messagesRequest(apiKey: "sk-one")
        countTokens.path = "/v1/messages/count_tokens"
        var badHeader = messagesRequest(apiKey: "sk-two")
        badHeader.headers.append(("anthropic-beta", "a\r\nx-injected: 1"))
        let plan: [UpstreamRequest] = [
            messagesRequest(apiKey: "sk-one"), messagesRequest(apiKey: "sk-one"), messagesRequest(apiKey: "sk-two"),
            messagesRequest(apiKey: "sk-two", extraHeaders: [("anthropic-beta", "b1")]),
            messagesRequest(apiKey: "sk-two", extraHeaders: [("anthropic-beta", "b2")]),
            // Canonically equivalent, different bytes: each must arrive as sent.
            messagesRequest(apiKey: "sk-two", extraHeaders: [("anthropic-beta", "caf\u{e9}")]),
            messagesRequest(apiKey: "sk-two", extraHeaders: [("anthropic-beta", "cafe\u{301}")]),
            messagesRequest(apiKey: "sk-two"), countTokens, badHeader, messagesRequest(apiKey: "sk-one"),
        ]
        for (index, request) in plan.enumerated() {
            let before = stub.requests.count
            let (status, error) = await send(request)
            if request.headers.contains(where: { $0.value.contains("\r") }) {
                #expect(status == nil || status == 0, "request \(index + 1) must not be sent")
                #expect(error?.detail.contains("CR, LF or NUL") == true, "request \(index + 1): \(String(describing: error))")
                #expect(stub.requests.count == before, "request \(index + 1) reached the upstream")
                continue
            }
            #expect(status == 200, "request \(index + 1)")
            let seen = try #require(stub.requests.last)
            #expect(stub.requests.count == before + 1)
            #expect(seen.path == request.path, "request \(index + 1): path")
            for name in ["x-api-key", "anthropic-beta", "anthropic-version", "content-type"] {
                let sent = request.headers.filter { $0.name == name }.map(\.value)
                let arrived = seen.headers.filter { $0.name.lowercased() == name }.map(\.value)
                #expect(arrived.map { Array($0.utf8) } == sent.map { Array($0.utf8) }, "request \(index + 1): \(name)")
            }
            #expect(!seen.headers.contains { $0.name.lowercased() == "x-injected" })
        }
    }

    /// An idle pooled connection stays in the loop's epoll set (curl wants it again on the next
    /// request). When the upstream closes it, it must leave the set rather than wake the loop
    /// over and over, and the next request must still go out, on a new connection.
    @Test func anIdleConnectionTheUpstreamClosesNeitherSpinsTheLoopNorBreaksTheNextRequest() async throws {
        // The latency makes curl wait for the reply, so it watches the socket and then lets it go.
        let stub = try UpstreamStubServer(.init(latency: .milliseconds(20), keepAliveTimeout: .milliseconds(100)))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }
        func send() async -> Int? {
            let recorder = Recorder()
            client.start(messagesRequest(), delegate: recorder)
            guard await recorder.waitForFinish() else { return nil }
            return recorder.snapshot.status
        }
        #expect(await send() == 200)
        #expect(await send() == 200)
        #expect(stub.connectionsOpened == 1)
        // The pooled connection stays in the epoll set while it is idle.
        #expect(client.watchedSockets == 1)
        let closed = try #require(await stub.waitForConnectionClose(timeout: .seconds(2)))
        #expect(closed.kind == .closed(byClient: false))
        // Level-triggered epoll wakes the loop for as long as a closed socket stays in the set:
        // the first wake-up must take it out, so it is seen once and never again.
        #expect(await waitFor(timeout: .seconds(10)) { client.watchedSockets == 0 }, "the closed connection is still watched")
        #expect(client.strayWakeups == 1)
        #expect(await send() == 200)
        #expect(stub.connectionsOpened == 2)
        #expect(client.strayWakeups == 1)
    }

    @Test func shutdownCancelsEverythingAndRefusesNewWork() async throws {
        let stub = try UpstreamStubServer(.init(deltaCount: 10, deltaInterval: .milliseconds(500)))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        let recorders = (0..<3).map { _ in Recorder() }
        for recorder in recorders { client.start(messagesRequest(stream: true), delegate: recorder) }
        #expect(await stub.waitUntil(timeout: .seconds(5)) { $0.openStreams == 3 })

        client.shutdown()
        // shutdown joined the thread: every delegate has its answer already.
        for recorder in recorders {
            #expect(recorder.snapshot.finishes == 1)
            #expect(recorder.snapshot.error?.kind == .cancelled)
        }
        #expect(client.activeTransfers == 0)
        #expect(await stub.waitUntil(timeout: .seconds(2)) { $0.openConnections == 0 && $0.openStreams == 0 })

        let late = Recorder()
        client.start(messagesRequest(), delegate: late)
        #expect(late.snapshot.error?.kind == .cancelled)
        client.shutdown()
    }

    @Test func invalidRequestsFailWithoutReachingTheUpstream() async throws {
        let stub = try UpstreamStubServer()
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: stub.baseURL))
        defer { client.shutdown() }
        var injected = messagesRequest()
        injected.headers.append(("x-note", "a\r\nauthorization: Bearer smuggled"))
        let recorder = Recorder()
        client.start(injected, delegate: recorder)
        #expect(await recorder.waitForFinish())
        #expect(recorder.snapshot.error?.kind == .other)
        #expect(stub.requests.isEmpty)

        #expect(throws: UpstreamClientError.self) { _ = try UpstreamClient(UpstreamConfiguration(baseURL: "ftp://example")) }
    }

    @Test func stubExecutablePrintsItsPortAndServes() async throws {
        let binary = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(".build/debug/upstream-stub").path
        try #require(FileManager.default.isExecutableFile(atPath: binary), "build the package first: \(binary)")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["--deltas", "3", "--delta-interval-ms", "1"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        defer {
            process.terminate()
            process.waitUntilExit()
        }

        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let more = output.fileHandleForReading.availableData
            if more.isEmpty { break }
            line += more
        }
        let announced = try #require(jsonObject(String(decoding: line, as: UTF8.self)))
        let baseURL = try #require(announced["base_url"] as? String)
        #expect(announced["port"] as? Int ?? 0 > 0)

        let client = try UpstreamClient(UpstreamConfiguration(baseURL: baseURL))
        defer { client.shutdown() }
        let recorder = Recorder()
        client.start(messagesRequest(stream: true), delegate: recorder)
        #expect(await recorder.waitForFinish())
        #expect(events(in: recorder.text).filter { $0.event == "content_block_delta" }.count == 3)
    }
}
