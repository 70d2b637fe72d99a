// Bedrock's answers in the Messages API's shapes: the streamed body as server-sent events, and
// error responses as Anthropic error bodies.
// Base64 and JSON text from AttestWire; the event-stream fuzzer compiles this file with
// EventStream.swift, CRC32.swift, JSONScan.swift and AttestWire's sources.
import AttestWire

public enum BedrockStreamError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A `chunk` event whose payload is not `{"bytes":"<base64 of a JSON object with a type>"}`.
    case malformedChunk(String)

    public var description: String {
        switch self {
        case .malformedChunk(let why): "malformed Bedrock chunk: \(why)"
        }
    }
}

/// Turns the body of InvokeModelWithResponseStream (event-stream frames) into the Messages API's
/// server-sent events. Each chunk's inner event JSON is passed on byte for byte, named by its
/// `type`; a stream exception becomes an SSE `error` event and ends the translation.
public struct BedrockStreamTranslator: Sendable {
    private var decoder: EventStreamDecoder
    /// True once an exception has been sent as an error event: later input is ignored.
    public private(set) var isFinished = false
    /// A chunk that could not be read: thrown again by every later call.
    private var chunkFailure: BedrockStreamError?
    /// The exception or error frame that ended the stream, as the device is told it (the status
    /// it would have had as Bedrock's reply) and in Bedrock's words for the log (`detail`).
    public private(set) var endedBy: CloudErrorAnswer?
    /// Chunk events translated so far.
    public private(set) var eventsTranslated = 0
    /// The exception or error frame that ended the stream, in Bedrock's words: for the log only
    /// (the device's error event has a message of this service's own, or a model's own words).
    public var cloudError: String? { endedBy?.detail }
    /// The stream ended with an exception before any event: nothing of it need reach the device
    /// as a stream, so it can be answered as the exception's own status and error body.
    public var endedBeforeAnyEvent: Bool { endedBy != nil && eventsTranslated == 0 }

    public init(maxMessageBytes: Int = 1 << 20) {
        decoder = EventStreamDecoder(maxMessageBytes: maxMessageBytes)
    }

    /// Whether a frame is unfinished: at the end of the body, a truncated stream.
    public var hasPartialMessage: Bool { decoder.hasPartialMessage }

    /// SSE bytes for every frame these bytes complete (possibly none). Throws `EventStreamError`
    /// for broken framing and `BedrockStreamError` for a chunk it cannot read; the events of
    /// earlier frames in the same bytes are then lost with the stream.
    public mutating func translate(_ bytes: UnsafeRawBufferPointer) throws -> [UInt8] {
        if let chunkFailure { throw chunkFailure }
        var out: [UInt8] = []
        var failure: BedrockStreamError?
        var finished = false
        // The decoder stops at the exception, before any bytes after it are checked.
        try decoder.feed(bytes) { message in
            switch message.stringHeader(":message-type") {
            case "event":
                guard message.stringHeader(":event-type") == "chunk" else { return true }
                do throws(BedrockStreamError) {
                    try appendChunk(message.payload, to: &out)
                    eventsTranslated += 1
                    return true
                } catch {
                    failure = error
                    return false
                }
            case "exception":
                let exception = message.stringHeader(":exception-type") ?? "unknownException"
                let answer = bedrockAnswer(exception: exception, status: nil, cloudMessage: bedrockMessage(message.payload))
                endedBy = answer
                appendErrorEvent(type: answer.type, message: answer.message, to: &out)
                finished = true
                return false
            case "error":
                // The event-stream protocol's own error frame: code and message in headers.
                let code = message.stringHeader(":error-code") ?? "unknown"
                let answer = CloudErrorAnswer(status: 502, type: "api_error", message: "Bedrock ended the stream with an error",
                                              detail: code + ": " + (message.stringHeader(":error-message") ?? ""))
                endedBy = answer
                appendErrorEvent(type: answer.type, message: answer.message, to: &out)
                finished = true
                return false
            default:
                return true
            }
        }
        if let failure {
            chunkFailure = failure
            throw failure
        }
        if finished { isFinished = true }
        return out
    }
}

private func appendChunk(_ payload: [UInt8], to out: inout [UInt8]) throws(BedrockStreamError) {
    guard let encoded = JSONScan.stringMember("bytes", of: payload) else {
        throw .malformedChunk("the payload has no \"bytes\" string")
    }
    guard let event = encoded.withUnsafeBufferPointer(Base64.decode(bytes:)) else {
        throw .malformedChunk("\"bytes\" is not base64")
    }
    // The name goes on the `event:` line, so only characters that cannot end it or confuse a reader.
    guard let type = JSONScan.stringMember("type", of: event), !type.isEmpty, type.allSatisfy(isEventNameByte) else {
        throw .malformedChunk("the event has no \"type\" usable as an SSE event name")
    }
    out.reserveCapacity(out.count + event.count + type.count + 17)
    out += Array("event: ".utf8)
    out += type
    out.append(0x0a)
    appendDataLines(event, to: &out)
    out.append(0x0a)
}

private func isEventNameByte(_ byte: UInt8) -> Bool {
    switch byte {
    case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
         UInt8(ascii: "_"), UInt8(ascii: "-"), UInt8(ascii: "."):
        return true
    default:
        return false
    }
}

/// `data:` lines carrying `payload`. Compact JSON has no line breaks and takes one line; a line
/// break (only possible as whitespace between JSON tokens) starts another `data:` line, which a
/// reader joins back with "\n".
private func appendDataLines(_ payload: [UInt8], to out: inout [UInt8]) {
    let prefix = Array("data: ".utf8)
    var lineStart = 0
    var index = 0
    while index < payload.count {
        let byte = payload[index]
        guard byte == 0x0a || byte == 0x0d else {
            index += 1
            continue
        }
        out += prefix
        out += payload[lineStart..<index]
        out.append(0x0a)
        index += byte == 0x0d && index + 1 < payload.count && payload[index + 1] == 0x0a ? 2 : 1
        lineStart = index
    }
    out += prefix
    out += payload[lineStart...]
    out.append(0x0a)
}

private func appendErrorEvent(type: String, message: String, to out: inout [UInt8]) {
    out += Array("event: error\ndata: ".utf8)
    out += anthropicErrorBody(type: type, message: message)
    out += Array("\n\n".utf8)
}

/// The Messages API's error body: `{"type":"error","error":{"type":…,"message":…}}`.
func anthropicErrorBody(type: String, message: String) -> [UInt8] {
    var body = Array(#"{"type":"error","error":{"type":""#.utf8)
    JSONScan.appendEscaped(type.utf8, to: &body)
    body += Array(#"","message":""#.utf8)
    JSONScan.appendEscaped(message.utf8, to: &body)
    body += Array(#""}}"#.utf8)
    return body
}

/// A Bedrock exception, by name in any case (lowerCamelCase in a stream, UpperCamelCase in a
/// reply's `x-amzn-ErrorType`), as the status and Messages API error type the device gets, after
/// botocore's model of bedrock-runtime: quota and throttling are 429 `rate_limit_error` (the
/// published client falls back to the on-device model); a model's own failure (424 there) is a
/// 502 with the model's words; expired, unrecognised or badly signed credentials are the
/// operator's problem (made 503 by `CloudErrorAnswer.generic`, never a 401 that would make the
/// device attest again). `status` is the HTTP status of a reply (nil in a stream).
func bedrockAnswer(exception: String?, status: Int?, cloudMessage: String?) -> CloudErrorAnswer {
    let (mappedStatus, type): (Int, String)
    switch exception?.lowercased() {
    case "throttlingexception", "servicequotaexceededexception": (mappedStatus, type) = (429, "rate_limit_error")
    case "validationexception": (mappedStatus, type) = (400, "invalid_request_error")
    case "accessdeniedexception", "unrecognizedclientexception", "expiredtokenexception", "invalidsignatureexception",
         "incompletesignatureexception", "missingauthenticationtokenexception", "invalidclienttokenid":
        (mappedStatus, type) = (403, "permission_error")
    case "resourcenotfoundexception": (mappedStatus, type) = (404, "not_found_error")
    case "modelnotreadyexception": (mappedStatus, type) = (529, "overloaded_error")
    case "serviceunavailableexception": (mappedStatus, type) = (503, "overloaded_error")
    case "modeltimeoutexception": (mappedStatus, type) = (504, "api_error")
    case "internalserverexception": (mappedStatus, type) = (500, "api_error")
    case "modelerrorexception", "modelstreamerrorexception":
        return CloudErrorAnswer.modelFailure(service: "Bedrock", cloudMessage: cloudMessage, exception: exception)
    default: (mappedStatus, type) = status == 401 || status == 403 ? (403, "permission_error") : (502, "api_error")
    }
    return CloudErrorAnswer.generic(status: mappedStatus, type: type, service: "Bedrock",
                                    cloudMessage: cloudMessage ?? status.map { "Bedrock answered HTTP \($0)" }, exception: exception)
}

/// The `message` (or `Message`) string of a Bedrock error payload, made valid UTF-8.
private func bedrockMessage(_ payload: [UInt8]) -> String? {
    guard let bytes = JSONScan.stringMember("message", of: payload) ?? JSONScan.stringMember("Message", of: payload) else { return nil }
    return String(decoding: bytes, as: UTF8.self)
}

/// An error response from Bedrock (a non-2xx InvokeModel or InvokeModelWithResponseStream) as the
/// Messages API would have answered: status and `{"type":"error","error":{…}}` body, with a
/// message of this service's own (the cloud's goes in `detail`, for the log), or a model's own
/// words for a model's failure. The error type comes from `x-amzn-ErrorType` (whose value may
/// carry a `:` and a namespace after the name), else from the body's `__type` or `code`; the
/// mapping is `bedrockAnswer`'s.
public func bedrockError(status: Int, errorTypeHeader: String?, body: [UInt8]) -> CloudErrorAnswer {
    bedrockAnswer(exception: bedrockErrorType(header: errorTypeHeader, body: body), status: status, cloudMessage: bedrockMessage(body))
}

/// The same as status and body.
public func bedrockErrorToAnthropic(status: Int, errorTypeHeader: String?, body: [UInt8]) -> (status: Int, body: [UInt8]) {
    let answer = bedrockError(status: status, errorTypeHeader: errorTypeHeader, body: body)
    return (answer.status, anthropicErrorBody(type: answer.type, message: answer.message))
}

/// The bare exception name: "ThrottlingException" from "ThrottlingException:http://internal…"
/// or "com.amazon.coral.service#ThrottlingException".
private func bedrockErrorType(header: String?, body: [UInt8]) -> String? {
    func bare(_ raw: Substring) -> String? {
        var name = raw.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        if let hash = name.lastIndex(of: "#") { name = name[name.index(after: hash)...] }
        while name.first == " " { name = name.dropFirst() }
        while name.last == " " { name = name.dropLast() }
        return name.isEmpty ? nil : String(name)
    }
    if let header, let name = bare(header[...]) { return name }
    for member in ["__type", "code"] {
        if let bytes = JSONScan.stringMember(member, of: body), let name = bare(String(decoding: bytes, as: UTF8.self)[...]) { return name }
    }
    return nil
}
