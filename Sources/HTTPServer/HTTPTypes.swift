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

    /// For the server: header names are already lowercase.
    init(method: String, path: String, query: String?, lowercasedHeaders: [(name: String, value: String)],
         body: [UInt8], remoteAddress: String) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = lowercasedHeaders
        self.body = body
        self.remoteAddress = remoteAddress
    }

    /// Value of the first header called `name` (case-insensitive).
    public func header(_ name: String) -> String? {
        // Callers name headers in lowercase, as they are stored: lowercasing is then skipped.
        let wanted = name.utf8.contains(where: { $0 >= 0x41 && $0 <= 0x5A }) ? name.lowercased() : name
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

    /// The server's default refusal: a short text/plain line naming the problem.
    public static func plainRefusal(_ status: Int) -> HTTPResponse {
        HTTPResponse(status: status, headers: [(name: "content-type", value: "text/plain")], body: Array((refusalText(status) + "\n").utf8))
    }

    /// What the server's own refusals say, by status (for refusals in other shapes too).
    public static func refusalText(_ status: Int) -> String {
        switch status {
        case 400: "malformed HTTP request"
        case 413: "request body too large"
        case 414: "request target too long"
        case 431: "request header fields too large"
        case 501: "transfer coding not implemented"
        default: "request refused"
        }
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
    /// How many event loops the server starts when it is not given a group: one libmicrohttpd
    /// daemon and thread each; handlers run on them. Deferred and streaming answers hold none of
    /// them while they wait.
    public var threads: Int = 4
    /// Larger bodies are answered with 413 (the default for every route; see `bodyLimit`).
    public var maxBodyBytes: Int = 65_536
    /// The body limit of one request, chosen from its method and path (no query) as soon as its
    /// headers have arrived; nil = `maxBodyBytes` for every request. A declared `Content-Length`
    /// over it is answered 413 before any body byte is read; a chunked upload that grows past it
    /// is answered 413 once it ends (or cut off if it keeps going).
    public var bodyLimit: (@Sendable (_ method: String, _ path: String) -> Int)? = nil
    /// Request-body bytes held in memory at once across all connections. A request reserves its
    /// declared `Content-Length` when its headers arrive, up to `bodyBytesReservedUpFront`, and
    /// the rest as it arrives (a chunked one all as it grows); it gives them back when it
    /// completes or dies. A request that would go over is answered with `overloadedResponse`:
    /// before its body is read when the up-front part does not fit, else once its body has ended.
    /// 256 MiB: eight 32 MB uploads at once.
    public var maxBufferedBodyBytes: Int = 256 << 20
    /// The most of a declared body reserved before it arrives. Whole, a few slow connections
    /// declaring 32 MB each held the entire budget while sending almost nothing; capped, an
    /// upload holds what it sent (and this much), and most requests, smaller, still learn at once.
    public var bodyBytesReservedUpFront: Int = 1 << 20
    /// The answer when `maxBufferedBodyBytes` would be exceeded; gets the request path.
    public var overloadedResponse: @Sendable (_ path: String) -> HTTPResponse = { _ in
        HTTPResponse(status: 503, headers: [(name: "content-type", value: "text/plain"), (name: "retry-after", value: "1")],
                     body: Array("server overloaded, retry later\n".utf8))
    }
    /// Per-connection memory pool; bounds request line + headers. A head that does not fit is
    /// answered by libmicrohttpd itself (431/414 with its own fixed text, whatever the route):
    /// keep `maxHeadBytes` and `maxTargetBytes` well below it so that the server answers first.
    public var connectionMemoryBytes: Int = 32_768
    /// A longer request target (path and query) is answered 414. 8 KiB, nginx's default: the
    /// service's own URLs are short paths without queries.
    public var maxTargetBytes: Int = 8_192
    /// A request head (request line and headers) larger than this, or with more header fields
    /// than `maxHeaderFields`, is answered 431. A real client's head is well under 2 KiB; 100
    /// fields is Apache's LimitRequestFields.
    public var maxHeadBytes: Int = 16_384
    public var maxHeaderFields: Int = 100
    /// The server's own refusals — 400 (framing), 413, 414, 431, 501 — from the status and the
    /// request path, so that each route can refuse in its own error shape. The server adds
    /// `Connection: close` (after a refusal the connection's framing is not trusted).
    public var refusalResponse: @Sendable (_ status: Int, _ path: String) -> HTTPResponse = { status, _ in .plainRefusal(status) }
    /// Total concurrent connections, split evenly across the event loops' daemons.
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
    /// An IPv6 client counts as its /N for `maxConnectionsPerIP` (IPv4 as its /32).
    public var ipv6PrefixLength: Int = 64
    /// Idle connections (including ones that never send anything) are closed after this. 0 = never.
    public var idleTimeoutSeconds: Int = 15
    /// A request whose body is still arriving this long after its request line is dropped, however
    /// fast it trickles. 600: a 32 MB upload needs 55 kB/s to make it; the minimum rate below is
    /// what stops deliberate trickles. 0 = none.
    public var bodyDeadlineSeconds: Double = 600
    /// The whole request head (request line and headers) must arrive within this many seconds of
    /// the server starting to wait for it: the connection's accept, or the end of the previous
    /// response on a keep-alive connection (so it also bounds idle keep-alives). libmicrohttpd's
    /// idle timeout restarts on every byte, so without this a head trickled in a byte at a time
    /// holds its slot for as long as the attacker likes. 10: a real head is one or two packets,
    /// even a phone on a poor network sends it within a few seconds. 0 = none.
    public var headDeadlineSeconds: Double = 10
    /// Once `bodyGraceSeconds` have passed since its headers, a body must have arrived at no less
    /// than this average rate, or the connection is closed. 1,024 B/s: any real client is far
    /// faster, and an attacker must keep spending 1 KiB/s per connection to hold a slot (the
    /// 64 KiB device exchanges arrive within the grace period anyway). 0 = no minimum.
    public var minBodyBytesPerSecond: Int = 1_024
    /// See `minBodyBytesPerSecond`. 10 s covers a slow start (TCP slow start, a radio waking up).
    public var bodyGraceSeconds: Double = 10
    /// A complete response must have been handed to the client's socket within this many seconds
    /// of being queued, and a stream's unsent bytes may wait no longer than this for the client
    /// to take some. Catches clients that ask and never read. 30: well above a phone's network
    /// stalls; streams that wait for their producer are not affected. 0 = none.
    public var writeTimeoutSeconds: Double = 30
    /// When a worker thread's connections pass this fraction of its share of `maxConnections`,
    /// the server closes the connections doing the least — idle keep-alives first, then the
    /// oldest incomplete heads — until it is 5% of its share below, rather than refusing new
    /// connections (Envoy's overload manager and nginx's reset_timedout_connection do the same).
    public var slotEvictionThreshold: Double = 0.9
    /// A streaming response stops taking bytes without complaint above this many unsent bytes:
    /// `HTTPResponseWriter.write` returns false and the producer should wait for `onWritable`.
    public var streamHighWaterBytes: Int = 64 << 10
    /// `onWritable` fires when the unsent bytes drop to this or below (after a `write` said false).
    public var streamLowWaterBytes: Int = 16 << 10
    /// A request that follows another on its connection is held, its handler not called, while
    /// more than this many bytes of earlier responses wait in the socket for the client to take
    /// them (SIOCOUTQ: sent and unacknowledged, or not sent yet). A client that reads each answer
    /// before it asks again never comes near it; one that pipelines requests and never reads
    /// gets this much and then costs nothing until it reads (the reaper looks a few times a
    /// second and resumes the request once the client has taken half) or `writeTimeoutSeconds`
    /// closes it. 4 KiB: a few dozen small answers. 0 = no bound.
    public var maxUnreadResponseBytes: Int = 2 << 10
    /// Pipelined requests handled per turn of an event loop, at most. A request is pipelined
    /// when libmicrohttpd parses it in the same turn as its connection's previous answer went
    /// out: it had been read already (a client that waits for each answer sends its next
    /// request after it, and that is read in a later turn). Past this many in a turn, a
    /// pipelined request waits, suspended, for a later turn, and each turn goes on first with
    /// the oldest of those waiting. So whatever clients pipeline, and however fast they take
    /// their answers (a large receive buffer takes hundreds of small answers, and nothing waits
    /// unsent for `maxUnreadResponseBytes` to see), a turn handles at most this many of their
    /// requests besides the ones that arrived on their own, and a new caller waits a few short
    /// turns, not one long one: libmicrohttpd otherwise answered one pipelined request on every
    /// busy connection in each run, and with 2,500 such connections a run took tens of
    /// milliseconds. Pipelined requests also get at most a share of the loop's time
    /// (`pipelinedTimeShare`). 64: such a turn takes one or two milliseconds here. 0 = no bound.
    public var pipelinedRequestsPerTurn: Int = 64
    /// Pipelined requests take at most 1/N of each event loop's processor time, in spells of
    /// about 10 ms: the rest is left to everything else (new callers, the exchange's worker
    /// threads, the database). 2, half: measured in docs/front-door.md, the 200-deep flood of
    /// 5,000 never-reading connections then leaves a legitimate exchange's worst round under
    /// 100 ms. A larger N makes the flood cheaper still (8 cut attestd's processor time during
    /// it from 12 s to 4.4 s in 15 s, on a loaded machine) and slows a lone pipelining client.
    public var pipelinedTimeShare: Int = 2

    public init() {}
}

/// Why the server closed a connection on its own.
public enum HTTPReapReason: String, Sendable, CaseIterable {
    /// A request head did not arrive within `headDeadlineSeconds`.
    case headTimeout
    /// A keep-alive connection stayed idle for `headDeadlineSeconds`.
    case idleTimeout
    /// A body fell below `minBodyBytesPerSecond`.
    case bodyTooSlow
    /// A body was still arriving after `bodyDeadlineSeconds`.
    case bodyDeadline
    /// A client did not take its response within `writeTimeoutSeconds`.
    case writeTimeout
    /// Closed to free a slot near the connection limit: an idle keep-alive…
    case evictedIdle
    /// …or an incomplete head.
    case evictedHead
    /// Closed by a graceful shutdown (idle or slow, or accepted after the shutdown began).
    case shutdown
    /// The client hung up mid-request in a way libmicrohttpd did not notice (see
    /// `DaemonDriver.checkReceiving`).
    case clientClosed
    /// A pipelined request was held for its connection's unread answers longer than
    /// `writeTimeoutSeconds` (see `maxUnreadResponseBytes`).
    case unreadAnswers
}

/// A snapshot of the server's connections and counters, for /metrics.
public struct HTTPServerStats: Sendable {
    /// Open connections, in total and by what they are doing.
    public var openConnections = 0
    /// Waiting for a request line (just accepted, or idle keep-alive).
    public var waitingConnections = 0
    public var receivingHeads = 0
    public var receivingBodies = 0
    /// The handler runs, or a deferred answer is pending.
    public var handling = 0
    /// A complete response is being sent.
    public var responding = 0
    /// Streamed responses under way.
    public var openStreams = 0
    /// Request-body bytes reserved against `maxBufferedBodyBytes`.
    public var bufferedBodyBytes = 0
    /// Since the server object was created:
    public var connectionsAccepted: UInt64 = 0
    public var requestsCompleted: UInt64 = 0
    /// Refused for their framing (400, 501) or their oversize head (414, 431).
    public var malformedRequests: UInt64 = 0
    /// Refused with 413.
    public var tooLargeRequests: UInt64 = 0
    /// Refused with `overloadedResponse` (the body budget was spent).
    public var overloadedRequests: UInt64 = 0
    /// Deferred or streamed answers cut short (client gone, deadline, stop): `onCancel` ran.
    public var cancelledAnswers: UInt64 = 0
    /// Pipelined requests held while their connection's earlier answers waited unread.
    public var heldRequests: UInt64 = 0
    /// Requests held now.
    public var held = 0
    /// Pipelined requests that waited for a later turn of their event loop, the turn's budget
    /// for them being spent (see `pipelinedRequestsPerTurn`)…
    public var turnWaits: UInt64 = 0
    /// …and those waiting now.
    public var waitingForTurn = 0
    /// Whole requests whose connection closed with no answer (the client left first, or a
    /// deadline); a graceful stop leaves none.
    public var unansweredRequests: UInt64 = 0
    /// Connections the server closed on its own, by reason (every reason present, 0 if none).
    public var reaped: [HTTPReapReason: UInt64] = [:]

    public init() {}
}

extension HTTPServerStats {
    /// Two servers' figures together (a service's public and admin listeners).
    public static func + (lhs: HTTPServerStats, rhs: HTTPServerStats) -> HTTPServerStats {
        var sum = lhs
        sum.openConnections += rhs.openConnections
        sum.waitingConnections += rhs.waitingConnections
        sum.receivingHeads += rhs.receivingHeads
        sum.receivingBodies += rhs.receivingBodies
        sum.handling += rhs.handling
        sum.responding += rhs.responding
        sum.openStreams += rhs.openStreams
        sum.held += rhs.held
        sum.waitingForTurn += rhs.waitingForTurn
        sum.turnWaits += rhs.turnWaits
        sum.bufferedBodyBytes += rhs.bufferedBodyBytes
        sum.connectionsAccepted += rhs.connectionsAccepted
        sum.requestsCompleted += rhs.requestsCompleted
        sum.malformedRequests += rhs.malformedRequests
        sum.tooLargeRequests += rhs.tooLargeRequests
        sum.overloadedRequests += rhs.overloadedRequests
        sum.cancelledAnswers += rhs.cancelledAnswers
        sum.heldRequests += rhs.heldRequests
        sum.unansweredRequests += rhs.unansweredRequests
        sum.reaped.merge(rhs.reaped, uniquingKeysWith: +)
        return sum
    }
}

/// Failure to start the server; `message` is meant for humans (logs, CLI).
public struct HTTPServerError: Error, LocalizedError, CustomStringConvertible, Sendable {
    public let message: String

    public init(_ message: String) { self.message = message }

    public var description: String { message }
    public var errorDescription: String? { message }
}
