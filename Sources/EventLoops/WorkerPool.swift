import CEventLoop
#if canImport(Glibc)
import Glibc
#endif

/// A few threads taking tasks from per-caller queues, for work that would hold an event loop
/// too long: an attestation's verification takes milliseconds of CPU and a device's registration
/// waits for the database's fsync. Any idle thread takes the next task, so one slow task delays
/// no other while a thread is free.
///
/// Tasks are queued by key (the caller's address): the next task is the oldest of the key that
/// has had the least work done lately, so a caller flooding the pool from a few addresses (or
/// pipelining requests on thousands of connections) waits behind itself, and a caller with
/// nothing queued is served next, not after the flood.
public final class WorkerPool: @unchecked Sendable {
    // @unchecked: everything below but `threadCount` is touched only under `mutex`.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private struct Queue {
        var tasks: [@Sendable () -> Void] = []
        var head = 0
        /// Tasks taken lately (halved every `decayEvery` picks): the fairness measure.
        var served: Double = 0
        /// When the key last became active: ties go to the longest waiting.
        var since: UInt64 = 0
        var isEmpty: Bool { head == tasks.count }
    }
    private var queues: [String: Queue] = [:]
    /// Keys with tasks waiting.
    private var active: [String] = []
    private var pending = 0
    private var picks: UInt64 = 0
    private var activations: UInt64 = 0
    private static let decayEvery: UInt64 = 256
    private var stopped = false
    private var threads: [pthread_t] = []
    public let threadCount: Int

    /// Starts `threads` workers (at least one), named `name-0`, `name-1`…
    public init(threads count: Int, name: String = "worker") throws {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(condition, nil)
        threadCount = max(1, count)
        for index in 0..<threadCount {
            let threadName = "\(name)-\(index)"
            threads.append(try spawnThread { [self] in
                attest_event_loop_name_thread(threadName)
                work()
            })
        }
    }

    deinit {
        shutdown()
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    /// Tasks queued and not yet started.
    public var queued: Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return pending
    }

    /// Queues `task` under `key` (tasks without one share a queue); false once the pool is shut
    /// down (the task is not run).
    @discardableResult
    public func submit(key: String = "", _ task: @escaping @Sendable () -> Void) -> Bool {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        guard !stopped else { return false }
        var queue = queues.removeValue(forKey: key) ?? Queue()
        if queue.isEmpty {
            queue.tasks.removeAll(keepingCapacity: queue.tasks.capacity <= 64)
            queue.head = 0
            activations &+= 1
            queue.since = activations
            active.append(key)
        }
        queue.tasks.append(task)
        queues[key] = queue
        pending += 1
        pthread_cond_signal(condition)
        return true
    }

    /// Runs what is queued, then stops the threads and waits for them. Idempotent.
    public func shutdown() {
        pthread_mutex_lock(mutex)
        let joining = stopped ? [] : threads
        stopped = true
        pthread_cond_broadcast(condition)
        pthread_mutex_unlock(mutex)
        let me = pthread_self()
        for thread in joining where pthread_equal(thread, me) == 0 { pthread_join(thread, nil) }
    }

    /// The next task (mutex held, something pending): the oldest of the least-served active key.
    private func next() -> @Sendable () -> Void {
        var best = 0
        if active.count > 1 {
            var bestServed = Double.infinity, bestSince = UInt64.max
            for (index, key) in active.enumerated() {
                let queue = queues[key]!
                if queue.served < bestServed || (queue.served == bestServed && queue.since < bestSince) {
                    best = index
                    bestServed = queue.served
                    bestSince = queue.since
                }
            }
        }
        let key = active[best]
        var queue = queues.removeValue(forKey: key)!
        let task = queue.tasks[queue.head]
        queue.head += 1
        queue.served += 1
        pending -= 1
        if queue.isEmpty {
            active.remove(at: best)
            queue.tasks = []
            queue.head = 0
        } else if queue.head >= 64, queue.head * 2 >= queue.tasks.count {
            queue.tasks.removeFirst(queue.head)
            queue.head = 0
        }
        queues[key] = queue
        picks &+= 1
        if picks % Self.decayEvery == 0 {
            // Old work counts less and less; keys idle and forgotten leave the table.
            for key in Array(queues.keys) {
                queues[key]!.served /= 2
                if queues[key]!.isEmpty && queues[key]!.served < 0.5 { queues[key] = nil }
            }
        }
        return task
    }

    private func work() {
        while true {
            pthread_mutex_lock(mutex)
            while pending == 0 && !stopped { pthread_cond_wait(condition, mutex) }
            guard pending > 0 else {  // stopped, and nothing left
                pthread_mutex_unlock(mutex)
                return
            }
            let task = next()
            pthread_mutex_unlock(mutex)
            task()
        }
    }
}
