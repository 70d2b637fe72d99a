import HTTPRouting
import AttestCrypto
import AttestWire
import CloudUpstreams
import EventLoops
import Foundation
import HTTPServer
import Synchronization
import TokenAuthentication
import TokenService
import UpstreamClient

/// Where the relay sends `/v1/messages` and with which keys.
public struct RelayConfiguration: Sendable {
    public var upstream: UpstreamConfiguration
    /// The key for workspaces that have none of their own (`attestd --upstream-key-file`).
    public var defaultKey: String?
    /// Opens the workspaces' sealed keys (`--secrets-key-file`), read when first needed (nil: none).
    public var secrets: SecretsKeySource?
    /// How long a failing upstream of a workspace's list is skipped (`--upstream-cooldown`).
    public var cooldown = UpstreamCooldown()
    /// The event loops the HTTP server runs on: each relayed request's upstream transfer then
    /// runs on the loop that took the request. Nil: the relay's client has one loop of its own.
    public var loops: EventLoopGroup?

    public init(upstream: UpstreamConfiguration, defaultKey: String? = nil, secrets: SecretsKeySource? = nil, loops: EventLoopGroup? = nil) {
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
    /// The largest request body relayed: image input arrives as base64 in the JSON.
    public static let maxBodyBytes = 32_000_000
    static let defaultAnthropicVersion = "2023-06-01"

    let upstream: UpstreamClient
    let defaultKey: String?
    let secrets: SecretsKeySource?
    /// Each workspace's list of upstreams, as last read.
    let upstreamLists = UpstreamLists()
    /// Which upstreams of the lists are cooling down after a failure, on this instance.
    public let health: UpstreamHealth
    /// Opened workspace keys, by workspace, with the sealed bytes they came from: a key set again
    /// with attestctl has other sealed bytes and is opened afresh on its next request.
    private let openedKeys = Mutex<[UpstreamSlot: (sealed: [UInt8], key: String)]>([:])

    public init(_ configuration: RelayConfiguration) throws {
        health = UpstreamHealth(cooldown: configuration.cooldown)
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

    /// Which of a workspace's upstreams opened values are kept for: its own (label nil) or a labelled one.
    struct UpstreamSlot: Hashable {
        let workspace: Int64
        let label: String?
    }

    /// The upstream key for the grant's workspace (or `sealed`, an upstream of its list): its
    /// own, else the service default.
    func key(for grant: TokenGrant, sealed: SealedUpstreamKey?) throws(KeyProblem) -> String {
        guard let sealed else {
            guard let defaultKey else { throw .none }
            return defaultKey
        }
        let slot = UpstreamSlot(workspace: grant.workspaceID, label: sealed.label)
        if let cached = openedKeys.withLock({ $0[slot] }), cached.sealed == sealed.sealed { return cached.key }
        let key = String(decoding: try open(sealed, of: grant), as: UTF8.self)
        openedKeys.withLock { $0[slot] = (sealed.sealed, key) }
        return key
    }

    private func open(_ sealed: SealedUpstreamKey, of grant: TokenGrant) throws(KeyProblem) -> [UInt8] {
        // A key file made since the last look (attestctl init just now) is read at once.
        guard let secrets, secrets.current() != nil || secrets.keyring(refresh: .now) != nil else {
            throw .unopenable("no secrets key file is loaded, so workspace \(grant.workspaceName)'s key cannot be opened")
        }
        do {
            // With the key the value names: during a rotation, the new key or the previous one.
            // A cloud upstream's credentials open only with the settings they were sealed with.
            return try secrets.open(sealed.sealed, associatedData: sealed.associatedData(workspaceID: grant.workspaceID))
        } catch {
            guard sealed.kind != .anthropic else {
                throw .unopenable("workspace \(grant.workspaceName)'s upstream key does not open with this secrets key file: \(error)")
            }
            if (try? secrets.open(sealed.sealed, associatedData: SealedUpstreamKey.associatedData(workspaceID: grant.workspaceID))) != nil {
                throw .unopenable("workspace \(grant.workspaceName)'s \(sealed.kind.rawValue) credentials were sealed before their settings were "
                                  + "bound to them, so nothing shows the settings are an owner's: check them (attestctl workspaces show "
                                  + "\(grant.workspaceName)), then run attestctl workspaces bind-upstream-settings --actor EMAIL --workspace "
                                  + "\(grant.workspaceName), or set the upstream again")
            }
            throw .unopenable("workspace \(grant.workspaceName)'s \(sealed.kind.rawValue) credentials do not open with their settings: the settings "
                              + "(endpoint, token URL, region, project or models) were changed outside attestctl and the console, or the "
                              + "secrets key file is not the one they were sealed with; nothing was sent")
        }
    }

    /// Where the grant's workspace sends its requests, with what it needs to sign them.
    enum Target {
        case anthropic(key: String)
        /// Where the credential comes from (`CloudCredentials` fetches and renews it) and what it
        /// is cached by.
        case bedrock(CredentialSource, CloudUpstreamSettings, identity: CloudCredentials.Identity)
        case vertex(CredentialSource, CloudUpstreamSettings, identity: CloudCredentials.Identity)
        /// An Anthropic-compatible service: its API key (sent as `x-api-key`), or the source of
        /// its SigV4 keys or bearer token.
        case compatible(CompatibleCredential, CloudUpstreamSettings, identity: CloudCredentials.Identity)

        var settings: CloudUpstreamSettings? {
            switch self {
            case .anthropic: nil
            case .bedrock(_, let settings, _), .vertex(_, let settings, _), .compatible(_, let settings, _): settings
            }
        }
    }

    /// How an Anthropic-compatible upstream's requests are authorized.
    enum CompatibleCredential {
        case apiKey(String)
        case source(CredentialSource)
    }

    /// Opened cloud credentials, by workspace, with the sealed bytes they came from (a service
    /// account's key is parsed once, not per request) and the pinned hosts they were checked against.
    private let openedCloud = Mutex<[UpstreamSlot: (sealed: [UInt8], pinsVersion: Int, target: Target)]>([:])
    /// The hosts cloud credentials may go to (`attestctl cloud-endpoints allow`), as last read
    /// from the database, and a count of their changes: a change checks every opened target again.
    private let pins = Mutex<(version: Int, pins: CloudEndpointPins)>((0, CloudEndpointPins()))

    /// The deployment's pinned cloud hosts, as attestd last read them.
    func cloudEndpointPins() -> CloudEndpointPins { pins.withLock { $0.pins } }

    /// Takes the pinned cloud hosts read from the database (at start, then every few seconds).
    public func setCloudEndpointPins(_ hosts: [String]) {
        pins.withLock { current in
            guard current.pins.hosts != hosts else { return }
            current = (current.version + 1, CloudEndpointPins(hosts))
        }
    }
    /// Every cloud workspace's credential, from whichever source: cached, renewed, dropped on a refusal.
    let credentials = CloudCredentials()

    /// Where the grant's workspace sends its requests: `upstream`, one of its list, else its own.
    func target(for grant: TokenGrant, upstream: SealedUpstreamKey?? = nil) throws(KeyProblem) -> Target {
        let chosen = upstream ?? grant.upstreamKey
        guard let sealed = chosen, sealed.kind != .anthropic else { return .anthropic(key: try key(for: grant, sealed: chosen)) }
        let slot = UpstreamSlot(workspace: grant.workspaceID, label: sealed.label)
        let pinsVersion = pins.withLock { $0.version }
        // The settings are compared too: settings edited in the database beside unchanged
        // credentials are opened again (and refused) at once, not after a restart.
        if let cached = openedCloud.withLock({ $0[slot] }), cached.sealed == sealed.sealed, cached.pinsVersion == pinsVersion,
           cached.target.settings == sealed.settings {
            return cached.target
        }
        guard let settings = sealed.settings else { throw .unopenable("workspace \(grant.workspaceName)'s \(sealed.kind.rawValue) upstream has no settings") }
        // The rules an owner's settings met when set, again as they are read, and the hosts the
        // deployment allows: a credential never goes where they would not have let it.
        do {
            try Validate.storedCloudSettings(settings, kind: sealed.kind, pins: cloudEndpointPins())
        } catch {
            throw .unopenable("workspace \(grant.workspaceName)'s \(sealed.kind.rawValue) settings are refused as read: \(error)")
        }
        let opened = try open(sealed, of: grant)
        let target: Target
        let source: CredentialSource
        do {
            // An API key in `x-api-key` is the opened bytes themselves; every other credential has its source.
            source = sealed.kind == .compatible && settings.compatible?.auth == .apiKey
                ? .fixed(.bearer(String(decoding: opened, as: UTF8.self)))
                : try CredentialSource.resolve(kind: sealed.kind, settings: settings, opened: opened)
        } catch {
            throw .unopenable("workspace \(grant.workspaceName)'s \(sealed.kind.rawValue) credentials: \(error)")
        }
        let identity = CloudCredentials.Identity(workspace: grant.workspaceID, label: sealed.label, sealed: sealed.sealed,
                                                 binding: settings.binding(kind: sealed.kind))
        switch sealed.kind {
        case .anthropic:
            target = .anthropic(key: String(decoding: opened, as: UTF8.self))
        case .bedrock:
            target = .bedrock(source, settings, identity: identity)
        case .vertex:
            if case .googleServiceAccount(_, let tokenURL) = source {
                do {
                    try Validate.pinned(settings, kind: .vertex, pins: cloudEndpointPins(), accountTokenURI: tokenURL)
                } catch {
                    throw .unopenable("workspace \(grant.workspaceName)'s vertex token endpoint is refused: \(error)")
                }
            }
            target = .vertex(source, settings, identity: identity)
        case .compatible:
            if settings.compatible?.auth == .apiKey, case .fixed(.bearer(let key)) = source {
                target = .compatible(.apiKey(key), settings, identity: identity)
            } else {
                target = .compatible(.source(source), settings, identity: identity)
            }
        }
        openedCloud.withLock { $0[slot] = (sealed.sealed, pinsVersion, target) }
        return target
    }

    /// The upstream request: the body byte for byte; the workspace's key instead of the device's
    /// token; only the headers the Messages API needs, minus any the client named hop-by-hop.
    static func upstreamRequest(_ request: HTTPRequest, key: String) -> UpstreamRequest {
        var headers: [(name: String, value: String)] = [("x-api-key", key)]
        headers.reserveCapacity(8)
        headers.append(("anthropic-version", request.header("anthropic-version") ?? defaultAnthropicVersion))
        let hopByHop = declaredHopByHop(in: request.headers)
        for header in request.headers where isForwarded(header.name) && !hopByHop.contains(header.name) {
            headers.append(header)
        }
        return UpstreamRequest(method: "POST", path: request.path, headers: headers, body: request.body)
    }

    /// Request headers passed through to the upstream (besides the key and the version). The
    /// user profile is checked by the policy before the request gets here.
    static func isForwarded(_ name: String) -> Bool {
        name == "content-type" || name == "accept" || name == "user-agent" || name == "anthropic-beta" || name == MessagesRequestFields.profileHeader
    }

    /// Response headers passed back: the ones the published client reads.
    static func clientHeaders(_ upstream: [(name: String, value: String)]) -> [(name: String, value: String)] {
        let hopByHop = declaredHopByHop(in: upstream)
        return upstream.filter { header in
            let name = header.name
            guard name == "content-type" || name == "request-id" || name == "retry-after" || name.hasPrefix("anthropic-ratelimit-") else { return false }
            return !hopByHop.contains(name)
        }
    }

    /// Whether a `Connection` header of the message names `name` (lowercase, as names are stored)
    /// hop-by-hop (RFC 9110 §7.6.1). Both lists above hold no header that is hop-by-hop by
    /// itself, so only such a declaration can take one out.
    static func isDeclaredHopByHop(_ name: String, in headers: [(name: String, value: String)]) -> Bool {
        declaredHopByHop(in: headers).contains(name)
    }

    /// The names the message's `Connection` headers declare, lowercased, read once per message.
    /// `keep-alive` and `close` (nearly every upstream sends one) name no header either list
    /// passes on, so they are left out and the usual result is empty, allocating nothing.
    static func declaredHopByHop(in headers: [(name: String, value: String)]) -> [String] {
        var names: [String] = []
        for header in headers where header.name == "connection" {
            for token in header.value.utf8.split(separator: UInt8(ascii: ","), omittingEmptySubsequences: true) {
                if RequestParsing.isTrimmed(token, caseInsensitively: "keep-alive") || RequestParsing.isTrimmed(token, caseInsensitively: "close") { continue }
                let trimmed = RequestParsing.withoutBlanks(token)
                if !trimmed.isEmpty { names.append(String(decoding: trimmed, as: UTF8.self).lowercased()) }
            }
        }
        return names
    }
}

/// One relayed request: forwards the upstream's head and chunks to the client as they come, and
/// ends the upstream transfer at once if the client goes away. What to do at each event is
/// `RelayExchangeMachine`'s; this does it, to the client's writer and the upstream transfer.
final class RelayedExchange: UpstreamDelegate {
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
        /// The model that served, as the reply said.
        var servingModel: String?
        /// A cloud's own words for its error (its exception and message): for the log only.
        var cloudError: String?
        /// The upstream's own ID of the request (`x-amzn-RequestId`, the API's `request-id`, as
        /// it was behind Vertex too), logged beside ours for support cases.
        var cloudRequestID: String?
        /// The cloud refused this service's credentials (or Vertex's token grant failed): why, in
        /// its words. The device got 503 `api_error`; `UpstreamCredentialFailures.record` counts
        /// and logs it with the workspace.
        var credentialFailure: String?

        /// The request's log detail: the cloud's words for its error, else the transfer's error,
        /// else a note that the client left; then the upstream's request ID.
        var logDetail: String? {
            let said = cloudError.map { "upstream said: \($0)" } ?? error.map { "upstream \($0)" }
                ?? (abandoned ? "the client left; the reply was read for its usage" : nil)
            guard let cloudRequestID else { return said }
            return (said.map { $0 + "; " } ?? "") + "upstream request ID \(cloudRequestID)"
        }
    }

    let writer: HTTPResponseWriter
    let requestID: String
    let started: UInt64
    let finished: @Sendable (Result) -> Void
    private let machine: Mutex<RelayExchangeMachine>
    /// The transfer, once started: cancelled when an abandoned reply turns out to be a stream or
    /// grows past its cap, resumed when its client leaves.
    private let transfer = Mutex<UpstreamTransfer?>(nil)
    /// What the log line says beyond the machine's result: a cloud's own words for its error, the
    /// upstream's request ID, a refusal of this service's credentials.
    private struct Notes {
        var cloudError: String?
        var cloudRequestID: String?
        var credentialFailure: String?
    }
    private let notes = Mutex(Notes())
    /// The headers naming the upstream's own request ID, by cloud: Bedrock's, then the API's
    /// (on its own and behind Vertex AI).
    static let requestIDHeaders = ["x-amzn-requestid", "request-id", "x-request-id"]

    /// - Parameters:
    ///   - readsAbandonedReply: a reply whose client leaves is read to its end for its usage (a
    ///     request that did not ask for a stream, with a ledger to record it).
    ///   - requestStreams: the request asked for an SSE stream.
    init(writer: HTTPResponseWriter, requestID: String, started: UInt64, readsAbandonedReply: Bool = false, requestStreams: Bool = true,
         finished: @escaping @Sendable (Result) -> Void) {
        self.writer = writer
        self.requestID = requestID
        self.started = started
        self.finished = finished
        machine = Mutex(RelayExchangeMachine(readsAbandonedReply: readsAbandonedReply, requestStreams: requestStreams))
    }

    /// Nothing of an answer has reached the client and it has not left: another upstream may
    /// still be tried (failover).
    var mayTryAgain: Bool { !left.withLock { $0 } && machine.withLock { $0.phase == .awaitingHead } }
    /// The client went away (no other upstream is tried for it).
    private let left = Mutex(false)

    /// The transfer this exchange relays (set once, right after it starts).
    func attach(_ transfer: UpstreamTransfer) {
        self.transfer.withLock { $0 = transfer }
    }

    /// The client went away. True: cancel the transfer (a stream: the client can no longer read
    /// it). False: a JSON reply is read to its end, so that its real usage is recorded.
    func clientLeft() -> Bool {
        left.withLock { $0 = true }
        let cancel = machine.withLock { $0.clientLeft() }
        // A chunk refused while the client was going (write returned false) paused the transfer.
        if !cancel { transfer.withLock { $0 }?.resume() }
        return cancel
    }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        if let id = Self.cloudRequestID(in: headers) { noteCloudRequestID(id) }
        var forwarded = MessagesRelay.clientHeaders(headers)
        if !forwarded.contains(where: { $0.name == "request-id" }) { forwarded.append(("request-id", requestID)) }
        let isEventStream = forwarded.contains { $0.name == "content-type" && $0.value.lowercased().hasPrefix("text/event-stream") }
        if isEventStream { forwarded.append(("cache-control", "no-cache")) }
        switch machine.withLock({ $0.head(status: status, headers: forwarded, isEventStream: isEventStream) }) {
        case .none: break
        // Streams go out at once, chunk by chunk; a JSON reply waits for its last byte.
        case .startStream: writer.startStream(status: status, headers: forwarded)
        // A stream nobody reads is cancelled, and recorded with what was seen (nothing yet).
        case .cancelTransfer: transfer.withLock { $0 }?.cancel()
        }
    }

    /// False: the client is slow (over the high-water mark; `onWritable` resumes) or gone
    /// (`onCancel` cancels the transfer), or nothing more goes to it.
    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        switch machine.withLock({ $0.chunk(chunk) }) {
        case .keep:
            return true
        case .stop:
            return false
        case .cancelTransfer:
            transfer.withLock { $0 }?.cancel()
            return true
        case .forward(let startStream, let before, let chunkPrefix, let keepTail):
            if startStream {
                let (status, headers) = machine.withLock { ($0.status, $0.clientHeaders) }
                writer.startStream(status: status, headers: headers)
            }
            var accepted = true
            if !before.isEmpty { accepted = writer.write(before) }
            if chunkPrefix > 0 { accepted = writer.write(UnsafeRawBufferPointer(rebasing: chunk[..<chunkPrefix])) && accepted }
            if keepTail { machine.withLock { $0.keepTail(chunk) } }
            return accepted
        }
    }

    /// The server is stopping: a stream ends cleanly with an SSE `overloaded_error` event, so the
    /// client retries elsewhere, and a stream not begun is a 529 in the API's shape. Returns false,
    /// and changes nothing, for a JSON reply: the upstream is generating it, it comes within
    /// seconds, and it is the client's answer, so it is left to finish within the grace period
    /// (what is still open at the deadline is ended).
    func endForShutdown() -> Bool {
        let message = "the service is restarting; retry the request"
        switch machine.withLock({ $0.shutdown() }) {
        case .leave:
            return false
        case .endStreamWithEvent:
            let event = "event: error\ndata: " + APIErrorResponse(type: "overloaded_error", message: message, requestID: requestID).json + "\n\n"
            writer.write(Array(event.utf8))
            writer.finish()
        case .refuse:
            writer.respond(.json(529, APIErrorResponse(type: "overloaded_error", message: message, requestID: requestID).json,
                                 headers: [("request-id", requestID), ("retry-after", "1")]))
        }
        return true
    }

    /// Answers with an error of this service's own before any upstream reply (a cloud upstream's
    /// credentials could not be used), through the same path as an upstream's answer.
    func answerAtOnce(status: Int, type: String, message: String) {
        upstreamDidReceiveHead(status: status, headers: [("content-type", "application/json")])
        let body = Array(APIErrorResponse(type: type, message: message, requestID: requestID).json.utf8)
        _ = body.withUnsafeBytes { upstreamDidReceive($0) }
        upstreamDidFinish(nil)
    }

    /// A cloud's error, answered in the Messages API's shape with this service's own message;
    /// the cloud's words go to the log. A refusal of this service's credentials is noted as one.
    func answerCloudError(_ answer: CloudErrorAnswer, retryAfter: String?) {
        noteCloudError(answer.detail)
        if answer.isCredentialFailure { notes.withLock { $0.credentialFailure = String(answer.detail.prefix(1000)) } }
        var headers: [(name: String, value: String)] = [("content-type", "application/json")]
        if let retryAfter { headers.append(("retry-after", retryAfter)) }
        upstreamDidReceiveHead(status: answer.status, headers: headers)
        let body = Array(APIErrorResponse(type: answer.type, message: answer.message, requestID: requestID).json.utf8)
        _ = body.withUnsafeBytes { upstreamDidReceive($0) }
        upstreamDidFinish(nil)
    }

    /// This service's credentials could not be used upstream (Vertex's token grant failed: `cause`
    /// says why): 503 `api_error`, "the upstream refused this service's credentials", never a 401
    /// that would make the device attest again; counted and logged as a credential failure.
    func answerCredentialFailure(cause: String) {
        answerCloudError(CloudErrorAnswer(status: 503, type: "api_error", message: CloudErrorAnswer.credentialsRefused, detail: cause),
                         retryAfter: nil)
    }

    /// Keeps a cloud's own words for its error, for the log line of this request.
    func noteCloudError(_ detail: String) {
        notes.withLock { $0.cloudError = String(detail.prefix(1000)) }
    }

    /// Keeps the upstream's ID of this request (the first one given), for the log line: printable
    /// ASCII, at most 200 bytes, else not kept.
    func noteCloudRequestID(_ id: String) {
        guard Self.isLoggableRequestID(id) else { return }
        notes.withLock { if $0.cloudRequestID == nil { $0.cloudRequestID = id } }
    }

    static func isLoggableRequestID(_ id: String) -> Bool {
        !id.isEmpty && id.utf8.count <= 200 && id.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7f }
    }

    /// The counts the cloud bills a JSON reply by, in its headers (Bedrock's
    /// `x-amzn-bedrock-*-token-count`): the ledger takes them over the reply's own `usage`.
    func noteBilledCounts(inBedrockHeaders headers: [(name: String, value: String)]) {
        machine.withLock { $0.noteBilledCounts(inBedrockHeaders: headers) }
    }

    /// The upstream's own request ID among a reply's headers (names lowercase, as the upstream
    /// client stores them).
    static func cloudRequestID(in headers: [(name: String, value: String)]) -> String? {
        for name in requestIDHeaders {
            if let header = headers.first(where: { $0.name == name }) { return header.value }
        }
        return nil
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        var (action, result, headers) = machine.withLock { machine in
            let (action, result) = machine.finish(error)
            return (action, result, machine.clientHeaders)
        }
        let noted = notes.withLock { $0 }
        result.cloudError = noted.cloudError
        result.cloudRequestID = noted.cloudRequestID
        result.credentialFailure = noted.credentialFailure
        transfer.withLock { $0 = nil }
        switch action {
        case .none:
            break
        case .respondHeld(let status, let body):
            writer.respond(HTTPResponse(status: status, headers: headers, body: body))
        case .finishStream(let remainder):
            // An upstream that ended without a last blank line: its bytes go out as they are.
            if !remainder.isEmpty { writer.write(remainder) }
            writer.finish()
        case .respondUpstreamError(let status, let timedOut):
            // Nothing sent yet: an answer in the Messages API's error shape; the cause goes to the log.
            let message = timedOut ? "the upstream Messages API did not answer in time"
                : result.error?.detail.contains("redirect") == true ? "the upstream Messages API answered with a redirect, which is not followed"
                : "the upstream Messages API could not be reached"
            writer.respond(.json(status, APIErrorResponse(type: "api_error", message: message, requestID: requestID).json,
                                 headers: [("request-id", requestID)]))
        case .endStreamWithError:
            // A stream that fails midway ends with an error event, as the API's own streams do.
            let event = "event: error\ndata: " + APIErrorResponse(type: "api_error", message: "the upstream stream was interrupted",
                                                                  requestID: requestID).json + "\n\n"
            writer.write(Array(event.utf8))
            writer.finish()
        case .endBody:
            writer.finish()
        }
        finished(result)
    }
}
