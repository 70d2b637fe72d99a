import CEventLoop
import CMicroHTTPD
import EventLoops
#if canImport(Glibc)
import Glibc
#endif

/// One libmicrohttpd daemon in external-polling epoll mode, driven by one event loop: the loop
/// watches the daemon's epoll descriptor and calls `MHD_run` when it is ready or when the
/// daemon's own time-out (idle connections) falls due.
///
/// The driver accepts connections itself and hands them to its daemon (MHD_add_connection):
/// every loop watches the one listening socket (EPOLLEXCLUSIVE, so a new connection wakes one
/// loop, an idle one first) and, before running its daemon, takes every connection waiting, up
/// to `acceptBatch` a turn. libmicrohttpd's own accept takes at most 10 a run, after walking
/// every ready connection; with thousands of connections busy, the queue of new ones grew
/// behind them and a legitimate caller waited there for a second. A daemon at its share of the
/// connection limit leaves the listening socket to the others until one of its own closes.
///
/// libmicrohttpd without an internal thread is single-threaded except for
/// `MHD_resume_connection` (its cleanup mutex and inter-thread channel make that safe from
/// anywhere): every other call on the daemon happens on its loop's thread.
final class DaemonDriver: EventLoopParticipant, @unchecked Sendable {
    // @unchecked: `ready` and `deadline` are confined to the loop's thread; the daemon pointer
    // is used there, and by `stop` only once the loop no longer runs it.
    let daemon: OpaquePointer
    let loop: EventLoop
    let epollFD: Int32
    /// This daemon's own duplicate of the listening socket (closed when it stops).
    let listenFD: Int32
    /// Its share of the server's connection limit.
    let connectionLimit: Int
    private var ready = true
    /// The listening socket has connections waiting.
    private var acceptReady = true
    /// After EMFILE or ENFILE: accepting pauses until then, rather than spinning on the socket.
    private var acceptPausedUntil: UInt64 = 0
    /// Every daemon of the server is at its limit: the listening socket is out of this loop's set.
    private var fullUp = false
    /// The listening socket is closed (a graceful shutdown began).
    private var closedListener = false
    private var acceptedCount = 0
    /// Called when accepting stops for a full server (wakes the reaper, which frees slots).
    var onFull: (@Sendable () -> Void)?
    static let acceptBatch = 256
    private var deadline: UInt64? = 0
    /// Connections suspended on this daemon, oldest first, from `suspensionsHead` on: each is
    /// looked at once `hangUpWatchDelay` has passed, and joins the monitor's hang-up watch if it
    /// is still in that same suspension.
    private var suspensions: [(writer: HTTPResponseWriter, since: UInt64)] = []
    private var suspensionsHead = 0
    /// Most relayed answers come back well within this: they never pay for the watch (two
    /// epoll_ctl calls and the monitor's lock), and a hang-up during a longer wait is seen
    /// this much later at most.
    static let hangUpWatchDelay: UInt64 = 20_000_000
    /// Requests whose body was still arriving when libmicrohttpd last handed us bytes: looked at
    /// once its run returns (`checkReceiving`).
    private var receiving: [HTTPResponseWriter] = []

    init(daemon: OpaquePointer, loop: EventLoop, listenFD: Int32, connectionLimit: Int) throws {
        self.daemon = daemon
        self.loop = loop
        self.listenFD = listenFD
        self.connectionLimit = connectionLimit
        epollFD = attest_mhd_epoll_fd(daemon)
        guard epollFD >= 0 else { throw HTTPServerError("libmicrohttpd did not report its epoll descriptor") }
    }

    func handleEvent(fd: Int32, events: UInt32) {
        if fd == listenFD { acceptReady = true } else { ready = true }
    }

    /// Takes the connections waiting on the listening socket (loop thread, before the daemon runs).
    private func acceptPending(now: UInt64, evenWhenFull: Bool = false) {
        guard acceptReady, !fullUp, !closedListener, now >= acceptPausedUntil else { return }
        var address = sockaddr_storage()
        var length = socklen_t(0)
        for _ in 0..<Self.acceptBatch {
            // Full: this loop stops taking connections (the others, with room, take them, and
            // when every one is full they wait in the kernel's queue while the reaper frees
            // slots) instead of taking them and closing them; a connection closing here resumes.
            if !hasRoom && !evenWhenFull {
                fullUp = true
                loop.unwatch(fd: listenFD)
                onFull?()
                return
            }
            let fd = attest_accept_nonblocking(listenFD, &address, &length)
            if fd < 0 {
                switch errno {
                case EAGAIN, EWOULDBLOCK: acceptReady = false
                case EINTR, ECONNABORTED, EPROTO: continue
                case EMFILE, ENFILE, ENOBUFS, ENOMEM: acceptPausedUntil = now &+ 100_000_000   // out of descriptors: retry soon
                default: acceptReady = false
                }
                return
            }
            acceptedCount &+= 1
            adopt(fd, address, length)
        }
    }

    /// Hands an accepted connection to this daemon (its loop's thread). libmicrohttpd applies the
    /// accept policy (the per-address limit) and its own limit, and closes what it refuses.
    private func adopt(_ fd: Int32, _ address: sockaddr_storage, _ length: socklen_t) {
        var address = address
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { MHD_add_connection(daemon, fd, $0, length) }
        }
        ready = true
        loop.requestTurn()
    }

    /// Takes the connections waiting on the listening socket one last time and closes it (from
    /// any thread: it runs on the loop and returns when done).
    func stopAccepting() {
        _ = loop.run(andWait: { [self] in
            guard !closedListener else { return true }
            acceptReady = true
            fullUp = false
            acceptPausedUntil = 0
            var before = -1
            // Until nothing more is waiting (a full daemon still takes them: the reaper then
            // closes the idle ones, and these are answered).
            while acceptReady, before != acceptedCount {
                before = acceptedCount
                acceptPending(now: monotonicNanoseconds(), evenWhenFull: true)
            }
            loop.unwatch(fd: listenFD)
            close(listenFD)
            closedListener = true
            return true
        })
    }

    /// A connection of this daemon closed (loop thread): a daemon that stopped accepting because
    /// every daemon was full takes connections again.
    func connectionClosed() {
        guard fullUp, !closedListener else { return }
        fullUp = false
        acceptReady = true
        _ = loop.watch(fd: listenFD, events: UInt32(EPOLLIN.rawValue) | EPOLLEXCLUSIVE.rawValue, for: self)
        loop.requestTurn()
    }

    /// Whether this daemon has room for another connection (loop thread).
    private var hasRoom: Bool { attest_mhd_current_connections(daemon) < connectionLimit }

    /// A connection of this daemon was resumed. Without an internal thread libmicrohttpd has no
    /// wake-up channel of its own (it drops MHD_USE_ITC), so the loop must run the daemon again:
    /// at once in this turn when called on the loop, else through the loop's task queue.
    func kick() {
        if loop.inLoop {
            ready = true
            // This daemon may already have been polled this turn (the curl driver delivers
            // upstream data after it, or its own callbacks resumed a connection).
            loop.requestTurn()
        } else {
            loop.execute { [self] in ready = true }
        }
    }

    func poll(now: UInt64) -> UInt64? {
        acceptPending(now: now)
        if ready || deadline.map({ now >= $0 }) ?? false {
            ready = false
            _ = MHD_run(daemon)
            checkReceiving()
            var milliseconds: UInt64 = 0
            // 0 when connections still hold unprocessed data: the loop turns again without sleeping.
            deadline = MHD_get_timeout(daemon, &milliseconds) == .YES
                ? now &+ min(milliseconds, 3_600_000) &* 1_000_000 : nil
        }
        var next = deadline
        if let watchBy = watchLongSuspensions(now: now) { next = min(next ?? watchBy, watchBy) }
        // More connections waiting than one batch took: the next turn takes more.
        if acceptReady {
            if now >= acceptPausedUntil { loop.requestTurn() } else { next = min(next ?? acceptPausedUntil, acceptPausedUntil) }
        }
        return next
    }

    /// A request of this daemon expects more body bytes (loop thread: libmicrohttpd's callbacks).
    func noteReceiving(_ writer: HTTPResponseWriter) {
        receiving.append(writer)
    }

    /// Finds the clients that hung up mid-body without libmicrohttpd noticing.
    ///
    /// libmicrohttpd 0.9.75 watches connections edge-triggered and, after a read shorter than its
    /// buffer, takes the socket for drained (connection.c, recv_param_adapter). When the last
    /// bytes and the FIN arrive before its epoll_wait, one edge reports both; the read returns the
    /// bytes, the end of file is never read, and no further edge comes. The request then waits
    /// for a body that will never arrive, holding its share of the body budget until a deadline.
    /// After each run (its reads are done), a request still waiting for its body peeks at the
    /// socket: an end of file or a reset there is a client that is gone. A FIN that arrives after
    /// this peek comes with an edge of its own, which libmicrohttpd does see.
    private func checkReceiving() {
        guard !receiving.isEmpty else { return }
        let writers = receiving
        receiving.removeAll(keepingCapacity: receiving.capacity <= 1024)
        for writer in writers { writer.closeIfClientLeftMidBody() }
    }

    /// A connection of this daemon was suspended (loop thread: libmicrohttpd's callbacks).
    func noteSuspended(_ writer: HTTPResponseWriter, since: UInt64) {
        suspensions.append((writer, since))
    }

    /// Puts suspensions older than the delay in the hang-up watch; returns when the next one is due.
    private func watchLongSuspensions(now: UInt64) -> UInt64? {
        var next: UInt64?
        while suspensionsHead < suspensions.count {
            let (writer, since) = suspensions[suspensionsHead]
            guard since &+ Self.hangUpWatchDelay <= now else {
                next = since &+ Self.hangUpWatchDelay
                break
            }
            suspensionsHead += 1
            writer.watchIfLongSuspended(since: since)
        }
        // Drop what was looked at as it goes: under steady load a recent suspension is always
        // pending, and the entries (each holding its request's writer) would otherwise pile up.
        if suspensionsHead == suspensions.count {
            suspensions.removeAll(keepingCapacity: suspensions.capacity <= 4096)
            suspensionsHead = 0
        } else if suspensionsHead >= 64, suspensionsHead * 2 >= suspensions.count {
            suspensions.removeFirst(suspensionsHead)
            suspensionsHead = 0
        }
        return next
    }

    /// Joins the loop (on the loop's thread).
    func attach() -> Bool {
        guard loop.watch(fd: epollFD, events: UInt32(EPOLLIN.rawValue), for: self),
              loop.watch(fd: listenFD, events: UInt32(EPOLLIN.rawValue) | EPOLLEXCLUSIVE.rawValue, for: self) else { return false }
        loop.add(self)
        return true
    }

    /// Leaves the loop and stops the daemon: on the loop's thread while it runs, else here.
    func stop() {
        let stopped = loop.run(andWait: { [self] in
            loop.remove(self)
            MHD_stop_daemon(daemon)
            if !closedListener { close(listenFD) }
            closedListener = true
            suspensions = []
            receiving = []
            return true
        })
        if stopped == nil {
            MHD_stop_daemon(daemon)
            if !closedListener { close(listenFD) }
        }
    }
}
/// A listening TCP socket (non-blocking, close-on-exec, SO_REUSEADDR) shared by every daemon
/// of a server; each daemon gets its own duplicate, since libmicrohttpd closes its listening
/// descriptor when it stops.
struct ListeningSocket {
    let fd: Int32
    let port: UInt16

    /// Binds and listens; the error is errno's.
    init(address: UnsafeMutableRawPointer, length: socklen_t, family: Int32, backlog: Int32) throws(ListenError) {
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ListenError(code: errno) }
        var on: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
        if family == AF_INET6 {
            _ = setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &on, socklen_t(MemoryLayout<Int32>.size))
        }
        guard bind(fd, address.assumingMemoryBound(to: sockaddr.self), length) == 0, listen(fd, backlog) == 0 else {
            let code = errno
            Glibc.close(fd)
            throw ListenError(code: code)
        }
        var bound = sockaddr_storage()
        var boundLength = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let named = withUnsafeMutablePointer(to: &bound) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &boundLength) }
        }
        guard named == 0 else {
            let code = errno
            Glibc.close(fd)
            throw ListenError(code: code)
        }
        self.fd = fd
        port = withUnsafePointer(to: &bound) { pointer in
            family == AF_INET6
                ? pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) }
                : pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) }
        }
    }

    /// A new descriptor for the same socket (close-on-exec), or -1.
    func duplicate() -> Int32 { fcntl(fd, F_DUPFD_CLOEXEC, 0) }

    func close() { _ = Glibc.close(fd) }
}

struct ListenError: Error {
    let code: Int32
}
