import CMicroHTTPD
import EventLoops
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// HTTP/1.1 server on libmicrohttpd: one daemon per event loop, all accepting from one
/// listening socket. The handler is called on the loop that owns the connection, once per
/// complete request; it answers at once (`.response`) or later through the
/// `HTTPResponseWriter` (`.deferred`), possibly as a stream, from any thread. Work the handler
/// starts on the same loop (an upstream transfer on a client sharing the group) answers without
/// a thread hand-off.
///
/// Do not call `stop()` from inside the handler: stopping waits for the loops.
public final class HTTPServer: Sendable {
    private let configuration: HTTPServerConfiguration
    /// The loops given at creation; nil: the server starts `configuration.threads` of its own.
    private let sharedLoops: EventLoopGroup?
    private let handler: @Sendable (HTTPRequest, HTTPResponseWriter) -> HTTPHandlerResult
    private let counters = ServerCounters()
    private let totals = ServerTotals()
    /// Held while starting and stopping, so the two never interleave. Not `running`'s lock: stop()
    /// waits for the loops, and a handler on a loop may read `running` (the stats for /metrics).
    private let lifecycle = Mutex<Void>(())
    /// What runs now; its lock is held only to read or set it.
    private let running = Mutex<Running?>(nil)
    private let boundPort = Atomic<UInt16>(0)

    private struct Running {
        let drivers: [DaemonDriver]
        let core: ServerCore
        /// Started by this run (and stopped with it) when no loops were given.
        let ownLoops: EventLoopGroup?
    }

    /// A server whose handler may answer later or stream (see `HTTPHandlerResult`), on `loops`
    /// (one daemon per loop) or, when nil, on `configuration.threads` loops of its own.
    public init(configuration: HTTPServerConfiguration, loops: EventLoopGroup? = nil,
                handler: @escaping @Sendable (HTTPRequest, HTTPResponseWriter) -> HTTPHandlerResult) {
        self.configuration = configuration
        self.sharedLoops = loops
        self.handler = handler
    }

    /// A server whose handler always answers at once.
    public convenience init(configuration: HTTPServerConfiguration, loops: EventLoopGroup? = nil,
                            handler: @escaping @Sendable (HTTPRequest) -> HTTPResponse) {
        self.init(configuration: configuration, loops: loops) { request, _ in .response(handler(request)) }
    }

    deinit { stop() }

    /// The port actually bound (resolves port 0); 0 when not running.
    public var port: UInt16 { boundPort.load(ordering: .acquiring) }

    /// Number of per-request contexts (writers) currently alive (tests check for leaks).
    var liveRequestContexts: Int { counters.liveRequests.load(ordering: .relaxed) }

    /// Suspended connections in the monitor's hang-up watch now (tests).
    var hangUpWatchCount: Int { running.withLock { $0?.core.monitor.watchedCount } ?? 0 }

    /// Request-body bytes currently reserved against `maxBufferedBodyBytes`.
    var bufferedBodyBytes: Int { counters.bufferedBodyBytes.load(ordering: .relaxed) }

    public func start() throws {
        try lifecycle.withLock { _ in
            guard running.withLock({ $0 == nil }) else { throw HTTPServerError("server already started") }
            let launched = try launch()
            running.withLock { $0 = launched.running }
            boundPort.store(launched.port, ordering: .releasing)
        }
    }

    /// Stops listening, ends every connection and waits for running handlers. Open streams and
    /// unanswered deferred requests are cancelled (their `onCancel` runs). Idempotent.
    public func stop() {
        lifecycle.withLock { _ in
            guard let current = running.withLock({ $0 }) else { return }
            // libmicrohttpd aborts if stopped with suspended connections, so first refuse new
            // suspensions and wake every suspended connection with its request cancelled (not
            // every suspended connection is in the monitor's watch, so every open request is).
            current.core.monitor.beginStop()
            for writer in current.core.registry.currentWriters() { writer.abort(serverStopping: true) }
            // Each daemon stops on its loop; completion callbacks release the remaining request contexts.
            for driver in current.drivers { driver.stop() }
            current.core.monitor.shutdown()
            current.ownLoops?.shutdown()
            running.withLock { $0 = nil }
            boundPort.store(0, ordering: .releasing)
        }
    }

    /// Stops gracefully, within `grace` seconds: no new connections are served (they are closed
    /// as soon as they are accepted), idle keep-alives and slow heads or bodies are closed at
    /// once, requests in flight are finished (answers queued from now on carry
    /// `Connection: close`), every open stream or pending deferred answer gets its `onShutdown`
    /// callback (so the relay can end it cleanly), and whatever is still open at the deadline is
    /// ended as by `stop()` (its `onCancel` runs). Returns when the server has stopped.
    ///
    /// libmicrohttpd's own MHD_quiesce_daemon is not used to stop accepting: in 0.9.75 it removes
    /// the listening socket from each worker's epoll set from the calling thread while the worker
    /// may be removing it too (daemon.c, MHD_epoll: "was_quiesced" → EPOLL_CTL_DEL), and whichever
    /// loses gets ENOENT and MHD_PANIC aborts the process.
    public func shutdown(grace: Double) {
        guard let (core, drivers) = running.withLock({ r in r.map { ($0.core, $0.drivers) } }) else { return }
        // No new connections: each loop takes what is already waiting for it, then closes its
        // listening socket (a connection that arrives after is refused). What was taken is
        // answered: requests that arrive on it are served, with `Connection: close`.
        for driver in drivers { driver.stopAccepting() }
        for writer in core.registry.beginDraining() { writer.notifyShutdown() }
        let deadline = monotonicNanoseconds() + UInt64(max(0, grace) * 1e9)
        while core.registry.openConnections > 0, monotonicNanoseconds() < deadline {
            usleep(10_000)
        }
        stop()
    }

    /// Open connections by what they are doing, and totals since this server object was created.
    public func stats() -> HTTPServerStats {
        var stats = HTTPServerStats()
        if let core = running.withLock({ $0?.core }) {
            let counts = core.registry.phaseCounts()
            stats.openConnections = counts.total
            stats.waitingConnections = counts.waiting
            stats.receivingHeads = counts.heads
            stats.receivingBodies = counts.bodies
            stats.handling = counts.handling
            stats.responding = counts.responding
            stats.openStreams = counts.streams
            stats.held = counts.held
        }
        stats.bufferedBodyBytes = counters.bufferedBodyBytes.load(ordering: .relaxed)
        stats.connectionsAccepted = totals.accepted.load(ordering: .relaxed)
        stats.requestsCompleted = totals.requests.load(ordering: .relaxed)
        stats.malformedRequests = totals.malformed.load(ordering: .relaxed)
        stats.tooLargeRequests = totals.tooLarge.load(ordering: .relaxed)
        stats.overloadedRequests = totals.overloaded.load(ordering: .relaxed)
        stats.cancelledAnswers = totals.cancelled.load(ordering: .relaxed)
        stats.heldRequests = totals.held.load(ordering: .relaxed)
        stats.unansweredRequests = totals.unanswered.load(ordering: .relaxed)
        let reaped = totals.reapedByReason
        for reason in HTTPReapReason.allCases { stats.reaped[reason] = reaped[reason] ?? 0 }
        return stats
    }

    private func launch() throws -> (running: Running, port: UInt16) {
        let config = configuration
        try Self.validate(config)
        guard let address = IPAddress(config.host) else {
            throw HTTPServerError("invalid listen host \"\(config.host)\": expected an IPv4 or IPv6 literal")
        }
        let endpoint = address.isIPv6 ? "[\(address)]:\(config.port)" : "\(address):\(config.port)"
        raiseDescriptorLimit(toFit: config.maxConnections)

        let listener: ListeningSocket
        let family = address.isIPv6 ? AF_INET6 : AF_INET
        do throws(ListenError) {
            listener = try address.withSockaddr(port: config.port) { (pointer, length) throws(ListenError) in
                try ListeningSocket(address: pointer, length: length, family: family,
                                    backlog: Int32(min(config.maxConnections, 4096)))
            }
        } catch {
            throw HTTPServerError("cannot listen on \(endpoint): \(Self.describeStartFailure(errno: error.code, log: []))")
        }
        defer { listener.close() }  // every daemon holds its own duplicate

        let ownLoops = sharedLoops == nil ? try EventLoopGroup(loops: config.threads, name: "http") : nil
        let loops = (sharedLoops ?? ownLoops!).loops
        let registry = ConnectionRegistry(configuration: config, workers: loops.count, totals: totals)
        let monitor = try ConnectionMonitor(tickMilliseconds: Self.tickMilliseconds(config)) { registry.sweep() }
        let core = ServerCore(configuration: config, handler: handler, counters: counters, totals: totals,
                              registry: registry, monitor: monitor)
        var drivers: [DaemonDriver] = []
        var created: [DaemonDriver] = []
        func unwind() {
            created.forEach { $0.stop() }
            ownLoops?.shutdown()
        }
        do {
            // Every daemon first, then the loops start accepting.
            for (index, loop) in loops.enumerated() {
                // libmicrohttpd's own split of a connection limit across workers.
                let share = max(1, config.maxConnections / loops.count + (index < config.maxConnections % loops.count ? 1 : 0))
                let listenFD = listener.duplicate()
                guard listenFD >= 0 else { throw HTTPServerError("cannot listen on \(endpoint): \(String(cString: strerror(errno)))") }
                let daemon: OpaquePointer
                do { daemon = try startDaemon(core: core, connectionLimit: share, endpoint: endpoint) } catch {
                    close(listenFD)
                    throw error
                }
                do {
                    created.append(try DaemonDriver(daemon: daemon, loop: loop, listenFD: listenFD, connectionLimit: share))
                } catch {
                    MHD_stop_daemon(daemon)
                    close(listenFD)
                    throw error
                }
            }
            for driver in created { driver.onFull = { [monitor] in monitor.wake() } }
            for driver in created {
                core.setDriver(driver, forLoop: driver.loop.index)
                guard driver.loop.run(andWait: { driver.attach() }) == true else {
                    throw HTTPServerError("cannot listen on \(endpoint): the event loop refused the daemon (errno \(errno))")
                }
                drivers.append(driver)
            }
            try monitor.start()
        } catch {
            unwind()
            throw error
        }
        return (Running(drivers: drivers, core: core, ownLoops: ownLoops), listener.port)
    }

    /// One daemon in external-polling epoll mode, without a listening socket of its own: its
    /// driver accepts for it.
    private func startDaemon(core: ServerCore, connectionLimit: Int, endpoint: String) throws -> OpaquePointer {
        let config = configuration
        let corePointer = Unmanaged.passUnretained(core).toOpaque()
        var flags = MHD_USE_ERROR_LOG.rawValue | MHD_ALLOW_SUSPEND_RESUME.rawValue | MHD_USE_NO_LISTEN_SOCKET.rawValue
        #if os(Linux)
        flags |= MHD_USE_EPOLL.rawValue
        #endif
        var options: [MHD_OptionItem] = [
            // First, so that start-up failures are captured rather than printed.
            MHD_OptionItem(option: .EXTERNAL_LOGGER,
                           value: unsafeBitCast(logCallback as MHD_LogCallback, to: Int.self), ptr_value: corePointer),
            MHD_OptionItem(option: .CONNECTION_MEMORY_LIMIT, value: config.connectionMemoryBytes, ptr_value: nil),
            MHD_OptionItem(option: .CONNECTION_LIMIT, value: connectionLimit, ptr_value: nil),
            MHD_OptionItem(option: .CONNECTION_TIMEOUT, value: config.idleTimeoutSeconds, ptr_value: nil),
            MHD_OptionItem(option: .URI_LOG_CALLBACK,
                           value: unsafeBitCast(uriCallback as UriLogCallback, to: Int.self), ptr_value: corePointer),
            MHD_OptionItem(option: .NOTIFY_COMPLETED,
                           value: unsafeBitCast(completedCallback as MHD_RequestCompletedCallback, to: Int.self),
                           ptr_value: corePointer),
            MHD_OptionItem(option: .NOTIFY_CONNECTION,
                           value: unsafeBitCast(connectionCallback as MHD_NotifyConnectionCallback, to: Int.self),
                           ptr_value: corePointer),
            MHD_OptionItem(option: .END, value: 0, ptr_value: nil),
        ]
        core.startupLog.withLock { $0 = [] }
        errno = 0
        // The per-address limit is the registry's (across every daemon), checked on accept.
        let daemon = options.withUnsafeMutableBufferPointer { buffer in
            attest_mhd_start_daemon(flags, acceptPolicy, corePointer, accessHandler, corePointer, buffer.baseAddress)
        }
        let code = errno
        let log = core.startupLog.withLock { lines -> [String] in
            defer { lines = nil }
            return lines ?? []
        }
        guard let daemon else {
            throw HTTPServerError("cannot listen on \(endpoint): \(Self.describeStartFailure(errno: code, log: log))")
        }
        return daemon
    }

    /// How often the reaper looks: a quarter of the shortest deadline, between 10 and 250 ms.
    private static func tickMilliseconds(_ config: HTTPServerConfiguration) -> Int32 {
        let deadlines = [config.headDeadlineSeconds, config.writeTimeoutSeconds, config.bodyGraceSeconds].filter { $0 > 0 }
        let shortest = deadlines.min() ?? 1
        return Int32(min(250, max(10, shortest * 1000 / 4)))
    }

    private static func validate(_ config: HTTPServerConfiguration) throws {
        func check(_ ok: Bool, _ what: String) throws {
            if !ok { throw HTTPServerError("invalid configuration: \(what)") }
        }
        let uintMax = Int(UInt32.max)
        try check((1...1024).contains(config.threads), "threads must be in 1...1024")
        try check(config.maxBodyBytes >= 0, "maxBodyBytes must not be negative")
        try check(config.maxBufferedBodyBytes >= 0, "maxBufferedBodyBytes must not be negative")
        try check(config.bodyBytesReservedUpFront >= 0, "bodyBytesReservedUpFront must not be negative")
        try check(config.connectionMemoryBytes >= 1024, "connectionMemoryBytes must be at least 1024")
        try check(config.maxTargetBytes > 0 && config.maxHeadBytes > 0 && config.maxHeaderFields > 0, "head limits must be positive")
        try check((1...uintMax).contains(config.maxConnections), "maxConnections must be positive")
        try check((0...uintMax).contains(config.maxConnectionsPerIP), "maxConnectionsPerIP must not be negative")
        try check((0...uintMax).contains(config.idleTimeoutSeconds), "idleTimeoutSeconds must not be negative")
        try check(config.streamLowWaterBytes >= 0 && config.streamHighWaterBytes >= config.streamLowWaterBytes,
                  "stream water marks must satisfy 0 <= low <= high")
        try check(config.headDeadlineSeconds >= 0 && config.writeTimeoutSeconds >= 0 && config.bodyGraceSeconds >= 0
                  && config.minBodyBytesPerSecond >= 0 && config.bodyDeadlineSeconds >= 0, "deadlines must not be negative")
        try check(config.slotEvictionThreshold > 0 && config.slotEvictionThreshold <= 1,
                  "slotEvictionThreshold must be in (0, 1]")
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

/// Raises the soft limit on open descriptors (up to the hard limit) so that `connections`
/// sockets plus the process's other files fit. Best effort: libmicrohttpd copes with EMFILE.
private func raiseDescriptorLimit(toFit connections: Int) {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
    let wanted = rlim_t(connections + 256)
    guard limit.rlim_cur < wanted else { return }
    limit.rlim_cur = min(wanted, limit.rlim_max)
    _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
}

/// Counters that outlive one run of the server (tests read them after `stop`).
final class ServerCounters: Sendable {
    let liveRequests = Atomic<Int>(0)
    let bufferedBodyBytes = Atomic<Int>(0)
}

// MARK: - State shared with the C callbacks

/// Everything the C callbacks need; passed to libmicrohttpd as the `cls` pointer. Kept alive by
/// the server while the daemon runs and by every request context (writer) after that.
final class ServerCore: Sendable {
    let configuration: HTTPServerConfiguration
    let handler: @Sendable (HTTPRequest, HTTPResponseWriter) -> HTTPHandlerResult
    let counters: ServerCounters
    let totals: ServerTotals
    let registry: ConnectionRegistry
    let monitor: ConnectionMonitor
    /// 0 = no deadline.
    let bodyDeadlineNanoseconds: UInt64
    /// libmicrohttpd log lines while the daemon starts (nil otherwise: runtime messages such as
    /// "connection limit reached" are routine under load and dropped).
    let startupLog = Mutex<[String]?>(nil)
    /// The daemon on each loop, by loop index (set before the daemon accepts anything).
    private let drivers = Mutex<[Int: DaemonDriver]>([:])

    func setDriver(_ driver: DaemonDriver, forLoop index: Int) {
        drivers.withLock { $0[index] = driver }
    }

    /// The daemon whose callback is running on this thread.
    func currentDriver() -> DaemonDriver? {
        guard let loop = EventLoop.current else { return nil }
        return drivers.withLock { $0[loop.index] }
    }

    init(configuration: HTTPServerConfiguration,
         handler: @escaping @Sendable (HTTPRequest, HTTPResponseWriter) -> HTTPHandlerResult,
         counters: ServerCounters, totals: ServerTotals, registry: ConnectionRegistry, monitor: ConnectionMonitor) {
        self.configuration = configuration
        self.handler = handler
        self.counters = counters
        self.totals = totals
        self.registry = registry
        self.monitor = monitor
        self.bodyDeadlineNanoseconds = UInt64(max(0, configuration.bodyDeadlineSeconds) * 1e9)
    }

    /// Reserves `bytes` of the global request-body budget; false (and nothing reserved) if that
    /// would exceed `maxBufferedBodyBytes`.
    func reserveBodyBytes(_ bytes: Int) -> Bool {
        let total = counters.bufferedBodyBytes.wrappingAdd(bytes, ordering: .relaxed).newValue
        if total > configuration.maxBufferedBodyBytes {
            counters.bufferedBodyBytes.wrappingSubtract(bytes, ordering: .relaxed)
            return false
        }
        return true
    }

    func releaseBodyBytes(_ bytes: Int) {
        counters.bufferedBodyBytes.wrappingSubtract(bytes, ordering: .relaxed)
    }

    func bodyLimit(method: String, path: String) -> Int {
        configuration.bodyLimit?(method, path) ?? configuration.maxBodyBytes
    }

    /// The configured refusal for `status` on `path`, counted (413 as too large, the rest as
    /// malformed).
    func refusal(_ status: Int, path: String) -> HTTPResponse {
        if status == 413 { totals.tooLarge.add(1, ordering: .relaxed) } else { totals.malformed.add(1, ordering: .relaxed) }
        return configuration.refusalResponse(status, path)
    }
}

// MARK: - C callbacks (no captures: they are plain C function pointers)

private typealias UriLogCallback = @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, OpaquePointer?)
    -> UnsafeMutableRawPointer?

private func logCallback(_ cls: UnsafeMutableRawPointer?, _ format: UnsafePointer<CChar>?, _ arguments: CVaListPointer?) {
    guard let cls, let format, let arguments else { return }
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    var buffer = [CChar](repeating: 0, count: 512)
    _ = attest_mhd_format_log(&buffer, buffer.count, format, arguments)
    let line = trimmed(buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) })
    // "Too large value of 'Content-Length' header." / "Failed to parse `Content-Length' header.":
    // libmicrohttpd is about to answer with two status lines; answer once ourselves instead.
    if line.utf8.count > 14, line.contains("Content-Length") {
        core.registry.answerMalformedContentLength(worker: pthread_self())
    }
    core.startupLog.withLock { lines in
        guard lines != nil, lines!.count < 32 else { return }
        lines!.append(line)
    }
}

/// Connection accepted (STARTED) or about to be closed (CLOSED); the socket context holds our
/// record in between.
private func connectionCallback(_ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
                                _ socketContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
                                _ code: MHD_ConnectionNotificationCode) {
    guard let cls, let connection, let socketContext else { return }
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    if code == .CONNECTION_NOTIFY_STARTED {
        let record = ConnectionRecord(connection: ConnectionHandle(pointer: connection),
                                      fd: attest_mhd_connection_fd(connection), worker: pthread_self(),
                                      address: attest_mhd_client_address(connection).flatMap(IPAddress.init),
                                      driver: core.currentDriver(), now: monotonicNanoseconds())
        socketContext.pointee = Unmanaged.passRetained(record).toOpaque()
        if core.registry.opened(record) { core.monitor.wake() }
    } else if let raw = socketContext.pointee {
        socketContext.pointee = nil
        let record = Unmanaged<ConnectionRecord>.fromOpaque(raw).takeRetainedValue()
        core.registry.closed(record)
        record.driver?.connectionClosed()
    }
}

/// Before libmicrohttpd takes a new connection: refused (closed at once) when its address
/// already holds `maxConnectionsPerIP` connections across every daemon of the server.
private func acceptPolicy(_ cls: UnsafeMutableRawPointer?, _ address: UnsafePointer<sockaddr>?, _ length: socklen_t) -> MHD_Result {
    guard let cls, let address, let peer = IPAddress(address) else { return .YES }
    return Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue().registry.admits(peer) ? .YES : .NO
}

/// Our record for a connection (nil only if the notification callback did not run).
private func record(of connection: OpaquePointer) -> ConnectionRecord? {
    attest_mhd_socket_context(connection).map { Unmanaged<ConnectionRecord>.fromOpaque($0).takeUnretainedValue() }
}

/// Called once per request, right after the request line, before any access-handler call.
/// Its return value becomes `*req_cls`; it also gives us the raw (undecoded) target.
private func uriCallback(_ cls: UnsafeMutableRawPointer?, _ uri: UnsafePointer<CChar>?,
                         _ connection: OpaquePointer?) -> UnsafeMutableRawPointer? {
    guard let cls, let connection else { return nil }
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    let connectionRecord = record(of: connection)
    let writer = HTTPResponseWriter(core: core, connection: ConnectionHandle(pointer: connection),
                                    record: connectionRecord, target: uri.map { String(cString: $0) } ?? "/")
    connectionRecord?.beginRequest(writer)
    return Unmanaged.passRetained(writer).toOpaque()
}

private func completedCallback(_ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
                               _ reqCls: UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
                               _ code: MHD_RequestTerminationCode) {
    guard let reqCls, let raw = reqCls.pointee else { return }
    reqCls.pointee = nil
    let writer = Unmanaged<HTTPResponseWriter>.fromOpaque(raw).takeRetainedValue()
    writer.completed()
}

/// Called after the headers (upload size 0), for each body chunk, and once more when the
/// request is complete (upload size 0 again; again after each resume while no response is queued).
private func accessHandler(_ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
                           _ url: UnsafePointer<CChar>?, _ method: UnsafePointer<CChar>?,
                           _ version: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
                           _ uploadSize: UnsafeMutablePointer<Int>?,
                           _ reqCls: UnsafeMutablePointer<UnsafeMutableRawPointer?>?) -> MHD_Result {
    guard let cls, let connection, let uploadSize, let reqCls else { return .NO }
    let writer: HTTPResponseWriter
    if let raw = reqCls.pointee {
        writer = Unmanaged<HTTPResponseWriter>.fromOpaque(raw).takeUnretainedValue()
    } else {
        // Not expected (the URI callback always runs first), but stay correct if it did not.
        let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
        writer = HTTPResponseWriter(core: core, connection: ConnectionHandle(pointer: connection),
                                    record: record(of: connection), target: url.map { String(cString: $0) } ?? "/")
        reqCls.pointee = Unmanaged.passRetained(writer).toOpaque()
    }
    return writer.access(connection: connection, method: method, version: version, uploadData: uploadData,
                         uploadSize: uploadSize)
}

private func contentReader(_ cls: UnsafeMutableRawPointer?, _ position: UInt64,
                           _ buffer: UnsafeMutablePointer<CChar>?, _ max: Int) -> Int {
    guard let cls, let buffer else { return contentReaderEndWithError }
    return Unmanaged<HTTPResponseWriter>.fromOpaque(cls).takeUnretainedValue().readChunk(into: buffer, max: max)
}

private func contentReaderFree(_ cls: UnsafeMutableRawPointer?) {
    guard let cls else { return }
    Unmanaged<HTTPResponseWriter>.fromOpaque(cls).release()
}

// MARK: - Request processing (on the event loop that runs the connection's daemon)

extension HTTPResponseWriter {
    fileprivate func access(connection: OpaquePointer, method: UnsafePointer<CChar>?, version: UnsafePointer<CChar>?,
                            uploadData: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>) -> MHD_Result {
        let headersSeen = state.withLock { $0.headersSeen }
        if !headersSeen { return headersArrived(connection: connection, method: method, version: version) }

        let chunkSize = uploadSize.pointee
        if chunkSize > 0 {
            uploadSize.pointee = 0
            return bodyChunk(UnsafeRawBufferPointer(start: uploadData, count: chunkSize))
        }
        return requestComplete(connection: connection)
    }

    private func headersArrived(connection: OpaquePointer, method rawMethod: UnsafePointer<CChar>?,
                                version: UnsafePointer<CChar>?) -> MHD_Result {
        let method = rawMethod.map { String(cString: $0) } ?? ""
        let (path, query) = splitTarget(target)
        let headers = requestHeaders(connection)
        // Oversize heads first: answered by us, in the route's shape, rather than by
        // libmicrohttpd once its memory pool is full.
        let config = core.configuration
        if target.utf8.count > config.maxTargetBytes { return refuse(414, path: path, on: connection) }
        if headers.count > config.maxHeaderFields || attest_mhd_request_header_size(connection) > config.maxHeadBytes {
            return refuse(431, path: path, on: connection)
        }
        switch checkFraming(headers, http11: version.map { strcmp($0, "HTTP/1.1") == 0 } ?? false) {
        case .malformed: return refuse(400, path: path, on: connection)
        case .unsupportedTransferEncoding: return refuse(501, path: path, on: connection)
        case .ok: break
        }
        let limit = core.bodyLimit(method: method, path: path)
        var declared: UInt64?
        // Refuse a declared oversize body before reading any of it. libmicrohttpd then skips
        // the upload and closes the connection after the answer.
        if let value = headers.first(where: { $0.name == "content-length" })?.value {
            if !value.isEmpty, value.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) {
                declared = UInt64(value) ?? .max  // digits only: nil means overflow
            }
        }
        var reserved = 0
        if let declared {
            if declared > UInt64(limit) { return refuse(413, path: path, on: connection) }
            // Up to `bodyBytesReservedUpFront` now; the rest as it arrives (bodyChunk).
            let upFront = min(Int(declared), config.bodyBytesReservedUpFront)
            if upFront > 0 {
                guard core.reserveBodyBytes(upFront) else {
                    core.totals.overloaded.add(1, ordering: .relaxed)
                    return send(core.configuration.overloadedResponse(path), on: connection)
                }
                reserved = upFront
            }
        }
        let chunked = headers.contains { $0.name == "transfer-encoding" }
        state.withLock { s in
            s.headersSeen = true
            s.method = method
            s.path = path
            s.query = query
            s.headers = headers
            s.bodyLimit = limit
            s.reservedBodyBytes = reserved
            if reserved > 0 { s.body.reserveCapacity(reserved) }
        }
        record?.enter(.body)
        if chunked || (declared ?? 0) > 0 { record?.driver?.noteReceiving(self) }
        return .YES
    }

    private enum Framing { case ok, malformed, unsupportedTransferEncoding }

    /// What libmicrohttpd lets through but RFC 9112 does not (it answers malformed and
    /// overflowing Content-Length values itself; see `answerMalformedContentLength`).
    private func checkFraming(_ headers: [(name: String, value: String)], http11: Bool) -> Framing {
        var hosts = 0, contentLengths = 0
        var transferEncodings: [String] = []
        for (name, value) in headers {
            switch name {
            case "host": hosts += 1
            case "content-length": contentLengths += 1
            case "transfer-encoding": transferEncodings.append(value)
            default: if !name.utf8.allSatisfy(isTokenByte) { return .malformed }  // e.g. "bad name: x"
            }
        }
        // §3.2: exactly one Host in HTTP/1.1, at most one otherwise.
        if hosts > 1 || (http11 && hosts == 0) { return .malformed }
        if !transferEncodings.isEmpty {
            // Only "chunked" is implemented (libmicrohttpd would otherwise wait for the body
            // to end with the connection); with Content-Length as well it is a smuggling attempt.
            // Compared as libmicrohttpd compares it (it drops only the blanks before a value):
            // "chunked " passed a trimmed check, and libmicrohttpd took the chunks as a body.
            guard transferEncodings.count == 1, asciiCaseInsensitiveEquals(transferEncodings[0], "chunked") else {
                return .unsupportedTransferEncoding
            }
            if contentLengths > 0 { return .malformed }
        }
        // libmicrohttpd reads the first Content-Length and would take the rest for the next request.
        if contentLengths > 1 { return .malformed }
        return .ok
    }

    private func bodyChunk(_ chunk: UnsafeRawBufferPointer) -> MHD_Result {
        // The idle timeout resets on every byte; this bounds a body trickled in slowly on purpose.
        if core.bodyDeadlineNanoseconds > 0, monotonicNanoseconds() - started > core.bodyDeadlineNanoseconds {
            core.totals.countReap(.bodyDeadline)
            return .NO
        }
        // Bodies with a valid Content-Length never exceed it (libmicrohttpd stops there), so the
        // limits below only bite on chunked uploads. MHD does not accept a response while body
        // data is being delivered, so the excess is consumed and dropped and the refusal goes
        // out once the body ends; a client that keeps streaming far past the limit is
        // disconnected instead.
        var released = 0
        let keepGoing = state.withLock { s -> Bool in
            if s.refusal != nil {
                s.discardedBytes += chunk.count
                return s.discardedBytes <= max(s.bodyLimit, 1 << 20)
            }
            let total = s.body.count + chunk.count
            var refusal: HTTPResponse?
            if total > s.bodyLimit {
                refusal = core.refusal(413, path: s.path)
            } else if total > s.reservedBodyBytes {
                let more = total - s.reservedBodyBytes
                if core.reserveBodyBytes(more) {
                    s.reservedBodyBytes += more
                } else {
                    refusal = core.configuration.overloadedResponse(s.path)
                    core.totals.overloaded.add(1, ordering: .relaxed)
                }
            }
            if let refusal {
                s.refusal = refusal
                s.discardedBytes = total
                s.body = []
                released = s.reservedBodyBytes
                s.reservedBodyBytes = 0
                return true
            }
            s.body.append(contentsOf: chunk)
            return true
        }
        record?.addBodyBytes(chunk.count)
        if released > 0 { core.releaseBodyBytes(released) }
        if keepGoing { record?.driver?.noteReceiving(self) }
        return keepGoing ? .YES : .NO
    }

    private func requestComplete(connection: OpaquePointer) -> MHD_Result {
        enum Next {
            case refuse(HTTPResponse)
            case callHandler(HTTPRequestParts)
            case deliver
            case hold
            case close
        }
        // Only a request that follows another on its connection can find answers still unread.
        let unreadLimit = core.configuration.maxUnreadResponseBytes
        let mayHold = unreadLimit > 0 && record?.hasServedRequests == true
        let next = state.withLock { s -> Next in
            if let refusal = s.refusal {
                s.refusal = nil
                s.queued = true
                return .refuse(refusal)
            }
            guard !s.handlerCalled else { return .deliver }
            if s.cancelled { return .close }   // held, and the client hung up
            // Pipelined behind answers the client has not read: no work for it until it reads.
            if mayHold, let record, unreadBytes(record.fd) > unreadLimit, suspend(&s) {
                s.heldForUnread = true
                return .hold
            }
            s.handlerCalled = true
            let parts = HTTPRequestParts(method: s.method, path: s.path, query: s.query, headers: s.headers, body: s.body)
            s.body = []  // the handler owns the bytes now
            s.headers = []
            return .callHandler(parts)
        }
        switch next {
        case .refuse(let response):
            return send(response, on: connection, close: true)
        case .deliver:
            return deliverAnswer(connection: connection)
        case .hold:
            core.totals.held.add(1, ordering: .relaxed)
            record?.enter(.held)
            return .YES
        case .close:
            return .NO
        case .callHandler(let parts):
            record?.enter(.handling)
            let request = HTTPRequest(method: parts.method, path: parts.path, query: parts.query,
                                      lowercasedHeaders: parts.headers, body: parts.body,
                                      remoteAddress: clientAddress(connection))
            switch core.handler(request, self) {
            case .response(let response):
                // The common case: one lock to note that the writer was not used.
                let writerUsed = state.withLock { s -> Bool in
                    if case .none = s.answer {
                        s.queued = true
                        return false
                    }
                    s.handlerOwnsAnswer = true
                    return true
                }
                return writerUsed ? deliverAnswer(connection: connection) : send(response, on: connection)
            case .deferred:
                state.withLock { $0.handlerOwnsAnswer = true }
                return deliverAnswer(connection: connection)
            }
        }
    }

    /// Queues the producer's answer if there is one, or suspends the connection until there is.
    private func deliverAnswer(connection: OpaquePointer) -> MHD_Result {
        enum Step {
            case alreadyQueued, close, wait
            case complete(HTTPResponse)
            case stream(Int, [(name: String, value: String)])
            case stopping((@Sendable () -> Void)?)
        }
        let step = state.withLock { s -> Step in
            if s.queued { return .alreadyQueued }
            if s.cancelled {
                guard s.stopping else { return .close }   // the client is gone
                s.queued = true
                return .stopping(nil)
            }
            switch s.answer {
            case .complete(let response):
                s.queued = true
                return .complete(response)
            case .stream(let status, let headers):
                s.queued = true
                return .stream(status, headers)
            case .none:
                if suspend(&s) { return .wait }
                s.cancelled = true
                s.queued = true
                return .stopping(s.takeCancelCallback())
            }
        }
        switch step {
        case .alreadyQueued, .wait: return .YES
        case .close: return .NO  // libmicrohttpd closes the connection; completion follows
        case .complete(let response): return send(response, on: connection)
        case .stream(let status, let headers): return queueStream(status: status, headers: headers, on: connection)
        case .stopping(let callback):
            callback?()
            return send(serviceUnavailable, on: connection)
        }
    }

    /// Queues a complete response (with `Connection: close` if asked, or once a graceful
    /// shutdown began).
    private func send(_ response: HTTPResponse, on connection: OpaquePointer, close: Bool = false) -> MHD_Result {
        record?.enter(.responding)
        return queue(response, on: connection, close: close || core.registry.isDraining)
    }

    /// Refuses the request with the configured refusal for `status`, and closes the connection.
    private func refuse(_ status: Int, path: String, on connection: OpaquePointer) -> MHD_Result {
        send(core.refusal(status, path: path), on: connection, close: true)
    }

    /// Queues a chunked response whose body comes from `readChunk`.
    private func queueStream(status: Int, headers: [(name: String, value: String)],
                             on connection: OpaquePointer) -> MHD_Result {
        guard (100...999).contains(status) else { return failStream(on: connection) }
        let context = Unmanaged.passRetained(self).toOpaque()
        // The block size is only used for HTTP/1.0 clients (no chunked encoding); chunks for
        // HTTP/1.1 are built in the connection's own write buffer.
        guard let response = MHD_create_response_from_callback(UInt64.max, 4096, contentReader, context,
                                                                contentReaderFree) else {
            Unmanaged<HTTPResponseWriter>.fromOpaque(context).release()
            return failStream(on: connection)
        }
        defer { MHD_destroy_response(response) }  // MHD keeps its own reference once queued
        let draining = core.registry.isDraining
        for (name, value) in headers {
            if asciiCaseInsensitiveEquals(name, "content-length") || asciiCaseInsensitiveEquals(name, "transfer-encoding") {
                continue
            }
            if draining, asciiCaseInsensitiveEquals(name, "connection") { continue }
            guard isValidHeader(name: name, value: value),
                  MHD_add_response_header(response, name, value) == .YES else { return failStream(on: connection) }
        }
        if draining { _ = MHD_add_response_header(response, "Connection", "close") }
        record?.enter(.streaming)
        guard MHD_queue_response(connection, UInt32(status), response) == .YES else { return failStream(on: connection) }
        return .YES
    }

    /// The producer's stream cannot start (bad status or header): 500, and the producer is told.
    private func failStream(on connection: OpaquePointer) -> MHD_Result {
        let callback = state.withLock { s -> (@Sendable () -> Void)? in
            s.cancelled = true
            return s.takeCancelCallback()
        }
        callback?()
        return send(internalError, on: connection)
    }
}

/// What the handler's `HTTPRequest` is built from, taken out of the writer's state.
private struct HTTPRequestParts {
    let method: String
    let path: String
    let query: String?
    let headers: [(name: String, value: String)]
    let body: [UInt8]
}

// MARK: - Helpers for the callbacks

private let internalError = HTTPResponse(
    status: 500, headers: [(name: "content-type", value: "text/plain")],
    body: Array("internal server error\n".utf8))

private let serviceUnavailable = HTTPResponse(
    status: 503, headers: [(name: "content-type", value: "text/plain"), (name: "connection", value: "close")],
    body: Array("server stopping\n".utf8))

/// Queues `response`; if libmicrohttpd rejects it (bad status, bad header), queues a 500.
private func queue(_ response: HTTPResponse, on connection: OpaquePointer, close: Bool) -> MHD_Result {
    if enqueue(response, on: connection, close: close) { return .YES }
    // Returning MHD_NO makes libmicrohttpd close the connection: the last resort.
    return enqueue(internalError, on: connection, close: close) ? .YES : .NO
}

private func enqueue(_ response: HTTPResponse, on connection: OpaquePointer, close: Bool) -> Bool {
    guard (100...999).contains(response.status) else { return false }
    let created = response.body.withUnsafeBytes { bytes in
        MHD_create_response_from_buffer(bytes.count, UnsafeMutableRawPointer(mutating: bytes.baseAddress),
                                        .RESPMEM_MUST_COPY)
    }
    guard let mhdResponse = created else { return false }
    defer { MHD_destroy_response(mhdResponse) }  // MHD keeps its own reference once queued

    for (name, value) in response.headers {
        // MHD derives content-length from the body; it refuses a second one.
        if asciiCaseInsensitiveEquals(name, "content-length") { continue }
        if close, asciiCaseInsensitiveEquals(name, "connection") { continue }
        // withCString: a short Swift string passed as a C pointer would be copied to the heap.
        guard isValidHeader(name: name, value: value),
              name.withCString({ n in value.withCString { MHD_add_response_header(mhdResponse, n, $0) } }) == .YES else { return false }
    }
    if close, MHD_add_response_header(mhdResponse, "Connection", "close") != .YES { return false }
    return MHD_queue_response(connection, UInt32(response.status), mhdResponse) == .YES
}

/// Header names must be tokens and values must not contain CR, LF or NUL (which would
/// also be silently truncated on the way to C).
private func isValidHeader(name: String, value: String) -> Bool {
    guard !name.isEmpty, name.utf8.allSatisfy(isTokenByte) else { return false }
    return !value.utf8.contains { $0 == 0 || $0 == 10 || $0 == 13 }
}

/// RFC 9110 tchar.
private func isTokenByte(_ byte: UInt8) -> Bool {
    switch byte {
    case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
        return true
    case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
         UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
         UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
        return true
    default:
        return false
    }
}

func asciiCaseInsensitiveEquals(_ a: String, _ b: StaticString) -> Bool {
    let lhs = a.utf8
    guard lhs.count == b.utf8CodeUnitCount else { return false }
    return b.withUTF8Buffer { rhs in
        zip(lhs, rhs).allSatisfy { asciiLowercased($0) == asciiLowercased($1) }
    }
}

func asciiLowercased(_ byte: UInt8) -> UInt8 {
    (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z")) ? byte | 0x20 : byte
}

func trimmed(_ text: String) -> String {
    let bytes = Array(text.utf8)
    var start = 0, end = bytes.count
    while start < end, bytes[start] == 32 || bytes[start] == 9 || bytes[start] == 10 || bytes[start] == 13 { start += 1 }
    while end > start, bytes[end - 1] == 32 || bytes[end - 1] == 9 || bytes[end - 1] == 10 || bytes[end - 1] == 13 { end -= 1 }
    return String(decoding: bytes[start..<end], as: UTF8.self)
}

/// The path and query of a request target: origin form (`/p?q`) or absolute form
/// (`http://host/p?q`, whose scheme and authority are dropped). Byte by byte: the delimiters
/// are ASCII, and walking Characters cost 1% of a relayed request.
func splitTarget(_ target: String) -> (path: String, query: String?) {
    let bytes = target.utf8
    var start = bytes.startIndex
    if bytes.first != UInt8(ascii: "/"), let scheme = target.firstRange(of: "://") {
        guard let next = bytes[scheme.upperBound...].firstIndex(where: { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") }) else {
            return ("/", nil)
        }
        if bytes[next] == UInt8(ascii: "?") { return ("/", String(target[bytes.index(after: next)...])) }
        start = next
    }
    guard let mark = bytes[start...].firstIndex(of: UInt8(ascii: "?")) else { return (String(target[start...]), nil) }
    return (String(target[start..<mark]), String(target[bytes.index(after: mark)...]))
}

/// The request's headers, names lowercased. Sized up front from MHD's count, and each name
/// lowercased while it is copied: growing the array and lowercasing a copy were a quarter of
/// the allocations the server made per request.
private func requestHeaders(_ connection: OpaquePointer) -> [(name: String, value: String)] {
    var headers: [(name: String, value: String)] = []
    headers.reserveCapacity(Int(max(0, MHD_get_connection_values(connection, .HEADER_KIND, nil, nil))))
    withUnsafeMutablePointer(to: &headers) { target in
        _ = MHD_get_connection_values(connection, .HEADER_KIND, { cls, _, key, value in
            guard let cls, let key else { return .YES }
            let length = strlen(key)
            let name = String(unsafeUninitializedCapacity: length) { out in
                for index in 0..<length { out[index] = asciiLowercased(UInt8(bitPattern: key[index])) }
                return length
            }
            cls.assumingMemoryBound(to: [(name: String, value: String)].self).pointee
                .append((name: name, value: value.map { String(cString: $0) } ?? ""))
            return .YES
        }, UnsafeMutableRawPointer(target))
    }
    return headers
}

private func clientAddress(_ connection: OpaquePointer) -> String {
    attest_mhd_client_address(connection).flatMap(IPAddress.init)?.description ?? ""
}

