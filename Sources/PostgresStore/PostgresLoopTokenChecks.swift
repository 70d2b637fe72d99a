import Dispatch
import EventLoops
import Foundation
import StoreRecords
import Synchronization
import TokenService
#if canImport(Glibc)
import Glibc
#endif

/// The relay's token check on PostgreSQL without a thread hop: each event loop has a connection
/// of its own, in non-blocking mode, watched by the loop's epoll set. A loop's checks that arrive
/// while its query runs go out together in the next one (`token_hash = ANY($1)`), so one round
/// trip answers all of them, and a check never waits on another thread.
///
/// Nothing is cached: every check is answered by a query sent after the check was asked for.
/// A connection that breaks or does not answer within `callTimeout` fails the checks it carried
/// (503, as a pooled call would) and is replaced on a background thread, never on the loop.
public final class PostgresLoopTokenChecks: NonBlockingTokenChecks {
    private let checkers: [LoopTokenChecker]
    private let loops: [EventLoop]

    /// - Parameter now: the clock the checks judge tokens by (the token service's).
    public init(connectionString: PostgresConnectionString, configuration: PostgresConfiguration, counters: PostgresCounters,
                loops: EventLoopGroup, now: @escaping @Sendable () -> Date) {
        self.loops = loops.loops
        checkers = loops.loops.map { loop in
            LoopTokenChecker(loop: loop, connectionString: connectionString, configuration: configuration, counters: counters, now: now)
        }
        for (loop, checker) in zip(self.loops, checkers) { loop.execute { loop.add(checker) } }
    }

    /// On the pool's settings, with the pool's counters (round trips are counted together).
    public convenience init(store: PostgresTokenStore, loops: EventLoopGroup, now: @escaping @Sendable () -> Date) {
        self.init(connectionString: store.pool.connectionString, configuration: store.pool.configuration, counters: store.pool.counters,
                  loops: loops, now: now)
    }

    public func check(hash: [UInt8], markBeforeCheck: @escaping @Sendable () -> Int,
                      done: @escaping @Sendable (Result<TokenCheck, any Error>) -> Void) -> Bool {
        guard let loop = EventLoop.current, loop.index < loops.count, loops[loop.index] === loop else { return false }
        checkers[loop.index].enqueue(LoopTokenChecker.Waiter(hash: hash, mark: markBeforeCheck, done: done))
        return true
    }

    /// Opens every loop's connection now (a server, before it listens), each on its own loop's
    /// behalf; waits at most `timeout` seconds. A failure is left to the first check to retry.
    public func warm(timeout: Double = 10) {
        let group = DispatchGroup()
        for checker in checkers {
            group.enter()
            checker.connectNow { group.leave() }
        }
        _ = group.wait(timeout: .now() + timeout)
    }

    /// Fails what is waiting and closes the connections (each on its own loop). Call before the
    /// loops stop; harmless after.
    public func shutdown() {
        for (loop, checker) in zip(loops, checkers) {
            _ = loop.run(andWait: { checker.shutdown() })
        }
    }

    /// The checks sent so far and the queries that carried them (for measurements and tests).
    public var figures: (checks: Int, queries: Int) {
        checkers.reduce((0, 0)) { ($0.0 + $1.checksSent.load(ordering: .relaxed), $0.1 + $1.queriesSent.load(ordering: .relaxed)) }
    }

    /// The batched form of the token check (`StoreColumns.grantQuery`): $1 is a `bytea[]` of hashes.
    static let batchSQL = StoreColumns.grantQuery(month: "$3", minute: "$4", previousMinute: "$4 - 1", hash: "ANY($1)", now: "$2")
    static let batchTypes: [PostgresType] = [.byteaArray, .float8, .int8, .int8]
    /// The most checks one query carries (a loop with more waiting sends them in turn).
    static let maxBatch = 128
}

/// One loop's connection and its checks. Everything but the `Atomic` figures is touched on the
/// loop's thread only.
final class LoopTokenChecker: EventLoopParticipant, @unchecked Sendable {
    // @unchecked: the state below is the loop thread's (as `EventLoop` runs its participants);
    // the background connect hands its result back through `loop.execute`.
    struct Waiter {
        let hash: [UInt8]
        let mark: @Sendable () -> Int
        let done: @Sendable (Result<TokenCheck, any Error>) -> Void
        /// Sent once already on a connection that turned out dead (a read may be sent again).
        var retried = false
    }

    private let loop: EventLoop
    private let connectionString: PostgresConnectionString
    private let configuration: PostgresConfiguration
    private let counters: PostgresCounters
    private let now: @Sendable () -> Date
    let checksSent = Atomic<Int>(0)
    let queriesSent = Atomic<Int>(0)

    private var connection: PostgresConnection?
    private var watchedSocket: Int32 = -1
    private var watchedEvents: UInt32 = 0
    private var connecting = false
    private var stopped = false
    /// Checks not yet sent, in arrival order.
    private var waiting: [Waiter] = []
    /// A query on the wire: its checks, the time it judges them at, each check's mark, and the
    /// monotonic time it gives up at.
    struct Query {
        let waiters: [Waiter]
        let at: Date
        let marks: [Int]
        let deadline: UInt64
    }
    private var inFlight: Query?
    /// Whether libpq still holds part of the query to write.
    private var flushing = false
    /// The grants last decoded, by token hash, with the bytes of the row they came from.
    private var decoded: [[UInt8]: (row: [UInt8], grant: TokenGrant)] = [:]
    static let maxDecoded = 4096

    init(loop: EventLoop, connectionString: PostgresConnectionString, configuration: PostgresConfiguration, counters: PostgresCounters,
         now: @escaping @Sendable () -> Date) {
        self.loop = loop
        self.connectionString = connectionString
        self.configuration = configuration
        self.counters = counters
        self.now = now
    }

    func enqueue(_ waiter: Waiter) {
        guard !stopped else {
            // Later, never inside the caller's `check` (a suspension resumes after it returns).
            let error = PostgresError(.connectionLost, message: "the service is stopping", target: connectionString.redactedDescription)
            if !loop.execute({ waiter.done(.failure(error)) }) { waiter.done(.failure(error)) }
            return
        }
        waiting.append(waiter)
        // Sent at the end of the turn (`poll`), with every other check this turn brings: the
        // requests that one epoll wake-up delivers share a query.
        if inFlight == nil { loop.requestTurn() }
    }

    // MARK: Sending and reading

    private func sendNext() {
        guard inFlight == nil, !waiting.isEmpty, !stopped else { return }
        guard let connection else {
            connect()
            return
        }
        let batch = Array(waiting.prefix(PostgresLoopTokenChecks.maxBatch))
        waiting.removeFirst(batch.count)
        // Each mark before the query: usage flushed while it runs is counted by the policy.
        let marks = batch.map { $0.mark() }
        let time = now()
        let minute = UsageClock.minute(time)
        do {
            try connection.send(PostgresLoopTokenChecks.batchSQL, [.byteaArray(batch.map(\.hash)), .double(time.timeIntervalSince1970),
                                                                   .int(UsageClock.month(time)), .int(minute)])
            flushing = !(try connection.flushWithoutWaiting())
        } catch {
            failOrRetry(batch, error)
            drop()
            return
        }
        inFlight = Query(waiters: batch, at: time, marks: marks, deadline: monotonicNanoseconds() + UInt64(configuration.callTimeout * 1_000_000_000))
        checksSent.add(batch.count, ordering: .relaxed)
        queriesSent.add(1, ordering: .relaxed)
        watch()
    }

    func handleEvent(fd: Int32, events: UInt32) {
        guard let connection, fd == watchedSocket else { return }
        do {
            if flushing {
                flushing = !(try connection.flushWithoutWaiting())
                watch()
            }
            guard events & (EpollEvents.readable | EpollEvents.error | EpollEvents.hangUp) != 0 else { return }
            guard let query = inFlight else {
                // Readable while idle: we never LISTEN, so the server closed the session (or the
                // network did). Replaced at the next check.
                drop()
                return
            }
            guard let result = try connection.readWithoutWaiting() else { return }
            inFlight = nil
            answer(query, result)
        } catch {
            // An error result leaves the session usable; a broken one was closed by the call.
            if let query = inFlight {
                inFlight = nil
                failOrRetry(query.waiters, error)
            }
            if (error as? PostgresError)?.kind != .server { drop() }
        }
        sendNext()
    }

    func poll(now: UInt64) -> UInt64? {
        guard let query = inFlight else {
            sendNext()
            return inFlight?.deadline
        }
        guard now >= query.deadline else { return query.deadline }
        inFlight = nil
        fail(query.waiters, PostgresError(.timeout, message: "no answer within the call's deadline", target: connectionString.redactedDescription))
        drop()
        sendNext()
        return nil
    }

    /// Each check's grant, from the row of its hash. A row that comes back byte for byte as it
    /// was last time gives the grant decoded then (decoding the policy's lists costs more than
    /// the comparison); any change in the row (a policy, a usage count) decodes it again.
    private func answer(_ query: Query, _ result: PostgresResult) {
        // A batch is small (its rows at most its checks): each check finds its row by comparing
        // hashes in place, with nothing allocated.
        let hashColumn = result.columnIndex("token_hash")
        for (waiter, mark) in zip(query.waiters, query.marks) {
            do {
                var grant: TokenGrant?
                if let hashColumn, let index = (0..<result.count).first(where: { result.value($0, hashColumn, equals: waiter.hash) }) {
                    if let kept = decoded[waiter.hash], result.row(index, equals: kept.row) {
                        grant = kept.grant
                    } else if let fresh = try TokenGrant(row: result[index], hash: waiter.hash) {
                        if decoded.count >= Self.maxDecoded { decoded.removeAll(keepingCapacity: true) }
                        decoded[waiter.hash] = (result.rawRow(index), fresh)
                        grant = fresh
                    }
                }
                waiter.done(.success(TokenCheck(grant: grant, checkedAt: query.at, markBeforeCheck: mark)))
            } catch {
                waiter.done(.failure(error))
            }
        }
    }

    private func fail(_ waiters: [Waiter], _ error: any Error) {
        for waiter in waiters { waiter.done(.failure(error)) }
    }

    /// A connection lost under a query (the server restarted, an idle session was closed before
    /// the loop saw it): its checks go out once more on a new connection, ahead of the others.
    /// Anything else, or a second loss, fails them.
    private func failOrRetry(_ waiters: [Waiter], _ error: any Error) {
        guard (error as? PostgresError)?.kind == .connectionLost, !stopped else { return fail(waiters, error) }
        var again: [Waiter] = []
        for var waiter in waiters {
            if waiter.retried {
                waiter.done(.failure(error))
            } else {
                waiter.retried = true
                again.append(waiter)
            }
        }
        waiting.insert(contentsOf: again, at: 0)
        if !again.isEmpty { loop.requestTurn() }
    }

    /// Watches the socket for its answer (and for room to write while libpq holds some of the
    /// query); epoll is told only of a change.
    private func watch() {
        guard let connection else { return }
        let socket = connection.socket
        let events = EpollEvents.readable | (flushing ? EpollEvents.writable : 0)
        guard socket != watchedSocket || events != watchedEvents else { return }
        if watchedSocket >= 0, watchedSocket != socket { loop.unwatch(fd: watchedSocket) }
        guard socket >= 0 else {
            drop()
            return
        }
        watchedSocket = socket
        watchedEvents = events
        if !loop.watch(fd: socket, events: events, for: self) { drop() }
    }

    /// Closes the connection (a new one is made for the next check).
    private func drop() {
        if watchedSocket >= 0 { loop.unwatch(fd: watchedSocket) }
        watchedSocket = -1
        watchedEvents = 0
        flushing = false
        connection?.close()
        connection = nil
        if let query = inFlight {
            inFlight = nil
            failOrRetry(query.waiters, PostgresError(.connectionLost, message: "connection closed", target: connectionString.redactedDescription))
        }
    }

    // MARK: Connecting, off the loop

    /// Opens a connection on a background thread (connecting waits on the network), then hands
    /// it to the loop; the checks waiting meanwhile go out on it, or fail with its error.
    private func connect(then: (@Sendable () -> Void)? = nil) {
        guard !connecting, !stopped else {
            then?()
            return
        }
        connecting = true
        let (connectionString, configuration, counters, loop) = (self.connectionString, self.configuration, self.counters, self.loop)
        DispatchQueue.global().async { [self] in
            let result = Result<PostgresConnection, any Error> {
                let connection = try PostgresConnection(connectionString, configuration: configuration,
                                                        deadline: .after(seconds: configuration.callTimeout), counters: counters)
                try connection.prepare(PostgresLoopTokenChecks.batchSQL, types: PostgresLoopTokenChecks.batchTypes)
                return connection
            }
            let delivered = loop.execute { [self] in
                connected(result)
                then?()
            }
            if !delivered {
                (try? result.get())?.close()
                then?()
            }
        }
    }

    private func connected(_ result: Result<PostgresConnection, any Error>) {
        connecting = false
        switch result {
        case .success(let connection) where !stopped:
            self.connection = connection
            // Watched from now on, idle or not: a session the server closes is seen and replaced
            // before a batch is sent on it.
            watch()
            sendNext()
        case .success(let connection):
            connection.close()
        case .failure(let error):
            let failed = waiting
            waiting = []
            fail(failed, error)
        }
    }

    /// For `warm`: connect now, from any thread.
    func connectNow(_ then: @escaping @Sendable () -> Void) {
        let queued = loop.execute { [self] in
            if connection == nil { connect(then: then) } else { then() }
        }
        if !queued { then() }
    }

    func shutdown() {
        stopped = true
        drop()
        let failed = waiting
        waiting = []
        fail(failed, PostgresError(.connectionLost, message: "the service is stopping", target: connectionString.redactedDescription))
        loop.remove(self)
    }
}
