import Dispatch
import MessagesBody
import TokenService
import UpstreamClient

/// One relayed exchange as a state machine: it is told what happens (the upstream's head, a
/// chunk, its end; the client leaving; the server stopping) and answers with what to do, which
/// `RelayedExchange` then does to the client's writer and the upstream transfer. No I/O here, so
/// every path is unit-tested without curl or libmicrohttpd.
struct RelayExchangeMachine {
    enum Phase: Equatable {
        /// Nothing from the upstream yet.
        case awaitingHead
        /// A JSON reply, held until its last byte and answered in one piece (one wake-up of the
        /// HTTP server instead of three).
        case holding
        /// A JSON reply past `maxHeldReply`: forwarded as it comes, its last bytes kept for its usage.
        case passing
        /// An SSE reply: forwarded event by event.
        case streaming
        /// The client left before a JSON reply came: it is read to its end for its usage.
        case abandoned
        /// Ended for a server shutdown: nothing more goes to the client.
        case shutDown
        /// The upstream answered a redirect: never followed, never passed on (the published client
        /// would refuse it, and its `Location` is the upstream's); the client gets a 502.
        case redirected
    }

    static let maxHeldReply = 1 << 20
    static let keptTail = 64 << 10
    /// How much of a reply its client left is read for its usage: a Messages reply is far
    /// smaller; past this it is cancelled and recorded as cut short.
    static let maxAbandonedBytes = 32 << 20

    /// A reply whose client leaves is read to its end (a request that did not ask for a stream,
    /// with a ledger to record it); otherwise the transfer is cancelled with the client.
    let readsAbandonedReply: Bool
    /// The request asked for a stream (`"stream": true`).
    let requestStreams: Bool

    private(set) var phase = Phase.awaitingHead
    private(set) var headSeen = false
    private(set) var isEventStream = false
    private(set) var status = 0
    private(set) var bytes = 0
    private(set) var firstByteAt: UInt64?
    private var headers: [(name: String, value: String)] = []
    private var held: [UInt8] = []
    private var tail: [UInt8] = []
    private var abandonedBytes = 0
    private var streamUsage = StreamUsageReader()
    /// The counts the cloud bills a JSON reply by, reported in its head (Bedrock's token-count
    /// headers): laid over the reply's own `usage`.
    private var billed = ReportedCounts()
    /// The start of an SSE event whose end has not arrived: the client gets whole events only,
    /// so an error event the relay adds never lands inside one.
    private var partialEvent: [UInt8] = []

    init(readsAbandonedReply: Bool, requestStreams: Bool) {
        self.readsAbandonedReply = readsAbandonedReply
        self.requestStreams = requestStreams
    }

    /// Bedrock's `x-amzn-bedrock-*-token-count` headers on a JSON reply: what Bedrock bills.
    mutating func noteBilledCounts(inBedrockHeaders headers: [(name: String, value: String)]) {
        billed = ReportedCounts(bedrockHeaders: headers)
    }

    // MARK: Events

    enum HeadAction: Equatable {
        case none
        /// Start the client's stream now.
        case startStream
        /// A stream nobody reads, or a redirect: cancel the transfer.
        case cancelTransfer
    }

    /// The upstream's head, with the headers passed on to the client.
    mutating func head(status: Int, headers: [(name: String, value: String)], isEventStream: Bool) -> HeadAction {
        headSeen = true
        self.status = status
        self.isEventStream = isEventStream
        self.headers = headers
        if (300..<400).contains(status), phase != .shutDown {
            phase = .redirected
            return .cancelTransfer
        }
        switch phase {
        case .abandoned:
            return isEventStream ? .cancelTransfer : .none
        case .shutDown:
            return .none
        default:
            phase = isEventStream ? .streaming : .holding
            return isEventStream ? .startStream : .none
        }
    }

    enum ChunkAction: Equatable {
        /// Keep reading; nothing to send yet.
        case keep
        /// Send: first start the stream (a held reply that outgrew the hold), then `before`,
        /// then the chunk's first `chunkPrefix` bytes. `keepTail`: afterwards, hand the chunk to
        /// `keepTail` (a JSON reply's usage is in its last bytes).
        case forward(startStream: Bool, before: [UInt8], chunkPrefix: Int, keepTail: Bool)
        /// The abandoned reply grew past its cap: cancel the transfer (keep reading until then).
        case cancelTransfer
        /// Nothing more goes to the client (ended for a shutdown): pause the transfer.
        case stop
    }

    mutating func chunk(_ chunk: UnsafeRawBufferPointer, at now: UInt64 = DispatchTime.now().uptimeNanoseconds) -> ChunkAction {
        if firstByteAt == nil { firstByteAt = now }
        bytes += chunk.count
        switch phase {
        case .awaitingHead, .shutDown, .redirected:
            return .stop
        case .abandoned:
            abandonedBytes += chunk.count
            keepTail(chunk)
            return abandonedBytes > Self.maxAbandonedBytes ? .cancelTransfer : .keep
        case .holding:
            // Appended in place: a copy taken out of the state would share the body's storage.
            held.append(contentsOf: chunk)
            guard held.count > Self.maxHeldReply else { return .keep }
            phase = .passing
            let body = held
            held = []
            tail = Array(body.suffix(Self.keptTail))
            return .forward(startStream: true, before: body, chunkPrefix: 0, keepTail: false)
        case .passing:
            return .forward(startStream: false, before: [], chunkPrefix: chunk.count, keepTail: true)
        case .streaming:
            // Whole events go out as they arrive; an event's start waits for its end (no client
            // can use half an event), up to an event's size limit.
            guard let boundary = streamUsage.feed(chunk) else {
                guard partialEvent.count + chunk.count > StreamUsageReader.maxEventBytes else {
                    partialEvent.append(contentsOf: chunk)
                    return .keep
                }
                defer { partialEvent = [] }
                return .forward(startStream: false, before: partialEvent, chunkPrefix: chunk.count, keepTail: false)
            }
            defer { partialEvent = Array(chunk[boundary...]) }
            return .forward(startStream: false, before: partialEvent, chunkPrefix: boundary, keepTail: false)
        }
    }

    /// A passed-through JSON reply's last bytes, kept after the chunk is on its way (so the
    /// reply never waits for this copy).
    mutating func keepTail(_ chunk: UnsafeRawBufferPointer) {
        tail.append(contentsOf: chunk)
        if tail.count > 2 * Self.keptTail { tail.removeFirst(tail.count - Self.keptTail) }
    }

    /// The client went away. True: cancel the transfer (a stream, or nothing to record). False:
    /// a JSON reply is read to its end for its usage (resume the transfer if it was paused).
    mutating func clientLeft() -> Bool {
        guard readsAbandonedReply, !isEventStream, phase != .shutDown, phase != .redirected else { return true }
        // What was held so far is where the reply's usage will be, if it is small.
        if phase == .holding { tail = Array(held.suffix(Self.keptTail)) }
        held = []
        phase = .abandoned
        return false
    }

    enum ShutdownAction: Equatable {
        /// A JSON reply: left to finish within the grace period.
        case leave
        /// End the stream with an SSE `overloaded_error` event.
        case endStreamWithEvent
        /// A stream not begun: answer 529 `overloaded_error`.
        case refuse
    }

    /// The server is stopping.
    mutating func shutdown() -> ShutdownAction {
        guard phase != .shutDown, phase != .redirected else { return .leave }
        if !isEventStream && (!requestStreams || headSeen) { return .leave }
        let streamGoingOut = phase == .streaming
        phase = .shutDown
        held = []
        return streamGoingOut ? .endStreamWithEvent : .refuse
    }

    enum FinishAction: Equatable {
        /// Nobody to answer (the client left, the transfer was cancelled, or the shutdown ended it).
        case none
        /// Answer with the held reply (its headers: `headers`).
        case respondHeld(status: Int, body: [UInt8])
        /// End the stream (after the bytes of an event left without its blank line).
        case finishStream(remainder: [UInt8])
        /// Nothing sent yet: answer 502 or 504 in the API's shape.
        case respondUpstreamError(status: Int, timedOut: Bool)
        /// A stream that failed midway: an SSE error event, then the end.
        case endStreamWithError
        /// A JSON reply that failed midway: end what was sent.
        case endBody
    }

    /// The headers the client gets (passed on from the upstream's head).
    var clientHeaders: [(name: String, value: String)] { headers }

    /// The transfer ended (`error` nil: the reply arrived whole). What to do, and how the
    /// exchange ended for the ledger, the metrics and the log.
    mutating func finish(_ error: UpstreamError?) -> (FinishAction, RelayedExchange.Result) {
        defer { held = []; partialEvent = [] }
        if phase == .redirected {
            let redirect = UpstreamError(kind: .other, detail: "the upstream answered \(status), a redirect, which is never followed")
            return (.respondUpstreamError(status: 502, timedOut: false), result(502, redirect, usage: TokenUsage(), incomplete: false))
        }
        if phase == .abandoned {
            // Read whole, the reply's usage is what the upstream bills; cut short (cancelled past
            // the cap, a stream after all, the upstream failing), what was seen.
            let whole = error == nil && headSeen && !isEventStream
            let usage = (whole && status < 400 ? UsageObject.ofTail(tail) : nil) ?? TokenUsage()
            return (.none, result(headSeen ? status : 499, error, usage: usage, incomplete: !whole, abandoned: true))
        }
        guard let error else {
            if phase == .holding {
                let served: (usage: TokenUsage?, model: String?) = status < 400 ? UsageObject.servedReply(held) : (nil, nil)
                // A context overflow in the words the published client maps to its own error.
                let body = status == 400 ? ErrorWording.contextOverflowWorded(held) ?? held : held
                return (.respondHeld(status: status, body: body),
                        result(status, nil, usage: served.usage ?? TokenUsage(), incomplete: false, servingModel: served.model))
            }
            let (usage, incomplete) = usage(cut: false, heldBody: nil)
            return (.finishStream(remainder: partialEvent), result(status, nil, usage: usage, incomplete: incomplete))
        }
        if error.kind == .cancelled || phase == .shutDown {
            let (usage, incomplete) = usage(cut: true, heldBody: phase == .holding ? held : nil)
            return (.none, result(headSeen ? status : 499, error, usage: usage, incomplete: incomplete))
        }
        if !headSeen || phase == .holding {
            let timedOut = error.kind == .timeout || error.kind == .idleTimeout
            let answered = timedOut ? 504 : 502
            let (usage, incomplete) = usage(cut: headSeen, heldBody: phase == .holding ? held : nil, status: answered)
            return (.respondUpstreamError(status: answered, timedOut: timedOut), result(answered, error, usage: usage, incomplete: incomplete))
        }
        let (usage, incomplete) = usage(cut: true, heldBody: nil)
        return (isEventStream ? .endStreamWithError : .endBody, result(status, error, usage: usage, incomplete: incomplete))
    }

    /// Usage as far as it was seen; cut short unless the reply arrived whole.
    private func usage(cut: Bool, heldBody: [UInt8]?, status: Int? = nil) -> (TokenUsage, Bool) {
        let status = status ?? self.status
        var incomplete = cut
        if isEventStream {
            var usage = streamUsage.usage
            incomplete = incomplete || (status < 400 && !streamUsage.sawStop)
            // Cut before the closing message_delta, the count is message_start's (usually 1):
            // every delta seen carried at least one token, so a client that hangs up just before
            // the end does not spend the budget for nothing.
            if incomplete { usage.outputTokens = max(usage.outputTokens, streamUsage.deltaEvents) }
            return (usage, incomplete)
        }
        if let heldBody { return ((status < 400 ? UsageObject.ofReply(heldBody) : nil) ?? TokenUsage(), incomplete) }
        return ((status < 400 ? UsageObject.ofTail(tail) : nil) ?? TokenUsage(), incomplete)
    }

    private func result(_ status: Int, _ error: UpstreamError?, usage: TokenUsage, incomplete: Bool, abandoned: Bool = false,
                        servingModel: String? = nil) -> RelayedExchange.Result {
        // A JSON reply the cloud answered with success is billed by the counts it reported in
        // its head, however much of the body arrived.
        let usage = !isEventStream && headSeen && (200..<300).contains(self.status) ? billed.laid(over: usage) : usage
        return RelayedExchange.Result(status: status, error: error, bytes: bytes, usage: usage, incomplete: incomplete, abandoned: abandoned,
                                      firstByteAt: firstByteAt, servingModel: servingModel ?? (isEventStream ? streamUsage.servingModel : nil))
    }
}
