import CSQLite
import Foundation

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
final class GroupCommit: @unchecked Sendable {   // the state is guarded by `lock`
    private final class Job {
        /// Dropped once it has run, with whatever the caller's closure holds.
        var body: ((SQLiteConnection) throws -> Any)?
        let completion: (Result<Any, any Error>) -> Void
        init(_ body: @escaping (SQLiteConnection) throws -> Any, _ completion: @escaping (Result<Any, any Error>) -> Void) {
            self.body = body
            self.completion = completion
        }
    }

    private let writer: LockedSQLiteConnection
    private let lock = NSLock()
    private var queue: [Job] = []
    /// The thread committing the queue now, if any.
    private var leader: pthread_t?
    /// A batch's transactions hold the write lock together; a bound keeps one batch short.
    static let maxBatch = 32
    /// Batches committed and the transactions in them (a measure of how much is shared).
    private var batchCount = 0, jobCount = 0
    var counts: (batches: Int, jobs: Int) {
        lock.lock()
        defer { lock.unlock() }
        return (batchCount, jobCount)
    }

    /// Transactions waiting for a batch (tests).
    var waiting: Int {
        lock.lock()
        defer { lock.unlock() }
        return queue.count
    }

    /// Whether some thread is committing the queue (tests).
    var isCommitting: Bool {
        lock.lock()
        defer { lock.unlock() }
        return leader != nil
    }

    init(writer: LockedSQLiteConnection) { self.writer = writer }

    /// Runs `body` in a transaction (its own, or a savepoint in a batch's) and calls `completion`
    /// once that transaction has committed or failed: on this thread before `submit` returns when
    /// no batch was being committed (this thread then commits whatever queues meanwhile too), else
    /// on the thread committing. A completion runs outside the writer's lock, so it may write
    /// again: a transaction submitted from a completion on the committing thread commits at once.
    func submit<T>(_ body: @escaping (SQLiteConnection) throws -> T, completion: @escaping (Result<T, any Error>) -> Void) {
        let job = Job({ try body($0) }) { result in completion(result.map { $0 as! T }) }
        let me = pthread_self()
        lock.lock()
        if let leader, pthread_equal(leader, me) != 0 {
            // From a completion this thread is calling between two batches: the writer is free.
            lock.unlock()
            let result = commit([job])
            lock.lock()
            batchCount += 1
            jobCount += 1
            lock.unlock()
            finish([job], result)
            return
        }
        queue.append(job)
        guard leader == nil else {
            lock.unlock()
            return
        }
        // The batch is taken under the same lock as the lead: a transaction queued from now on
        // waits for the next batch (tests count on it).
        leader = me
        let batch = takeBatch()
        lock.unlock()
        lead(batch)
    }

    /// `submit`, waiting for the commit.
    func run<T>(_ body: @escaping (SQLiteConnection) throws -> T) throws -> T {
        let outcome = ResultBox<T>()
        submit(body) { outcome.set($0) }
        return try outcome.wait()
    }

    /// Commits `batch`, then the next ones until the queue is empty (`leader` is this thread). The
    /// next batch is taken after this one's completions have run, so that it holds the
    /// transactions that arrived meanwhile too (only the leader takes from the queue).
    private func lead(_ batch: [Job]) {
        var batch = batch
        while true {
            let results = commit(batch)
            lock.lock()
            batchCount += 1
            jobCount += batch.count
            let more = !queue.isEmpty
            if !more { leader = nil }
            lock.unlock()
            finish(batch, results)
            guard more else { return }
            lock.lock()
            batch = takeBatch()
            lock.unlock()
        }
    }

    /// The next batch, out of the queue (`lock` held).
    private func takeBatch() -> [Job] {
        let batch = Array(queue.prefix(Self.maxBatch))
        queue.removeFirst(batch.count)
        return batch
    }

    private func finish(_ batch: [Job], _ results: [Result<Any, any Error>]) {
        for (job, result) in zip(batch, results) {
            job.body = nil
            job.completion(result)
        }
    }

    private func commit(_ batch: [Job]) -> [Result<Any, any Error>] {
        do {
            return try writer.withConnection { db in
                try db.execute("BEGIN IMMEDIATE")
                // Whatever way this ends, the writer is left outside a transaction: a SAVEPOINT or
                // RELEASE that throws must not leave it holding the write lock.
                defer { if db.inTransaction { try? db.execute("ROLLBACK") } }
                // One transaction alone needs no savepoint: if it throws, the whole is rolled back.
                guard batch.count > 1 else {
                    do {
                        let value = try batch[0].body!(db)
                        try db.execute("COMMIT")
                        return [.success(value)]
                    } catch {
                        return [.failure(error)]
                    }
                }
                var results: [Result<Any, any Error>] = []
                for job in batch {
                    try db.run("SAVEPOINT exchange")
                    do {
                        let value = try job.body!(db)
                        try db.run("RELEASE exchange")
                        results.append(.success(value))
                    } catch {
                        // Some errors (a full disk, an I/O error) make SQLite roll the whole
                        // transaction back: then nothing of the batch is committed.
                        guard db.inTransaction else { return batch.map { _ in .failure(error) } }
                        try db.run("ROLLBACK TO exchange")
                        try db.run("RELEASE exchange")
                        results.append(.failure(error))
                    }
                }
                do {
                    try db.execute("COMMIT")
                } catch {
                    return batch.map { _ in .failure(error) }
                }
                return results
            }
        } catch {
            return batch.map { _ in .failure(error) }
        }
    }
}

/// One result, set once on some thread and waited for on another.
final class ResultBox<T>: @unchecked Sendable {   // `result` is written before `ready` is signalled and read after
    private var result: Result<T, any Error>?
    private let ready = DispatchSemaphore(value: 0)

    func set(_ value: Result<T, any Error>) {
        result = value
        ready.signal()
    }

    func wait() throws -> T {
        ready.wait()
        return try result!.get()
    }
}
