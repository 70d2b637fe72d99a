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
    let state = Mutex(WriterState())

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
        state.withLock { s in
            guard case .none = s.answer, !s.closed else { return }
            s.answer = .complete(response)
            s.producerDone = true
            resumeIfSuspended(&s)
        }
    }

    /// Answers with a status and headers now and a body that follows in chunks (chunked transfer
    /// encoding for HTTP/1.1 clients; an HTTP/1.0 client gets the body until the connection
    /// closes). `content-length` and `transfer-encoding` headers given here are dropped.
    /// Ignored if the request was already answered or its connection is gone.
    public func startStream(status: Int, headers: [(name: String, value: String)]) {
        state.withLock { s in
            guard case .none = s.answer, !s.closed else { return }
            s.answer = .stream(status: status, headers: headers)
            resumeIfSuspended(&s)
        }
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
        return state.withLock { s in
            guard case .stream = s.answer, !s.closed, !s.cancelled, !s.producerDone else { return false }
            if s.pending.count == s.sentOffset, !bytes.isEmpty {
                // Bytes wait from now on; the write timeout counts while the client takes none.
                _ = record?.streamStalledSince.compareExchange(expected: 0, desired: monotonicNanoseconds(),
                                                               ordering: .relaxed)
            }
            s.pending.append(contentsOf: bytes)
            resumeIfSuspended(&s)
            if s.pending.count - s.sentOffset > highWater {
                s.wantsWritable = true
                return false
            }
            return true
        }
    }

    /// Ends the body cleanly (the terminating chunk goes out after the bytes already written).
    /// Ignored unless a stream was started.
    public func finish() {
        state.withLock { s in
            guard case .stream = s.answer, !s.closed, !s.producerDone else { return }
            s.producerDone = true
            resumeIfSuspended(&s)
        }
    }

    /// `body` runs once if the connection ends before the answer is complete (`respond`, or
    /// `startStream` … `finish`): the client disconnected, a deadline expired or the server is
    /// stopping. The producer must then cancel its work at once. If that already happened,
    /// `body` runs immediately, on the caller's thread. Replaces an earlier callback.
    public func onCancel(_ body: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { s -> Bool in
            if s.cancelled {
                guard !s.producerDone, !s.cancelReported else { return false }
                s.cancelReported = true
                return true
            }
            if s.closed { return false }
            s.onCancel = body
            return false
        }
        if runNow { body() }
    }

    /// `body` runs once when a graceful `HTTPServer.shutdown(grace:)` begins while this answer is
    /// incomplete (a deferred answer not given yet, or a stream not finished): end it cleanly now
    /// (the relay sends an SSE `error` event of type `overloaded_error` and calls `finish()`).
    /// What is still open at the deadline is cancelled. Runs at once if the shutdown already began.
    public func onShutdown(_ body: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { s -> Bool in
            guard !s.closed, !s.producerDone, !s.shutdownReported else { return false }
            // Read under the lock `notifyShutdown` takes: read before it, a shutdown beginning in
            // between found no callback yet, and the one stored then never ran.
            if core.registry.isDraining {
                s.shutdownReported = true
                return true
            }
            s.onShutdown = body
            return false
        }
        if runNow { body() }
    }

    /// `body` runs each time the unsent bytes drop to `streamLowWaterBytes` after a `write`
    /// returned false. Replaces an earlier callback.
    public func onWritable(_ body: @escaping @Sendable () -> Void) {
        state.withLock { s in
            if !s.closed { s.onWritable = body }
        }
    }

    // MARK: Server side

    /// Resumes the connection if it is suspended waiting for this writer. Called with the lock
    /// held, so that suspension, resumption and the server's stop sweep are totally ordered;
    /// libmicrohttpd's resume only takes its own cleanup mutex and never calls back into us.
    func resumeIfSuspended(_ s: inout WriterState) {
        guard s.suspended else { return }
        s.suspended = false
        if s.watched {
            s.watched = false
            core.monitor.unwatch(key: monitorKey, fd: s.fd)
        }
        MHD_resume_connection(connection.pointer)
        record?.driver?.kick()
    }

    /// Suspends the connection until the producer acts (connection's own thread, lock held).
    /// False when the server is stopping; the caller must then end the request instead.
    ///
    /// The socket joins the monitor's hang-up watch only once the suspension has lasted
    /// `DaemonDriver.hangUpWatchDelay` (20 ms; the loop's driver registers it): most
    /// relayed answers come back within a millisecond, and watching each one would cost two
    /// epoll_ctl calls and the monitor's lock per request.
    func suspend(_ s: inout WriterState) -> Bool {
        guard !core.monitor.isStopping else { return false }
        if s.fd < 0 { s.fd = attest_mhd_connection_fd(connection.pointer) }
        s.suspended = true
        s.suspendedSince = monotonicNanoseconds()
        record?.driver?.noteSuspended(self, since: s.suspendedSince)
        MHD_suspend_connection(connection.pointer)
        return true
    }

    /// The answer comes after a bounded wait and nothing is to be cancelled if the client goes
    /// meanwhile: the connection stays out of the monitor's hang-up watch however long it is
    /// suspended (the request's deadline still applies). Call before the answer is given.
    public func skipHangUpWatch() {
        state.withLock { $0.hangUpWatch = false }
    }

    /// In the monitor's hang-up watch now (tests).
    var isHangUpWatched: Bool { state.withLock { $0.watched } }

    /// Puts the socket in the monitor's hang-up watch if the connection has been suspended since
    /// `cutoff` or earlier, without a resume in between. Under the writer's lock, so the
    /// connection is still suspended while registered and libmicrohttpd cannot have closed the socket.
    func watchIfLongSuspended(since cutoff: UInt64) {
        state.withLock { s in
            guard s.suspended, s.hangUpWatch, !s.watched, s.suspendedSince <= cutoff else { return }
            s.watched = core.monitor.watch(self, key: monitorKey, fd: s.fd)
        }
    }

    /// The connection is gone or must go (peer closed while suspended, server stopping): marks
    /// the request cancelled, wakes the connection so libmicrohttpd closes it, and runs the
    /// producer's cancel callback. Any thread.
    /// - Parameter serverStopping: the server stops with this request unanswered: it is answered
    ///   503 with `Connection: close` (never a bare close that leaves the client guessing).
    func abort(serverStopping: Bool = false) {
        let callback = state.withLock { s -> (@Sendable () -> Void)? in
            guard !s.closed, !s.cancelled else { return nil }
            s.cancelled = true
            s.stopping = serverStopping
            resumeIfSuspended(&s)
            return s.producerDone ? nil : s.takeCancelCallback()
        }
        callback?()
    }

    /// Closes the connection if its request is still receiving its body and the client has hung
    /// up (see `DaemonDriver.checkReceiving`). The loop's thread, between runs of the daemon.
    func closeIfClientLeftMidBody() {
        let receiving = state.withLock { s in s.headersSeen && !s.handlerCalled && !s.closed }
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
        state.withLock { s in
            guard s.heldForUnread, !s.closed else { return }
            s.heldForUnread = false
            resumeIfSuspended(&s)
        }
    }

    /// A graceful shutdown began: runs the producer's `onShutdown` if its answer is incomplete.
    func notifyShutdown() {
        let callback = state.withLock { s -> (@Sendable () -> Void)? in
            guard !s.closed, !s.producerDone, !s.shutdownReported, let callback = s.onShutdown else { return nil }
            s.shutdownReported = true
            s.onShutdown = nil
            return callback
        }
        callback?()
    }

    /// libmicrohttpd finished with the request (completion callback, connection's thread).
    func completed() {
        let (callback, reserved, cut, unanswered) = state.withLock { s -> ((@Sendable () -> Void)?, Int, Bool, Bool) in
            s.closed = true
            // A whole request whose connection closes with no answer queued.
            let unanswered = s.handlerCalled && !s.queued
            var callback: (@Sendable () -> Void)?
            let cut = (s.handlerOwnsAnswer || s.cancelled) && !s.producerDone
            if s.handlerOwnsAnswer, !s.producerDone {
                s.cancelled = true
                callback = s.takeCancelCallback()
            }
            // Break reference cycles through the producer's closures, free the buffers.
            s.onCancel = nil
            s.onWritable = nil
            s.onShutdown = nil
            s.headers = []
            s.pending = []
            s.sentOffset = 0
            s.body = []
            let reserved = s.reservedBodyBytes
            s.reservedBodyBytes = 0
            return (callback, reserved, cut, unanswered)
        }
        if reserved > 0 { core.releaseBodyBytes(reserved) }
        if unanswered { core.totals.unanswered.add(1, ordering: .relaxed) }
        record?.endRequest()
        core.totals.requests.add(1, ordering: .relaxed)
        if cut { core.totals.cancelled.add(1, ordering: .relaxed) }
        callback?()
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
        var writable: (@Sendable () -> Void)?
        var cancel: (@Sendable () -> Void)?
        let result = state.withLock { s -> Int in
            if s.cancelled { return contentReaderEndWithError }
            let available = s.pending.count - s.sentOffset
            if available > 0 {
                let count = min(available, max)
                s.pending.withUnsafeBytes { bytes in
                    UnsafeMutableRawPointer(buffer).copyMemory(from: bytes.baseAddress! + s.sentOffset, byteCount: count)
                }
                s.sentOffset += count
                let left = available - count
                // The client took bytes: what is left starts waiting now.
                record?.streamStalledSince.store(left == 0 ? 0 : monotonicNanoseconds(), ordering: .relaxed)
                if left == 0 {
                    s.pending.removeAll(keepingCapacity: s.pending.capacity <= 1 << 16)
                    s.sentOffset = 0
                } else if s.sentOffset >= 1 << 16, s.sentOffset >= left {
                    s.pending.removeFirst(s.sentOffset)
                    s.sentOffset = 0
                }
                if s.wantsWritable, left <= lowWater {
                    s.wantsWritable = false
                    writable = s.onWritable
                }
                return count
            }
            if s.producerDone { return contentReaderEndOfStream }
            if suspend(&s) { return 0 }
            // The server is stopping: no new suspensions; end the stream as failed.
            s.cancelled = true
            cancel = s.takeCancelCallback()
            return contentReaderEndWithError
        }
        writable?()
        cancel?()
        return result
    }
}

/// A libmicrohttpd connection pointer carried across threads.
/// @unchecked Sendable: the pointer is only dereferenced by libmicrohttpd; off the connection's
/// own thread the server calls nothing but MHD_resume_connection on it (documented safe from any
/// thread), and only while the connection is suspended, so it cannot have been freed.
struct ConnectionHandle: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// How the request is being answered.
enum Answer {
    case none
    case complete(HTTPResponse)
    case stream(status: Int, headers: [(name: String, value: String)])
}

struct WriterState {
    // Receiving (the connection's own thread only; behind the lock only to keep the writer Sendable).
    var headersSeen = false
    var handlerCalled = false
    var method = ""
    var path = ""
    var query: String?
    var headers: [(name: String, value: String)] = []
    var body: [UInt8] = []
    var bodyLimit = 0
    var reservedBodyBytes = 0
    /// Chosen while the body was arriving (413, overload); sent once it has ended.
    var refusal: HTTPResponse?
    /// Suspended before its handler while earlier answers on the connection wait unread.
    var heldForUnread = false
    /// Cancelled because the server stops (not because the client left).
    var stopping = false
    var discardedBytes = 0

    // Answering.
    var answer: Answer = .none
    /// The handler returned `.deferred`: the answer is the producer's to give.
    var handlerOwnsAnswer = false
    /// A libmicrohttpd response has been queued for this request.
    var queued = false
    var suspended = false
    /// When the connection was last suspended (monotonic nanoseconds).
    var suspendedSince: UInt64 = 0
    /// The suspended connection's socket is in the monitor's hang-up watch.
    var watched = false
    /// False: never watched (`skipHangUpWatch`).
    var hangUpWatch = true
    var fd: Int32 = -1
    /// Stream bytes not yet handed to libmicrohttpd start at `sentOffset`.
    var pending: [UInt8] = []
    var sentOffset = 0
    /// `respond` or `finish` was called: nothing more will come from the producer.
    var producerDone = false
    /// The connection ended (completion callback ran).
    var closed = false
    /// The request was aborted before the producer was done.
    var cancelled = false
    var cancelReported = false
    var wantsWritable = false
    var onCancel: (@Sendable () -> Void)?
    var onWritable: (@Sendable () -> Void)?
    var onShutdown: (@Sendable () -> Void)?
    var shutdownReported = false

    /// The cancel callback, at most once over the writer's life.
    /// (If none is registered yet, `onCancel` runs the one registered later at once.)
    mutating func takeCancelCallback() -> (@Sendable () -> Void)? {
        guard !cancelReported, let callback = onCancel else { return nil }
        cancelReported = true
        onCancel = nil
        return callback
    }
}

/// MHD_CONTENT_READER_END_OF_STREAM and …_END_WITH_ERROR (cast macros Swift does not import).
let contentReaderEndOfStream = -1
let contentReaderEndWithError = -2
