import AttestCrypto
import AttestWire
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

    public init(upstream: UpstreamConfiguration, defaultKey: String? = nil, secrets: SecretBox? = nil) {
        self.upstream = upstream
        self.defaultKey = defaultKey
        self.secrets = secrets
    }
}

/// Relays the Messages API to the upstream with the workspace's own key: the device's token
/// never leaves this process, the key never reaches the device. Replies stream through chunk by
/// chunk, on the upstream client's one thread; the HTTP worker that took the request is free as
/// soon as the transfer starts.
public final class MessagesRelay: Sendable {
    public static let relayedPaths: Set<String> = [WireProtocol.messagesPath, WireProtocol.countTokensPath]
    /// The largest request body relayed: image input arrives as base64 in the JSON.
    public static let maxBodyBytes = 32_000_000
    static let defaultAnthropicVersion = "2023-06-01"
    /// Request headers passed through to the upstream (besides the key and the version).
    static let forwardedRequestHeaders: Set<String> = ["anthropic-beta", "content-type", "accept", "user-agent"]

    let upstream: UpstreamClient
    let defaultKey: String?
    let secrets: SecretBox?
    /// Opened workspace keys, by workspace, with the sealed bytes they came from: a key set again
    /// with attestctl has other sealed bytes and is opened afresh on its next request.
    private let openedKeys = Mutex<[Int64: (sealed: [UInt8], key: String)]>([:])

    public init(_ configuration: RelayConfiguration) throws {
        upstream = try UpstreamClient(configuration.upstream)
        defaultKey = configuration.defaultKey
        secrets = configuration.secrets
    }

    public func shutdown() { upstream.shutdown() }

    public var activeTransfers: Int { upstream.activeTransfers }

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
        let hopByHop = connectionTokens(request.headers)
        var headers: [(name: String, value: String)] = [("x-api-key", key)]
        headers.append(("anthropic-version", request.header("anthropic-version") ?? defaultAnthropicVersion))
        for header in request.headers where forwardedRequestHeaders.contains(header.name) && !hopByHop.contains(header.name) {
            headers.append(header)
        }
        return UpstreamRequest(method: "POST", path: request.path, headers: headers, body: request.body)
    }

    /// Response headers passed back: the ones the published client reads, nothing hop-by-hop.
    static func clientHeaders(_ upstream: [(name: String, value: String)]) -> [(name: String, value: String)] {
        let hopByHop = connectionTokens(upstream)
        return upstream.filter { header in
            guard !hopByHop.contains(header.name) else { return false }
            return header.name == "content-type" || header.name == "request-id" || header.name == "retry-after"
                || header.name.hasPrefix("anthropic-ratelimit-")
        }
    }

    /// Header names a `Connection` header declares hop-by-hop (RFC 9110 §7.6.1), plus the fixed ones.
    static func connectionTokens(_ headers: [(name: String, value: String)]) -> Set<String> {
        var names: Set<String> = ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
                                  "proxy-authenticate", "proxy-authorization"]
        for header in headers where header.name == "connection" {
            for token in header.value.split(separator: ",") {
                names.insert(token.trimmingCharacters(in: .whitespaces).lowercased())
            }
        }
        return names
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
    }

    let writer: HTTPResponseWriter
    let requestID: String
    let started: UInt64
    let finished: @Sendable (_ status: Int, _ error: UpstreamError?, _ bytes: Int) -> Void
    private let state = Mutex(State())

    init(writer: HTTPResponseWriter, requestID: String, started: UInt64,
         finished: @escaping @Sendable (_ status: Int, _ error: UpstreamError?, _ bytes: Int) -> Void) {
        self.writer = writer
        self.requestID = requestID
        self.started = started
        self.finished = finished
    }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        var forwarded = MessagesRelay.clientHeaders(headers)
        if !forwarded.contains(where: { $0.name == "request-id" }) { forwarded.append(("request-id", requestID)) }
        let isEventStream = forwarded.contains { $0.name == "content-type" && $0.value.lowercased().hasPrefix("text/event-stream") }
        if isEventStream { forwarded.append(("cache-control", "no-cache")) }
        state.withLock {
            $0.headSent = true
            $0.status = status
            $0.isEventStream = isEventStream
        }
        writer.startStream(status: status, headers: forwarded)
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        state.withLock {
            if $0.firstByteAt == nil { $0.firstByteAt = DispatchTime.now().uptimeNanoseconds }
            $0.bytes += chunk.count
        }
        // False: the client is slow (over the high-water mark; `onWritable` resumes) or gone
        // (`onCancel` cancels the transfer).
        return writer.write(chunk)
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        let (headSent, status, isEventStream, bytes) = state.withLock { ($0.headSent, $0.status, $0.isEventStream, $0.bytes) }
        guard let error else {
            writer.finish()
            finished(status, nil, bytes)
            return
        }
        if error.kind == .cancelled {
            finished(headSent ? status : 499, error, bytes)
            return
        }
        if !headSent {
            // Nothing sent yet: an answer in the Messages API's error shape; the cause goes to the log.
            let timedOut = error.kind == .timeout || error.kind == .idleTimeout
            let status = timedOut ? 504 : 502
            let message = timedOut ? "the upstream Messages API did not answer in time" : "the upstream Messages API could not be reached"
            writer.respond(.json(status, APIErrorResponse(type: "api_error", message: message, requestID: requestID).json,
                                 headers: [("request-id", requestID)]))
            finished(status, error, bytes)
            return
        }
        if isEventStream {
            // A stream that fails midway ends with an error event, as the API's own streams do.
            let event = "event: error\ndata: " + APIErrorResponse(type: "api_error", message: "the upstream stream was interrupted",
                                                                  requestID: requestID).json + "\n\n"
            writer.write(Array(event.utf8))
        }
        writer.finish()
        finished(status, error, bytes)
    }
}
