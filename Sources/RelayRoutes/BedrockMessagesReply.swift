import CloudUpstreams
import Synchronization
import UpstreamClient

/// Bedrock's Messages API reply: the API's own JSON and SSE, relayed as they are; an error,
/// which AWS's front end answers in its own shape (`x-amzn-ErrorType`, `{"message":…}`), becomes
/// the API's error shape with this service's words (`bedrockError`).
final class BedrockMessagesReply: UpstreamDelegate {
    private struct State {
        var failure: (status: Int, type: String?, retryAfter: String?, body: [UInt8])?
    }

    let exchange: RelayedExchange
    private let state = Mutex(State())

    init(_ exchange: RelayedExchange) { self.exchange = exchange }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        if let id = RelayedExchange.cloudRequestID(in: headers) { exchange.noteCloudRequestID(id) }
        guard (200..<300).contains(status) else {
            let type = headers.first { $0.name == "x-amzn-errortype" }?.value
            state.withLock { $0.failure = (status, type, headers.first { $0.name == "retry-after" }?.value, []) }
            return
        }
        exchange.noteBilledCounts(inBedrockHeaders: headers)
        exchange.upstreamDidReceiveHead(status: status, headers: headers)
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        let held = state.withLock { s -> Bool in
            guard s.failure != nil else { return false }
            let room = BedrockReply.maxErrorBody - s.failure!.body.count
            if room > 0 { s.failure!.body.append(contentsOf: chunk.prefix(room)) }
            return true
        }
        return held ? true : exchange.upstreamDidReceive(chunk)
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        guard let failure = state.withLock({ $0.failure }), error == nil else {
            exchange.upstreamDidFinish(error)
            return
        }
        exchange.answerCloudError(bedrockError(status: failure.status, errorTypeHeader: failure.type, body: failure.body),
                                  retryAfter: failure.retryAfter)
    }
}
