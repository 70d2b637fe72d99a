import AttestWire
import CloudUpstreams
import Foundation
import HTTPRouting
import Synchronization
import TokenService
import UpstreamClient

/// What a cloud's reply hands on: `RelayedExchange` (a recorder in tests).
protocol CloudReplyExchange: AnyObject, Sendable {
    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)])
    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool
    func upstreamDidFinish(_ error: UpstreamError?)
    func answerCloudError(_ answer: CloudErrorAnswer, retryAfter: String?)
    func noteCloudError(_ detail: String)
    func noteCloudRequestID(_ id: String)
    func noteBilledCounts(inBedrockHeaders headers: [(name: String, value: String)])
}

extension RelayedExchange: CloudReplyExchange {}

/// Bedrock's reply, handed to the exchange as the Messages API would have sent it: a stream's
/// event-stream frames become SSE events (the same JSON bytes in `data:`), an error becomes the
/// API's status and error shape. A frame that does not decode ends the transfer: a clean 502, or
/// an SSE `error` event once the stream has begun. An exception before the stream's first event
/// is answered as that exception's own status and error body (429 for `throttlingException`),
/// and recorded so. A JSON reply's token-count headers are what Bedrock bills: the ledger takes
/// them over the body's `usage`. `x-amzn-RequestId` goes to the request's log line.
final class BedrockReply: UpstreamDelegate {
    private struct State {
        var translator = BedrockStreamTranslator(maxMessageBytes: 1 << 20)
        /// A non-2xx reply, collected whole (bounded) and answered at its end.
        var failure: (status: Int, type: String?, retryAfter: String?, body: [UInt8])?
        /// Why the stream could not be decoded.
        var broken: String?
        /// A stream's 200 waits for its first decoded event: a first frame that does not decode
        /// is then a clean 502, not an error event in a stream already begun, and an exception
        /// as the first frame is answered as its own status.
        var headPending = false
        /// The exception that came before any event: answered when the transfer ends.
        var firstFrameException: CloudErrorAnswer?
        var transfer: UpstreamTransfer?
    }

    let exchange: any CloudReplyExchange
    let streams: Bool
    private let state = Mutex(State())
    static let maxErrorBody = 65_536

    init(_ exchange: any CloudReplyExchange, streams: Bool) {
        self.exchange = exchange
        self.streams = streams
    }

    func attach(_ transfer: UpstreamTransfer) {
        state.withLock { $0.transfer = transfer }
    }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        if let id = RelayedExchange.cloudRequestID(in: headers) { exchange.noteCloudRequestID(id) }
        guard (200..<300).contains(status) else {
            let type = headers.first { $0.name == "x-amzn-errortype" }?.value
            let retryAfter = headers.first { $0.name == "retry-after" }?.value
            state.withLock { $0.failure = (status, type, retryAfter, []) }
            return
        }
        if streams {
            state.withLock { $0.headPending = true }
            return
        }
        exchange.noteBilledCounts(inBedrockHeaders: headers)
        exchange.upstreamDidReceiveHead(status: status, headers: [("content-type", "application/json")])
    }

    private func sendPendingHead() {
        exchange.upstreamDidReceiveHead(status: 200, headers: [("content-type", "text/event-stream; charset=utf-8")])
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        enum Step { case collected, forward([UInt8], head: Bool), ended(UpstreamTransfer?) }
        let step: Step = state.withLock { s in
            if s.failure != nil {
                let room = Self.maxErrorBody - s.failure!.body.count
                if room > 0 { s.failure!.body.append(contentsOf: chunk.prefix(room)) }
                return .collected
            }
            guard streams else { return .forward(Array(chunk), head: false) }
            if s.broken != nil || s.firstFrameException != nil { return .collected }
            do {
                let events = try s.translator.translate(chunk)
                // Nothing has reached the device: the exception is the answer, with its own status.
                if s.headPending, s.translator.endedBeforeAnyEvent, let answer = s.translator.endedBy {
                    s.headPending = false
                    s.firstFrameException = answer
                    return .ended(s.transfer)
                }
                let head = s.headPending && !events.isEmpty
                if head { s.headPending = false }
                return .forward(events, head: head)
            } catch {
                s.broken = "Bedrock's event stream does not decode: \(error)"
                return .ended(s.transfer)
            }
        }
        switch step {
        case .collected:
            return true
        case .forward(let bytes, let head):
            if head { sendPendingHead() }
            if bytes.isEmpty { return true }
            return bytes.withUnsafeBytes { exchange.upstreamDidReceive($0) }
        case .ended(let transfer):
            // Nothing after the exception or the broken frame is read: the transfer ends here,
            // and `upstreamDidFinish` answers.
            transfer?.cancel()
            return true
        }
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        let (failure, broken, partial, headPending, firstFrameException) = state.withLock { s in
            s.transfer = nil
            return (s.failure, s.broken, s.translator.hasPartialMessage, s.headPending, s.firstFrameException)
        }
        // The transfer was cancelled here, after the exception (a client that left meanwhile is
        // still answered, as with any error reply: the exchange records it as the exception).
        if let firstFrameException {
            exchange.answerCloudError(firstFrameException, retryAfter: nil)
            return
        }
        // A stream that ends before its first event still gets its head (unless it failed:
        // then the exchange answers 502 in the API's shape).
        if headPending, broken == nil, error == nil, !partial { sendPendingHead() }
        if let broken {
            exchange.upstreamDidFinish(UpstreamError(kind: .other, detail: broken))
            return
        }
        if let failure, error == nil {
            exchange.answerCloudError(bedrockError(status: failure.status, errorTypeHeader: failure.type, body: failure.body),
                                      retryAfter: failure.retryAfter)
            return
        }
        if let cloudError = state.withLock({ $0.translator.cloudError }) { exchange.noteCloudError(cloudError) }
        if error == nil, streams, partial {
            exchange.upstreamDidFinish(UpstreamError(kind: .reset, detail: "Bedrock's event stream ended inside a frame"))
            return
        }
        exchange.upstreamDidFinish(error)
    }
}

/// Vertex AI's reply: the Messages API's own shapes, relayed as they are, except an error that
/// Google's front end answers itself (`{"error":{"code":…,"status":"RESOURCE_EXHAUSTED"}}`), which
/// becomes the API's error shape with the same status. Its request ID goes to the log line.
final class VertexReply: UpstreamDelegate {
    private struct State {
        var googleError: (status: Int, retryAfter: String?, body: [UInt8])?
    }

    let exchange: any CloudReplyExchange
    private let state = Mutex(State())

    init(_ exchange: any CloudReplyExchange) { self.exchange = exchange }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        if let id = RelayedExchange.cloudRequestID(in: headers) { exchange.noteCloudRequestID(id) }
        if !(200..<300).contains(status) {
            // Held until its end (bounded): Google's front end answers in its own shapes (JSON,
            // or an HTML page), and its words can name the project.
            state.withLock { $0.googleError = (status, headers.first { $0.name == "retry-after" }?.value, []) }
            return
        }
        exchange.upstreamDidReceiveHead(status: status, headers: headers)
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        let held = state.withLock { s -> Bool in
            guard s.googleError != nil else { return false }
            let room = BedrockReply.maxErrorBody - s.googleError!.body.count
            if room > 0 { s.googleError!.body.append(contentsOf: chunk.prefix(room)) }
            return true
        }
        return held ? true : exchange.upstreamDidReceive(chunk)
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        guard let held = state.withLock({ $0.googleError }), error == nil else {
            exchange.upstreamDidFinish(error)
            return
        }
        exchange.answerCloudError(Self.answer(status: held.status, body: held.body), retryAfter: held.retryAfter)
    }

    /// A Vertex AI error as the device gets it: the API's error type (from the API's own body, or
    /// from the status of Google's front end) and a message of this service's own.
    static func answer(status: Int, body: [UInt8], service: String = "Vertex AI") -> CloudErrorAnswer {
        let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any]
        let error = object?["error"] as? [String: Any]
        let apiType = object?["type"] as? String == "error" ? error?["type"] as? String : nil
        let byStatus = switch status {
        case 400: "invalid_request_error"
        case 401: "authentication_error"
        case 403: "permission_error"
        case 404: "not_found_error"
        case 413: "request_too_large"
        case 429: "rate_limit_error"
        case 503, 529: "overloaded_error"
        default: "api_error"
        }
        let type = apiType ?? byStatus
        let cloudMessage = error?["message"] as? String ?? String(decoding: body.prefix(300), as: UTF8.self)
        // Google's 401 and 403 are about this service's account; the API's own ones (from behind
        // Google's front end) are too: the device's token was checked here.
        return CloudErrorAnswer.generic(status: status, type: type, service: service, cloudMessage: cloudMessage,
                                        exception: (error?["status"] as? String) ?? apiType.map { _ in "api" })
    }
}

/// `attestd_upstream_credential_failures_total{kind}` and the log line `upstream_credentials_refused`:
/// a cloud refused this service's credentials (a 401 or 403 from its front end, AWS's expired,
/// unrecognised or badly signed credentials) or Vertex's token grant failed. The device got 503
/// `api_error` (`CloudErrorAnswer.credentialsRefused`); the operator gets the workspace and the cause.
enum UpstreamCredentialFailures {
    static let metric = "attestd_upstream_credential_failures_total"

    static func describe(_ metrics: Metrics) {
        metrics.describe(metric, "Relayed requests a cloud upstream answered by refusing this service's credentials (or a failed token grant), by kind.")
    }

    /// Counts one and logs it; `kind` is the upstream's (`bedrock`, `vertex`), `cause` the cloud's
    /// words (`RelayedExchange.Result.credentialFailure`).
    static func record(kind: String, workspace: String, requestID: String, cause: String, metrics: Metrics, logger: Logger) {
        metrics.increment(metric, labels: [("kind", kind)])
        logger.error("upstream_credentials_refused", [("request_id", requestID), ("workspace", workspace), ("kind", kind), ("cause", cause)])
    }
}
