import CloudUpstreams
import EventLoops
import Foundation
import Synchronization
import TokenService
import UpstreamClient

/// A request to a cloud upstream, prepared before anything is sent: the request without its
/// credential, how its reply is read, and where the credential comes from.
struct CloudPlan: Sendable {
    enum Reply: Sendable {
        /// Bedrock's Messages API: the API's own shapes; its errors in AWS's.
        case bedrockMessages
        /// InvokeModel: event-stream frames become SSE events.
        case bedrockInvoke
        /// CountTokens, whose `{"inputTokens":N}` becomes the API's `{"input_tokens":N}`.
        case bedrockCountTokens
        case vertex
        /// An Anthropic-compatible service: the API's own shapes; its front end's errors (AWS's
        /// or Microsoft's) read by status.
        case compatible(CloudAPI)
    }

    let request: UpstreamRequest
    let reply: Reply
    /// SigV4's service and region, when the credential is AWS keys.
    let signingService: String
    let region: String
    let source: CredentialSource
    let identity: CloudCredentials.Identity
}

/// One cloud request's tries: the credential (from memory, or fetched), the request authorized
/// with it, and, when the upstream refuses a credential that renews (a 401, or AWS's expired or
/// unrecognised token), the credential dropped and the request sent once more with a fresh one.
/// The refusal is held back from the device (nothing of it was sent), so the device sees only
/// the second answer. No credential at all: 503, never a 401 (that would make the device attest
/// again), and the log says why.
final class CloudAttempt: Sendable {
    let plan: CloudPlan
    let credentials: CloudCredentials
    let loop: EventLoop?
    /// Starts a credential endpoint's transfer.
    let fetch: CloudCredentials.Start
    /// Starts the upstream transfer of this request's exchange.
    let send: @Sendable (UpstreamRequest, any UpstreamDelegate) -> Void
    /// The delegate that reads the cloud's reply for the exchange.
    let reply: @Sendable () -> any UpstreamDelegate
    /// No credential could be had: answer 503 and log `why`.
    let unavailable: @Sendable (CredentialFailure) -> Void
    /// A refused credential was dropped: log it (the retry follows).
    let dropped: @Sendable (String) -> Void

    init(plan: CloudPlan, credentials: CloudCredentials, loop: EventLoop?, fetch: @escaping CloudCredentials.Start,
         send: @escaping @Sendable (UpstreamRequest, any UpstreamDelegate) -> Void, reply: @escaping @Sendable () -> any UpstreamDelegate,
         unavailable: @escaping @Sendable (CredentialFailure) -> Void, dropped: @escaping @Sendable (String) -> Void) {
        self.plan = plan
        self.credentials = credentials
        self.loop = loop
        self.fetch = fetch
        self.send = send
        self.reply = reply
        self.unavailable = unavailable
        self.dropped = dropped
    }

    func run(retrying: Bool = false) {
        credentials.credential(plan.identity, source: plan.source, start: fetch) { [self] result in
            let go: @Sendable () -> Void = { [self] in
                switch result {
                case .success(let credential):
                    let request = CloudRoute.authorized(plan.request, with: credential, service: plan.signingService, region: plan.region, at: Date())
                    var delegate = reply()
                    if !retrying, plan.source.renews {
                        delegate = RefusalCheck(delegate) { [self] refusal in
                            credentials.drop(plan.identity, used: credential)
                            dropped(refusal)
                            run(retrying: true)
                        }
                    }
                    send(request, delegate)
                case .failure(let why):
                    unavailable(why)
                }
            }
            // The credential may come on another loop (another request's fetch): the transfer
            // is driven by the loop that holds this client's connection.
            if let loop, !loop.inLoop, loop.execute(go) { return }
            go()
        }
    }
}

/// The first try's reader: a refusal of the credential (401, or AWS's 403 for an expired or
/// unrecognised token) is swallowed and reported at its end; any other reply goes to `inner`.
final class RefusalCheck: UpstreamDelegate {
    let inner: any UpstreamDelegate
    private let refused: @Sendable (String) -> Void
    private let refusal = Mutex<String?>(nil)

    init(_ inner: any UpstreamDelegate, refused: @escaping @Sendable (String) -> Void) {
        self.inner = inner
        self.refused = refused
    }

    /// AWS answers an expired or unknown session token with 403 and these error types.
    static let awsRefusals = ["ExpiredToken", "UnrecognizedClient", "InvalidClientTokenId"]

    static func refusal(status: Int, headers: [(name: String, value: String)]) -> String? {
        if status == 401 { return "HTTP 401" }
        guard status == 403, let type = headers.first(where: { $0.name == "x-amzn-errortype" })?.value,
              awsRefusals.contains(where: { type.hasPrefix($0) }) else { return nil }
        return "HTTP 403 " + String(type.prefix { $0 != ":" }.prefix(80))
    }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        if let why = Self.refusal(status: status, headers: headers) {
            refusal.withLock { $0 = why }
            return
        }
        inner.upstreamDidReceiveHead(status: status, headers: headers)
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        if refusal.withLock({ $0 }) != nil { return true }
        return inner.upstreamDidReceive(chunk)
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        if let why = refusal.withLock({ $0 }) {
            refused(why)
            return
        }
        inner.upstreamDidFinish(error)
    }
}
