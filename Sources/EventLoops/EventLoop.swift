import CEventLoop
import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Something an event loop drives: descriptors it registered, and work it does every turn.
/// Every call comes on the loop's own thread.
public protocol EventLoopParticipant: AnyObject {
    /// A descriptor this participant registered is ready; `events` is epoll's mask.
    func handleEvent(fd: Int32, events: UInt32)
    /// Runs once every turn of the loop, after ready descriptors and queued tasks. Returns the
    /// monotonic time (nanoseconds) by which it must run again, or nil to wait for events.
    func poll(now: UInt64) -> UInt64?
}

/// One thread, one epoll set, and a task queue. Whatever a request needs (its HTTP connection,
/// its upstream transfer, the hand-over between them) lives on one loop, so a relayed request
/// starts, waits and answers without crossing threads.
///
/// `execute` may be called from any thread: from the loop's own thread it appends to a plain
/// array (no lock, no system call); from another it queues behind a mutex and wakes the loop
/// through an eventfd.
public final class EventLoop: @unchecked Sendable {
    // @unchecked: the mutable state below is touched only on the loop's thread (`loopOnly`),
    // except the `remote` queue (a Mutex) and the atomics.

    /// Position in its group.
    public let index: Int
    /// The thread's name (at most 15 bytes are kept).
    private let name: String
    private let epollFD: Int32
    private let wakeFD: Int32

    private struct Remote {
        var tasks: [@Sendable () -> Void] = []
        var closed = false
    }
    private let remote = Mutex(Remote())
    private let remotePending = Atomic<Bool>(false)
    private let threadHandle = Mutex<pthread_t?>(nil)

    // Loop thread only.
    private var handlers: [Int32: any EventLoopParticipant] = [:]
    private var participants: [any EventLoopParticipant] = []
    private var localTasks: [() -> Void] = []
    /// Set during a turn when a participant has work for the next one: that turn does not wait.
    private var turnAgain = false

    init(index: Int, name: String) throws {
        self.index = index
        self.name = name
        epollFD = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epollFD >= 0 else { throw EventLoopError("epoll_create1 failed: \(String(cString: strerror(errno)))") }
        wakeFD = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        guard wakeFD >= 0 else {
            close(epollFD)
            throw EventLoopError("eventfd failed: \(String(cString: strerror(errno)))")
        }
        guard attest_event_loop_ctl(epollFD, EPOLL_CTL_ADD, wakeFD, EPOLLIN.rawValue) == 0 else {
            close(epollFD)
            close(wakeFD)
            throw EventLoopError("epoll_ctl failed: \(String(cString: strerror(errno)))")
        }
    }

    deinit {
        close(epollFD)
        close(wakeFD)
    }

    /// The loop whose thread is calling, if any.
    public static var current: EventLoop? {
        attest_event_loop_current().map { Unmanaged<EventLoop>.fromOpaque($0).takeUnretainedValue() }
    }

    /// True on this loop's own thread.
    public var inLoop: Bool { attest_event_loop_current() == Unmanaged.passUnretained(self).toOpaque() }

    /// Runs `task` on the loop's thread, after whatever is already queued. From the loop's own
    /// thread it runs later in the same turn, never inside the caller. False once the loop has
    /// stopped (the task is dropped).
    @discardableResult
    public func execute(_ task: @escaping @Sendable () -> Void) -> Bool {
        if inLoop {
            localTasks.append(task)
            return true
        }
        let (accepted, mustWake) = remote.withLock { r -> (Bool, Bool) in
            guard !r.closed else { return (false, false) }
            r.tasks.append(task)
            guard r.tasks.count == 1 else { return (true, false) }
            remotePending.store(true, ordering: .releasing)
            return (true, true)
        }
        if mustWake { wake() }
        return accepted
    }

    /// Runs `body` on the loop's thread and waits for its result: inline when called on the loop
    /// itself. Nil if the loop has stopped.
    public func run<T: Sendable>(andWait body: @escaping @Sendable () -> T) -> T? {
        if inLoop { return body() }
        let box = ResultBox<T>()
        guard execute({ box.fulfil(body()) }) else { return nil }
        return box.wait()
    }

    // MARK: Loop thread only

    /// Watches `fd` for `events` (epoll flags) on behalf of `participant`; a descriptor already
    /// watched gets the new mask. False (with errno) if epoll refuses it.
    @discardableResult
    public func watch(fd: Int32, events: UInt32, for participant: any EventLoopParticipant) -> Bool {
        let op = handlers[fd] == nil ? EPOLL_CTL_ADD : EPOLL_CTL_MOD
        var ok = attest_event_loop_ctl(epollFD, op, fd, events) == 0
        // A descriptor closed without being unwatched leaves epoll by itself, and its number may
        // come back: fall back from MOD to ADD and from ADD to MOD.
        if !ok, op == EPOLL_CTL_MOD, errno == ENOENT {
            ok = attest_event_loop_ctl(epollFD, EPOLL_CTL_ADD, fd, events) == 0
        } else if !ok, op == EPOLL_CTL_ADD, errno == EEXIST {
            ok = attest_event_loop_ctl(epollFD, EPOLL_CTL_MOD, fd, events) == 0
        }
        if ok { handlers[fd] = participant }
        return ok
    }

    /// Stops watching `fd` (call before closing it, or after: either is harmless).
    public func unwatch(fd: Int32) {
        guard handlers.removeValue(forKey: fd) != nil else { return }
        _ = attest_event_loop_ctl(epollFD, EPOLL_CTL_DEL, fd, 0)
    }

    /// A participant has work (for itself or another participant already polled this turn):
    /// the next turn does not wait for an event or a deadline.
    public func requestTurn() {
        turnAgain = true
    }

    /// Adds a participant: its `poll` runs every turn from now on.
    public func add(_ participant: any EventLoopParticipant) {
        participants.append(participant)
    }

    /// Removes a participant and every descriptor it watches.
    public func remove(_ participant: any EventLoopParticipant) {
        participants.removeAll { $0 === participant }
        for (fd, owner) in handlers where owner === participant { unwatch(fd: fd) }
    }

    // MARK: The thread

    func start() throws {
        // Handlers run here (request parsing, the token check, attestation verification): give
        // them the same room as a libmicrohttpd worker would have.
        let thread = try spawnThread(stackSize: 8 << 20) { [self] in run() }
        threadHandle.withLock { $0 = thread }
    }

    /// Refuses new tasks, lets the loop run what is queued, and joins its thread. Participants
    /// should have removed themselves first; any left are dropped without another call.
    func stop() {
        remote.withLock { $0.closed = true }
        remotePending.store(true, ordering: .releasing)
        wake()
        if let thread = threadHandle.withLock({ t -> pthread_t? in defer { t = nil }; return t }) {
            if pthread_equal(thread, pthread_self()) != 0 { pthread_detach(thread) } else { pthread_join(thread, nil) }
        }
    }

    private func wake() {
        var one: UInt64 = 1
        _ = withUnsafeBytes(of: &one) { write(wakeFD, $0.baseAddress, 8) }
    }

    private func run() {
        attest_event_loop_set_current(Unmanaged.passUnretained(self).toOpaque())
        attest_event_loop_name_thread(name)
        let capacity = 256
        var fds = [Int32](repeating: 0, count: capacity)
        var masks = [UInt32](repeating: 0, count: capacity)
        var deadline: UInt64?
        var closed = false
        while true {
            let timeout: Int32
            if !localTasks.isEmpty || closed || turnAgain {
                timeout = 0
            } else if let deadline {
                let now = monotonicNanoseconds()
                // Rounded up, so the loop does not spin through the last millisecond.
                timeout = deadline <= now ? 0 : Int32(min((deadline - now + 999_999) / 1_000_000, 1000))
            } else {
                timeout = 1000
            }
            turnAgain = false
            let count = attest_event_loop_wait(epollFD, &fds, &masks, Int32(capacity), timeout)
            for slot in 0..<Int(max(0, count)) {
                let fd = fds[slot]
                if fd == wakeFD {
                    var drained: UInt64 = 0
                    _ = read(wakeFD, &drained, 8)
                } else if let participant = handlers[fd] {
                    participant.handleEvent(fd: fd, events: masks[slot])
                }
            }
            if remotePending.exchange(false, ordering: .acquiring) {
                let (tasks, isClosed) = remote.withLock { r in
                    defer { r.tasks = [] }
                    return (r.tasks, r.closed)
                }
                for task in tasks { localTasks.append(task) }
                closed = isClosed
            }
            if !localTasks.isEmpty {
                // Tasks queued while these run wait for the next turn (which then does not sleep).
                let tasks = localTasks
                localTasks = []
                for task in tasks { task() }
            }
            let now = monotonicNanoseconds()
            deadline = nil
            for participant in participants {
                if let next = participant.poll(now: now) { deadline = min(deadline ?? next, next) }
            }
            if closed, localTasks.isEmpty { break }
        }
        participants = []
        handlers = [:]
        attest_event_loop_set_current(nil)
    }
}

/// A fixed set of event loops, one thread each.
public final class EventLoopGroup: Sendable {
    public let loops: [EventLoop]
    private let turn = Atomic<Int>(0)
    private let stopped = Atomic<Bool>(false)

    /// Starts `count` loops (at least one), their threads named `name-0`, `name-1`…
    public init(loops count: Int, name: String = "event-loop") throws {
        var loops: [EventLoop] = []
        for index in 0..<max(1, count) {
            let loop = try EventLoop(index: index, name: "\(name)-\(index)")
            do {
                try loop.start()
            } catch {
                loops.forEach { $0.stop() }
                throw error
            }
            loops.append(loop)
        }
        self.loops = loops
    }

    deinit { shutdown() }

    /// The calling thread's loop if it is one of ours, else the next in turn.
    public func preferred() -> EventLoop {
        if let current = EventLoop.current, current.index < loops.count, loops[current.index] === current { return current }
        return next()
    }

    /// The loops in turn.
    public func next() -> EventLoop {
        let slot = turn.wrappingAdd(1, ordering: .relaxed).oldValue
        return loops[Int(UInt(bitPattern: slot) % UInt(loops.count))]
    }

    /// Stops every loop and joins their threads. Idempotent.
    public func shutdown() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        for loop in loops { loop.stop() }
    }
}

public struct EventLoopError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// A result handed from the loop's thread to a waiting caller.
private final class ResultBox<T: Sendable>: Sendable {
    private let value = Mutex<T?>(nil)
    private let ready = DispatchSemaphore(value: 0)

    func fulfil(_ result: T) {
        value.withLock { $0 = result }
        ready.signal()
    }

    func wait() -> T {
        ready.wait()
        return value.withLock { $0! }
    }
}

private final class ThreadBody {
    let body: @Sendable () -> Void
    init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}

/// A joinable POSIX thread running `body` (stack size in bytes; 0: the system's default).
public func spawnThread(stackSize: Int = 0, _ body: @escaping @Sendable () -> Void) throws -> pthread_t {
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    if stackSize > 0 { pthread_attr_setstacksize(&attributes, stackSize) }
    let context = Unmanaged.passRetained(ThreadBody(body)).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(&thread, &attributes, { argument in
        Unmanaged<ThreadBody>.fromOpaque(argument!).takeRetainedValue().body()
        return nil
    }, context)
    guard rc == 0 else {
        Unmanaged<ThreadBody>.fromOpaque(context).release()
        throw EventLoopError("pthread_create failed: \(String(cString: strerror(rc)))")
    }
    return thread
}

/// CLOCK_MONOTONIC in nanoseconds.
public func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// epoll's event bits, for participants that do not import the C headers themselves.
public enum EpollEvents {
    public static let readable = EPOLLIN.rawValue
    public static let writable = EPOLLOUT.rawValue
    public static let error = EPOLLERR.rawValue
    public static let hangUp = EPOLLHUP.rawValue
}
