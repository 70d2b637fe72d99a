import EventLoops
import Foundation
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The loops under the HTTP server and the upstream client: tasks, descriptors and deadlines.
@Suite(.serialized) struct EventLoopTests {
    @Test func tasksFromOtherThreadsRunInOrderOnTheLoopThread() throws {
        let group = try EventLoopGroup(loops: 2, name: "test-loop")
        defer { group.shutdown() }
        let loop = group.loops[1]
        let seen = Mutex<[Int]>([])
        let onLoop = Atomic<Bool>(true)
        for value in 0..<1000 {
            loop.execute {
                if !loop.inLoop || EventLoop.current !== loop { onLoop.store(false, ordering: .relaxed) }
                seen.withLock { $0.append(value) }
            }
        }
        #expect(loop.run(andWait: { 1 }) == 1)  // queued after the 1,000
        #expect(seen.withLock { $0 } == Array(0..<1000))
        let allOnLoop = onLoop.load(ordering: .relaxed)
        #expect(allOnLoop)
        #expect(!loop.inLoop && EventLoop.current == nil)
    }

    @Test func aTaskQueuedOnTheLoopItselfRunsAfterTheCurrentOneNotInsideIt() throws {
        let group = try EventLoopGroup(loops: 1, name: "test-loop")
        defer { group.shutdown() }
        let loop = group.loops[0]
        let order = loop.run(andWait: { () -> [String] in
            let log = Mutex<[String]>([])
            loop.execute { log.withLock { $0.append("queued") } }
            log.withLock { $0.append("caller") }
            return log.withLock { $0 }
        })
        #expect(order == ["caller"])
        // run(andWait:) from the loop itself runs inline rather than deadlocking.
        #expect(loop.run(andWait: { loop.run(andWait: { 7 }) }) == 7)
    }

    @Test func preferredIsTheCallersLoopOnALoopAndTakenInTurnElsewhere() throws {
        let group = try EventLoopGroup(loops: 3, name: "test-loop")
        defer { group.shutdown() }
        for loop in group.loops { #expect(loop.run(andWait: { group.preferred() === loop }) == true) }
        let picks = (0..<6).map { _ in group.preferred().index }
        #expect(Set(picks) == [0, 1, 2])
    }

    @Test func aWatchedDescriptorAndADeadlineReachTheirParticipant() throws {
        let group = try EventLoopGroup(loops: 1, name: "test-loop")
        defer { group.shutdown() }
        let loop = group.loops[0]
        var pair: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &pair) == 0)
        defer { close(pair[0]); close(pair[1]) }
        let probe = Probe(fd: pair[0], wakeAfter: 50_000_000)
        #expect(loop.run(andWait: { loop.watch(fd: probe.fd, events: 0x001 /* EPOLLIN */, for: probe) }) == true)
        loop.execute { loop.add(probe) }
        // The deadline: the loop sleeps until it, not the 1 s default.
        #expect(waitUntil(1) { probe.deadlineHitAfter.load(ordering: .relaxed) > 0 })
        let late = Double(probe.deadlineHitAfter.load(ordering: .relaxed)) / 1e9
        #expect(late >= 0.05 && late < 0.5, "deadline met after \(late) s")
        // Readiness.
        var byte: UInt8 = 1
        #expect(write(pair[1], &byte, 1) == 1)
        #expect(waitUntil(1) { probe.bytesRead.load(ordering: .relaxed) == 1 })
        // After removal nothing is delivered.
        _ = loop.run(andWait: { loop.remove(probe); return true })
        #expect(write(pair[1], &byte, 1) == 1)
        // Two full turns of the loop: a readiness it still watched would have been handled by then.
        for _ in 0..<2 { _ = loop.run(andWait: { true }) }
        #expect(probe.bytesRead.load(ordering: .relaxed) == 1)
    }

    /// The HTTP daemon is polled before or after the curl driver depending on which joined the
    /// loop first; work one hands the other must not wait for the next event or time-out.
    @Test func workHandedToAParticipantAlreadyPolledThisTurnRunsOnTheNextTurn() throws {
        let group = try EventLoopGroup(loops: 1, name: "test-loop")
        defer { group.shutdown() }
        let loop = group.loops[0]
        let first = Handoff(loop: loop, target: nil)
        let second = Handoff(loop: loop, target: first)  // polled after `first`, hands it work
        _ = loop.run(andWait: { loop.add(first); loop.add(second); return true })
        for _ in 0..<5 {
            let started = monotonicNanoseconds()
            loop.execute { second.armed = true }
            #expect(waitUntil(2) { first.handled.load(ordering: .relaxed) > 0 })
            let latency = Double(first.handled.exchange(0, ordering: .relaxed) - started) / 1e9
            #expect(latency < 0.1, "handed-over work ran after \(latency) s")
        }
    }

    @Test func stoppedLoopsRefuseTasksAndJoinTheirThreads() throws {
        let group = try EventLoopGroup(loops: 2, name: "test-stop")
        let ran = Atomic<Int>(0)
        for loop in group.loops { loop.execute { ran.add(1, ordering: .relaxed) } }
        group.shutdown()
        #expect(ran.load(ordering: .relaxed) == 2)  // queued before the stop: run
        #expect(group.loops.allSatisfy { !$0.execute {} })
        #expect(group.loops[0].run(andWait: { 1 }) == nil)
        #expect(threads(named: "test-stop-") == 0)
    }
}

private final class Probe: EventLoopParticipant, @unchecked Sendable {
    let fd: Int32
    let bytesRead = Atomic<Int>(0)
    let deadlineHitAfter = Atomic<UInt64>(0)
    private let started = monotonicNanoseconds()
    private let wakeAfter: UInt64
    private var deadline: UInt64?

    init(fd: Int32, wakeAfter: UInt64) {
        self.fd = fd
        self.wakeAfter = wakeAfter
    }

    func handleEvent(fd: Int32, events: UInt32) {
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = read(fd, &buffer, buffer.count)
        if count > 0 { bytesRead.add(count, ordering: .relaxed) }
    }

    func poll(now: UInt64) -> UInt64? {
        if deadline == nil { deadline = started + wakeAfter }
        if let due = deadline, now >= due, deadlineHitAfter.load(ordering: .relaxed) == 0 {
            deadlineHitAfter.store(now - started, ordering: .relaxed)
        }
        return deadlineHitAfter.load(ordering: .relaxed) == 0 ? deadline : nil
    }
}

/// Polled every turn: when armed, hands `target` work (as the curl driver resumes a connection).
private final class Handoff: EventLoopParticipant, @unchecked Sendable {
    let loop: EventLoop
    let target: Handoff?
    var armed = false
    var pending = false
    let handled = Atomic<UInt64>(0)

    init(loop: EventLoop, target: Handoff?) {
        self.loop = loop
        self.target = target
    }

    func handleEvent(fd: Int32, events: UInt32) {}

    func poll(now: UInt64) -> UInt64? {
        if armed, let target {
            armed = false
            target.pending = true
            loop.requestTurn()
        }
        if pending {
            pending = false
            handled.store(monotonicNanoseconds(), ordering: .relaxed)
        }
        return nil
    }
}

private func waitUntil(_ seconds: Double, _ condition: () -> Bool) -> Bool {
    let end = Date().addingTimeInterval(seconds)
    while Date() < end {
        if condition() { return true }
        usleep(2_000)
    }
    return condition()
}

private func threads(named prefix: String) -> Int {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    return tasks.filter { task in
        ((try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8)) ?? "").hasPrefix(prefix)
    }.count
}

/// The workers the device exchange runs on, off the loops.
@Suite(.serialized) struct WorkerPoolTests {
    @Test func tasksRunOnTheWorkersAndASlowOneHoldsUpNoOther() throws {
        let pool = try WorkerPool(threads: 2, name: "test-worker")
        defer { pool.shutdown() }
        let slowStarted = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        #expect(pool.submit {
            slowStarted.signal()
            release.wait()
        })
        slowStarted.wait()
        // While one worker is held, the other runs everything else, in order.
        let done = DispatchSemaphore(value: 0)
        let seen = Mutex<[Int]>([])
        let names = Mutex<Set<String>>([])
        for value in 0..<100 {
            pool.submit {
                let name = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? ""
                names.withLock { _ = $0.insert(name) }
                seen.withLock { $0.append(value) }
                if value == 99 { done.signal() }
            }
        }
        #expect(done.wait(timeout: .now() + 5) == .success)
        #expect(seen.withLock { $0 } == Array(0..<100))
        #expect(names.withLock { $0 }.allSatisfy { $0.hasPrefix("test-worker-") })
        release.signal()
    }

    @Test func shutdownRunsWhatIsQueuedThenRefusesNewTasks() throws {
        let pool = try WorkerPool(threads: 1, name: "test-worker")
        let ran = Atomic<Int>(0)
        for _ in 0..<50 {
            pool.submit {
                usleep(1000)
                ran.add(1, ordering: .relaxed)
            }
        }
        pool.shutdown()
        #expect(ran.load(ordering: .relaxed) == 50)
        #expect(!pool.submit { ran.add(1, ordering: .relaxed) })
        pool.shutdown()
        #expect(threadCount(named: "test-worker-0") == 0)
    }

    private func threadCount(named name: String) -> Int {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.filter { ((try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8)) ?? "").hasPrefix(name) }.count
    }
}

/// The worker pool serves callers fairly: one caller's queued flood does not delay another.
@Suite struct WorkerPoolFairnessTests {
    @Test func aCallerWithNothingQueuedIsServedBeforeAFloodersBacklog() throws {
        let pool = try WorkerPool(threads: 1, name: "fair")
        defer { pool.shutdown() }
        let order = Mutex<[String]>([])
        let blocked = DispatchSemaphore(value: 0), running = DispatchSemaphore(value: 0)
        let all = DispatchGroup()
        func submit(_ key: String, _ before: @escaping @Sendable () -> Void = {}) {
            all.enter()
            pool.submit(key: key) { before(); order.withLock { $0.append(key) }; all.leave() }
        }
        // The one thread is busy with the flooder's first task while the rest queue up.
        submit("flooder") { running.signal(); blocked.wait() }
        running.wait()
        for _ in 0..<200 { submit("flooder") }
        submit("fresh")
        for _ in 0..<3 { submit("second") }
        blocked.signal()
        #expect(all.wait(timeout: .now() + 10) == .success)
        let seen = order.withLock { $0 }
        // The fresh caller goes right after the task that was running; the second caller's three
        // are not behind the flood either; the flood still runs in full, in order.
        #expect(seen.firstIndex(of: "fresh") == 1, "\(seen.prefix(10))")
        #expect((seen.lastIndex(of: "second") ?? 999) < 10, "\(seen.prefix(12))")
        #expect(seen.filter { $0 == "flooder" }.count == 201)
        #expect(pool.queued == 0)
    }
}
