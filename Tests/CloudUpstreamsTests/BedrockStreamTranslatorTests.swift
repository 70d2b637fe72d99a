@testable import CloudUpstreams
import Foundation
import Testing

@Suite struct BedrockStreamTranslatorTests {
    static let events = [
        #"{"type":"message_start","message":{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-3-5-sonnet-20241022","content":[],"stop_reason":null,"usage":{"input_tokens":12,"output_tokens":1}}}"#,
        #"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        #"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi \"there\" \u00e9 🙂\n"}}"#,
        #"{"type":"content_block_stop","index":0}"#,
        #"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}"#,
        #"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":12,"outputTokenCount":5}}"#,
    ]

    static func sse(_ event: String) -> String {
        let type = JSONScan.stringMember("type", of: Array(event.utf8)).map { String(decoding: $0, as: UTF8.self) }!
        return "event: \(type)\ndata: \(event)\n\n"
    }

    @Test func chunksBecomeServerSentEventsWithTheirBytesUnchanged() throws {
        let stream = Self.events.flatMap { chunkFrame($0) }
        let expected = Self.events.map(Self.sse).joined()
        var whole = BedrockStreamTranslator()
        #expect(try translate(&whole, stream) == expected)
        var bytewise = BedrockStreamTranslator()
        var out = ""
        for byte in stream { out += try translate(&bytewise, [byte]) }
        #expect(out == expected)
        #expect(!bytewise.hasPartialMessage && !bytewise.isFinished)
    }

    @Test func otherEventsAndMessageTypesAreSkipped() throws {
        var translator = BedrockStreamTranslator()
        let stream = frame([(":message-type", "event"), (":event-type", "initial-response")], "{}")
            + frame([(":event-type", "chunk")], "{}")  // no message type
            + chunkFrame(Self.events[3])
            + frame([(":message-type", "event"), (":event-type", "metadata")], #"{"usage":{}}"#)
        #expect(try translate(&translator, stream) == Self.sse(Self.events[3]))
    }

    @Test func escapedBase64AndAnUnpaddedOneAreRead() throws {
        let event = #"{"type":"ping"}"#
        let encoded = Data(event.utf8).base64EncodedString()  // "eyJ0eXBlIjoicGluZyJ9"
        var translator = BedrockStreamTranslator()
        let escaped = frame([(":message-type", "event"), (":event-type", "chunk")], #"{"p":"x\"y","bytes":"\#(encoded.replacingOccurrences(of: "J", with: "\\u004a"))"}"#)
        #expect(try translate(&translator, escaped) == "event: ping\ndata: \(event)\n\n")
        let unpadded = frame([(":message-type", "event"), (":event-type", "chunk")], #"{"bytes":"\#(Data(#"{"type":"a"}"#.utf8).base64EncodedString().replacingOccurrences(of: "=", with: ""))"}"#)
        #expect(try translate(&translator, unpadded) == "event: a\ndata: {\"type\":\"a\"}\n\n")
    }

    /// A line break between JSON tokens would end the `data:` field early: each line gets its own.
    @Test func lineBreaksInTheEventBecomeDataLines() throws {
        var translator = BedrockStreamTranslator()
        let event = "{\"type\":\"ping\",\n\"a\":1,\r\n\"b\":2\r}"
        #expect(try translate(&translator, chunkFrame(event)) == "event: ping\ndata: {\"type\":\"ping\",\ndata: \"a\":1,\ndata: \"b\":2\ndata: }\n\n")
    }

    static let exceptions: [(String, String)] = [
        ("throttlingException", "rate_limit_error"),
        ("serviceUnavailableException", "overloaded_error"),
        ("modelNotReadyException", "overloaded_error"),
        ("validationException", "invalid_request_error"),
        // modelStreamErrorException, a model's own failure, carries the model's words: BedrockErrorMappingTests.
        ("internalServerException", "api_error"),
        ("modelTimeoutException", "api_error"),
    ]

    @Test(arguments: exceptions) func anExceptionBecomesAnErrorEventAndEndsTheStream(_ exception: String, _ mapped: String) throws {
        var translator = BedrockStreamTranslator()
        let failure = frame([(":exception-type", exception), (":content-type", "application/json"), (":message-type", "exception")],
                            #"{"message":"Too many \"requests\"\nwait \u00e9","originalStatusCode":429}"#)
        let out = try translate(&translator, chunkFrame(Self.events[0]) + failure + chunkFrame(Self.events[1]))
        let message = CloudErrorAnswer.generic(status: 500, type: mapped, service: "Bedrock", cloudMessage: nil).message
        #expect(out == Self.sse(Self.events[0])
            + #"event: error\#ndata: {"type":"error","error":{"type":"\#(mapped)","message":"\#(message)"}}\#n\#n"#)
        // Bedrock's own words go to the log only.
        #expect(translator.cloudError == exception + ": Too many \"requests\"\nwait é")
        #expect(translator.isFinished)
        #expect(try translate(&translator, chunkFrame(Self.events[2])) == "")
        // Even broken framing after the end is ignored.
        #expect(try translate(&translator, [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 2, 3, 4]) == "")
    }

    /// The exception and whatever follows it in the same read: the decoder stops at the exception,
    /// so bytes after it are never checked.
    @Test func bytesAfterAnExceptionInTheSameReadAreNotDecoded() throws {
        var translator = BedrockStreamTranslator()
        let failure = frame([(":message-type", "exception"), (":exception-type", "validationException")], #"{"message":"bad"}"#)
        let out = try translate(&translator, failure + [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 2, 3, 4] + chunkFrame(Self.events[0]))
        #expect(out == #"event: error\#ndata: {"type":"error","error":{"type":"invalid_request_error","message":"Bedrock refused the request as invalid"}}\#n\#n"#)
        #expect(translator.isFinished && !translator.hasPartialMessage)
    }

    @Test func anUnreadableChunkKeepsFailing() {
        var translator = BedrockStreamTranslator()
        let bad = frame([(":message-type", "event"), (":event-type", "chunk")], "{}")
        #expect(throws: BedrockStreamError.self) { try translate(&translator, bad) }
        #expect(throws: BedrockStreamError.self) { try translate(&translator, chunkFrame(Self.events[0])) }
    }

    @Test func anExceptionsMessageIsLoggedNeverSentAndAContextOverflowKeepsTheAPIsWording() throws {
        var translator = BedrockStreamTranslator()
        let failure = frame([(":message-type", "exception"), (":exception-type", "throttlingException")],
                            #"{"Message":"User: arn:aws:sts::123456789012:assumed-role/r/s is throttled"}"#)
        let out = try translate(&translator, failure)
        #expect(out.contains(#""type":"rate_limit_error","message":"Bedrock is limiting this workspace's requests; retry later""#))
        #expect(!out.contains("arn:aws") && !out.contains("123456789012"))
        #expect(translator.cloudError?.contains("arn:aws:sts::123456789012") == true)
        var other = BedrockStreamTranslator()
        #expect(try translate(&other, frame([(":message-type", "exception"), (":exception-type", "internalServerException")], "not json"))
            == #"event: error\#ndata: {"type":"error","error":{"type":"api_error","message":"Bedrock could not answer the request"}}\#n\#n"#)
        var overflow = BedrockStreamTranslator()
        #expect(try translate(&overflow, frame([(":message-type", "exception"), (":exception-type", "validationException")],
                                               #"{"message":"Input is too long for requested model."}"#))
            .contains(#""type":"invalid_request_error","message":"\#(CloudErrorAnswer.promptTooLong)""#))
    }

    @Test func anEventStreamErrorFrameBecomesAnAPIError() throws {
        var translator = BedrockStreamTranslator()
        #expect(try translate(&translator, PublishedFrames.errorMessage)
            == #"event: error\#ndata: {"type":"error","error":{"type":"api_error","message":"Bedrock ended the stream with an error"}}\#n\#n"#)
        #expect(translator.cloudError?.hasSuffix(": message") == true)
        #expect(translator.isFinished)
    }

    @Test func unreadableChunksThrow() {
        let cases: [(String, String)] = [
            (#"{"p":"x"}"#, #"the payload has no "bytes" string"#),
            (#"{"bytes":12}"#, #"the payload has no "bytes" string"#),
            (#"{"bytes":"!!!!"}"#, #""bytes" is not base64"#),
            (#"["bytes"]"#, #"the payload has no "bytes" string"#),
            (#"{"bytes":"\#(Data("[1,2]".utf8).base64EncodedString())"}"#, #"the event has no "type" usable as an SSE event name"#),
            (#"{"bytes":"\#(Data(#"{"type":"a\nb"}"#.utf8).base64EncodedString())"}"#, #"the event has no "type" usable as an SSE event name"#),
            (#"{"bytes":"\#(Data(#"{"type":""}"#.utf8).base64EncodedString())"}"#, #"the event has no "type" usable as an SSE event name"#),
        ]
        for (payload, why) in cases {
            var translator = BedrockStreamTranslator()
            #expect(throws: BedrockStreamError.malformedChunk(why)) {
                try translate(&translator, frame([(":message-type", "event"), (":event-type", "chunk")], payload))
            }
        }
    }

    @Test func framingErrorsPropagate() {
        var translator = BedrockStreamTranslator()
        var broken = chunkFrame(Self.events[0])
        broken[20] ^= 1
        #expect(throws: EventStreamError.self) { try translate(&translator, broken) }
        var truncated = BedrockStreamTranslator()
        #expect((try? translate(&truncated, Array(chunkFrame(Self.events[0]).dropLast()))) == "")
        #expect(truncated.hasPartialMessage)
    }

    // MARK: - Error responses

    /// Each exception's status and type; 401 and 403 kinds (the operator's credentials) are 503
    /// `api_error`, so the published client never throws its App Attest token away for them.
    static let errorResponses: [(String?, Int, String)] = [
        ("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/", 429, "rate_limit_error"),
        ("ValidationException", 400, "invalid_request_error"),
        ("AccessDeniedException:http://internal.amazon.com/coral/com.amazon.coral.service/", 503, "api_error"),
        ("ExpiredTokenException", 503, "api_error"),
        ("UnrecognizedClientException", 503, "api_error"),
        ("InvalidSignatureException", 503, "api_error"),
        ("ResourceNotFoundException", 404, "not_found_error"),
        ("ModelNotReadyException", 529, "overloaded_error"),
        ("ServiceUnavailableException", 503, "overloaded_error"),
        ("ModelTimeoutException", 504, "api_error"),
        ("InternalServerException", 500, "api_error"),
        ("ModelErrorException", 502, "api_error"),
        ("ServiceQuotaExceededException", 429, "rate_limit_error"),
        (nil, 502, "api_error"),
    ]

    @Test(arguments: errorResponses) func errorResponsesMapToAnthropicErrorsWithoutTheCloudsWords(_ header: String?, _ status: Int, _ type: String) {
        let said = #"User: arn:aws:iam::123456789012:user/relay is not authorized (\"no\")"#
        let mapped = bedrockErrorToAnthropic(status: 418, errorTypeHeader: header, body: Array(#"{"message":"\#(said)"}"#.utf8))
        #expect(mapped.status == status)
        let body = String(decoding: mapped.body, as: UTF8.self)
        #expect(body.hasPrefix(#"{"type":"error","error":{"type":"\#(type)","message":""#), "\(body)")
        #expect(!body.contains("arn:") && !body.contains("123456789012"), "\(body)")
        #expect(bedrockError(status: 418, errorTypeHeader: header, body: Array(#"{"message":"\#(said)"}"#.utf8)).detail.contains("123456789012"))
    }

    @Test func theErrorTypeMayComeFromTheBodyAndTheMessageMayBeMissing() {
        let fromBody = bedrockError(status: 429, errorTypeHeader: nil,
                                    body: Array(#"{"__type":"com.amazon.coral.service#ThrottlingException","Message":"slow down"}"#.utf8))
        #expect(fromBody.status == 429 && fromBody.type == "rate_limit_error")
        #expect(fromBody.detail == "ThrottlingException: slow down")
        let bare = bedrockError(status: 400, errorTypeHeader: " ValidationException ", body: [])
        #expect(bare.status == 400 && bare.type == "invalid_request_error")
        #expect(bare.detail == "ValidationException: Bedrock answered HTTP 400")
        let nothing = bedrockErrorToAnthropic(status: 500, errorTypeHeader: "", body: Array("<html>".utf8))
        #expect(nothing.status == 502)
        #expect(String(decoding: nothing.body, as: UTF8.self) == #"{"type":"error","error":{"type":"api_error","message":"Bedrock could not answer the request"}}"#)
        let unauthorised = bedrockError(status: 403, errorTypeHeader: nil, body: Array("{}".utf8))
        #expect(unauthorised.status == 503 && unauthorised.message == CloudErrorAnswer.credentialsRefused)
    }
}

private func translate(_ translator: inout BedrockStreamTranslator, _ bytes: [UInt8]) throws -> String {
    String(decoding: try bytes.withUnsafeBytes { try translator.translate($0) }, as: UTF8.self)
}

/// A Bedrock `chunk` event frame carrying `event` as its base64 `bytes`, with the padding member
/// (`p`) that Bedrock adds.
private func chunkFrame(_ event: String) -> [UInt8] {
    let payload = #"{"bytes":"\#(Data(event.utf8).base64EncodedString())","p":"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ"}"#
    return frame([(":event-type", "chunk"), (":content-type", "application/json"), (":message-type", "event")], payload)
}

private func frame(_ headers: [(String, String)], _ payload: String) -> [UInt8] {
    encodeEventStreamMessage(headers: headers.map { EventStreamHeader($0.0, .string($0.1)) }, payload: Array(payload.utf8))
}
