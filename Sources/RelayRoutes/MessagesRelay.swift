import HTTPRouting
import AttestCrypto
import AttestWire
import EventLoops
import Foundation
import HTTPServer
import Synchronization
import TokenService
import UpstreamClient

/// Where the relay sends `/v1/messages` and with which keys.
public struct RelayConfiguration: Sendable {
    public var upstream: UpstreamConfiguration
    /// The key for workspaces that have none of their own (`attestd --upstream-key-file`).
    public var defaultKey: String?
    /// Opens the workspaces' sealed keys (`--secrets-key-file`); nil when the file is absent.
    public var secrets: SecretBox?
    /// The event loops the HTTP server runs on: each relayed request's upstream transfer then
    /// runs on the loop that took the request. Nil: the relay's client has one loop of its own.
    public var loops: EventLoopGroup?

    public init(upstream: UpstreamConfiguration, defaultKey: String? = nil, secrets: SecretBox? = nil, loops: EventLoopGroup? = nil) {
        self.upstream = upstream
        self.defaultKey = defaultKey
        self.secrets = secrets
        self.loops = loops
    }
}

/// Relays the Messages API to the upstream with the workspace's own key: the device's token
/// never leaves this process, the key never reaches the device. Replies stream through chunk by
/// chunk on the event loop that took the request, which is free for other connections while the
/// transfer waits.
public final class MessagesRelay: Sendable {
    public static let relayedPaths: Set<String> = [WireProtocol.messagesPath, WireProtocol.countTokensPath]
    /// The largest request body relayed: image input arrives as base64 in the JSON.
    public static let maxBodyBytes = 32_000_000
    static let defaultAnthropicVersion = "2023-06-01"

    let upstream: UpstreamClient
    let defaultKey: String?
    let secrets: SecretBox?
    /// Opened workspace keys, by workspace, with the sealed bytes they came from: a key set again
    /// with attestctl has other sealed bytes and is opened afresh on its next request.
    private let openedKeys = Mutex<[Int64: (sealed: [UInt8], key: String)]>([:])

    public init(_ configuration: RelayConfiguration) throws {
        upstream = try UpstreamClient(configuration.upstream, loops: configuration.loops)
        defaultKey = configuration.defaultKey
        secrets = configuration.secrets
    }

    public func shutdown() { upstream.shutdown() }

    public var activeTransfers: Int { upstream.activeTransfers }

    /// Starts a transfer, on the calling event loop when called on one.
    func start(_ request: UpstreamRequest, delegate: any UpstreamDelegate) -> UpstreamTransfer {
        upstream.start(request, delegate: delegate)
    }

    /// Why a request could not be relayed before anything was sent upstream.
    enum KeyProblem: Error {
        case none
        case unopenable(String)
    }

    /// The upstream key for the grant's workspace: its own, else the service default.
    func key(for grant: TokenGrant) throws(KeyProblem) -> String {
        guard let sealed = grant.upstreamKey else {
            guard let defaultKey else { throw .none }
            return defaultKey
        }
        if let cached = openedKeys.withLock({ $0[grant.workspaceID] }), cached.sealed == sealed.sealed { return cached.key }
        guard let secrets else { throw .unopenable("no secrets key file is loaded, so workspace \(grant.workspaceName)'s key cannot be opened") }
        let opened: [UInt8]
        do {
            opened = try secrets.open(sealed.sealed, associatedData: SealedUpstreamKey.associatedData(workspaceID: grant.workspaceID))
        } catch {
            throw .unopenable("workspace \(grant.workspaceName)'s upstream key does not open with this secrets key file: \(error)")
        }
        let key = String(decoding: opened, as: UTF8.self)
        openedKeys.withLock { $0[grant.workspaceID] = (sealed.sealed, key) }
        return key
    }

    /// The upstream request: the body byte for byte; the workspace's key instead of the device's
    /// token; only the headers the Messages API needs, minus any the client named hop-by-hop.
    static func upstreamRequest(_ request: HTTPRequest, key: String) -> UpstreamRequest {
        var headers: [(name: String, value: String)] = [("x-api-key", key)]
        headers.reserveCapacity(6)
        headers.append(("anthropic-version", request.header("anthropic-version") ?? defaultAnthropicVersion))
        for header in request.headers where isForwarded(header.name) && !isDeclaredHopByHop(header.name, in: request.headers) {
            headers.append(header)
        }
        return UpstreamRequest(method: "POST", path: request.path, headers: headers, body: request.body)
    }

    /// Request headers passed through to the upstream (besides the key and the version).
    static func isForwarded(_ name: String) -> Bool {
        name == "content-type" || name == "accept" || name == "user-agent" || name == "anthropic-beta"
    }

    /// Response headers passed back: the ones the published client reads.
    static func clientHeaders(_ upstream: [(name: String, value: String)]) -> [(name: String, value: String)] {
        upstream.filter { header in
            let name = header.name
            guard name == "content-type" || name == "request-id" || name == "retry-after" || name.hasPrefix("anthropic-ratelimit-") else { return false }
            return !isDeclaredHopByHop(name, in: upstream)
        }
    }

    /// Whether a `Connection` header of the message names `name` (lowercase, as names are stored)
    /// hop-by-hop (RFC 9110 §7.6.1). Both lists above hold no header that is hop-by-hop by
    /// itself, so only such a declaration can take one out. Read in place: no list is built.
    static func isDeclaredHopByHop(_ name: String, in headers: [(name: String, value: String)]) -> Bool {
        for header in headers where header.name == "connection" {
            let value = Substring(header.value).utf8
            var start = value.startIndex
            while true {
                let end = value[start...].firstIndex(of: UInt8(ascii: ",")) ?? value.endIndex
                if RequestParsing.isTrimmed(value[start..<end], caseInsensitively: name) { return true }
                guard end < value.endIndex else { break }
                start = value.index(after: end)
            }
        }
        return false
    }
}

/// One relayed request: forwards the upstream's head and chunks to the client as they come, and
/// ends the upstream transfer at once if the client goes away.
final class RelayedExchange: UpstreamDelegate {
    struct State {
        var headSent = false
        var status = 0
        var isEventStream = false
        var firstByteAt: UInt64?
        var bytes = 0
        /// A JSON reply is held until complete and answered in one piece (one wake-up of the HTTP
        /// server instead of three); past `maxHeldReply` it is streamed like an SSE reply.
        var held: (headers: [(name: String, value: String)], body: [UInt8])?
        /// The answer was ended by a server shutdown; nothing more goes to the client.
        var shutDown = false
        /// Usage read from an SSE reply as it passes.
        var streamUsage = StreamUsageReader()
        /// The start of an SSE event whose end has not arrived: the client gets whole events only,
        /// so an error event the relay adds never lands inside one.
        var partialEvent: [UInt8] = []
        /// The last bytes of a JSON reply too large to hold, where its `usage` is.
        var tail: [UInt8] = []
        /// The client left before a non-streamed reply came: it is read to its end for its usage
        /// (the upstream bills it all the same), and nothing more goes to the client.
        var abandoned = false
        /// Bytes read since the client left (bounded by `maxAbandonedBytes`).
        var abandonedBytes = 0
        /// The transfer, once started: cancelled when an abandoned reply turns out to be a stream
        /// or grows past its cap.
        var transfer: UpstreamTransfer?
    }

    /// How the exchange ended, for the ledger, the metrics and the log.
    struct Result {
        var status: Int
        var error: UpstreamError?
        var bytes: Int
        var usage: TokenUsage
        var incomplete: Bool
        var abandoned = false
        /// Nanoseconds (uptime) of the first body byte from upstream.
        var firstByteAt: UInt64?
    }

    static let maxHeldReply = 1 << 20
    static let keptTail = 64 << 10
    /// How much of a reply its client left is read for its usage: a Messages reply is far
    /// smaller; past this it is cancelled and recorded as cut short.
    static let maxAbandonedBytes = 32 << 20

    let writer: HTTPResponseWriter
    let requestID: String
    let started: UInt64
    /// A reply whose client leaves is read to its end for its usage (a request that did not ask
    /// for a stream, with a ledger to record it); otherwise it is cancelled upstream at once.
    let readsAbandonedReply: Bool
    /// The request asked for an SSE stream (`"stream": true`).
    let requestStreams: Bool
    let finished: @Sendable (Result) -> Void
    private let state = Mutex(State())

    init(writer: HTTPResponseWriter, requestID: String, started: UInt64, readsAbandonedReply: Bool = false, requestStreams: Bool = true,
         finished: @escaping @Sendable (Result) -> Void) {
        self.writer = writer
        self.requestID = requestID
        self.started = started
        self.readsAbandonedReply = readsAbandonedReply
        self.requestStreams = requestStreams
        self.finished = finished
    }

    /// The transfer this exchange relays (set once, right after it starts).
    func attach(_ transfer: UpstreamTransfer) {
        state.withLock { $0.transfer = transfer }
    }

    /// The client went away. A stream is cancelled upstream at once (true: cancel it), as the
    /// client can no longer read it. A non-streamed reply is read to its end instead, so that its
    /// real usage is recorded (false): the upstream generates and bills it all the same.
    func clientLeft() -> Bool {
        let (cancel, transfer) = state.withLock { state -> (Bool, UpstreamTransfer?) in
            guard readsAbandonedReply, !state.isEventStream, !state.shutDown else { return (true, state.transfer) }
            state.abandoned = true
            // What was held so far is where the reply's usage will be, if it is small.
            if let held = state.held { state.tail = Array(held.body.suffix(Self.keptTail)) }
            state.held = nil
            return (false, state.transfer)
        }
        // A chunk refused while the client was going (write returned false) paused the transfer.
        if !cancel { transfer?.resume() }
        return cancel
    }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        var forwarded = MessagesRelay.clientHeaders(headers)
        if !forwarded.contains(where: { $0.name == "request-id" }) { forwarded.append(("request-id", requestID)) }
        let isEventStream = forwarded.contains { $0.name == "content-type" && $0.value.lowercased().hasPrefix("text/event-stream") }
        if isEventStream { forwarded.append(("cache-control", "no-cache")) }
        let (abandoned, transfer) = state.withLock { state -> (Bool, UpstreamTransfer?) in
            state.headSent = true
            state.status = status
            state.isEventStream = isEventStream
            if !isEventStream && !state.abandoned { state.held = (forwarded, []) }
            return (state.abandoned, state.transfer)
        }
        if abandoned {
            // A stream nobody reads is cancelled, and recorded with what was seen (nothing yet).
            if isEventStream { transfer?.cancel() }
            return
        }
        // Streams go out at once, chunk by chunk; a JSON reply waits for its last byte.
        if isEventStream { writer.startStream(status: status, headers: forwarded) }
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        // A reply whose client left: only its last bytes are kept, for the usage at its end.
        let overCap: UpstreamTransfer?? = state.withLock { state in
            guard state.abandoned else { return nil }
            if state.firstByteAt == nil { state.firstByteAt = DispatchTime.now().uptimeNanoseconds }
            state.bytes += chunk.count
            state.abandonedBytes += chunk.count
            state.tail.append(contentsOf: chunk)
            if state.tail.count > 2 * Self.keptTail { state.tail.removeFirst(state.tail.count - Self.keptTail) }
            return .some(state.abandonedBytes > Self.maxAbandonedBytes ? state.transfer : nil)
        }
        if let overCap {
            overCap?.cancel()
            return true
        }
        let overflow: (status: Int, headers: [(name: String, value: String)], body: [UInt8])? = state.withLock { state in
            if state.firstByteAt == nil { state.firstByteAt = DispatchTime.now().uptimeNanoseconds }
            state.bytes += chunk.count
            // Appended in place: a copy taken out of the state would share the body's storage,
            // so every chunk would copy the whole body held so far.
            guard state.held != nil else { return nil }
            state.held!.body.append(contentsOf: chunk)
            guard state.held!.body.count > Self.maxHeldReply, let held = state.held else { return nil }
            state.held = nil
            state.tail = Array(held.body.suffix(Self.keptTail))
            return (state.status, held.headers, held.body)
        }
        if let overflow {
            writer.startStream(status: overflow.status, headers: overflow.headers)
            return writer.write(overflow.body)
        }
        let (held, isEventStream) = state.withLock { ($0.held != nil, $0.isEventStream) }
        if held { return true }
        // False: the client is slow (over the high-water mark; `onWritable` resumes) or gone
        // (`onCancel` cancels the transfer).
        guard isEventStream else {
            let accepted = writer.write(chunk)
            // The tail is kept after the chunk is on its way, so the reply never waits for it.
            state.withLock { state in
                state.tail.append(contentsOf: chunk)
                if state.tail.count > 2 * Self.keptTail { state.tail.removeFirst(state.tail.count - Self.keptTail) }
            }
            return accepted
        }
        // Whole events go out as they arrive; an event's start waits for its end (no client can
        // use half an event), up to an event's size limit.
        let ready: (earlier: [UInt8], count: Int)? = state.withLock { state in
            guard !state.shutDown else { return nil }
            guard let boundary = state.streamUsage.feed(chunk) else {
                guard state.partialEvent.count + chunk.count > StreamUsageReader.maxEventBytes else {
                    state.partialEvent.append(contentsOf: chunk)
                    return ([], 0)
                }
                defer { state.partialEvent = [] }
                return (state.partialEvent, chunk.count)
            }
            defer { state.partialEvent = Array(chunk[boundary...]) }
            return (state.partialEvent, boundary)
        }
        guard let ready else { return false }
        var accepted = true
        if !ready.earlier.isEmpty { accepted = writer.write(ready.earlier) }
        if ready.count > 0 { accepted = writer.write(UnsafeRawBufferPointer(rebasing: chunk[..<ready.count])) && accepted }
        return accepted
    }

    /// The server is stopping: a stream ends cleanly with an SSE `overloaded_error` event, so the
    /// client retries elsewhere, and a stream not begun is a 529 in the API's shape. Returns false,
    /// and changes nothing, for a JSON reply: the upstream is generating it, it comes within
    /// seconds, and it is the client's answer, so it is left to finish within the grace period
    /// (what is still open at the deadline is ended).
    func endForShutdown() -> Bool {
        let ending: (headSent: Bool, isEventStream: Bool, held: (headers: [(name: String, value: String)], body: [UInt8])?)? = state.withLock { state in
            if !state.isEventStream && (!requestStreams || state.headSent) { return nil }
            defer { state.held = nil; state.shutDown = true }
            return (state.headSent, state.isEventStream, state.held)
        }
        guard let (headSent, isEventStream, held) = ending else { return false }
        let message = "the service is restarting; retry the request"
        if headSent && isEventStream && held == nil {
            let event = "event: error\ndata: " + APIErrorResponse(type: "overloaded_error", message: message, requestID: requestID).json + "\n\n"
            writer.write(Array(event.utf8))
            writer.finish()
        } else {
            writer.respond(.json(529, APIErrorResponse(type: "overloaded_error", message: message, requestID: requestID).json,
                                 headers: [("request-id", requestID), ("retry-after", "1")]))
        }
        return true
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        let (headSent, status, isEventStream, bytes, held, streamUsage, tail, firstByteAt, partialEvent, abandoned) = state.withLock { state in
            defer { state.held = nil; state.partialEvent = []; state.transfer = nil }
            return (state.headSent, state.status, state.isEventStream, state.bytes, state.held, state.streamUsage, state.tail, state.firstByteAt,
                    state.partialEvent, state.abandoned)
        }
        if abandoned {
            // Nobody to answer. Read whole, the reply's usage is what the upstream bills; cut short
            // (cancelled past the cap, a stream after all, the upstream failing), what was seen.
            let whole = error == nil && headSent && !isEventStream
            let usage = (whole && status < 400 ? UsageObject.ofTail(tail) : nil) ?? TokenUsage()
            finished(Result(status: headSent ? status : 499, error: error, bytes: bytes, usage: usage, incomplete: !whole,
                            abandoned: true, firstByteAt: firstByteAt))
            return
        }
        /// Usage as far as it was seen; cut short unless the reply arrived whole.
        func result(_ status: Int, cut: Bool) -> Result {
            var usage: TokenUsage
            var incomplete = cut
            if isEventStream {
                usage = streamUsage.usage
                incomplete = incomplete || (status < 400 && !streamUsage.sawStop)
                // Cut before the closing message_delta, the count is message_start's (usually 1):
                // every delta seen carried at least one token, so a client that hangs up just
                // before the end does not spend the budget for nothing.
                if incomplete { usage.outputTokens = max(usage.outputTokens, streamUsage.deltaEvents) }
            } else if let held {
                usage = (status < 400 ? UsageObject.ofReply(held.body) : nil) ?? TokenUsage()
            } else {
                usage = (status < 400 ? UsageObject.ofTail(tail) : nil) ?? TokenUsage()
            }
            return Result(status: status, error: error, bytes: bytes, usage: usage, incomplete: incomplete, firstByteAt: firstByteAt)
        }
        guard let error else {
            if let held {
                writer.respond(HTTPResponse(status: status, headers: held.headers, body: held.body))
            } else {
                // An upstream that ended without a last blank line: its bytes go out as they are.
                if !partialEvent.isEmpty { writer.write(partialEvent) }
                writer.finish()
            }
            finished(result(status, cut: false))
            return
        }
        if error.kind == .cancelled || state.withLock({ $0.shutDown }) {
            finished(result(headSent ? status : 499, cut: true))
            return
        }
        if !headSent || held != nil {
            // Nothing sent yet: an answer in the Messages API's error shape; the cause goes to the log.
            let timedOut = error.kind == .timeout || error.kind == .idleTimeout
            let answered = timedOut ? 504 : 502
            let message = timedOut ? "the upstream Messages API did not answer in time" : "the upstream Messages API could not be reached"
            writer.respond(.json(answered, APIErrorResponse(type: "api_error", message: message, requestID: requestID).json,
                                 headers: [("request-id", requestID)]))
            finished(result(answered, cut: headSent))
            return
        }
        if isEventStream {
            // A stream that fails midway ends with an error event, as the API's own streams do.
            let event = "event: error\ndata: " + APIErrorResponse(type: "api_error", message: "the upstream stream was interrupted",
                                                                  requestID: requestID).json + "\n\n"
            writer.write(Array(event.utf8))
        }
        writer.finish()
        finished(result(status, cut: true))
    }
}
