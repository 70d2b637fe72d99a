import CMicroHTTPD
import EventLoops
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Handed to the handler with every request; the way to answer later (`respond`) or in pieces
/// (`startStream`, `write`, `finish`). Thread-safe: every method may be called from any thread.
///
/// A handler that answers at once returns `.response(…)` and never touches the writer. One that
/// returns `.deferred` keeps the writer and must eventually call `respond(_:)` or
/// `startStream(status:headers:)` (then `write` … `finish()`); meanwhile the connection is
/// suspended and holds no server thread. The first answer wins; later ones are ignored.
///
/// Callbacks (`onCancel`, `onWritable`) run on a server thread and must return quickly (signal
/// your own thread; do not block). They may call the writer's methods.
///
/// The writer is also the server's per-request context, so a handler that answers at once costs
/// no extra allocation.
public final class HTTPResponseWriter: Sendable {
    let core: ServerCore
    let connection: ConnectionHandle
    /// The connection's deadline bookkeeping (nil only if libmicrohttpd skipped the notification).
    let record: ConnectionRecord?
    /// The raw request target, as the URI callback saw it.
    let target: String
    /// When the request line arrived (monotonic nanoseconds).
    let started: UInt64
    let state = Mutex(WriterMachine())

    init(core: ServerCore, connection: ConnectionHandle, record: ConnectionRecord?, target: String) {
        self.core = core
        self.connection = connection
        self.record = record
        self.target = target
        self.started = monotonicNanoseconds()
        core.counters.liveRequests.add(1, ordering: .relaxed)
    }

    deinit { core.counters.liveRequests.subtract(1, ordering: .relaxed) }

    /// The key under which the connection monitor knows this writer (unique while it lives).
    var monitorKey: UInt64 { UInt64(UInt(bitPattern: Unmanaged.passUnretained(self).toOpaque())) }

    // MARK: Public API

    /// Answers a deferred request with a complete response (`content-length` set by the server).
    /// Ignored if the request was already answered or its connection is gone.
    public func respond(_ response: HTTPResponse) {
        perform(transition { $0.respond(response) })
    }

    /// Answers with a status and headers now and a body that follows in chunks (chunked transfer
    /// encoding for HTTP/1.1 clients; an HTTP/1.0 client gets the body until the connection
    /// closes). `content-length` and `transfer-encoding` headers given here are dropped.
    /// Ignored if the request was already answered or its connection is gone.
    public func startStream(status: Int, headers: [(name: String, value: String)]) {
        perform(transition { $0.startStream(status: status, headers: headers) })
    }

    /// Appends body bytes after `startStream`. Each call's bytes go to the socket as soon as the
    /// client can take them, never waiting for the next call.
    ///
    /// The bytes are always taken while the connection lives. Returns false when the connection
    /// is gone (or the stream was never started, or already finished) — stop producing — or when
    /// more than `streamHighWaterBytes` are now waiting to be sent — pause until `onWritable`.
    @discardableResult
    public func write(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { write($0) }
    }

    /// `write(_:)` without an intermediate array: the bytes are copied once, into the send buffer.
    @discardableResult
    public func write(_ bytes: UnsafeRawBufferPointer) -> Bool {
        let highWater = core.configuration.streamHighWaterBytes
        let outcome = state.withLock { m in
            let outcome = m.write(bytes, highWater: highWater)
            noteResume(outcome.wake)
            return outcome
        }
        if outcome.startedWaiting {
            // Bytes wait from now on; the write timeout counts while the client takes none.
            _ = record?.streamStalledSince.compareExchange(expected: 0, desired: monotonicNanoseconds(),
                                                           ordering: .relaxed)
        }
        perform(outcome.wake)
        return outcome.accepted
    }

    /// Ends the body cleanly (the terminating chunk goes out after the bytes already written).
    /// Ignored unless a stream was started.
    public func finish() {
        perform(transition { $0.finish() })
    }

    /// `body` runs once if the connection ends before the answer is complete (`respond`, or
    /// `startStream` … `finish`): the client disconnected, a deadline expired or the server is
    /// stopping. The producer must then cancel its work at once. If that already happened,
    /// `body` runs immediately, on the caller's thread. Replaces an earlier callback.
    public func onCancel(_ body: @escaping @Sendable () -> Void) {
        if state.withLock({ $0.registerCancel(body) }) { body() }
    }

    /// `body` runs once when a graceful `HTTPServer.shutdown(grace:)` begins while this answer is
    /// incomplete (a deferred answer not given yet, or a stream not finished): end it cleanly now
    /// (the relay sends an SSE `error` event of type `overloaded_error` and calls `finish()`).
    /// What is still open at the deadline is cancelled. Runs at once if the shutdown already began.
    public func onShutdown(_ body: @escaping @Sendable () -> Void) {
        // Draining is read under the lock `notifyShutdown` takes: read before it, a shutdown
        // beginning in between found no callback yet, and the one stored then never ran.
        if state.withLock({ $0.registerShutdown(body, draining: core.registry.isDraining) }) { body() }
    }

    /// `body` runs each time the unsent bytes drop to `streamLowWaterBytes` after a `write`
    /// returned false. Replaces an earlier callback.
    public func onWritable(_ body: @escaping @Sendable () -> Void) {
        state.withLock { $0.registerWritable(body) }
    }

    /// The answer comes after a bounded wait and nothing is to be cancelled if the client goes
    /// meanwhile: the connection stays out of the monitor's hang-up watch however long it is
    /// suspended (the request's deadline still applies). Call before the answer is given.
    public func skipHangUpWatch() {
        state.withLock { $0.skipHangUpWatch() }
    }

    // MARK: Transitions and their actions

    /// Runs a transition that may wake the connection, under the lock.
    func transition(_ body: (inout WriterMachine) -> Wake) -> Wake {
        state.withLock { m in
            let wake = body(&m)
            noteResume(wake)
            return wake
        }
    }

    /// Counts a resume decided under the lock until `perform` has made it, so that the server's
    /// stop waits for it before stopping the daemon (which frees the connection).
    func noteResume(_ wake: Wake) {
        if case .resume = wake { core.resumesInFlight.add(1, ordering: .acquiringAndReleasing) }
    }

    /// Carries out a wake-up, outside the lock. Only the thread whose transition took the
    /// connection out of `.suspended` gets `.resume`, so each suspension is resumed once.
    func perform(_ wake: Wake) {
        guard case .resume(let unwatchFD) = wake else { return }
        if let unwatchFD { core.monitor.unwatch(key: monitorKey, fd: unwatchFD) }
        MHD_resume_connection(connection.pointer)
        record?.driver?.kick()
        core.resumesInFlight.subtract(1, ordering: .acquiringAndReleasing)
    }

    /// Parks the connection until the producer acts (the connection's own thread, inside a
    /// libmicrohttpd callback, lock not held). The machine is already `.suspending`.
    ///
    /// The socket joins the monitor's hang-up watch only once the suspension has lasted
    /// `DaemonDriver.hangUpWatchDelay` (20 ms; the loop's driver registers it): most
    /// relayed answers come back within a millisecond, and watching each one would cost two
    /// epoll_ctl calls and the monitor's lock per request.
    /// `watchHangUp` false: never put in the hang-up watch (a wait the driver ends by itself soon).
    func parkConnection(watchHangUp: Bool = true) {
        let needsFD = state.withLock { $0.fd < 0 }
        let fd = needsFD ? attest_mhd_connection_fd(connection.pointer) : -1
        MHD_suspend_connection(connection.pointer)
        let now = monotonicNanoseconds()
        let wake = state.withLock { m in
            if needsFD { m.fd = fd }
            let wake = m.suspended(at: now)
            noteResume(wake)
            return wake
        }
        if watchHangUp, case .none = wake { record?.driver?.noteSuspended(self, since: now) }
        perform(wake)
    }

    /// In the monitor's hang-up watch now (tests).
    var isHangUpWatched: Bool { state.withLock { $0.isWatched } }

    /// Puts the socket in the monitor's hang-up watch if the connection has been suspended since
    /// `cutoff` or earlier, without a resume in between (the loop's thread). A resume racing with
    /// this leaves the monitor's tombstone, and the late `watch` adds nothing.
    func watchIfLongSuspended(since cutoff: UInt64) {
        let fd = state.withLock { m -> Int32? in m.watch(ifSuspendedSince: cutoff) ? m.fd : nil }
        if let fd { core.monitor.watch(self, key: monitorKey, fd: fd) }
    }

    /// The connection is gone or must go (peer closed while suspended, server stopping): marks
    /// the request cancelled, wakes the connection so libmicrohttpd closes it, and runs the
    /// producer's cancel callback. Any thread.
    /// - Parameter serverStopping: the server stops with this request unanswered: it is answered
    ///   503 with `Connection: close` (never a bare close that leaves the client guessing).
    func abort(serverStopping: Bool = false) {
        let (wake, callback) = state.withLock { m in
            let result = m.abort(serverStopping: serverStopping)
            noteResume(result.0)
            return result
        }
        perform(wake)
        callback?()
    }

    /// Closes the connection if its request is still receiving its body and the client has hung
    /// up (see `DaemonDriver.checkReceiving`). The loop's thread, between runs of the daemon.
    func closeIfClientLeftMidBody() {
        let receiving = state.withLock { m in m.phase == .body }
        guard receiving, let record else { return }
        var byte: UInt8 = 0
        let peeked = recv(record.fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        if peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            core.registry.reapClosedByClient(record)
        }
    }

    /// A request held for its connection's unread answers goes on (the reaper's thread, once the
    /// client has taken enough of them).
    func releaseHold() {
        perform(transition { $0.releaseHold() })
    }

    /// A request waiting for a later turn of its loop goes on (the loop's thread, before its
    /// daemon runs). False if it was no longer waiting (its connection ended meanwhile).
    func releaseTurn() -> Bool {
        var waited = false
        perform(transition { m in
            waited = m.phase == .waitingTurn
            return m.releaseTurn()
        })
        return waited
    }

    /// A graceful shutdown began: runs the producer's `onShutdown` if its answer is incomplete.
    func notifyShutdown() {
        state.withLock { $0.beginShutdown() }?()
    }

    /// libmicrohttpd finished with the request (completion callback, connection's thread).
    func completed() {
        let completion = state.withLock { $0.complete() }
        if completion.reservedBodyBytes > 0 { core.releaseBodyBytes(completion.reservedBodyBytes) }
        if completion.unanswered { core.totals.unanswered.add(1, ordering: .relaxed) }
        record?.endRequest(turn: record?.driver?.turn ?? 0)
        core.totals.requests.add(1, ordering: .relaxed)
        if completion.cut { core.totals.cancelled.add(1, ordering: .relaxed) }
        completion.cancel?()
    }

    /// The content reader: copies what is buffered into libmicrohttpd's send buffer, or ends the
    /// stream, or — with nothing to send yet — suspends the connection and returns 0.
    ///
    /// Why suspend here: libmicrohttpd 0.9.75 treats 0 as "not ready" (state
    /// CHUNKED_BODY_UNREADY, event-loop state BLOCK) and keeps the connection on its epoll ready
    /// list, so every run of the daemon calls this function again and the loop spins (measured
    /// when the daemon had its own thread: ~5 million calls and 0.97 s of CPU per second for one
    /// idle stream). Its header documents
    /// MHD_suspend_connection as safe from inside a content reader; suspended, the connection
    /// leaves the epoll set and costs nothing until `write`/`finish` resumes it, after which
    /// libmicrohttpd calls this reader again.
    func readChunk(into buffer: UnsafeMutablePointer<CChar>, max: Int) -> Int {
        let lowWater = core.configuration.streamLowWaterBytes
        let stopping = core.monitor.isStopping
        let result = state.withLock { m in
            m.readChunk(into: UnsafeMutableRawPointer(buffer), max: max, lowWater: lowWater, serverStopping: stopping)
        }
        switch result {
        case .bytes(let count, let left, let writable):
            // The client took bytes: what is left starts waiting now.
            record?.streamStalledSince.store(left == 0 ? 0 : monotonicNanoseconds(), ordering: .relaxed)
            writable?()
            return count
        case .endOfStream:
            return contentReaderEndOfStream
        case .endWithError(let cancel):
            cancel?()
            return contentReaderEndWithError
        case .suspend:
            parkConnection()
            return 0
        }
    }
}

/// A libmicrohttpd connection pointer carried across threads.
/// @unchecked Sendable: the pointer is only dereferenced by libmicrohttpd; off the connection's
/// own thread the server calls nothing but MHD_resume_connection on it (documented safe from any
/// thread), and only while the connection is suspended, so it cannot have been freed.
struct ConnectionHandle: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// MHD_CONTENT_READER_END_OF_STREAM and …_END_WITH_ERROR (cast macros Swift does not import).
let contentReaderEndOfStream = -1
let contentReaderEndWithError = -2
