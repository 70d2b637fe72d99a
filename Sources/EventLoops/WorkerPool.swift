import CEventLoop
#if canImport(Glibc)
import Glibc
#endif

/// A few threads taking tasks from one queue, for work that would hold an event loop too long:
/// an attestation's verification takes milliseconds of CPU and a device's registration waits
/// for the database's fsync. Any idle thread takes the next task, so one slow task delays no
/// other while a thread is free.
public final class WorkerPool: @unchecked Sendable {
    // @unchecked: `tasks`, `head` and `stopped` are touched only under `mutex`.
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var tasks: [(@Sendable () -> Void)?] = []
    /// The next task to run: `tasks` is consumed from the front without shifting it.
    private var head = 0
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

    /// Queues `task`; false once the pool is shut down (the task is not run).
    @discardableResult
    public func submit(_ task: @escaping @Sendable () -> Void) -> Bool {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        guard !stopped else { return false }
        tasks.append(task)
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

    private func work() {
        while true {
            pthread_mutex_lock(mutex)
            while head == tasks.count && !stopped { pthread_cond_wait(condition, mutex) }
            guard head < tasks.count else {  // stopped, and nothing left
                pthread_mutex_unlock(mutex)
                return
            }
            let task = tasks[head]
            tasks[head] = nil
            head += 1
            if head == tasks.count || head >= 1024 {
                tasks.removeFirst(head)
                head = 0
            }
            pthread_mutex_unlock(mutex)
            task?()
        }
    }
}
