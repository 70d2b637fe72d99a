import CMicroHTTPD
import EventLoops
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// What a connection is doing, as far as deadlines and slots are concerned.
enum ConnectionPhase: Sendable {
    /// Waiting for a request line: just accepted, or an idle keep-alive after a response.
    case waiting
    /// Request line seen, headers still arriving.
    case head
    /// Headers done, body arriving.
    case body
    /// The handler runs, or its deferred answer is pending (no transport deadline).
    case handling
    /// A complete response is being sent.
    case responding
    /// A streamed response is under way.
    case streaming
    /// A request is held, unhandled, while its connection's earlier answers wait unread.
    case held
    /// A pipelined request waits, unhandled, for a later turn of its loop: this turn's budget
    /// for them was spent (`pipelinedRequestsPerTurn`).
    case waitingTurn
}

/// One per TCP connection (libmicrohttpd's socket context), from the STARTED to the CLOSED
/// connection notification.
final class ConnectionRecord: Sendable {
    let connection: ConnectionHandle
    let fd: Int32
    /// The event loop thread whose daemon owns the connection (all its callbacks run there).
    let worker: pthread_t
    /// The peer's IP address, for the per-address limit (nil: not IPv4 or IPv6).
    let address: IPAddress?
    /// The daemon (and so the loop) that owns the connection: told when it is resumed.
    let driver: DaemonDriver?
    let state: Mutex<RecordState>
    /// For streams: since when unsent bytes have waited without the client taking any (monotonic
    /// nanoseconds; 0 = nothing waiting). Written by the writer, read by the reaper.
    let streamStalledSince = Atomic<UInt64>(0)

    init(connection: ConnectionHandle, fd: Int32, worker: pthread_t, address: IPAddress?, driver: DaemonDriver?, now: UInt64) {
        self.connection = connection
        self.fd = fd
        self.worker = worker
        self.address = address
        self.driver = driver
        self.state = Mutex(RecordState(phaseSince: now, headSince: now))
    }

    func enter(_ phase: ConnectionPhase, now: UInt64 = monotonicNanoseconds()) {
        state.withLock { s in
            s.phase = phase
            s.phaseSince = now
            if phase == .body { s.bodyBytes = 0 }
        }
    }

    /// The request line arrived (URI callback): the head keeps the deadline it started with.
    func beginRequest(_ writer: HTTPResponseWriter) {
        state.withLock { s in
            s.phase = .head
            s.phaseSince = monotonicNanoseconds()
            s.writer = writer
        }
    }

    /// The request ended (completion callback, in its loop's `turn`): the connection waits for
    /// the next one.
    func endRequest(turn: UInt64) {
        streamStalledSince.store(0, ordering: .relaxed)
        state.withLock { s in
            let now = monotonicNanoseconds()
            s.phase = .waiting
            s.phaseSince = now
            s.headSince = now
            s.requests += 1
            s.completedTurn = turn
            s.writer = nil
        }
    }

    /// Whether a request on this connection has completed before (the current one follows it).
    var hasServedRequests: Bool { state.withLock { $0.requests > 0 } }

    /// Whether the connection's previous request ended in its loop's `turn`: the current one
    /// was then already read when that answer went out, i.e. pipelined (a client that waits for
    /// each answer sends its next request after it, and it is read in a later turn).
    func previousEnded(inTurn turn: UInt64) -> Bool {
        state.withLock { $0.completedTurn == turn }
    }

    func addBodyBytes(_ count: Int) {
        state.withLock { $0.bodyBytes += count }
    }

    /// Shuts the socket down (once) so that libmicrohttpd, or the monitor for a suspended
    /// connection, notices and closes it. Only called with the registry's lock held, which the
    /// CLOSED notification also takes before libmicrohttpd closes the descriptor: `fd` is
    /// still this connection's socket here.
    fileprivate func reap(_ reason: HTTPReapReason) -> Bool {
        let first = state.withLock { s -> Bool in
            guard s.reaped == nil else { return false }
            s.reaped = reason
            return true
        }
        if first { _ = Glibc.shutdown(fd, Int32(SHUT_RDWR)) }
        return first
    }
}

struct RecordState {
    var phase: ConnectionPhase = .waiting
    var phaseSince: UInt64
    /// When the server began waiting for the current request head (accept, or the end of the
    /// previous request): the whole head must arrive within the head deadline from here.
    var headSince: UInt64
    var bodyBytes = 0
    var requests = 0
    /// The turn of its loop in which the connection's last request ended (0: none yet).
    var completedTurn: UInt64 = 0
    var reaped: HTTPReapReason?
    /// The current request's writer (cleared when the request ends).
    var writer: HTTPResponseWriter?
    /// The server already answered a malformed Content-Length itself (see `answerMalformedContentLength`).
    var framingAnswered = false
}

/// All open connections: deadlines, slot eviction, graceful shutdown, counters.
final class ConnectionRegistry: Sendable {
    private struct State {
        var records: [ObjectIdentifier: ConnectionRecord] = [:]
        var perWorker: [pthread_t: Int] = [:]
        var perAddress: [IPAddress: Int] = [:]
        var draining = false
    }

    private let state = Mutex(State())
    private let configuration: HTTPServerConfiguration
    let totals: ServerTotals
    /// Per-worker share of `maxConnections` (libmicrohttpd splits the limit evenly).
    private let workerLimit: Int
    private let evictAbove: Int
    private let evictDownTo: Int

    init(configuration: HTTPServerConfiguration, workers: Int, totals: ServerTotals) {
        self.configuration = configuration
        self.totals = totals
        let workers = max(1, workers)
        workerLimit = max(1, configuration.maxConnections / workers)
        evictAbove = max(1, Int(Double(workerLimit) * configuration.slotEvictionThreshold))
        evictDownTo = max(0, evictAbove - max(1, workerLimit / 20))
    }

    /// Read on every response: an atomic copy of `State.draining`, so that the hot path takes no
    /// global lock.
    private let drainingFlag = Atomic<Bool>(false)

    var isDraining: Bool { drainingFlag.load(ordering: .acquiring) }

    /// A connection was accepted (its worker thread). True when the worker is near its share of
    /// the connection limit, so the caller should wake the reaper.
    func opened(_ record: ConnectionRecord) -> Bool {
        totals.accepted.add(1, ordering: .relaxed)
        return state.withLock { s in
            s.records[ObjectIdentifier(record)] = record
            let count = (s.perWorker[record.worker] ?? 0) + 1
            s.perWorker[record.worker] = count
            if let address = record.address.map(limitKey) {
                let sameAddress = (s.perAddress[address] ?? 0) + 1
                s.perAddress[address] = sameAddress
                // Two loops accepting from one address at once can both pass `admits`: the
                // later one is closed here.
                let limit = configuration.maxConnectionsPerIP
                if limit > 0, sameAddress > limit { _ = Glibc.shutdown(record.fd, Int32(SHUT_RDWR)) }
            }
            return count > evictAbove
        }
    }

    /// What `maxConnectionsPerIP` counts an address under: its IPv6 /N, or its IPv4 address.
    private func limitKey(_ address: IPAddress) -> IPAddress { address.limitNetwork(ipv6PrefixLength: configuration.ipv6PrefixLength) }

    /// Whether a connection from `address` may be accepted (under `maxConnectionsPerIP`).
    func admits(_ address: IPAddress) -> Bool {
        let limit = configuration.maxConnectionsPerIP
        guard limit > 0 else { return true }
        let key = limitKey(address)
        return state.withLock { ($0.perAddress[key] ?? 0) < limit }
    }

    func closed(_ record: ConnectionRecord) {
        state.withLock { s in
            guard s.records.removeValue(forKey: ObjectIdentifier(record)) != nil else { return }
            let count = (s.perWorker[record.worker] ?? 1) - 1
            s.perWorker[record.worker] = count > 0 ? count : nil
            if let address = record.address.map(limitKey) {
                let sameAddress = (s.perAddress[address] ?? 1) - 1
                s.perAddress[address] = sameAddress > 0 ? sameAddress : nil
            }
        }
        record.state.withLock { $0.writer = nil }
    }

    /// Closes a connection whose client is known to be gone (its loop's thread, between runs of
    /// its daemon, so libmicrohttpd cannot be closing the descriptor meanwhile).
    func reapClosedByClient(_ record: ConnectionRecord) {
        state.withLock { _ in _ = reap(record, .clientClosed) }
    }

    private func reap(_ record: ConnectionRecord, _ reason: HTTPReapReason) -> Bool {
        guard record.reap(reason) else { return false }
        totals.countReap(reason)
        return true
    }

    /// Applies the deadlines and, near the connection limit, frees slots. Runs on the monitor
    /// thread every tick.
    func sweep(now: UInt64 = monotonicNanoseconds()) {
        let c = configuration
        let head = nanoseconds(c.headDeadlineSeconds)
        let write = nanoseconds(c.writeTimeoutSeconds)
        let grace = nanoseconds(c.bodyGraceSeconds)
        let bodyDeadline = nanoseconds(c.bodyDeadlineSeconds)
        let minRate = c.minBodyBytesPerSecond
        // While draining, a head counts as slow after a tenth of its deadline (at most 1 s).
        let slowHead = head > 0 ? min(1_000_000_000, head / 10) : 1_000_000_000
        // Workers move their records' clocks concurrently: a time may be later than `now`.
        func age(_ since: UInt64) -> UInt64 { now > since ? now - since : 0 }
        var resumable: [HTTPResponseWriter] = []
        state.withLock { s in
            let draining = s.draining
            var heldWriters: [(record: ConnectionRecord, writer: HTTPResponseWriter)] = []
            defer {
                // Under the registry's lock, so each descriptor is still its connection's. A held
                // request goes on once its client has taken half of what waited.
                for (record, writer) in heldWriters where unreadBytes(record.fd) <= c.maxUnreadResponseBytes / 2 { resumable.append(writer) }
            }
            var live: [pthread_t: Int] = [:]
            var candidates: [pthread_t: [(rank: Int, since: UInt64, record: ConnectionRecord)]] = [:]
            for record in s.records.values {
                let verdict = record.state.withLock { r -> (HTTPReapReason?, rank: Int, since: UInt64)? in
                    guard r.reaped == nil else { return nil }
                    switch r.phase {
                    case .waiting, .head:
                        let idle = r.phase == .waiting && r.requests > 0
                        // Draining: an idle keep-alive goes at once, a head (or a connection taken
                        // but silent so far) after a tenth of its deadline; but not one whose next
                        // request is already in the socket, unread: that request is answered.
                        if draining, idle || age(r.headSince) > slowHead, pendingBytes(record.fd) == 0 {
                            return (.shutdown, 0, 0)
                        }
                        if head > 0, age(r.headSince) > head { return (idle ? .idleTimeout : .headTimeout, 0, 0) }
                        // Eviction order: idle keep-alives, then heads; oldest first in each.
                        return (nil, idle ? 0 : 1, r.headSince)
                    case .body:
                        let elapsed = age(r.phaseSince)
                        if bodyDeadline > 0, elapsed > bodyDeadline { return (.bodyDeadline, 0, 0) }
                        if minRate > 0, draining || elapsed > grace,
                           Double(r.bodyBytes) < Double(minRate) * Double(elapsed) / 1e9 {
                            return (.bodyTooSlow, 0, 0)
                        }
                    case .responding:
                        if write > 0, age(r.phaseSince) > write { return (.writeTimeout, 0, 0) }
                    case .streaming:
                        let stalled = record.streamStalledSince.load(ordering: .relaxed)
                        if write > 0, stalled != 0, age(stalled) > write { return (.writeTimeout, 0, 0) }
                    case .handling, .waitingTurn:
                        break
                    case .held:
                        if write > 0, age(r.phaseSince) > write { return (.unreadAnswers, 0, 0) }
                        if let writer = r.writer { heldWriters.append((record, writer)) }
                        return (nil, 0, r.phaseSince)
                    }
                    return (nil, 2, 0)
                }
                guard let verdict else { continue }  // already reaped, closing
                if let reason = verdict.0 {
                    _ = reap(record, reason)
                    continue
                }
                live[record.worker, default: 0] += 1
                if verdict.rank < 2 { candidates[record.worker, default: []].append((verdict.rank, verdict.since, record)) }
            }
            // Slots: a worker over its high mark closes the connections doing the least (idle
            // keep-alives and requests held for unread answers first, then heads).
            for (worker, count) in live where count > evictAbove {
                var excess = count - evictDownTo
                let ordered = (candidates[worker] ?? []).sorted { ($0.rank, $0.since) < ($1.rank, $1.since) }
                for candidate in ordered where excess > 0 {
                    if reap(candidate.record, candidate.rank == 0 ? .evictedIdle : .evictedHead) { excess -= 1 }
                }
            }
        }
        for writer in resumable { writer.releaseHold() }
    }

    /// Graceful shutdown begins: new connections are closed at once, idle ones now, heads older
    /// than a tenth of the head deadline (at most 1 s) and bodies below the minimum rate (grace
    /// period or not) at each sweep; returns the writers whose answers are still incomplete.
    func beginDraining() -> [HTTPResponseWriter] {
        let records = state.withLock { s -> [ConnectionRecord] in
            s.draining = true
            drainingFlag.store(true, ordering: .releasing)
            return Array(s.records.values)
        }
        sweep()
        return records.compactMap { record in record.state.withLock { $0.writer } }
    }

    var openConnections: Int { state.withLock { $0.records.count } }

    /// The writers of every request in progress.
    func currentWriters() -> [HTTPResponseWriter] {
        let records = state.withLock { Array($0.records.values) }
        return records.compactMap { record in record.state.withLock { $0.writer } }
    }

    /// libmicrohttpd 0.9.75 answers an invalid or overflowing Content-Length itself, from
    /// parse_connection_headers, before the access handler runs, and its state machine then
    /// builds the response head a second time (two status lines on the wire). Nothing of ours
    /// runs in between except its log callback, on the connection's worker thread, so that is
    /// where we answer instead: the one connection on this worker whose head is complete but
    /// that has not reached the access handler gets a single 400 written to its socket, and the
    /// socket's write side is shut down so libmicrohttpd's own (doubled) answer cannot follow.
    func answerMalformedContentLength(worker: pthread_t) {
        state.withLock { s in
            for record in s.records.values where pthread_equal(record.worker, worker) != 0 {
                let claim = record.state.withLock { r -> String? in
                    guard r.phase == .head, !r.framingAnswered, r.reaped == nil,
                          attest_mhd_request_header_size(record.connection.pointer) > 0 else { return nil }
                    r.framingAnswered = true
                    return r.writer?.target ?? "/"
                }
                guard let target = claim else { continue }
                let answer = serialized(configuration.refusalResponse(400, splitTarget(target).path))
                answer.withUnsafeBytes { bytes in
                    _ = send(record.fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                }
                _ = Glibc.shutdown(record.fd, Int32(SHUT_WR))
                totals.malformed.add(1, ordering: .relaxed)
            }
        }
    }

    /// Counts connections by phase (for `HTTPServer.stats()`).
    func phaseCounts() -> (total: Int, waiting: Int, heads: Int, bodies: Int, handling: Int, responding: Int, streams: Int, held: Int,
                           waitingTurn: Int) {
        state.withLock { s in
            var counts = (total: s.records.count, waiting: 0, heads: 0, bodies: 0, handling: 0, responding: 0, streams: 0, held: 0,
                          waitingTurn: 0)
            for record in s.records.values {
                switch record.state.withLock({ $0.phase }) {
                case .waiting: counts.waiting += 1
                case .head: counts.heads += 1
                case .body: counts.bodies += 1
                case .handling: counts.handling += 1
                case .responding: counts.responding += 1
                case .streaming: counts.streams += 1
                case .held: counts.held += 1
                case .waitingTurn: counts.waitingTurn += 1
                }
            }
            return counts
        }
    }
}

/// `response` as HTTP/1.1 bytes that close the connection, for answers written to the socket
/// directly (libmicrohttpd does not frame them).
private func serialized(_ response: HTTPResponse) -> [UInt8] {
    let reason = MHD_get_reason_phrase_for(UInt32(response.status)).map { String(cString: $0) } ?? ""
    var head = "HTTP/1.1 \(response.status) \(reason)\r\nConnection: close\r\n"
    for (name, value) in response.headers where !asciiCaseInsensitiveEquals(name, "content-length")
        && !asciiCaseInsensitiveEquals(name, "connection") && !value.utf8.contains(where: { $0 == 10 || $0 == 13 }) {
        head += "\(name): \(value)\r\n"
    }
    head += "Content-Length: \(response.body.count)\r\n\r\n"
    return Array(head.utf8) + response.body
}

private func nanoseconds(_ seconds: Double) -> UInt64 {
    seconds > 0 ? UInt64(seconds * 1e9) : 0
}

/// A peer's IP address as a dictionary key.

/// Totals since the server was created (they survive restarts).
final class ServerTotals: Sendable {
    let accepted = Atomic<UInt64>(0)
    let requests = Atomic<UInt64>(0)
    let malformed = Atomic<UInt64>(0)
    let tooLarge = Atomic<UInt64>(0)
    let overloaded = Atomic<UInt64>(0)
    let cancelled = Atomic<UInt64>(0)
    /// Requests held for their connection's unread answers (each time one was held).
    let held = Atomic<UInt64>(0)
    /// Requests that waited for a later turn of their loop (each time one waited).
    let turnWaits = Atomic<UInt64>(0)
    /// Whole requests whose connection closed before any answer was queued.
    let unanswered = Atomic<UInt64>(0)
    private let reaped = Mutex<[HTTPReapReason: UInt64]>([:])

    func countReap(_ reason: HTTPReapReason) {
        reaped.withLock { $0[reason, default: 0] += 1 }
    }

    var reapedByReason: [HTTPReapReason: UInt64] { reaped.withLock { $0 } }
}

/// Bytes of answers waiting in the socket for the client (0 when that cannot be told).
func unreadBytes(_ fd: Int32) -> Int { max(0, Int(attest_unread_bytes(fd))) }

/// Bytes received on the socket and not read yet (0 when that cannot be told).
func pendingBytes(_ fd: Int32) -> Int { max(0, Int(attest_pending_bytes(fd))) }
