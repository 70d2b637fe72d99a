import CloudUpstreams
import MessagesBody
import Synchronization
import UpstreamClient

/// Bedrock's Messages API reply: the API's own JSON and SSE, relayed as they are; an error,
/// which AWS's front end answers in its own shape (`x-amzn-ErrorType`, `{"message":…}`), becomes
/// the API's error shape with this service's words (`bedrockError`). With `countsTokens`, the
/// answer of CountTokens (`{"inputTokens":N}`) is held and answered as the API's
/// `{"input_tokens":N}`.
final class BedrockMessagesReply: UpstreamDelegate {
    private struct State {
        var failure: (status: Int, type: String?, retryAfter: String?, body: [UInt8])?
        var counted: [UInt8]?
    }

    let exchange: any CloudReplyExchange
    let countsTokens: Bool
    /// How the device reads the service in an error.
    let service: String
    /// AWS's front end answers its own errors (`x-amzn-ErrorType`, `{"message":…}`); any other
    /// service's front end (Microsoft Foundry's) answers in its own JSON, read by status.
    let awsErrors: Bool
    private let state = Mutex(State())

    init(_ exchange: any CloudReplyExchange, countsTokens: Bool = false, service: String = "Bedrock", awsErrors: Bool = true) {
        self.exchange = exchange
        self.countsTokens = countsTokens
        self.service = service
        self.awsErrors = awsErrors
    }

    static let inputTokens = JSONMemberScan.Names("inputTokens")
    static let apiErrorMembers = JSONMemberScan.Names("type", "error")

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        if let id = RelayedExchange.cloudRequestID(in: headers) { exchange.noteCloudRequestID(id) }
        guard (200..<300).contains(status) else {
            let type = headers.first { $0.name == "x-amzn-errortype" }?.value
            state.withLock { $0.failure = (status, type, headers.first { $0.name == "retry-after" }?.value, []) }
            return
        }
        if countsTokens {
            state.withLock { $0.counted = [] }
            return
        }
        exchange.noteBilledCounts(inBedrockHeaders: headers)
        exchange.upstreamDidReceiveHead(status: status, headers: headers)
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        let held = state.withLock { s -> Bool in
            if s.counted != nil {
                if s.counted!.count < BedrockReply.maxErrorBody { s.counted!.append(contentsOf: chunk.prefix(BedrockReply.maxErrorBody - s.counted!.count)) }
                return true
            }
            guard s.failure != nil else { return false }
            let room = BedrockReply.maxErrorBody - s.failure!.body.count
            if room > 0 { s.failure!.body.append(contentsOf: chunk.prefix(room)) }
            return true
        }
        return held ? true : exchange.upstreamDidReceive(chunk)
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        if let counted = state.withLock({ $0.counted }), error == nil {
            let count = counted.withUnsafeBytes { bytes in
                (try? JSONMemberScan.members(of: Self.inputTokens, in: bytes))?[0].flatMap { JSONMemberScan.integer(bytes, $0) }
            }
            guard let count, count >= 0 else {
                exchange.upstreamDidFinish(UpstreamError(kind: .other, detail: "Bedrock's CountTokens answer has no inputTokens"))
                return
            }
            exchange.upstreamDidReceiveHead(status: 200, headers: [("content-type", "application/json")])
            _ = Array(#"{"input_tokens":\#(count)}"#.utf8).withUnsafeBytes { exchange.upstreamDidReceive($0) }
            exchange.upstreamDidFinish(nil)
            return
        }
        guard let failure = state.withLock({ $0.failure }), error == nil else {
            exchange.upstreamDidFinish(error)
            return
        }
        // AWS's front end names its errors in `x-amzn-ErrorType`; the model's own errors come in
        // the API's shape, with the API's status and type.
        let answer = failure.type == nil && (Self.isAPIError(failure.body) || !awsErrors)
            ? VertexReply.answer(status: failure.status, body: failure.body, service: service)
            : bedrockError(status: failure.status, errorTypeHeader: failure.type, body: failure.body)
        exchange.answerCloudError(answer, retryAfter: failure.retryAfter)
    }

    /// `{"type":"error","error":{…}}`: the Messages API's own error shape.
    static func isAPIError(_ body: [UInt8]) -> Bool {
        body.withUnsafeBytes { bytes in
            guard let found = try? JSONMemberScan.members(of: apiErrorMembers, in: bytes), let type = found[0], found[1] != nil else { return false }
            return JSONMemberScan.plainString(bytes, type) == "error"
        }
    }
}
