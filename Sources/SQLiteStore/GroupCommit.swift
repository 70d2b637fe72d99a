import CSQLite
import Foundation
import Synchronization

/// Group commit for the token exchange's writes. Each exchange's transaction used to commit (and
/// fsync the WAL) on its own: under load the writer spent its time in fdatasync (13.5% of
/// attestd's CPU at 64 devices) while other exchanges queued for its lock. Now the exchanges that
/// arrive while one batch commits wait together, and the next of them to run commits them all in
/// one transaction: each in a savepoint of its own (one that throws is rolled back alone), then one
/// COMMIT and one fsync. No exchange is answered before the COMMIT that holds it has returned, so
/// an acknowledged token still survives a crash or a power cut (`synchronous=FULL` unchanged).
/// Within a batch the transactions run one after another on one connection, so they see each
/// other's writes exactly as if each had committed alone.
///
/// Nobody waits for a batch: a transaction is handed over with what to do once it has committed
/// (`submit`), and whichever thread finds no batch being committed commits the queue, batch after
/// batch, until it is empty, calling each transaction's completion after its COMMIT. A caller
/// that must wait (`run`) waits on its own completion alone. The exchange workers used to stay
/// blocked until their batch committed, so with 16 of them the batch committing and the one
/// queued behind it (8.4 exchanges each at 64 devices) held every worker while requests waited on
/// the loops and both cores idled.
final class GroupCommit: Sendable {
    private let writer: LockedSQLiteConnection
    private struct State {
        var queue: [any GroupCommitJob] = []
        /// The thread committing the queue now, if any.
        var leader: pthread_t?
        /// Batches committed and the transactions in them (a measure of how much is shared).
        var batchCount = 0, jobCount = 0

        /// The next batch, out of the queue.
        mutating func takeBatch() -> [any GroupCommitJob] {
            let batch = Array(queue.prefix(GroupCommit.maxBatch))
            queue.removeFirst(batch.count)
            return batch
        }
    }
    private let state = Mutex(State())
    /// What a submitting thread does next.
    private enum SubmitStep { case alone, queued, lead([any GroupCommitJob]) }
    /// A batch's transactions hold the write lock together; a bound keeps one batch short.
    static let maxBatch = 32
    var counts: (batches: Int, jobs: Int) { state.withLock { ($0.batchCount, $0.jobCount) } }

    /// Transactions waiting for a batch (tests).
    var waiting: Int { state.withLock { $0.queue.count } }

    /// Whether some thread is committing the queue (tests).
    var isCommitting: Bool { state.withLock { $0.leader != nil } }

    init(writer: LockedSQLiteConnection) { self.writer = writer }

    /// Runs `body` in a transaction (its own, or a savepoint in a batch's) and calls `completion`
    /// once that transaction has committed or failed: on this thread before `submit` returns when
    /// no batch was being committed (this thread then commits whatever queues meanwhile too), else
    /// on the thread committing. A completion runs outside the writer's lock, so it may write
    /// again: a transaction submitted from a completion on the committing thread commits at once.
    func submit<T: Sendable>(_ body: @escaping @Sendable (SQLiteConnection) throws -> T, completion: @escaping @Sendable (Result<T, any Error>) -> Void) {
        let job = TypedJob(body, completion)
        let me = pthread_self()
        let next: SubmitStep = state.withLock { state in
            // From a completion this thread is calling between two batches: the writer is free.
            if let leader = state.leader, pthread_equal(leader, me) != 0 { return .alone }
            state.queue.append(job)
            guard state.leader == nil else { return .queued }
            // The batch is taken under the same lock as the lead: a transaction queued from now
            // on waits for the next batch (tests count on it).
            state.leader = me
            return .lead(state.takeBatch())
        }
        switch next {
        case .alone:
            commit([job])
            state.withLock { $0.batchCount += 1; $0.jobCount += 1 }
            job.complete()
        case .queued:
            break
        case .lead(let batch):
            lead(batch)
        }
    }

    /// `submit`, waiting for the commit.
    func run<T: Sendable>(_ body: @escaping @Sendable (SQLiteConnection) throws -> T) throws -> T {
        let outcome = ResultBox<T>()
        submit(body) { outcome.set($0) }
        return try outcome.wait()
    }

    /// Commits `batch`, then the next ones until the queue is empty (`leader` is this thread). The
    /// next batch is taken after this one's completions have run, so that it holds the
    /// transactions that arrived meanwhile too (only the leader takes from the queue).
    private func lead(_ batch: [any GroupCommitJob]) {
        var batch = batch
        while true {
            commit(batch)
            let more = state.withLock { state in
                state.batchCount += 1
                state.jobCount += batch.count
                if state.queue.isEmpty { state.leader = nil }
                return !state.queue.isEmpty
            }
            for job in batch { job.complete() }
            guard more else { return }
            batch = state.withLock { $0.takeBatch() }
        }
    }

    /// Runs the batch in one transaction, each job in a savepoint of its own; every job has its
    /// outcome recorded when this returns (a failure of the whole batch is every job's).
    private func commit(_ batch: [any GroupCommitJob]) {
        do {
            try writer.withConnection { db in
                try db.execute("BEGIN IMMEDIATE")
                // Whatever way this ends, the writer is left outside a transaction: a SAVEPOINT or
                // RELEASE that throws must not leave it holding the write lock.
                defer { if db.inTransaction { try? db.execute("ROLLBACK") } }
                // One transaction alone needs no savepoint: if it throws, the whole is rolled back.
                guard batch.count > 1 else {
                    do {
                        try batch[0].execute(db)
                        try db.execute("COMMIT")
                    } catch {
                        batch[0].fail(error)
                    }
                    return
                }
                for job in batch {
                    try db.run("SAVEPOINT exchange")
                    do {
                        try job.execute(db)
                        try db.run("RELEASE exchange")
                    } catch {
                        // Some errors (a full disk, an I/O error) make SQLite roll the whole
                        // transaction back: then nothing of the batch is committed.
                        guard db.inTransaction else { throw error }
                        try db.run("ROLLBACK TO exchange")
                        try db.run("RELEASE exchange")
                    }
                }
                try db.execute("COMMIT")
            }
        } catch {
            for job in batch { job.fail(error) }
        }
    }
}

/// One transaction of a batch and what to do once its fate is known. Its result keeps its own
/// type (`TypedJob`): the batch only runs jobs and tells each how it ended.
protocol GroupCommitJob: Sendable {
    /// Runs the transaction's body on the writer, keeping its result; throws what it threw.
    func execute(_ db: SQLiteConnection) throws
    /// Records the failure of the job (its own, or the whole batch's).
    func fail(_ error: any Error)
    /// Calls the completion with what was recorded; the body is dropped.
    func complete()
}

private final class TypedJob<T: Sendable>: GroupCommitJob {
    private struct State {
        /// Dropped once it has run, with whatever the caller's closure holds.
        var body: (@Sendable (SQLiteConnection) throws -> T)?
        var result: Result<T, any Error>?
    }
    private let state: Mutex<State>
    private let completion: @Sendable (Result<T, any Error>) -> Void

    init(_ body: @escaping @Sendable (SQLiteConnection) throws -> T, _ completion: @escaping @Sendable (Result<T, any Error>) -> Void) {
        state = Mutex(State(body: body))
        self.completion = completion
    }

    func execute(_ db: SQLiteConnection) throws {
        guard let body = state.withLock({ $0.body }) else { return }
        let result: Result<T, any Error>
        do { result = .success(try body(db)) } catch { result = .failure(error) }
        state.withLock { $0.result = result }
        _ = try result.get()
    }

    func fail(_ error: any Error) { state.withLock { $0.result = .failure(error) } }

    func complete() {
        let result = state.withLock { state in
            state.body = nil
            return state.result
        }
        completion(result ?? .failure(SQLiteError(code: SQLITE_MISUSE, message: "a transaction of the batch was never run")))
    }
}

/// One result, set once on some thread and waited for on another.
final class ResultBox<T: Sendable>: Sendable {
    private let result = Mutex<Result<T, any Error>?>(nil)
    private let ready = DispatchSemaphore(value: 0)

    func set(_ value: Result<T, any Error>) {
        result.withLock { $0 = value }
        ready.signal()
    }

    func wait() throws -> T {
        ready.wait()
        return try result.withLock { $0! }.get()
    }
}
