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
final class GroupCommit: @unchecked Sendable {   // the state is guarded by `condition`
    private final class Job {
        let body: (SQLiteConnection) throws -> Any
        var result: Result<Any, any Error>?
        init(_ body: @escaping (SQLiteConnection) throws -> Any) { self.body = body }
    }

    private let writer: LockedSQLiteConnection
    private let condition = NSCondition()
    private var queue: [Job] = []
    private var committing = false
    /// A batch's transactions hold the write lock together; a bound keeps one batch short.
    static let maxBatch = 32
    /// Batches committed and the transactions in them (a measure of how much is shared).
    private var batchCount = 0, jobCount = 0
    var counts: (batches: Int, jobs: Int) {
        condition.lock()
        defer { condition.unlock() }
        return (batchCount, jobCount)
    }

    /// Transactions waiting for a batch (tests).
    var waiting: Int {
        condition.lock()
        defer { condition.unlock() }
        return queue.count
    }

    init(writer: LockedSQLiteConnection) { self.writer = writer }

    /// Runs `body` in a transaction (its own, or a savepoint in a batch's) and returns once that
    /// transaction has committed.
    func run<T>(_ body: @escaping (SQLiteConnection) throws -> T) throws -> T {
        let job = Job { try body($0) }
        condition.lock()
        queue.append(job)
        while job.result == nil {
            if committing {
                condition.wait()
                continue
            }
            // Nobody is committing: this thread commits what is queued (its own job among them).
            committing = true
            let batch = Array(queue.prefix(Self.maxBatch))
            queue.removeFirst(batch.count)
            condition.unlock()
            let results = commit(batch)
            condition.lock()
            for (job, result) in zip(batch, results) { job.result = result }
            batchCount += 1
            jobCount += batch.count
            committing = false
            condition.broadcast()
        }
        let result = job.result!
        condition.unlock()
        return try result.get() as! T
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
                        let value = try batch[0].body(db)
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
                        let value = try job.body(db)
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
