import CMicroHTTPD
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// HTTP/1.1 server on libmicrohttpd. The handler is called synchronously on
/// libmicrohttpd's pool threads, once per complete request.
///
/// Do not call `stop()` from inside the handler: stopping joins the pool threads.
public final class HTTPServer: @unchecked Sendable {
    private let configuration: HTTPServerConfiguration
    private let handler: @Sendable (HTTPRequest) -> HTTPResponse
    private let liveRequests = LockedCounter()

    // Guarded by `lock`.
    private let lock = NSLock()
    private var daemon: OpaquePointer?
    private var context: Unmanaged<DaemonContext>?
    private var boundPort: UInt16 = 0

    public init(configuration: HTTPServerConfiguration,
                handler: @escaping @Sendable (HTTPRequest) -> HTTPResponse) {
        self.configuration = configuration
        self.handler = handler
    }

    deinit { stop() }

    /// The port actually bound (resolves port 0); 0 when not running.
    public var port: UInt16 {
        lock.lock(); defer { lock.unlock() }
        return boundPort
    }

    /// Number of per-request contexts currently allocated (tests check for leaks).
    var liveRequestContexts: Int { liveRequests.value }

    public func start() throws {
        lock.lock(); defer { lock.unlock() }
        guard daemon == nil else { throw HTTPServerError("server already started") }

        let config = configuration
        try Self.validate(config)
        var address = try SocketAddress(host: config.host, port: config.port)
        let endpoint = address.isIPv6 ? "[\(address.host)]:\(config.port)" : "\(address.host):\(config.port)"

        let ctx = DaemonContext(handler: handler, maxBodyBytes: config.maxBodyBytes,
                                bodyDeadlineNanoseconds: UInt64(config.bodyDeadlineSeconds) * 1_000_000_000, liveRequests: liveRequests)
        let retained = Unmanaged.passRetained(ctx)
        let ctxPointer = retained.toOpaque()

        var flags = MHD_USE_INTERNAL_POLLING_THREAD.rawValue | MHD_USE_ERROR_LOG.rawValue
        #if os(Linux)
        flags |= MHD_USE_EPOLL.rawValue
        #else
        flags |= MHD_USE_AUTO.rawValue
        #endif
        if address.isIPv6 { flags |= MHD_USE_IPv6.rawValue }

        let (daemonPointer, startErrno, startLog) = address.withSockaddr { sockaddr in
            var options: [MHD_OptionItem] = [
                // First, so that start-up failures are captured rather than printed.
                MHD_OptionItem(option: .EXTERNAL_LOGGER,
                               value: unsafeBitCast(logCallback, to: Int.self), ptr_value: ctxPointer),
                MHD_OptionItem(option: .SOCK_ADDR, value: 0, ptr_value: sockaddr),
                MHD_OptionItem(option: .CONNECTION_MEMORY_LIMIT,
                               value: config.connectionMemoryBytes, ptr_value: nil),
                MHD_OptionItem(option: .CONNECTION_LIMIT, value: config.maxConnections, ptr_value: nil),
                MHD_OptionItem(option: .PER_IP_CONNECTION_LIMIT,
                               value: config.maxConnectionsPerIP, ptr_value: nil),
                MHD_OptionItem(option: .CONNECTION_TIMEOUT, value: config.idleTimeoutSeconds, ptr_value: nil),
                MHD_OptionItem(option: .URI_LOG_CALLBACK,
                               value: unsafeBitCast(uriCallback, to: Int.self), ptr_value: ctxPointer),
                MHD_OptionItem(option: .NOTIFY_COMPLETED,
                               value: unsafeBitCast(completedCallback, to: Int.self), ptr_value: ctxPointer),
            ]
            // A "pool" of one is just the internal polling thread.
            if config.threads > 1 {
                options.append(MHD_OptionItem(option: .THREAD_POOL_SIZE,
                                              value: config.threads, ptr_value: nil))
            }
            options.append(MHD_OptionItem(option: .END, value: 0, ptr_value: nil))

            ctx.startupLog.beginCapture()
            errno = 0
            let result = options.withUnsafeMutableBufferPointer { buffer in
                attest_mhd_start_daemon(flags, accessHandler, ctxPointer, buffer.baseAddress)
            }
            let code = errno  // read before anything else can clobber it
            return (result, code, ctx.startupLog.endCapture())
        }

        guard let started = daemonPointer else {
            retained.release()
            let reason = Self.describeStartFailure(errno: startErrno, log: startLog)
            throw HTTPServerError("cannot listen on \(endpoint): \(reason)")
        }
        daemon = started
        context = retained
        boundPort = attest_mhd_bind_port(started)
    }

    /// Stops listening, closes all connections and waits for running handlers. Idempotent.
    public func stop() {
        lock.lock(); defer { lock.unlock() }
        guard let running = daemon else { return }
        // Joins the pool threads; completion callbacks release outstanding request contexts.
        MHD_stop_daemon(running)
        daemon = nil
        boundPort = 0
        context?.release()
        context = nil
    }

    private static func validate(_ config: HTTPServerConfiguration) throws {
        func check(_ ok: Bool, _ what: String) throws {
            if !ok { throw HTTPServerError("invalid configuration: \(what)") }
        }
        let uintMax = Int(UInt32.max)
        try check((1...1024).contains(config.threads), "threads must be in 1...1024")
        try check(config.maxBodyBytes >= 0, "maxBodyBytes must not be negative")
        try check(config.connectionMemoryBytes >= 1024, "connectionMemoryBytes must be at least 1024")
        try check((1...uintMax).contains(config.maxConnections), "maxConnections must be positive")
        try check((0...uintMax).contains(config.maxConnectionsPerIP), "maxConnectionsPerIP must not be negative")
        try check((0...uintMax).contains(config.idleTimeoutSeconds), "idleTimeoutSeconds must not be negative")
    }

    private static func describeStartFailure(errno code: Int32, log: [String]) -> String {
        switch code {
        case EADDRINUSE: return "address in use"
        case EADDRNOTAVAIL: return "address not available on this host"
        case EACCES: return "permission denied"
        default:
            // libmicrohttpd does not always leave errno meaningful; its own log line says more.
            if let last = log.last { return last }
            if code != 0, let text = strerror(code) { return String(cString: text) }
            return "libmicrohttpd failed to start"
        }
    }
}

// MARK: - Daemon and request state shared with the C callbacks

/// Everything the C callbacks need; passed to libmicrohttpd as the `cls` pointer and kept
/// retained by the server for the daemon's lifetime.
private final class DaemonContext: @unchecked Sendable {
    let handler: @Sendable (HTTPRequest) -> HTTPResponse
    let maxBodyBytes: Int
    /// 0 = no deadline.
    let bodyDeadlineNanoseconds: UInt64
    let startupLog = StartupLog()
    let liveRequests: LockedCounter

    init(handler: @escaping @Sendable (HTTPRequest) -> HTTPResponse, maxBodyBytes: Int, bodyDeadlineNanoseconds: UInt64,
         liveRequests: LockedCounter) {
        self.handler = handler
        self.maxBodyBytes = maxBodyBytes
        self.bodyDeadlineNanoseconds = bodyDeadlineNanoseconds
        self.liveRequests = liveRequests
    }
}

/// Collects libmicrohttpd log lines while the daemon starts; drops them afterwards
/// (runtime messages such as "connection limit reached" are routine under load).
private final class StartupLog: @unchecked Sendable {
    private let lock = NSLock()
    private var lines: [String]?

    func beginCapture() { lock.lock(); lines = []; lock.unlock() }

    func endCapture() -> [String] {
        lock.lock(); defer { lock.unlock() }
        let captured = lines ?? []
        lines = nil
        return captured
    }

    func record(_ line: @autoclosure () -> String) {
        lock.lock(); defer { lock.unlock() }
        if lines != nil, lines!.count < 32 { lines!.append(line()) }
    }
}

final class LockedCounter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    var value: Int { lock.lock(); defer { lock.unlock() }; return count }
    func add(_ delta: Int) { lock.lock(); count += delta; lock.unlock() }
}

/// Per-request state, stored in libmicrohttpd's `*req_cls` from the URI callback until
/// the completion callback.
private final class RequestContext {
    let target: String
    /// When the request line arrived: a body must be complete within the body deadline.
    let started = DispatchTime.now().uptimeNanoseconds
    var headersSeen = false
    var body: [UInt8] = []
    /// The body went over the limit: the rest is discarded and the answer is 413.
    var tooLarge = false
    var discardedBytes = 0
    private let live: LockedCounter

    init(target: String, live: LockedCounter) {
        self.target = target
        self.live = live
        live.add(1)
    }

    deinit { live.add(-1) }
}

// MARK: - C callbacks (no captures: they are plain C function pointers)

private let logCallback: MHD_LogCallback = { cls, format, arguments in
    guard let cls, let format, let arguments else { return }
    let ctx = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()
    ctx.startupLog.record({
        var buffer = [CChar](repeating: 0, count: 512)
        _ = attest_mhd_format_log(&buffer, buffer.count, format, arguments)
        return String(cString: buffer).trimmingCharacters(in: .whitespacesAndNewlines)
    }())
}

/// Called once per request, right after the request line, before any access-handler call.
/// Its return value becomes `*req_cls`; it also gives us the raw (undecoded) target.
private let uriCallback: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, OpaquePointer?)
    -> UnsafeMutableRawPointer? = { cls, uri, _ in
    guard let cls else { return nil }
    let ctx = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()
    let request = RequestContext(target: uri.map { String(cString: $0) } ?? "/", live: ctx.liveRequests)
    return Unmanaged.passRetained(request).toOpaque()
}

private let completedCallback: MHD_RequestCompletedCallback = { _, _, reqCls, _ in
    guard let reqCls, let raw = reqCls.pointee else { return }
    Unmanaged<RequestContext>.fromOpaque(raw).release()
    reqCls.pointee = nil
}

/// Called after the headers (upload size 0), for each body chunk, and once more when the
/// request is complete (upload size 0 again); the response is queued on the last call.
private let accessHandler: MHD_AccessHandlerCallback = { cls, connection, url, method, _, uploadData, uploadSize, reqCls in
    guard let cls, let connection, let uploadSize, let reqCls else { return .NO }
    let ctx = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()

    let request: RequestContext
    if let raw = reqCls.pointee {
        request = Unmanaged<RequestContext>.fromOpaque(raw).takeUnretainedValue()
    } else {
        // Not expected (the URI callback always runs first), but stay correct if it did not.
        request = RequestContext(target: url.map { String(cString: $0) } ?? "/", live: ctx.liveRequests)
        reqCls.pointee = Unmanaged.passRetained(request).toOpaque()
    }

    if !request.headersSeen {
        request.headersSeen = true
        // Refuse a declared oversize body before reading any of it. libmicrohttpd then
        // skips the upload and closes the connection after the answer.
        if let declared = MHD_lookup_connection_value(connection, .HEADER_KIND, "Content-Length") {
            let text = String(cString: declared)
            if !text.isEmpty, text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) {
                let length = UInt64(text) ?? .max  // digits only: nil means overflow
                if length > UInt64(ctx.maxBodyBytes) { return queue(payloadTooLarge, on: connection) }
                request.body.reserveCapacity(Int(length))
            }
        }
        return .YES
    }

    let chunkSize = uploadSize.pointee
    if chunkSize > 0 {
        // The idle timeout resets on every byte; this bounds a body trickled in slowly on purpose.
        if ctx.bodyDeadlineNanoseconds > 0, DispatchTime.now().uptimeNanoseconds - request.started > ctx.bodyDeadlineNanoseconds {
            return .NO
        }
        // Only reachable without a (valid) Content-Length, i.e. chunked uploads. MHD does
        // not accept a response while body data is being delivered, so the excess is
        // consumed and dropped and 413 goes out once the body ends; a client that keeps
        // streaming far past the limit is disconnected instead.
        uploadSize.pointee = 0
        if request.tooLarge {
            request.discardedBytes += chunkSize
            return request.discardedBytes > max(ctx.maxBodyBytes, 1 << 20) ? .NO : .YES
        }
        if request.body.count + chunkSize > ctx.maxBodyBytes {
            request.tooLarge = true
            request.discardedBytes = request.body.count + chunkSize
            request.body = []
            return .YES
        }
        if let uploadData {
            request.body.append(contentsOf: UnsafeRawBufferPointer(start: uploadData, count: chunkSize))
        }
        return .YES
    }

    if request.tooLarge { return queue(payloadTooLarge, on: connection) }

    let (path, query) = splitTarget(request.target)
    let httpRequest = HTTPRequest(
        method: method.map { String(cString: $0) } ?? "",
        path: path,
        query: query,
        headers: requestHeaders(connection),
        body: request.body,
        remoteAddress: clientAddress(connection))
    request.body = []  // the handler owns the bytes now
    return queue(ctx.handler(httpRequest), on: connection)
}

// MARK: - Helpers for the callbacks

private let payloadTooLarge = HTTPResponse(
    status: 413, headers: [(name: "content-type", value: "text/plain")],
    body: Array("request body too large\n".utf8))

private let internalError = HTTPResponse(
    status: 500, headers: [(name: "content-type", value: "text/plain")],
    body: Array("internal server error\n".utf8))

/// Queues `response`; if libmicrohttpd rejects it (bad status, bad header), queues a 500.
private func queue(_ response: HTTPResponse, on connection: OpaquePointer) -> MHD_Result {
    if enqueue(response, on: connection) { return .YES }
    // Returning MHD_NO makes libmicrohttpd close the connection: the last resort.
    return enqueue(internalError, on: connection) ? .YES : .NO
}

private func enqueue(_ response: HTTPResponse, on connection: OpaquePointer) -> Bool {
    guard (100...999).contains(response.status) else { return false }
    let created = response.body.withUnsafeBytes { bytes in
        MHD_create_response_from_buffer(bytes.count, UnsafeMutableRawPointer(mutating: bytes.baseAddress),
                                        .RESPMEM_MUST_COPY)
    }
    guard let mhdResponse = created else { return false }
    defer { MHD_destroy_response(mhdResponse) }  // MHD keeps its own reference once queued

    for (name, value) in response.headers {
        // MHD derives content-length from the body; it refuses a second one.
        if name.caseInsensitiveCompare("content-length") == .orderedSame { continue }
        guard isValidHeader(name: name, value: value),
              MHD_add_response_header(mhdResponse, name, value) == .YES else { return false }
    }
    return MHD_queue_response(connection, UInt32(response.status), mhdResponse) == .YES
}

/// Header names must be tokens and values must not contain CR, LF or NUL (which would
/// also be silently truncated on the way to C).
private func isValidHeader(name: String, value: String) -> Bool {
    let separators: Set<UInt8> = Set("()<>@,;:\\\"/[]?={} \t".utf8)
    guard !name.isEmpty, name.utf8.allSatisfy({ $0 > 32 && $0 < 127 && !separators.contains($0) }) else {
        return false
    }
    return !value.utf8.contains { $0 == 0 || $0 == 10 || $0 == 13 }
}

/// Splits an origin-form target ("/a/b?x=1") into path and raw query. An absolute-form
/// target ("http://host/a?x") is reduced to its path first.
private func splitTarget(_ target: String) -> (path: String, query: String?) {
    var rest = Substring(target)
    if let scheme = rest.range(of: "://"), !rest.hasPrefix("/") {
        let afterAuthority = rest[scheme.upperBound...]
        rest = afterAuthority.firstIndex(where: { $0 == "/" || $0 == "?" }).map { afterAuthority[$0...] } ?? "/"
        if rest.hasPrefix("?") { rest = "/" + rest }
    }
    guard let mark = rest.firstIndex(of: "?") else { return (String(rest), nil) }
    return (String(rest[..<mark]), String(rest[rest.index(after: mark)...]))
}

private final class HeaderCollector {
    var headers: [(name: String, value: String)] = []
}

private func requestHeaders(_ connection: OpaquePointer) -> [(name: String, value: String)] {
    let collector = HeaderCollector()
    withExtendedLifetime(collector) {
        _ = MHD_get_connection_values(connection, .HEADER_KIND, { cls, _, key, value in
            guard let cls, let key else { return .YES }
            let collector = Unmanaged<HeaderCollector>.fromOpaque(cls).takeUnretainedValue()
            collector.headers.append((name: String(cString: key).lowercased(),
                                      value: value.map { String(cString: $0) } ?? ""))
            return .YES
        }, Unmanaged.passUnretained(collector).toOpaque())
    }
    return collector.headers
}

private func clientAddress(_ connection: OpaquePointer) -> String {
    guard let address = attest_mhd_client_address(connection) else { return "" }
    var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
    switch Int32(address.pointee.sa_family) {
    case AF_INET:
        var ipv4 = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr }
        guard inet_ntop(AF_INET, &ipv4, &text, socklen_t(text.count)) != nil else { return "" }
    case AF_INET6:
        var ipv6 = address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_addr }
        guard inet_ntop(AF_INET6, &ipv6, &text, socklen_t(text.count)) != nil else { return "" }
    default:
        return ""
    }
    return String(cString: text)
}

// MARK: - Listening address

/// The socket address to bind, parsed from an IP literal (no name resolution).
private struct SocketAddress {
    let host: String
    let isIPv6: Bool
    private var ipv4 = sockaddr_in()
    private var ipv6 = sockaddr_in6()

    init(host rawHost: String, port: UInt16) throws {
        var literal = rawHost
        if literal.hasPrefix("["), literal.hasSuffix("]") { literal = String(literal.dropFirst().dropLast()) }
        host = literal
        if inet_pton(AF_INET, literal, &ipv4.sin_addr) == 1 {
            isIPv6 = false
            ipv4.sin_family = sa_family_t(AF_INET)
            ipv4.sin_port = port.bigEndian
        } else if inet_pton(AF_INET6, literal, &ipv6.sin6_addr) == 1 {
            isIPv6 = true
            ipv6.sin6_family = sa_family_t(AF_INET6)
            ipv6.sin6_port = port.bigEndian
        } else {
            throw HTTPServerError("invalid listen host \"\(rawHost)\": expected an IPv4 or IPv6 literal")
        }
    }

    /// Runs `body` with a pointer to the sockaddr (only valid during the call).
    mutating func withSockaddr<T>(_ body: (UnsafeMutableRawPointer) -> T) -> T {
        isIPv6 ? withUnsafeMutablePointer(to: &ipv6) { body($0) }
               : withUnsafeMutablePointer(to: &ipv4) { body($0) }
    }
}
