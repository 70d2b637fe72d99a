import Foundation

/// One complete HTTP request as handed to the application handler.
public struct HTTPRequest: Sendable {
    /// Request method exactly as sent ("GET", "POST", ...).
    public let method: String
    /// Path part of the request target, without the query, not percent-decoded
    /// (e.g. "/v1/oauth/token").
    public let path: String
    /// Raw query string (text after the first "?"), if the target had one.
    public let query: String?
    /// Request headers in arrival order; names lowercased.
    public let headers: [(name: String, value: String)]
    /// The complete request body (at most `maxBodyBytes`).
    public let body: [UInt8]
    /// Client IP address as text ("127.0.0.1", "::1").
    public let remoteAddress: String

    public init(method: String, path: String, query: String? = nil,
                headers: [(name: String, value: String)] = [], body: [UInt8] = [],
                remoteAddress: String = "127.0.0.1") {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers.map { (name: $0.name.lowercased(), value: $0.value) }
        self.body = body
        self.remoteAddress = remoteAddress
    }

    /// Value of the first header called `name` (case-insensitive).
    public func header(_ name: String) -> String? {
        let wanted = name.lowercased()
        return headers.first { $0.name == wanted }?.value
    }
}

/// The handler's answer. `content-length` is computed by the server; a
/// `content-length` header set here is ignored.
public struct HTTPResponse: Sendable {
    public var status: Int
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A response with `content-type: application/json` and `body` as UTF-8.
    public static func json(_ status: Int, _ body: String,
                            headers: [(name: String, value: String)] = []) -> HTTPResponse {
        HTTPResponse(status: status,
                     headers: [(name: "content-type", value: "application/json")] + headers,
                     body: Array(body.utf8))
    }
}

/// What a handler returns.
public enum HTTPHandlerResult: Sendable {
    /// The complete answer, now (the common case; `content-length` is set by the server).
    case response(HTTPResponse)
    /// The handler kept the `HTTPResponseWriter` and answers later, from any thread, with
    /// `respond(_:)` or `startStream(status:headers:)`. No server thread waits meanwhile: the
    /// connection is suspended until the answer (or a disconnect, or the server stopping).
    case deferred
}

public struct HTTPServerConfiguration: Sendable {
    /// IPv4 or IPv6 literal to bind to (and only there). "[::1]" is accepted too.
    public var host: String = "127.0.0.1"
    /// 0 = let the kernel pick a free port (see `HTTPServer.port`).
    public var port: UInt16 = 8080
    /// Size of libmicrohttpd's internal thread pool; handlers run on these threads. Deferred and
    /// streaming answers hold none of them while they wait.
    public var threads: Int = 4
    /// Larger bodies are answered with 413 (the default for every route; see `bodyLimit`).
    public var maxBodyBytes: Int = 65_536
    /// The body limit of one request, chosen from its method and path (no query) as soon as its
    /// headers have arrived; nil = `maxBodyBytes` for every request. A declared `Content-Length`
    /// over it is answered 413 before any body byte is read; a chunked upload that grows past it
    /// is answered 413 once it ends (or cut off if it keeps going).
    public var bodyLimit: (@Sendable (_ method: String, _ path: String) -> Int)? = nil
    /// Request-body bytes held in memory at once across all connections. A request reserves its
    /// declared `Content-Length` when its headers arrive (a chunked one reserves as it grows) and
    /// gives it back when it completes or dies. A request that would go over is answered with
    /// `overloadedResponse` instead of being read. 256 MiB: eight 32 MB uploads at once.
    public var maxBufferedBodyBytes: Int = 256 << 20
    /// The answer when `maxBufferedBodyBytes` would be exceeded; gets the request path.
    public var overloadedResponse: @Sendable (_ path: String) -> HTTPResponse = { _ in
        HTTPResponse(status: 503, headers: [(name: "content-type", value: "text/plain"), (name: "retry-after", value: "1")],
                     body: Array("server overloaded, retry later\n".utf8))
    }
    /// Per-connection memory pool; bounds request line + headers (MHD answers 431/414 itself).
    public var connectionMemoryBytes: Int = 32_768
    /// Total concurrent connections, split evenly across the pool threads by libmicrohttpd.
    /// 10,000: with epoll an idle socket costs one descriptor and a few KiB, and the service must
    /// hold 1,000 open relayed streams plus token exchanges plus whatever slow clients the
    /// deadlines have not reaped yet. The server raises the process's soft descriptor limit to
    /// fit (up to the hard limit) when it starts.
    public var maxConnections: Int = 10_000
    /// Concurrent connections per client IP; extra connections are closed at once. 0 = no limit.
    /// 64 keeps one address from taking a noticeable share of `maxConnections` while leaving
    /// room for carrier NAT. Behind a proxy every client shares the proxy's address: raise it
    /// (or set 0) there.
    public var maxConnectionsPerIP: Int = 64
    /// Idle connections (including ones that never send anything) are closed after this. 0 = never.
    public var idleTimeoutSeconds: Int = 15
    /// A request whose body is still arriving this long after its request line is dropped (the
    /// idle timeout alone resets on every byte, so it cannot stop a deliberate trickle). 0 = none.
    public var bodyDeadlineSeconds: Int = 30
    /// A streaming response stops taking bytes without complaint above this many unsent bytes:
    /// `HTTPResponseWriter.write` returns false and the producer should wait for `onWritable`.
    public var streamHighWaterBytes: Int = 64 << 10
    /// `onWritable` fires when the unsent bytes drop to this or below (after a `write` said false).
    public var streamLowWaterBytes: Int = 16 << 10

    public init() {}
}

/// Failure to start the server; `message` is meant for humans (logs, CLI).
public struct HTTPServerError: Error, LocalizedError, CustomStringConvertible, Sendable {
    public let message: String

    public init(_ message: String) { self.message = message }

    public var description: String { message }
    public var errorDescription: String? { message }
}
