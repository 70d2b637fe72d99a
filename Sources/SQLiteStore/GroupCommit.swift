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
/// Waiting is per transaction: a finished batch wakes its own transactions and the next leader
/// only (one broadcast used to wake every thread queued for the next batch too, which went back
/// to sleep at once: about one context switch per exchange for nothing).
final class GroupCommit: @unchecked Sendable {   // the state is guarded by `lock`
    private final class Job {
        /// Dropped once it has run: the caller's closure must not outlive its `run` call (it is
        /// only "escaping" so that another thread may run it), and the leader still holds the job.
        var body: ((SQLiteConnection) throws -> Any)?
        var result: Result<Any, any Error>?
        /// Set (under `lock`) when this job's thread is to commit the next batch.
        var leads = false
        /// Signalled once: when the result is set, or when the job is made the next leader.
        let woken = DispatchSemaphore(value: 0)
        init(_ body: @escaping (SQLiteConnection) throws -> Any) { self.body = body }
    }

    private let writer: LockedSQLiteConnection
    private let lock = NSLock()
    private var queue: [Job] = []
    /// Whether some thread is committing a batch (or has been made the next leader).
    private var committing = false
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

    init(writer: LockedSQLiteConnection) { self.writer = writer }

    /// Runs `body` in a transaction (its own, or a savepoint in a batch's) and returns once that
    /// transaction has committed.
    func run<T>(_ body: @escaping (SQLiteConnection) throws -> T) throws -> T {
        let job = Job { try body($0) }
        lock.lock()
        queue.append(job)
        if committing {
            lock.unlock()
            job.woken.wait()
            lock.lock()
        } else {
            committing = true
            job.leads = true
        }
        // Woken with a result, or to lead: a leader's own job is first in the queue, so the
        // batch it takes holds it.
        if job.result == nil {
            precondition(job.leads, "a group-commit job woke with neither a result nor the lead")
            let batch = Array(queue.prefix(Self.maxBatch))
            queue.removeFirst(batch.count)
            lock.unlock()
            let results = commit(batch)
            lock.lock()
            for (done, result) in zip(batch, results) {
                done.result = result
                done.body = nil
            }
            batchCount += 1
            jobCount += batch.count
            // The next batch's leader is the longest waiting; committing stays true until then.
            let next = queue.first
            if let next { next.leads = true } else { committing = false }
            lock.unlock()
            // The next leader first: its BEGIN need not wait behind the batch's wake-ups.
            next?.woken.signal()
            for done in batch where done !== job { done.woken.signal() }
        } else {
            lock.unlock()
        }
        return try job.result!.get() as! T
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
