import CMicroHTTPD
import EventLoops
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One thread per running server that watches the sockets of suspended connections, and runs
/// the server's reaper (`tick`) a few times a second.
///
/// libmicrohttpd 0.9.75 takes a suspended connection out of its epoll set (daemon.c,
/// internal_suspend_connection_) and documents that "while a connection is suspended, MHD will
/// not detect disconnects by the client". A relayed stream waiting for its upstream is suspended
/// most of its life, so without this a client that hangs up would keep its upstream transfer
/// running until the next chunk failed to send. Here each suspended connection's socket is in a
/// second epoll set, for EPOLLRDHUP/EPOLLHUP/EPOLLERR only (not EPOLLIN, so a pipelined request is
/// not mistaken for a hang-up); when one fires the request is aborted: its producer's `onCancel`
/// runs and the connection is resumed so that libmicrohttpd closes it.
///
/// A connection joins this set once it has stayed suspended for `DaemonDriver.hangUpWatchDelay`
/// (its loop registers it, `HTTPResponseWriter.watchIfLongSuspended`): a relayed answer that comes
/// back within milliseconds never pays for the watch, and a hang-up during a long wait is seen
/// that much later at most. The writer marks itself watched under its lock and registers here
/// after releasing it; a resume that takes the connection out of suspension in between calls
/// `unwatch` first, which leaves a tombstone, and the late `watch` then adds nothing. A resume
/// always unwatches before it calls MHD_resume_connection, and a suspended connection's socket is
/// never closed by libmicrohttpd (the server resumes every open request before it stops the
/// daemon), so a descriptor here can never have been reused for another connection.
final class ConnectionMonitor: Sendable {
    private struct State {
        var exit = false
        /// Run `tick` as soon as possible (a worker is near its connection limit).
        var tickNow = false
        var watched: [UInt64: HTTPResponseWriter] = [:]
        /// Writers unwatched before their `watch` arrived (see the type's comment).
        var unwatchedEarly: Set<UInt64> = []
    }

    private let epollFD: Int32
    private let wakeFD: Int32
    private let state = Mutex(State())
    private let thread = Mutex<pthread_t?>(nil)
    /// Called on the monitor thread about every `tickMilliseconds`.
    private let tick: @Sendable () -> Void
    private let tickMilliseconds: Int32

    /// The key of the wake-up eventfd; writer keys are object addresses, never 0.
    private static let wakeKey: UInt64 = 0

    init(tickMilliseconds: Int32 = 250, tick: @escaping @Sendable () -> Void = {}) throws {
        epollFD = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epollFD >= 0 else { throw HTTPServerError("epoll_create1 failed: errno \(errno)") }
        wakeFD = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        guard wakeFD >= 0 else {
            close(epollFD)
            throw HTTPServerError("eventfd failed: errno \(errno)")
        }
        self.tick = tick
        self.tickMilliseconds = tickMilliseconds
        _ = attest_watch_add_readable(epollFD, wakeFD, Self.wakeKey)
    }

    deinit {
        close(epollFD)
        close(wakeFD)
    }

    func start() throws {
        let handle: pthread_t
        do {
            handle = try spawnThread { [self] in run() }
        } catch {
            throw HTTPServerError("cannot start the connection monitor thread: \(error)")
        }
        thread.withLock { $0 = handle }
    }

    /// Watches `fd` for the peer going away while its connection is suspended. Nothing happens
    /// when the server is stopping (its open requests are being aborted anyway) or when the
    /// writer was already unwatched (it was resumed meanwhile).
    func watch(_ writer: HTTPResponseWriter, key: UInt64, fd: Int32) {
        state.withLock { s in
            if s.unwatchedEarly.remove(key) != nil { return }
            guard !isStopping else { return }
            if fd >= 0 { _ = attest_watch_add(epollFD, fd, key) }
            s.watched[key] = writer
        }
    }

    /// Connections watched now (tests).
    var watchedCount: Int { state.withLock { $0.watched.count } }

    func unwatch(key: UInt64, fd: Int32) {
        state.withLock { s in
            guard s.watched.removeValue(forKey: key) != nil else {
                if !isStopping { s.unwatchedEarly.insert(key) }
                return
            }
            if fd >= 0 { _ = attest_watch_remove(epollFD, fd) }
        }
    }

    /// Refuses new registrations and suspensions: the server is stopping.
    func beginStop() {
        stoppingFlag.store(true, ordering: .releasing)
    }

    /// The server is stopping: no connection may be suspended or watched any more.
    var isStopping: Bool { stoppingFlag.load(ordering: .acquiring) }
    private let stoppingFlag = Atomic<Bool>(false)

    /// Runs the tick (the reaper) now rather than at the next interval.
    func wake() {
        let already = state.withLock { s -> Bool in
            defer { s.tickNow = true }
            return s.tickNow
        }
        if !already { signal() }
    }

    private func signal() {
        var one: UInt64 = 1
        _ = Glibc.write(wakeFD, &one, 8)
    }

    /// Ends the thread and waits for it.
    func shutdown() {
        state.withLock { $0.exit = true }
        signal()
        if let handle = thread.withLock({ t -> pthread_t? in defer { t = nil }; return t }) {
            pthread_join(handle, nil)
        }
    }

    private func run() {
        var keys = [UInt64](repeating: 0, count: 64)
        var nextTick = monotonicNanoseconds() + UInt64(tickMilliseconds) * 1_000_000
        var lastTick: UInt64 = 0
        var tickRequested = false
        // A requested tick runs at once, but no sooner than 20 ms after the previous one, so a
        // flood of new connections near the limit cannot keep this thread sweeping.
        let minimumGap: UInt64 = 20_000_000
        while true {
            let now = monotonicNanoseconds()
            let due = tickRequested ? min(nextTick, lastTick + minimumGap) : nextTick
            let wait = due > now ? Int32((due - now + 999_999) / 1_000_000) : 0
            let count = keys.withUnsafeMutableBufferPointer {
                attest_watch_wait(epollFD, $0.baseAddress, Int32($0.count), wait)
            }
            if count < 0 { return }
            var lost: [HTTPResponseWriter] = []
            let exit = state.withLock { s -> Bool in
                if s.tickNow { tickRequested = true }
                s.tickNow = false
                for index in 0..<Int(count) {
                    let key = keys[index]
                    if key == Self.wakeKey {
                        var drained: UInt64 = 0
                        _ = read(wakeFD, &drained, 8)
                    } else if let writer = s.watched[key] {
                        lost.append(writer)
                    }
                }
                return s.exit
            }
            if exit { return }
            // Outside the lock: aborting takes the writer's lock, which nests ours.
            for writer in lost { writer.abort() }
            let current = monotonicNanoseconds()
            if current >= nextTick || (tickRequested && current >= lastTick + minimumGap) {
                tick()
                lastTick = monotonicNanoseconds()
                nextTick = lastTick + UInt64(tickMilliseconds) * 1_000_000
                tickRequested = false
            }
        }
    }
}
