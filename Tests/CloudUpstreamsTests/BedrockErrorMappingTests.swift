@testable import CloudUpstreams
import Foundation
import Testing

/// Issue 47's error items at the translator and the error mapping: an exception before any event
/// carries its own status, quota and throttling are 429, a model's failure is a 502 with the
/// model's own words (without account names), a context overflow is worded as the published
/// client maps it, and a refusal of this service's credentials is marked as one.
@Suite struct BedrockErrorMappingTests {
    static let start = #"{"type":"message_start","message":{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-x","content":[],"usage":{"input_tokens":3,"output_tokens":1}}}"#

    /// Each in-stream exception (botocore's `ResponseStream` members, and the quota one) as the
    /// status a reply would have had, and its type.
    static let firstFrames: [(String, Int, String)] = [
        ("throttlingException", 429, "rate_limit_error"),
        ("serviceQuotaExceededException", 429, "rate_limit_error"),
        ("validationException", 400, "invalid_request_error"),
        ("modelStreamErrorException", 502, "api_error"),
        ("modelTimeoutException", 504, "api_error"),
        ("internalServerException", 500, "api_error"),
        ("serviceUnavailableException", 503, "overloaded_error"),
        ("somethingNewException", 502, "api_error"),
    ]

    @Test(arguments: firstFrames)
    func anExceptionAsTheFirstFrameCarriesItsOwnStatus(_ exception: String, _ status: Int, _ type: String) throws {
        var translator = BedrockStreamTranslator()
        let out = try translate(&translator, exceptionFrame(exception, #"{"message":"no"}"#))
        #expect(translator.endedBeforeAnyEvent && translator.isFinished)
        let answer = try #require(translator.endedBy)
        #expect(answer.status == status && answer.type == type)
        #expect(answer.detail == "\(exception): no")
        // The event the stream would have carried is the same answer's.
        #expect(out.contains(#""type":"\#(type)""#))
    }

    @Test func anExceptionAfterAnEventIsNotTheFirstFrame() throws {
        var translator = BedrockStreamTranslator()
        _ = try translate(&translator, chunkFrame(Self.start) + exceptionFrame("throttlingException", #"{"message":"slow down"}"#))
        #expect(translator.eventsTranslated == 1)
        #expect(!translator.endedBeforeAnyEvent && translator.endedBy?.status == 429)
        // Skipped frames (not chunks) before it leave it the first.
        var skipped = BedrockStreamTranslator()
        _ = try translate(&skipped, frame([(":message-type", "event"), (":event-type", "initial-response")], "{}")
            + exceptionFrame("throttlingException", "{}"))
        #expect(skipped.endedBeforeAnyEvent && skipped.endedBy?.status == 429)
        // The event-stream's own error frame is a 502.
        var errorFrame = BedrockStreamTranslator()
        _ = try translate(&errorFrame, frame([(":message-type", "error"), (":error-code", "InternalFailure"), (":error-message", "boom")], ""))
        #expect(errorFrame.endedBeforeAnyEvent && errorFrame.endedBy?.status == 502 && errorFrame.cloudError == "InternalFailure: boom")
    }

    /// Botocore's model: ModelErrorException is 424 there, the model's own failure; its message
    /// reaches the device, without anything that names the account.
    @Test func aModelsFailureIsA502WithTheModelsWordsWithoutAccountNames() {
        let said = "The model returned an invalid response for arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.x (account 1234-5678-9012, key AKIAABCDEFGHIJKLMNOP): output was truncated"
        let reply = bedrockError(status: 424, errorTypeHeader: "ModelErrorException:http://internal.amazon.com/coral/com.amazon.bedrock/",
                                 body: Array(try! JSONSerialization.data(withJSONObject: ["message": said, "originalStatusCode": 500])))
        #expect(reply.status == 502 && reply.type == "api_error")
        #expect(reply.message == "The model returned an invalid response for [ARN] (account [account], key [access key]): output was truncated")
        #expect(reply.detail.contains("123456789012"), "the log keeps the cloud's words")
        var stream = BedrockStreamTranslator()
        let out = try! translate(&stream, chunkFrame(Self.start)
            + exceptionFrame("modelStreamErrorException", #"{"message":"Model stream ended: 123456789012 arn:aws:iam::123456789012:role/x","originalStatusCode":500}"#))
        #expect(out.hasSuffix(#"event: error"# + "\n" + #"data: {"type":"error","error":{"type":"api_error","message":"Model stream ended: [account] [ARN]"}}"# + "\n\n"))
        // Without words of its own, a message of this service's.
        #expect(bedrockError(status: 424, errorTypeHeader: "ModelErrorException", body: []).message == "Bedrock's model failed while answering")
        let long = CloudErrorAnswer.modelFailure(service: "Bedrock", cloudMessage: String(repeating: "x", count: 2000))
        #expect(long.message.count == CloudErrorAnswer.maxModelMessage + 1)
    }

    @Test(arguments: [
        ("arn:aws:iam::123456789012:user/relay is not authorized", "[ARN] is not authorized"),
        ("User: arn:aws-us-gov:sts::123456789012:assumed-role/r/s, then", "User: [ARN], then"),
        ("(ARN:aws:s3:::bucket)", "([ARN])"),
        ("barn:aws stays, 12345678901 stays, 2026-10-07 stays", "barn:aws stays, 12345678901 stays, 2026-10-07 stays"),
        ("id 123456789012.", "id [account]."),
        ("x123456789012345y", "x[account]y"),
        ("ASIAABCDEFGHIJKLMNOP and AKIAabc", "[access key] and AKIAabc"),
        ("é arn:aws:x é", "é [ARN] é"),
        ("", ""),
    ])
    func accountNamesAreTakenOut(_ text: String, _ expected: String) {
        #expect(CloudErrorAnswer.withoutAccountNames(text) == expected)
    }

    /// The published client (`ErrorMapper`) maps `case .invalidRequest where
    /// error.message.lowercased().contains("context")` to `contextSizeExceeded`.
    @Test func aContextOverflowIsWordedAsThePublishedClientMapsIt() {
        #expect(CloudErrorAnswer.promptTooLong.lowercased().contains("context"))
        for said in ["Input is too long for requested model.", "prompt is too long: 210000 tokens > 200000 maximum",
                     "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000"] {
            let answer = bedrockError(status: 400, errorTypeHeader: "ValidationException", body: Array(#"{"message":"\#(said)"}"#.utf8))
            #expect(answer.status == 400 && answer.type == "invalid_request_error" && answer.message == CloudErrorAnswer.promptTooLong, "\(said)")
        }
        // Other validation errors keep this service's words: not mistaken for an overflow.
        let other = bedrockError(status: 400, errorTypeHeader: "ValidationException",
                                 body: Array(#"{"message":"messages.0.content.0.tool_use.name: String is too long (64 characters at most)"}"#.utf8))
        #expect(other.message == "Bedrock refused the request as invalid" && !other.message.lowercased().contains("context"))
        var stream = BedrockStreamTranslator()
        #expect(try! translate(&stream, exceptionFrame("validationException", #"{"message":"Input is too long for requested model."}"#))
            .contains(#""type":"invalid_request_error","message":"\#(CloudErrorAnswer.promptTooLong)""#))
        #expect(stream.endedBy?.status == 400)
    }

    @Test func aRefusalOfTheCredentialsIsMarkedAsOne() {
        for type in ["ExpiredTokenException", "UnrecognizedClientException", "InvalidSignatureException", "AccessDeniedException"] {
            let answer = bedrockError(status: 403, errorTypeHeader: type, body: Array(#"{"message":"The security token included in the request is expired"}"#.utf8))
            #expect(answer.isCredentialFailure && answer.status == 503 && answer.type == "api_error", "\(type)")
            #expect(answer.detail == "\(type): The security token included in the request is expired")
        }
        #expect(bedrockError(status: 401, errorTypeHeader: nil, body: []).isCredentialFailure)
        #expect(!bedrockError(status: 429, errorTypeHeader: "ThrottlingException", body: []).isCredentialFailure)
        #expect(CloudErrorAnswer.generic(status: 401, type: "authentication_error", service: "Vertex AI", cloudMessage: "UNAUTHENTICATED").isCredentialFailure)
    }
}

private func translate(_ translator: inout BedrockStreamTranslator, _ bytes: [UInt8]) throws -> String {
    String(decoding: try bytes.withUnsafeBytes { try translator.translate($0) }, as: UTF8.self)
}

private func chunkFrame(_ event: String) -> [UInt8] {
    frame([(":event-type", "chunk"), (":content-type", "application/json"), (":message-type", "event")],
          #"{"bytes":"\#(Data(event.utf8).base64EncodedString())"}"#)
}

private func exceptionFrame(_ exception: String, _ payload: String) -> [UInt8] {
    frame([(":exception-type", exception), (":content-type", "application/json"), (":message-type", "exception")], payload)
}

private func frame(_ headers: [(String, String)], _ payload: String) -> [UInt8] {
    encodeEventStreamMessage(headers: headers.map { EventStreamHeader($0.0, .string($0.1)) }, payload: Array(payload.utf8))
}
