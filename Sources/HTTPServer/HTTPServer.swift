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

    /// The turn of the daemon whose callback runs on the calling thread, or nil elsewhere (tests:
    /// which requests one turn of a loop handled).
    var currentDaemonTurn: UInt64? { running.withLock { $0?.core }?.currentDriver()?.turn }

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
            // A producer may have taken a connection out of suspension just before; its
            // MHD_resume_connection must happen before the daemon frees the connection.
            while current.core.resumesInFlight.load(ordering: .acquiring) > 0 { sched_yield() }
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
            stats.waitingForTurn = counts.waitingTurn
        }
        stats.bufferedBodyBytes = counters.bufferedBodyBytes.load(ordering: .relaxed)
        stats.connectionsAccepted = totals.accepted.load(ordering: .relaxed)
        stats.requestsCompleted = totals.requests.load(ordering: .relaxed)
        stats.malformedRequests = totals.malformed.load(ordering: .relaxed)
        stats.tooLargeRequests = totals.tooLarge.load(ordering: .relaxed)
        stats.overloadedRequests = totals.overloaded.load(ordering: .relaxed)
        stats.cancelledAnswers = totals.cancelled.load(ordering: .relaxed)
        stats.heldRequests = totals.held.load(ordering: .relaxed)
        stats.turnWaits = totals.turnWaits.load(ordering: .relaxed)
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
                    created.append(try DaemonDriver(daemon: daemon, loop: loop, listenFD: listenFD, connectionLimit: share,
                                                  turnBudget: config.pipelinedRequestsPerTurn,
                                                  pipelinedTimeShare: config.pipelinedTimeShare))
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
        try check(config.pipelinedRequestsPerTurn >= 0, "pipelinedRequestsPerTurn must not be negative")
        try check(config.pipelinedTimeShare >= 1, "pipelinedTimeShare must be at least 1")
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
func raiseDescriptorLimit(toFit connections: Int) {
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
