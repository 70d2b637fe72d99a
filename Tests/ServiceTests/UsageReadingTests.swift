import Foundation
import MessagesBody
import Testing
import TokenService
@testable import ServiceRoutes
@testable import RelayRoutes

/// The bounded scans behind the policy and the ledger: the request's `model` and `max_tokens`,
/// the reply's `usage`, and usage read from an SSE stream as its bytes pass.
/// What the client 0.2.3's requests carry that the policy governs: fallbacks, server tools, betas,
/// the user profile; and what its replies say about the serving model and server-tool use.
@Suite struct ClientFieldReadingTests {
    static func fields(_ json: String) -> PolicyInput { UsageReadingTests.fields(json) }

    @Test func fallbacksInBothFormsAndServerToolsAreRead() {
        let list = Self.fields(#"{"fallbacks":[{"model":"claude-opus-4-8"},{"model":"b","thinking":{"type":"disabled"}}],"model":"a","tools":[{"name":"f","input_schema":{}},{"type":"custom","name":"c"},{"type":"bash_20250124","name":"bash"},{"max_uses":3,"name":"web_search","type":"web_search_20260209"},{"name":"code_execution","type":"code_execution_20260120"}]}"#)
        #expect(list.malformed == nil && list.problem == nil)
        #expect(list.fallbacks == .models(["claude-opus-4-8", "b"]))
        #expect(list.serverTools == [ServerToolInput(type: "web_search_20260209", maxUses: 3), ServerToolInput(type: "code_execution_20260120")])
        #expect(list.serverTools.map(\.name) == ["web_search", "code_execution"])
        #expect(Self.fields(#"{"fallbacks":"default"}"#).fallbacks == .serverDefault)
        #expect(Self.fields(#"{"fallbacks":[],"tools":[]}"#).fallbacks == FallbacksInput.none)
        #expect(Self.fields(#"{"fallbacks":null,"tools":null}"#).malformed == nil)
    }

    @Test(arguments: [
        (#"{"fallbacks":{"model":"a"}}"#, "fallbacks: must be"),
        (#"{"fallbacks":7}"#, "fallbacks: must be"),
        (#"{"fallbacks":"other"}"#, "the only string it takes"),
        (#"{"fallbacks":[{"model":"a"},{"model":"b"},{"model":"c"},{"model":"d"}]}"#, "at most 3"),
        (#"{"fallbacks":[{"name":"a"}]}"#, "fallbacks[0]"),
        (#"{"fallbacks":["a"]}"#, "fallbacks[0]"),
        (#"{"tools":{"type":"web_search_20260209"}}"#, "tools: must be an array"),
        (#"{"tools":[{"type":"web_search_20260209","max_uses":"2"}]}"#, "tools[0].max_uses"),
        (#"{"tools":[{"type":"web_search_20260209","max_uses":-1}]}"#, "tools[0].max_uses"),
        (#"{"tools":[{"type":7}]}"#, "tools[0].type"),
        (#"{"tools":[1]}"#, "tools[0]"),
    ])
    func malformedGovernedFieldsAreNamed(_ body: String, _ problem: String) {
        let malformed = Self.fields(body).malformed
        #expect(malformed?.contains(problem) == true, "\(malformed ?? "nil")")
    }

    @Test func betasAreSplitAsTheClientJoinsThemAndTheProfileIsChecked() {
        var input = PolicyInput()
        input.betaHeaderValues = ["feature-1,server-side-fallback-2026-06-01, user-profiles-2026-08-18", " ,\tx ,"]
        #expect(input.betas == ["feature-1", "server-side-fallback-2026-06-01", "user-profiles-2026-08-18", "x"])
        for good in ["uprof_test_1", "uprof_A-b_9", "uprof_" + String(repeating: "x", count: 122)] { #expect(IntegrationPolicy.isValidProfileID(good), "\(good)") }
        for bad in ["uprof_", "user_1", "uprof_a b", "uprof_é", "uprof_" + String(repeating: "x", count: 123), "UPROF_a"] {
            #expect(!IntegrationPolicy.isValidProfileID(bad), "\(bad)")
        }
    }

    @Test func theServingModelIsTheLastFallbacksTargetElseTheRepliesModel() {
        let plain = UsageObject.servedReply(Array(#"{"model":"claude-a","content":[{"type":"text","text":"fallback \"to\""}],"usage":{"input_tokens":3,"output_tokens":4,"server_tool_use":{"web_search_requests":2,"web_fetch_requests":0,"Bad-Name":9}}}"#.utf8))
        #expect(plain.model == "claude-a")
        #expect(plain.usage == TokenUsage(inputTokens: 3, outputTokens: 4, serverToolUse: ["web_search_requests": 2]))
        let handed = UsageObject.servedReply(Array(#"{"model":"claude-a","content":[{"type":"fallback","from":{"model":"claude-a"},"to":{"model":"claude-b"}},{"type":"text","text":"x"},{"type":"fallback","from":{"model":"claude-b"},"to":{"model":"claude-c"},"trigger":{"type":"refusal"}}],"usage":{}}"#.utf8))
        #expect(handed.model == "claude-c")
    }

    @Test func aStreamsServingModelAndServerToolUseAreReadAsTheyPass() {
        var reader = StreamUsageReader()
        let events = [
            #"event: message_start"# + "\n" + #"data: {"type":"message_start","message":{"model":"claude-a","usage":{"input_tokens":5,"output_tokens":1,"server_tool_use":{"web_search_requests":0}}}}"#,
            #"event: content_block_start"# + "\n" + #"data: {"type":"content_block_start","index":0,"content_block":{"type":"fallback","from":{"model":"claude-a"},"to":{"model":"claude-b"}}}"#,
            #"event: content_block_start"# + "\n" + #"data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            #"event: message_delta"# + "\n" + #"data: {"type":"message_delta","usage":{"output_tokens":7,"server_tool_use":{"web_search_requests":3}}}"#,
            #"event: message_stop"# + "\n" + #"data: {"type":"message_stop"}"#,
        ].map { $0 + "\n\n" }.joined()
        let bytes = Array(events.utf8)
        // Fed in small pieces, as chunks arrive.
        for start in stride(from: 0, to: bytes.count, by: 7) {
            bytes[start..<min(start + 7, bytes.count)].withUnsafeBytes { _ = reader.feed($0) }
        }
        #expect(reader.servingModel == "claude-b")
        #expect(reader.usage == TokenUsage(inputTokens: 5, outputTokens: 7, serverToolUse: ["web_search_requests": 3]))
    }
}

@Suite struct UsageReadingTests {
    static func fields(_ json: String) -> PolicyInput {
        MessagesRequestFields.policyInput(Array(json.utf8), spendsTokens: true)
    }

    @Test func modelAndMaxTokensAreFoundWhereverTheyAreAtTheTopLevel() {
        let input = Self.fields(#" { "messages" : [{"role":"user","content":[{"type":"text","text":"say \"model\": \"x\", max_tokens 9 }"}]}], "metadata":{"model":"nested","max_tokens":1},"max_tokens" : 2048 ,"model":"claude-sonnet-4-5"} "#)
        #expect(input.problem == nil)
        #expect(input.model == "claude-sonnet-4-5")
        #expect(input.maxTokens == 2048)
        let absent = Self.fields(#"{"messages":[]}"#)
        #expect(absent.problem == nil && absent.model == nil && absent.maxTokens == nil)
    }

    /// Each way a body could make our reading differ from the upstream's is refused, not guessed.
    @Test(arguments: [
        (#"{"model":"a","model":"b"}"#, "model appears more than once"),
        (#"{"max_tokens":10,"max_tokens":100000}"#, "max_tokens appears more than once"),
        (#"{"max\u005ftokens":100000}"#, "a member name is written with escapes"),
        (#"{"max_tokens":1e5}"#, "max_tokens is not an integer"),
        (#"{"max_tokens":"100"}"#, "max_tokens is not an integer"),
        (#"{"model":"claude\u002dx"}"#, "model is not a plain string"),
        (#"{"model":["a"]}"#, "model is not a plain string"),
        (#"[1,2]"#, "the body is not a JSON object"),
        (#""#, "the body is not a JSON object"),
        (#"{"model":"a""#, "the body is not valid JSON (at byte 12)"),
        (#"{"model":"a"} {"model":"b"}"#, "the body is not valid JSON (at byte 14)"),
        (#"{"model":"a",}"#, "the body is not valid JSON (at byte 13)"),
        (#"{"text":"unterminated}"#, "the body is not valid JSON (at byte 8)"),
    ])
    func malformedOrAmbiguousBodiesAreNamed(_ body: String, _ problem: String) {
        #expect(Self.fields(body).problem == problem)
    }

    @Test func escapedQuotesAndBackslashesInsideStringsAreSkippedCorrectly() {
        // `\\"` ends the string (an escaped backslash, then the quote); `\"` does not.
        let input = Self.fields(#"{"a":"x\\","b":"y\"z\\\"","model":"m1","c":"\\\\"}"#)
        #expect(input.problem == nil)
        #expect(input.model == "m1")
    }

    @Test func hugeIntegersSaturateInsteadOfWrapping() {
        #expect(Self.fields(#"{"max_tokens":99999999999999999999999}"#).maxTokens == Int.max)
        #expect(Self.fields(#"{"max_tokens":-5}"#).maxTokens == -5)
    }

    /// A 20 MB base64 image before the fields: found, and the scan is linear (memchr over the string).
    @Test func aTwentyMegabyteImageBodyIsScanned() {
        let image = String(repeating: "QUJDRA==", count: 2_500_000)
        let body = #"{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":""#
            + image + #""}}]}],"model":"claude-x","max_tokens":100}"#
        let input = Self.fields(body)
        #expect(input.problem == nil && input.model == "claude-x" && input.maxTokens == 100)
    }

    @Test func theUsageOfAJSONReplyAndOfATooLargeOnesTail() {
        let reply = #"{"id":"msg_1","type":"message","content":[{"type":"text","text":"usage: {\"input_tokens\": 999}"}],"#
            + #""usage":{"input_tokens":12,"cache_creation_input_tokens":3,"cache_read_input_tokens":4,"output_tokens":56}}"#
        let expected = TokenUsage(inputTokens: 12, outputTokens: 56, cacheCreationInputTokens: 3, cacheReadInputTokens: 4)
        #expect(UsageObject.ofReply(Array(reply.utf8)) == expected)
        #expect(UsageObject.ofTail(Array(reply.utf8.suffix(150))) == expected)
        #expect(UsageObject.ofReply(Array(#"{"type":"error"}"#.utf8)) == nil)
        // Null counts are zero.
        #expect(UsageObject.ofReply(Array(#"{"usage":{"input_tokens":7,"output_tokens":1,"cache_read_input_tokens":null}}"#.utf8))
                == TokenUsage(inputTokens: 7, outputTokens: 1))
    }

    static let stream = """
        event: message_start
        data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"usage":{"input_tokens":25,"cache_creation_input_tokens":7,"cache_read_input_tokens":9,"output_tokens":1}}}

        event: content_block_start
        data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

        event: ping
        data: {"type": "ping"}

        event: content_block_delta
        data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"\\"usage\\":{\\"output_tokens\\":999}"}}

        event: content_block_stop
        data: {"type":"content_block_stop","index":0}

        event: message_delta
        data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}

        event: message_delta
        data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":42}}

        event: message_stop
        data: {"type":"message_stop"}


        """

    /// Whatever the chunking (down to one byte at a time, CRLF or LF), the same usage: input and
    /// cache from message_start, output from the last message_delta (a total, not an increment).
    @Test(arguments: [1, 2, 3, 7, 64, 100_000])
    func streamUsageIsTheSameForAnyChunking(_ size: Int) {
        for text in [Self.stream, Self.stream.replacingOccurrences(of: "\n", with: "\r\n")] {
            var reader = StreamUsageReader()
            let bytes = Array(text.utf8)
            var offset = 0
            while offset < bytes.count {
                let end = min(bytes.count, offset + size)
                bytes[offset..<end].withUnsafeBytes { reader.feed($0) }
                offset = end
            }
            #expect(reader.usage == TokenUsage(inputTokens: 25, outputTokens: 42, cacheCreationInputTokens: 7, cacheReadInputTokens: 9))
            #expect(reader.sawStart && reader.sawStop)
        }
    }

    /// The relay forwards whole events only: whatever the chunking, the bytes up to each boundary
    /// `feed` reports end an event, and together the pieces are the stream, byte for byte.
    @Test(arguments: [1, 2, 3, 7, 64, 100_000])
    func feedReportsEveryEventBoundary(_ size: Int) {
        for text in [Self.stream, Self.stream.replacingOccurrences(of: "\n", with: "\r\n")] {
            var reader = StreamUsageReader()
            let bytes = Array(text.utf8)
            var forwarded: [UInt8] = [], held: [UInt8] = []
            var offset = 0
            while offset < bytes.count {
                let chunk = Array(bytes[offset..<min(bytes.count, offset + size)])
                offset += chunk.count
                guard let boundary = chunk.withUnsafeBytes({ reader.feed($0) }) else {
                    held += chunk
                    continue
                }
                forwarded += held + chunk[..<boundary]
                held = Array(chunk[boundary...])
                let end = String(decoding: forwarded.suffix(4), as: UTF8.self)
                #expect(end.hasSuffix("\n\n") || end.hasSuffix("\r\n\r\n"), "size \(size): forwarded bytes end mid-event")
            }
            #expect(forwarded + held == bytes)
            #expect(held.allSatisfy { $0 == 0x0a || $0 == 0x0d }, "only the trailing blank line is left: \(held)")
            #expect(reader.deltaEvents == 1)
        }
    }

    /// A cut stream's deltas are counted whether named by an `event:` line or only by their data.
    @Test func deltasAreCountedNamedOrNot() {
        var reader = StreamUsageReader()
        let delta = #"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}"#
        let text = "event: content_block_delta\ndata: \(delta)\n\n" + "data: \(delta)\n\n" + "event: ping\ndata: {}\n\n"
            + "event: content_block_delta\ndata: \(delta)\n\n"
        #expect(Array(text.utf8).withUnsafeBytes { reader.feed($0) } == text.utf8.count)
        #expect(reader.deltaEvents == 3)
        #expect(Array("event: content_block_delta\ndata: {\"ty".utf8).withUnsafeBytes { reader.feed($0) } == nil)
        #expect(reader.deltaEvents == 3, "an event not yet ended is not counted")
    }

    @Test func aStreamCutAfterItsStartHasTheStartsCountsAndNoStop() {
        var reader = StreamUsageReader()
        let cut = Self.stream.components(separatedBy: "event: message_delta")[0]
        Array(cut.utf8).withUnsafeBytes { reader.feed($0) }
        #expect(reader.usage == TokenUsage(inputTokens: 25, outputTokens: 1, cacheCreationInputTokens: 7, cacheReadInputTokens: 9))
        #expect(reader.sawStart && !reader.sawStop)
    }

    /// Data-only events (no `event:` line) are recognised by their `type`.
    @Test func dataOnlyEventsAreReadByTheirType() {
        var reader = StreamUsageReader()
        let text = #"data: {"type":"message_start","message":{"usage":{"input_tokens":3,"output_tokens":1}}}"# + "\n\n"
            + #"data: {"type":"message_delta","usage":{"output_tokens":8}}"# + "\n\n" + #"data: {"type":"message_stop"}"# + "\n\n"
        Array(text.utf8).withUnsafeBytes { reader.feed($0) }
        #expect(reader.usage == TokenUsage(inputTokens: 3, outputTokens: 8))
        #expect(reader.sawStop)
    }

    /// The per-device limit's sliding window: exact in a fresh minute; the last minute's requests
    /// weigh by how much of it the window still covers; retry-after says when one more fits.
    @Test func theSlidingWindowAllowsTheLimitAndSaysWhenMoreFits() {
        let minuteStart = Date(timeIntervalSince1970: 1_800_000_000 - 1_800_000_000.truncatingRemainder(dividingBy: 60))
        #expect(UsageLedger.slidingWindowRetry(current: 2, previous: 0, limit: 3, at: minuteStart + 10) == nil)
        // Full this minute after 10 s: its 3 requests are spread over those 10 s, so one has left
        // the window when it starts 6.7 s into this minute, 54 s from now (never the 70 s a
        // spread over the whole minute gave, past the minute in which all three surely leave).
        #expect(UsageLedger.slidingWindowRetry(current: 3, previous: 0, limit: 3, at: minuteStart + 10) == 54)
        // Half-way through the minute, 4 last minute count as 2: with 1 this minute, 3 of 3 used.
        #expect(UsageLedger.slidingWindowRetry(current: 1, previous: 4, limit: 3, at: minuteStart + 30) == 15)
        #expect(UsageLedger.slidingWindowRetry(current: 0, previous: 4, limit: 3, at: minuteStart + 30) == nil)
    }

    /// Over every count, limit and second of the minute: a refused request is told to wait 1 to
    /// 60 s, the estimate admits one more exactly then and not a second earlier, and whatever was
    /// counted has left the window 60 s on.
    @Test(arguments: [1, 2, 3, 10, 60])
    func retryAfterIsAtMostAMinuteAndExactlyWhenOneMoreFits(limit: Int) {
        let minuteStart = 1_800_000_000 - 1_800_000_000.truncatingRemainder(dividingBy: 60)
        for tenths in stride(from: 0, to: 600, by: 7) {
            let now = minuteStart + Double(tenths) / 10
            for current in Int64(0)...Int64(limit + 2) {
                for previous in [Int64(0), Int64(limit / 2), Int64(limit), Int64(limit * 3)] {
                    guard let retry = UsageLedger.slidingWindowRetry(current: current, previous: previous, limit: limit,
                                                                     at: Date(timeIntervalSince1970: now)) else { continue }
                    #expect((1...60).contains(retry), "limit \(limit), \(current)+\(previous) at +\(Double(tenths) / 10): \(retry)")
                    guard retry > 1 else { continue }
                    // One second earlier, it would not have fitted yet.
                    let earlier = now + Double(retry - 1)
                    let (c, p) = shifted(current, previous, from: now, to: earlier)
                    #expect(UsageLedger.slidingWindowRetry(current: c, previous: p, limit: limit, at: Date(timeIntervalSince1970: earlier)) != nil
                            || earlier.truncatingRemainder(dividingBy: 60) < now.truncatingRemainder(dividingBy: 60),
                            "limit \(limit), \(current)+\(previous) at +\(Double(tenths) / 10): fits before \(retry) s")
                }
            }
        }
        /// The counts as the two-minute view sees them at `later` (a new minute moves them along).
        func shifted(_ current: Int64, _ previous: Int64, from now: Double, to later: Double) -> (Int64, Int64) {
            let minutes = Int((later / 60).rounded(.down) - (now / 60).rounded(.down))
            return minutes == 0 ? (current, previous) : minutes == 1 ? (0, current) : (0, 0)
        }
    }
}
