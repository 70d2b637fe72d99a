import CloudUpstreams
import Foundation
import HTTPRouting
import MessagesBody
import Synchronization
import Testing
import TokenService
import UpstreamClient
@testable import RelayRoutes

/// Issue 47's usage and error items below the HTTP server: the stream reader takes each
/// `message_delta`'s running totals and Bedrock's `message_stop` (its usage, then its invocation
/// metrics, which are what Bedrock bills), a JSON reply's token-count headers win over its body,
/// an exception before any event is answered with its own status, a context overflow reaches the
/// device in the words the published client maps, and the cloud's request ID and a refusal of
/// this service's credentials reach the log.
@Suite struct CloudUsageAndErrorsTests {
    static func sse(_ events: [String]) -> String {
        events.map { data in
            let type = try! #require((try? JSONSerialization.jsonObject(with: Data(data.utf8)) as? [String: Any])?["type"] as? String)
            return "event: \(type)\ndata: \(data)\n\n"
        }.joined()
    }

    /// The reader fed the whole stream, byte by byte and in uneven pieces: one reading.
    static func read(_ stream: String) -> StreamUsageReader {
        let bytes = Array(stream.utf8)
        var whole = StreamUsageReader()
        bytes.withUnsafeBytes { _ = whole.feed($0) }
        var bytewise = StreamUsageReader()
        for byte in bytes { [byte].withUnsafeBytes { _ = bytewise.feed($0) } }
        var pieces = StreamUsageReader()
        var offset = 0, size = 1
        while offset < bytes.count {
            let end = min(bytes.count, offset + size)
            Array(bytes[offset..<end]).withUnsafeBytes { _ = pieces.feed($0) }
            offset = end
            size = size * 3 % 97 + 1
        }
        #expect(bytewise.usage == whole.usage && pieces.usage == whole.usage && bytewise.sawStop == whole.sawStop)
        return whole
    }

    static let bedrockStart = #"{"type":"message_start","message":{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}}"#
    static let bedrockBody = [
        bedrockStart,
        #"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        #"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        #"{"type":"content_block_stop","index":0}"#,
        #"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":42}}"#,
    ]

    // MARK: - The stream reader

    /// Bedrock: the cache counts are on `message_stop` only, nowhere else.
    @Test func bedrocksCacheCountsOnMessageStopAreRead() {
        let stream = Self.sse(Self.bedrockBody + [
            #"{"type":"message_stop","usage":{"cache_creation_input_tokens":120,"cache_read_input_tokens":9821}}"#,
        ])
        let reader = Self.read(stream)
        #expect(reader.sawStop)
        #expect(reader.usage == TokenUsage(inputTokens: 3, outputTokens: 42, cacheCreationInputTokens: 120, cacheReadInputTokens: 9821))
    }

    /// `amazon-bedrock-invocationMetrics` is what Bedrock bills: where present, its counts are the
    /// reply's, whatever the events said before.
    @Test func theInvocationMetricsAreTheCount() {
        let stream = Self.sse(Self.bedrockBody + [
            #"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":10174,"outputTokenCount":57,"invocationLatency":2210,"firstByteLatency":412,"cacheReadInputTokenCount":9821,"cacheWriteInputTokenCount":7}}"#,
        ])
        #expect(Self.read(stream).usage == TokenUsage(inputTokens: 10174, outputTokens: 57, cacheCreationInputTokens: 7, cacheReadInputTokens: 9821))
        // Both on message_stop (litellm#36878's shape): the metrics win where they count; the
        // usage's cache counts stand where they are silent.
        let both = Self.sse(Self.bedrockBody + [
            #"{"type":"message_stop","usage":{"input_tokens":3,"cache_read_input_tokens":9821,"cache_creation_input_tokens":0},"amazon-bedrock-invocationMetrics":{"inputTokenCount":10174,"outputTokenCount":43,"invocationLatency":900,"firstByteLatency":200}}"#,
        ])
        #expect(Self.read(both).usage == TokenUsage(inputTokens: 10174, outputTokens: 43, cacheCreationInputTokens: 0, cacheReadInputTokens: 9821))
        // Without metrics or a usage, message_stop changes nothing.
        let plain = Self.sse(Self.bedrockBody + [#"{"type":"message_stop"}"#])
        #expect(Self.read(plain).usage == TokenUsage(inputTokens: 3, outputTokens: 42))
        // Metrics that are not counts count nothing.
        let odd = Self.sse(Self.bedrockBody + [#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":"many","outputTokenCount":null}}"#])
        #expect(Self.read(odd).usage == TokenUsage(inputTokens: 3, outputTokens: 42))
    }

    /// The Anthropic API's `message_delta` usage is the running total of every count: a server
    /// tool's turns grow `input_tokens` (and the cache's) there, the last delta is the reply's.
    @Test func messageDeltaCarriesRunningTotalsOfEveryCount() {
        let stream = Self.sse([
            #"{"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[],"usage":{"input_tokens":2679,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3,"server_tool_use":{"web_search_requests":0}}}}"#,
            #"{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_01","name":"web_search","input":{}}}"#,
            #"{"type":"content_block_stop","index":0}"#,
            #"{"type":"message_delta","delta":{"stop_reason":null},"usage":{"input_tokens":9120,"cache_creation_input_tokens":0,"cache_read_input_tokens":2048,"output_tokens":88,"server_tool_use":{"web_search_requests":1}}}"#,
            #"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Found it"}}"#,
            #"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":10682,"cache_creation_input_tokens":null,"cache_read_input_tokens":4096,"output_tokens":510,"server_tool_use":{"web_search_requests":2}}}"#,
            #"{"type":"message_stop"}"#,
        ])
        let reader = Self.read(stream)
        // A null count is no count: the one before stands.
        #expect(reader.usage == TokenUsage(inputTokens: 10682, outputTokens: 510, cacheCreationInputTokens: 0, cacheReadInputTokens: 4096,
                                           serverToolUse: ["web_search_requests": 2]))
        // Cut after the first delta, the totals so far.
        let cut = String(stream[..<stream.range(of: "event: content_block_delta")!.lowerBound])
        #expect(Self.read(cut).usage == TokenUsage(inputTokens: 9120, outputTokens: 88, cacheReadInputTokens: 2048,
                                                   serverToolUse: ["web_search_requests": 1]))
        // Only output, as older streams say: the input of message_start stands.
        let old = Self.sse([Self.bedrockStart, #"{"type":"message_delta","usage":{"output_tokens":7}}"#])
        #expect(Self.read(old).usage == TokenUsage(inputTokens: 3, outputTokens: 7))
    }

    /// What the relay records for a Bedrock stream is what Bedrock billed: the machine's result
    /// for the events BedrockReply hands on.
    @Test func theLedgerOfABedrockStreamIsWhatBedrockBilled() {
        var machine = RelayExchangeMachine(readsAbandonedReply: false, requestStreams: true)
        #expect(machine.head(status: 200, headers: [("content-type", "text/event-stream; charset=utf-8")], isEventStream: true) == .startStream)
        let stream = Self.sse(Self.bedrockBody + [
            #"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":18,"outputTokenCount":386,"invocationLatency":5000,"firstByteLatency":600,"cacheReadInputTokenCount":0,"cacheWriteInputTokenCount":7502}}"#,
        ])
        _ = Array(stream.utf8).withUnsafeBytes { machine.chunk($0, at: 1) }
        let (action, result) = machine.finish(nil)
        #expect(action == .finishStream(remainder: []))
        #expect(result.status == 200 && !result.incomplete)
        #expect(result.usage == TokenUsage(inputTokens: 18, outputTokens: 386, cacheCreationInputTokens: 7502, cacheReadInputTokens: 0))
    }

    // MARK: - A JSON reply's headers

    static let bedrockHeaders: [(name: String, value: String)] = [
        ("content-type", "application/json"), ("x-amzn-requestid", "6f1c0e5a-2b7d-4e0c-9a51-0c1d2e3f4a5b"),
        ("x-amzn-bedrock-invocation-latency", "926"), ("x-amzn-bedrock-input-token-count", "14"),
        ("x-amzn-bedrock-output-token-count", " 36 "), ("X-Amzn-Bedrock-Cache-Read-Input-Token-Count", "2048"),
        ("x-amzn-bedrock-cache-write-input-token-count", "0"),
    ]

    @Test func bedrocksTokenCountHeadersAreRead() {
        #expect(ReportedCounts(bedrockHeaders: Self.bedrockHeaders)
            == ReportedCounts(inputTokens: 14, outputTokens: 36, cacheCreationInputTokens: 0, cacheReadInputTokens: 2048))
        #expect(ReportedCounts(bedrockHeaders: [("x-amzn-bedrock-input-token-count", "-3"), ("x-amzn-bedrock-output-token-count", "1 2"),
                                                ("x-amzn-bedrock-cache-read-input-token-count", ""), ("x-amzn-bedrock-other-token-count", "5")]).isEmpty)
        #expect(ReportedCounts(bedrockHeaders: [("x-amzn-bedrock-input-token-count", "99999999999999999999999")]).inputTokens == TokenUsage.maxCount)
    }

    /// InvokeModel's reply carries the API's `usage` and the counts Bedrock bills in its
    /// headers: the ledger takes the headers' where they are.
    @Test func aBedrockJSONReplyIsRecordedByItsHeaders() {
        let body = #"{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-3-haiku","content":[{"type":"text","text":"42"}],"usage":{"input_tokens":30,"cache_creation_input_tokens":5,"output_tokens":265}}"#
        var machine = RelayExchangeMachine(readsAbandonedReply: true, requestStreams: false)
        machine.noteBilledCounts(inBedrockHeaders: Self.bedrockHeaders)
        _ = machine.head(status: 200, headers: [("content-type", "application/json")], isEventStream: false)
        _ = Array(body.utf8).withUnsafeBytes { machine.chunk($0, at: 1) }
        let (action, result) = machine.finish(nil)
        #expect(action == .respondHeld(status: 200, body: Array(body.utf8)), "the body goes out as it came")
        #expect(result.usage == TokenUsage(inputTokens: 14, outputTokens: 36, cacheCreationInputTokens: 0, cacheReadInputTokens: 2048))
        // Without the headers, the body's usage.
        var plain = RelayExchangeMachine(readsAbandonedReply: true, requestStreams: false)
        _ = plain.head(status: 200, headers: [("content-type", "application/json")], isEventStream: false)
        _ = Array(body.utf8).withUnsafeBytes { plain.chunk($0, at: 1) }
        #expect(plain.finish(nil).1.usage == TokenUsage(inputTokens: 30, outputTokens: 265, cacheCreationInputTokens: 5))
        // A client that left is still recorded with what Bedrock billed.
        var left = RelayExchangeMachine(readsAbandonedReply: true, requestStreams: false)
        left.noteBilledCounts(inBedrockHeaders: Self.bedrockHeaders)
        let cancels = left.clientLeft()
        #expect(!cancels)
        _ = left.head(status: 200, headers: [("content-type", "application/json")], isEventStream: false)
        _ = Array(body.utf8).withUnsafeBytes { left.chunk($0, at: 1) }
        #expect(left.finish(nil).1.usage.inputTokens == 14)
    }

    // MARK: - First-frame exceptions

    /// BedrockReply with a stream whose first frame is `throttlingException`: nothing reaches the
    /// device as a stream; it gets the exception's status and error body.
    @Test func anExceptionBeforeAnyEventIsAnsweredWithItsOwnStatus() {
        let exchange = RecordingExchange()
        let reply = BedrockReply(exchange, streams: true)
        reply.upstreamDidReceiveHead(status: 200, headers: [("x-amzn-requestid", "a1b2c3"), ("content-type", "application/vnd.amazon.eventstream")])
        let frames = frame([(":message-type", "event"), (":event-type", "initial-response")], "{}")
            + frame([(":message-type", "exception"), (":exception-type", "throttlingException")], #"{"message":"Too many tokens, please wait before trying again."}"#)
        // In two reads, split inside the exception frame.
        #expect(frames.prefix(40).withUnsafeBytes { reply.upstreamDidReceive($0) })
        #expect(Array(frames.dropFirst(40)).withUnsafeBytes { reply.upstreamDidReceive($0) })
        // Whatever follows is not read.
        #expect([UInt8](repeating: 0xff, count: 16).withUnsafeBytes { reply.upstreamDidReceive($0) })
        reply.upstreamDidFinish(UpstreamError(kind: .cancelled, detail: "cancelled"))
        let seen = exchange.seen
        #expect(seen.heads.isEmpty && seen.bytes.isEmpty && seen.finished.isEmpty)
        #expect(seen.requestIDs == ["a1b2c3"])
        let answer = seen.answers.first
        #expect(seen.answers.count == 1 && answer?.status == 429 && answer?.type == "rate_limit_error")
        #expect(answer?.detail == "throttlingException: Too many tokens, please wait before trying again.")
        // The exchange records what it answers: the ledger's row is that status, with no tokens.
        var machine = RelayExchangeMachine(readsAbandonedReply: false, requestStreams: true)
        _ = machine.head(status: 429, headers: [("content-type", "application/json")], isEventStream: false)
        _ = Array(#"{"type":"error","error":{"type":"rate_limit_error","message":"…"}}"#.utf8).withUnsafeBytes { machine.chunk($0, at: 1) }
        let (action, result) = machine.finish(nil)
        guard case .respondHeld(429, _) = action else { Issue.record("\(action)"); return }
        #expect(result.status == 429 && result.usage == TokenUsage() && !result.incomplete)
    }

    /// After an event has gone out, an exception is an SSE error event in the stream begun.
    @Test func anExceptionAfterAnEventEndsTheStreamWithAnErrorEvent() {
        let exchange = RecordingExchange()
        let reply = BedrockReply(exchange, streams: true)
        reply.upstreamDidReceiveHead(status: 200, headers: [])
        let start = #"{"type":"message_start","message":{"usage":{"input_tokens":3,"output_tokens":1}}}"#
        let frames = frame([(":message-type", "event"), (":event-type", "chunk")], #"{"bytes":"\#(Data(start.utf8).base64EncodedString())"}"#)
            + frame([(":message-type", "exception"), (":exception-type", "throttlingException")], #"{"message":"slow"}"#)
        #expect(frames.withUnsafeBytes { reply.upstreamDidReceive($0) })
        reply.upstreamDidFinish(nil)
        let seen = exchange.seen
        #expect(seen.heads.map(\.status) == [200] && seen.answers.isEmpty)
        let text = String(decoding: seen.bytes, as: UTF8.self)
        #expect(text.hasPrefix("event: message_start\n") && text.hasSuffix(#""type":"rate_limit_error","message":"Bedrock is limiting this workspace's requests; retry later"}}"# + "\n\n"))
        #expect(seen.cloudErrors == ["throttlingException: slow"] && seen.finished == [nil])
    }

    /// A JSON reply: its token-count headers go to the exchange with its head, and its request ID.
    @Test func aJSONReplysHeadersReachTheExchange() {
        let exchange = RecordingExchange()
        let reply = BedrockReply(exchange, streams: false)
        reply.upstreamDidReceiveHead(status: 200, headers: Self.bedrockHeaders)
        let seen = exchange.seen
        #expect(seen.billed.count == 1 && seen.billed.first?.contains { $0.name == "x-amzn-bedrock-input-token-count" } == true)
        #expect(seen.heads.map(\.status) == [200] && seen.requestIDs == ["6f1c0e5a-2b7d-4e0c-9a51-0c1d2e3f4a5b"])
        // An error reply's request ID too; its credentials refusal is answered as one.
        let refused = RecordingExchange()
        let failing = BedrockReply(refused, streams: true)
        failing.upstreamDidReceiveHead(status: 403, headers: [("x-amzn-requestid", "r-403"), ("x-amzn-errortype", "ExpiredTokenException")])
        _ = Array(#"{"message":"The security token included in the request is expired"}"#.utf8).withUnsafeBytes { failing.upstreamDidReceive($0) }
        failing.upstreamDidFinish(nil)
        #expect(refused.seen.requestIDs == ["r-403"])
        #expect(refused.seen.answers.first.map { $0.isCredentialFailure && $0.status == 503 } == true)
        // Vertex's, from the API behind it.
        let vertex = RecordingExchange()
        VertexReply(vertex).upstreamDidReceiveHead(status: 401, headers: [("request-id", "req_vrtx_011")])
        #expect(vertex.seen.requestIDs == ["req_vrtx_011"])
    }

    // MARK: - Context overflow

    @Test func theAPIsContextOverflowIsWordedAsTheClientMapsIt() throws {
        let api = #"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"},"request_id":"req_011"}"#
        let worded = try #require(ErrorWording.contextOverflowWorded(Array(api.utf8)))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(worded)) as? [String: Any])
        let message = try #require((object["error"] as? [String: Any])?["message"] as? String)
        #expect(message == "prompt is too long: 208310 tokens > 200000 maximum" + ErrorWording.contextClause)
        // The published client's condition: `.invalidRequest where error.message.lowercased().contains("context")`.
        #expect(message.lowercased().contains("context"))
        #expect(String(decoding: worded, as: UTF8.self) == api.replacingOccurrences(of: "maximum\"", with: "maximum\(ErrorWording.contextClause)\""))
        // Anything else is left alone.
        for other in [
            #"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 1 + 2 > 3"}}"#,
            #"{"type":"error","error":{"type":"invalid_request_error","message":"\#(CloudErrorAnswer.promptTooLong)"}}"#,
            #"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: must be positive"}}"#,
            #"{"type":"error","error":{"type":"api_error","message":"prompt is too long"}}"#,
            #"{"type":"message","error":{"type":"invalid_request_error","message":"prompt is too long"}}"#,
            #"{"type":"error","error":{"type":"invalid_request_error","message":7}}"#,
            "prompt is too long", "",
        ] {
            #expect(ErrorWording.contextOverflowWorded(Array(other.utf8)) == nil, "\(other)")
        }
        // Escapes in the message stay as they were.
        let escaped = #"{"type":"error","error":{"message":"Prompt Is Too Long: \"x\"\\","type":"invalid_request_error"}}"#
        let rewritten = try #require(ErrorWording.contextOverflowWorded(Array(escaped.utf8)))
        let again = try #require(try JSONSerialization.jsonObject(with: Data(rewritten)) as? [String: Any])
        #expect((again["error"] as? [String: Any])?["message"] as? String == "Prompt Is Too Long: \"x\"\\" + ErrorWording.contextClause)
    }

    /// On the Anthropic API kind the 400 reaches the device through the machine, worded.
    @Test func aHeldOverflowReplyGoesOutWorded() {
        let api = #"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#
        var machine = RelayExchangeMachine(readsAbandonedReply: true, requestStreams: true)
        _ = machine.head(status: 400, headers: [("content-type", "application/json")], isEventStream: false)
        _ = Array(api.utf8).withUnsafeBytes { machine.chunk($0, at: 1) }
        let (action, result) = machine.finish(nil)
        #expect(action == .respondHeld(status: 400, body: ErrorWording.contextOverflowWorded(Array(api.utf8))!))
        #expect(result.status == 400)
        // Another status passes as it came.
        var other = RelayExchangeMachine(readsAbandonedReply: true, requestStreams: true)
        _ = other.head(status: 413, headers: [("content-type", "application/json")], isEventStream: false)
        _ = Array(api.utf8).withUnsafeBytes { other.chunk($0, at: 1) }
        #expect(other.finish(nil).0 == .respondHeld(status: 413, body: Array(api.utf8)))
    }

    // MARK: - The log

    @Test func theUpstreamsRequestIDIsLoggedWithOurs() {
        var result = RelayedExchange.Result(status: 429, error: nil, bytes: 10, usage: TokenUsage(), incomplete: false)
        #expect(result.logDetail == nil)
        result.cloudRequestID = "6f1c0e5a-2b7d-4e0c-9a51-0c1d2e3f4a5b"
        #expect(result.logDetail == "upstream request ID 6f1c0e5a-2b7d-4e0c-9a51-0c1d2e3f4a5b")
        result.cloudError = "ThrottlingException: Too many requests"
        #expect(result.logDetail == "upstream said: ThrottlingException: Too many requests; upstream request ID 6f1c0e5a-2b7d-4e0c-9a51-0c1d2e3f4a5b")
        result.cloudError = nil
        result.error = UpstreamError(kind: .reset, detail: "Bedrock's event stream ended inside a frame")
        #expect(result.logDetail?.hasPrefix("upstream ") == true && result.logDetail?.hasSuffix("; upstream request ID 6f1c0e5a-2b7d-4e0c-9a51-0c1d2e3f4a5b") == true)
        #expect(RelayedExchange.cloudRequestID(in: [("x-amzn-requestid", "a"), ("request-id", "b")]) == "a")
        #expect(RelayedExchange.cloudRequestID(in: [("request-id", "req_1")]) == "req_1")
        #expect(RelayedExchange.cloudRequestID(in: [("content-type", "x")]) == nil)
        #expect(RelayedExchange.isLoggableRequestID("req_011CV"))
        for bad in ["", "a b", "a\n\"level\":\"x\"", String(repeating: "x", count: 201), "é"] { #expect(!RelayedExchange.isLoggableRequestID(bad)) }
    }

    @Test func aRefusalOfTheCredentialsIsCountedAndLoggedWithItsWorkspaceAndCause() {
        let metrics = Metrics()
        let lines = Mutex<[String]>([])
        let logger = Logger(write: { line in lines.withLock { $0.append(line) } })
        UpstreamCredentialFailures.describe(metrics)
        UpstreamCredentialFailures.record(kind: "bedrock", workspace: "aws", requestID: "req_1",
                                          cause: "ExpiredTokenException: The security token included in the request is expired",
                                          metrics: metrics, logger: logger)
        UpstreamCredentialFailures.record(kind: "vertex", workspace: "gcp", requestID: "req_2", cause: "the token endpoint answered HTTP 400",
                                          metrics: metrics, logger: logger)
        let text = metrics.prometheusText()
        #expect(text.contains(#"attestd_upstream_credential_failures_total{kind="bedrock"} 1"#), "\(text)")
        #expect(text.contains(#"attestd_upstream_credential_failures_total{kind="vertex"} 1"#))
        let logged = lines.withLock { $0 }.compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        #expect(logged.count == 2)
        #expect(logged.first?["event"] as? String == "upstream_credentials_refused" && logged.first?["workspace"] as? String == "aws"
            && logged.first?["cause"] as? String == "ExpiredTokenException: The security token included in the request is expired"
            && logged.first?["request_id"] as? String == "req_1" && logged.first?["kind"] as? String == "bedrock")
    }
}

/// What BedrockReply and VertexReply hand on, recorded.
final class RecordingExchange: CloudReplyExchange {
    struct Seen {
        var heads: [(status: Int, headers: [(name: String, value: String)])] = []
        var bytes: [UInt8] = []
        var finished: [UpstreamError?] = []
        var answers: [CloudErrorAnswer] = []
        var cloudErrors: [String] = []
        var requestIDs: [String] = []
        var billed: [[(name: String, value: String)]] = []
    }
    private let state = Mutex(Seen())
    var seen: Seen { state.withLock { $0 } }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) { state.withLock { $0.heads.append((status, headers)) } }
    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        state.withLock { $0.bytes.append(contentsOf: chunk) }
        return true
    }
    func upstreamDidFinish(_ error: UpstreamError?) { state.withLock { $0.finished.append(error) } }
    func answerCloudError(_ answer: CloudErrorAnswer, retryAfter: String?) { state.withLock { $0.answers.append(answer) } }
    func noteCloudError(_ detail: String) { state.withLock { $0.cloudErrors.append(detail) } }
    func noteCloudRequestID(_ id: String) { state.withLock { $0.requestIDs.append(id) } }
    func noteBilledCounts(inBedrockHeaders headers: [(name: String, value: String)]) { state.withLock { $0.billed.append(headers) } }
}

private func frame(_ headers: [(String, String)], _ payload: String) -> [UInt8] {
    encodeEventStreamMessage(headers: headers.map { EventStreamHeader($0.0, .string($0.1)) }, payload: Array(payload.utf8))
}
