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
/// Pipelined requests get a budget per turn. libmicrohttpd runs every ready connection in each
/// run, and a connection whose client pipelined parses its next request as soon as the previous
/// answer is written: one request per busy connection per run, so 2,500 connections that
/// pipeline and take their answers into large receive buffers made each run tens of
/// milliseconds long, and a new caller waited several such runs. Here (`turn` counts the
/// daemon's runs) a request parsed in the same turn as its connection's previous answer went
/// out is pipelined, and a turn handles at most `turnBudget` of them: past that, one is
/// suspended and queued, and each turn first resumes the oldest queued, up to the budget,
/// before the daemon runs. A suspended connection is out of the daemon's epoll set and ready
/// list, so it costs nothing while it waits. And pipelined requests take at most a share of the
/// loop's time (half by default, `pipelinedTimeShare`): each turn that handled or queued any
/// moves `pipelinedNotBefore` on by N times the processor time it used; once that is `pipelinedBurst` ahead of the clock they pause until
/// the clock has caught up (other turns go on meanwhile), so the loop alternates some 10 ms of
/// them with some 10 ms without. Pausing only until the lead was back under the burst made
/// pauses of a millisecond, each followed by the scheduler's wake-up delay: on a loaded machine
/// (a debug build beside other test suites) pipelined requests then got a small fraction of the
/// loop instead of half, and 300 never-reading connections took over 30 s to be held. Short turns alone answer a new caller
/// at once, but the loops still spend whole cores on the pipelined answers, and a legitimate
/// exchange (the device, the server's worker threads, the database) then waits for the
/// processor. No real client pipelines deeply (browsers, URLSession and proxies do not), so
/// the limit costs no real client anything.
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
    /// Pipelined requests handled per turn, resumed ones included (0: they never wait).
    let turnBudget: Int
    /// The daemon's runs so far (loop thread).
    private(set) var turn: UInt64 = 0
    /// What is left of this turn's budget (loop thread).
    private var budgetLeft = 0
    /// Where the pipelined requests' share of the loop's time has got to (monotonic nanoseconds;
    /// loop thread).
    private var pipelinedNotBefore: UInt64 = 0
    /// Pipelined requests wait until `pipelinedNotBefore` (loop thread).
    private var pipelinedPaused = false
    static let pipelinedBurst: UInt64 = 10_000_000
    /// A turn with pipelined requests moves `pipelinedNotBefore` on by this many times the
    /// processor time it used (`HTTPServerConfiguration.pipelinedTimeShare`).
    let pipelinedShare: UInt64
    /// This turn handled, resumed or queued pipelined requests (loop thread)…
    private var pipelinedThisTurn = false
    /// …and the one before.
    private var pipelinedLastTurn = false
    /// Requests waiting for a later turn, oldest first from `waitingHead` on (loop thread).
    private var waiting: [HTTPResponseWriter] = []
    private var waitingHead = 0
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

    init(daemon: OpaquePointer, loop: EventLoop, listenFD: Int32, connectionLimit: Int, turnBudget: Int,
         pipelinedTimeShare: Int = 2) throws {
        self.daemon = daemon
        self.loop = loop
        self.listenFD = listenFD
        self.connectionLimit = connectionLimit
        self.turnBudget = turnBudget
        pipelinedShare = UInt64(max(1, pipelinedTimeShare))
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
        let began = turnBudget > 0 ? monotonicNanoseconds() : now
        // While pipelined requests come, a turn is charged the processor time it used (a turn
        // that waited for the processor is not charged the wait); the first one, its length.
        let cpuBegan = waitingHead < waiting.count || pipelinedLastTurn ? threadCPUNanoseconds() : nil
        pipelinedThisTurn = false
        resumeWaiting(now: began)
        if ready || deadline.map({ now >= $0 }) ?? false {
            ready = false
            turn &+= 1
            _ = MHD_run(daemon)
            checkReceiving()
            var milliseconds: UInt64 = 0
            // 0 when connections still hold unprocessed data: the loop turns again without sleeping.
            deadline = MHD_get_timeout(daemon, &milliseconds) == .YES
                ? now &+ min(milliseconds, 3_600_000) &* 1_000_000 : nil
        }
        var next = deadline
        var ended = began
        if pipelinedThisTurn {
            // `pipelinedShare` times the turn's cost: pipelined requests get that fraction of the
            // loop's time.
            ended = monotonicNanoseconds()
            let spent = cpuBegan.map { threadCPUNanoseconds() &- $0 } ?? (ended &- began)
            pipelinedNotBefore = max(pipelinedNotBefore, began) &+ pipelinedShare &* spent
            if pipelinedNotBefore > ended &+ Self.pipelinedBurst { pipelinedPaused = true }
        }
        pipelinedLastTurn = pipelinedThisTurn
        if let watchBy = watchLongSuspensions(now: now) { next = min(next ?? watchBy, watchBy) }
        // Requests still wait for a turn: the next one that may take them.
        if waitingHead < waiting.count {
            if pipelinedPaused { next = min(next ?? pipelinedNotBefore, pipelinedNotBefore) } else { loop.requestTurn() }
        }
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

    /// A request of this daemon waits, suspended, for a later turn (loop thread: libmicrohttpd's
    /// callbacks).
    func waitForTurn(_ writer: HTTPResponseWriter) {
        waiting.append(writer)
        pipelinedThisTurn = true
    }

    /// Whether a pipelined request may be handled in this turn (loop thread: libmicrohttpd's
    /// callbacks): not while older ones wait, nor once the turn's budget is spent.
    func takePipelinedSlot() -> Bool {
        guard budgetLeft > 0, waitingHead == waiting.count else { return false }
        budgetLeft -= 1
        pipelinedThisTurn = true
        return true
    }

    /// Starts a turn's budget (none while pipelined requests must wait, after the last turn that
    /// had some) and resumes up to that many of the requests waiting for a turn, oldest first
    /// (loop thread, before the daemon runs: libmicrohttpd takes them back in this run). A
    /// request whose connection ended meanwhile is passed over.
    private func resumeWaiting(now: UInt64) {
        if pipelinedPaused, now >= pipelinedNotBefore { pipelinedPaused = false }
        budgetLeft = pipelinedPaused ? 0 : turnBudget
        while budgetLeft > 0, waitingHead < waiting.count {
            let writer = waiting[waitingHead]
            waitingHead += 1
            if writer.releaseTurn() {
                budgetLeft -= 1
                pipelinedThisTurn = true
            }
        }
        dropConsumed(&waiting, head: &waitingHead)
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
        dropConsumed(&suspensions, head: &suspensionsHead)
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
            waiting = []
            waitingHead = 0
            return true
        })
        if stopped == nil {
            MHD_stop_daemon(daemon)
            if !closedListener { close(listenFD) }
        }
    }
}
/// Drops the entries of a queue read from `head` on that were already taken: all of them once
/// every one was, else at least 64 once they are half of it (so the copy is amortised).
private func dropConsumed<Element>(_ queue: inout [Element], head: inout Int) {
    if head == queue.count {
        queue.removeAll(keepingCapacity: queue.capacity <= 4096)
        head = 0
    } else if head >= 64, head * 2 >= queue.count {
        queue.removeFirst(head)
        head = 0
    }
}

/// Processor time of the calling thread.
private func threadCPUNanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
    return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
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
