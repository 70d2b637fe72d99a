/// Where the upstream Messages API is and how long to wait for it.
public struct UpstreamConfiguration: Sendable {
    /// Scheme, host and optional port, without a trailing path: `https://api.anthropic.com`,
    /// `http://127.0.0.1:8089`. A request's path is appended to it.
    public var baseURL: String
    /// Extra trusted roots (PEM), in addition to the system's roots. For tests with a local TLS
    /// upstream; `nil` in production.
    public var caFile: String?
    /// TCP connect plus TLS handshake.
    public var connectTimeout: Duration
    /// How long a transfer may go without a byte in either direction before it fails with
    /// `.idleTimeout`. There is no total timeout: a stream may run for minutes. A paused
    /// transfer is exempt while paused, and its clock restarts at `resume()`.
    public var idleTimeout: Duration
    /// Offer HTTP/2 over TLS (ALPN); streams to the same host then share one connection.
    /// Plain `http://` always uses HTTP/1.1.
    public var allowHTTP2: Bool
    /// Connections kept for reuse by each event loop's multi handle (CURLMOPT_MAXCONNECTS);
    /// 0 keeps curl's default, four times the transfers in progress, which closes most of a
    /// burst's connections in the next lull and reopens them in the next burst (2% of relayed
    /// requests opened a connection at 64 concurrent clients).
    public var maxIdleConnections: Int
    /// libcurl's CURLOPT_CONNECT_TO for every transfer: each entry `HOST:PORT:ADDRESS:PORT` sends
    /// a request for `HOST:PORT` to `ADDRESS:PORT` instead, while `Host`, SNI and the certificate
    /// check keep the name `HOST`. For tests (a stub on loopback standing in for a cloud's real
    /// host); empty in production. `[v6]` addresses are written with their brackets.
    public var connectTo: [String]

    public init(baseURL: String = "https://api.anthropic.com",
                caFile: String? = nil,
                connectTimeout: Duration = .seconds(10),
                idleTimeout: Duration = .seconds(600),
                allowHTTP2: Bool = true,
                maxIdleConnections: Int = 256,
                connectTo: [String] = []) {
        self.baseURL = baseURL
        self.caFile = caFile
        self.connectTimeout = connectTimeout
        self.idleTimeout = idleTimeout
        self.allowHTTP2 = allowHTTP2
        self.maxIdleConnections = maxIdleConnections
        self.connectTo = connectTo
    }
}

/// One request to the upstream. Headers go out as given, in order, except `content-length`
/// and `transfer-encoding` (curl frames the body itself). curl adds `Host` and
/// `Content-Length`, and nothing else: no `Accept`, `Expect` or default `Content-Type`.
public struct UpstreamRequest: Sendable {
    public var method: String
    /// Starts with `/`; appended to the configuration's `baseURL`.
    public var path: String
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// `scheme://host[:port]` to send this request to instead of the configuration's `baseURL`
    /// (a workspace's cloud upstream; the same trusted roots apply).
    public var origin: String?
    /// The most the whole transfer may take (nil: none, as for a stream that runs for minutes):
    /// a token fetch that many requests wait on ends by then, answered or not.
    public var totalTimeout: Duration?

    public init(method: String = "POST", path: String,
                headers: [(name: String, value: String)] = [], body: [UInt8] = [], origin: String? = nil, totalTimeout: Duration? = nil) {
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.origin = origin
        self.totalTimeout = totalTimeout
    }
}

/// Receives one transfer's response. Every call is made on the client's event thread, in this
/// order: `upstreamDidReceiveHead` at most once (final response only, before any chunk),
/// `upstreamDidReceive` for each chunk as curl hands it over, then `upstreamDidFinish` exactly
/// once. An HTTP error status is a response like any other (head, body, `nil` error).
///
/// The calls must not block: they hold up every other transfer on the client. They may call
/// `cancel()`, `resume()` or `UpstreamClient.start`, which only queue work for the thread.
public protocol UpstreamDelegate: AnyObject, Sendable {
    /// The final response's status and raw headers: names lowercased, values trimmed, in
    /// arrival order, repeated names kept. 1xx responses are skipped.
    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)])
    /// A chunk of the body (after transfer decoding, before any content decoding), valid only
    /// during the call. The chunk counts as consumed either way; return `false` to stop further
    /// delivery until `UpstreamTransfer.resume()`.
    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool
    /// The end: `nil` when the whole response arrived, otherwise why not.
    func upstreamDidFinish(_ error: UpstreamError?)
}

/// Why a transfer ended early. `detail` is for logs: curl's own message when curl failed.
public struct UpstreamError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        /// Could not resolve the host or connect (refused, unreachable).
        case connect
        /// TLS handshake or certificate verification failed.
        case tls
        /// The connect timeout (TCP plus TLS) expired.
        case timeout
        /// No byte in `idleTimeout`.
        case idleTimeout
        /// The connection broke after it was established: reset, closed mid-response, HTTP/2
        /// stream error.
        case reset
        /// `cancel()` or `shutdown()`.
        case cancelled
        /// Anything else (an invalid request, out of memory, an unexpected curl failure).
        case other
    }

    public var kind: Kind
    public var detail: String
    /// curl's CURLcode when curl reported the failure.
    public var curlCode: Int?

    public init(kind: Kind, detail: String, curlCode: Int? = nil) {
        self.kind = kind
        self.detail = detail
        self.curlCode = curlCode
    }

    public var description: String {
        curlCode.map { "\(kind.rawValue) (curl \($0)): \(detail)" } ?? "\(kind.rawValue): \(detail)"
    }
}

/// Why `UpstreamClient.init` failed.
public struct UpstreamClientError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
