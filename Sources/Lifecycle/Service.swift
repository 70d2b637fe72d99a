import Foundation
import Synchronization

/// Something that runs in the background of the daemon and must stop in order: a listener, a
/// periodic flush, a job. The group starts it, watches its `run`, and stops it.
public protocol Service: AnyObject, Sendable {
    /// For the log and the stop order's record.
    var name: String { get }
    /// Starts it; returns once it serves (the group starts the next one then). A failure to
    /// start is thrown.
    func start() throws
    /// Lasts as long as the service: returns once `stop` has stopped it, and throws when it
    /// ended on its own (the group then stops everything, and attestd exits non-zero).
    func run() throws
    /// Stops it gracefully: what is in flight finishes by `deadline`, what must be written is
    /// written (retried until then). Returns when it has stopped, or at the deadline. Called
    /// once, after `start`.
    func stop(by deadline: ContinuousClock.Instant)
}

/// A service's life, from its start to its end: `run` waits on it, the service ends it.
public final class ServiceLife: Sendable {
    private let outcome = Mutex<(ended: Bool, error: (any Error)?)>((false, nil))
    private let ended = DispatchSemaphore(value: 0)

    public init() {}

    /// The end, once (later calls are ignored): nil when it was stopped, else why it died.
    public func end(_ error: (any Error)? = nil) {
        let first = outcome.withLock { state -> Bool in
            guard !state.ended else { return false }
            state = (true, error)
            return true
        }
        if first { ended.signal() }
    }

    /// Waits for the end; throws what ended it.
    public func wait() throws {
        ended.wait()
        ended.signal()   // any other waiter sees it too
        if let error = outcome.withLock({ $0.error }) { throw error }
    }
}

/// Why a service ended by itself, for the log.
public struct ServiceEndedError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Seconds left until `deadline` (0 once past).
public func seconds(until deadline: ContinuousClock.Instant) -> Double {
    let left = deadline - ContinuousClock.now
    return max(0, Double(left.components.seconds) + Double(left.components.attoseconds) / 1e18)
}

/// Tries `attempt` until it succeeds, pausing 50 ms, then twice as long each time (at most 1 s),
/// while a pause still ends before `deadline`: a stop's last write against a store that refuses
/// it for a while. True once it succeeded.
@discardableResult
public func retry(until deadline: ContinuousClock.Instant, _ attempt: () -> Bool) -> Bool {
    var pause = 0.05
    while !attempt() {
        guard seconds(until: deadline) > pause else { return false }
        Thread.sleep(forTimeInterval: pause)
        pause = min(pause * 2, 1)
    }
    return true
}

/// A service made of two closures (for what already has a start and a stop of its own). It
/// lives from its start until its stop.
public final class BasicService: Service {
    public let name: String
    private let begin: @Sendable () throws -> Void
    private let end: @Sendable (ContinuousClock.Instant) -> Void
    private let life = ServiceLife()

    public init(_ name: String, start: @escaping @Sendable () throws -> Void = {}, stop: @escaping @Sendable (ContinuousClock.Instant) -> Void) {
        self.name = name
        begin = start
        end = stop
    }

    public func start() throws { try begin() }
    public func run() throws { try life.wait() }
    public func stop(by deadline: ContinuousClock.Instant) {
        end(deadline)
        life.end()
    }
}

/// What a group did, in order (the log; tests read the stop order).
public struct LifecycleEvent: Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable { case started, stopping, stopped, failed }
    public let kind: Kind
    public let service: String
    /// Why it failed (`failed` only).
    public let detail: String?
    public var description: String { "\(service) \(kind.rawValue)" + (detail.map { ": \($0)" } ?? "") }
    public init(kind: Kind, service: String, detail: String? = nil) {
        self.kind = kind
        self.service = service
        self.detail = detail
    }
}

/// How a group ended.
public enum ServiceGroupOutcome: Sendable, Equatable {
    /// Stopped when asked (a signal, `stop`).
    case stopped
    /// A service ended on its own (or failed to start): everything was stopped after it.
    case failed(service: String, detail: String)

    /// What the process exits with.
    public var exitStatus: Int32 { self == .stopped ? 0 : 1 }
}

/// Services started in order and stopped in reverse, within one shutdown grace: the listeners
/// (started last) stop first, so that nothing new arrives, and what they had in flight finishes;
/// the flushes (started first) stop last, after the last request has ended, so its usage and
/// audit events are in their final write. Each started service's `run` is watched on a thread of
/// its own: one that ends while nobody asked stops the whole group, and `wait` says which.
public final class ServiceGroup: Sendable {
    private let services: [any Service]
    private let grace: Duration
    private let report: @Sendable (LifecycleEvent) -> Void
    /// Called once, when the group begins to stop (attestd tells systemd `STOPPING=1`).
    private let willStop: @Sendable () -> Void
    private struct State {
        var started = 0
        var stopping = false
        var outcome: ServiceGroupOutcome?
        var running = 0
        var events: [LifecycleEvent] = []
    }
    private let state = Mutex(State())
    private let allEnded = DispatchSemaphore(value: 0)
    /// Where signal handlers run.
    private let signalQueue = DispatchQueue(label: "signals")

    /// - Parameter grace: the one deadline of a stop the group decides itself (a service failed, a signal).
    public init(_ services: [any Service], grace: Duration = .seconds(10), report: @escaping @Sendable (LifecycleEvent) -> Void = { _ in },
                willStop: @escaping @Sendable () -> Void = {}) {
        self.services = services
        self.grace = grace
        self.report = report
        self.willStop = willStop
    }

    /// Every event so far, in order.
    public var events: [LifecycleEvent] { state.withLock { $0.events } }

    private func record(_ kind: LifecycleEvent.Kind, _ service: any Service, detail: String? = nil) {
        let event = LifecycleEvent(kind: kind, service: service.name, detail: detail)
        state.withLock { $0.events.append(event) }
        report(event)
    }

    /// Starts each service in order and watches it. If one fails to start, those started are
    /// stopped (in reverse, at once) and the error is rethrown.
    public func start() throws {
        for (index, service) in services.enumerated() {
            do {
                try service.start()
            } catch {
                record(.failed, service, detail: "\(error)")
                state.withLock { $0.outcome = $0.outcome ?? .failed(service: service.name, detail: "\(error)") }
                stop(grace: .zero)
                throw error
            }
            state.withLock {
                $0.started = index + 1
                $0.running += 1
            }
            record(.started, service)
            let watcher = Thread { [self] in watch(service) }
            watcher.name = "watch-\(service.name)"
            watcher.start()
        }
    }

    /// Runs on the service's watcher thread for as long as the service lives.
    private func watch(_ service: any Service) {
        var failure: String?
        do { try service.run() } catch { failure = "\(error)" }
        let unexpected = state.withLock { state -> Bool in
            guard !state.stopping else { return false }
            state.outcome = state.outcome ?? .failed(service: service.name, detail: failure ?? "it ended without being stopped")
            return true
        }
        if unexpected {
            record(.failed, service, detail: failure ?? "it ended without being stopped")
            stop()
        }
        let last = state.withLock { state -> Bool in
            state.running -= 1
            return state.running == 0 && state.stopping
        }
        if last { allEnded.signal() }
    }

    /// `stop(grace:)` with the group's own grace.
    public func stop() { stop(grace: grace) }

    /// Stops the started services in reverse order, all by one deadline (`grace` from now).
    /// Idempotent: a second call returns at once.
    public func stop(grace: Duration) {
        let (started, alreadyEnded, first) = state.withLock { s -> (Int, Bool, Bool) in
            defer { s.stopping = true }
            return (s.stopping ? 0 : s.started, !s.stopping && s.running == 0, !s.stopping)
        }
        if first { willStop() }
        let deadline = ContinuousClock.now + grace
        for service in services.prefix(started).reversed() {
            record(.stopping, service)
            service.stop(by: deadline)
            record(.stopped, service)
        }
        state.withLock { $0.outcome = $0.outcome ?? .stopped }
        if alreadyEnded { allEnded.signal() }
    }

    /// Stops the group, within its grace, on any of `signals` (SIGINT and SIGTERM for attestd);
    /// `received` is told first (the log).
    public func stopOnSignals(_ signals: [Int32], received: @escaping @Sendable (Int32) -> Void = { _ in }) {
        for number in signals {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: signalQueue)
            source.setEventHandler { [self] in
                received(number)
                // Off the signal queue: a second signal during the stop is then only logged.
                Thread { [self] in stop() }.start()
            }
            source.resume()
            // Held for the process's life (a released source stops delivering); one per signal.
            _ = Unmanaged.passRetained(source as AnyObject)
        }
    }

    /// Waits until the group has stopped (asked, or after a service ended on its own) and every
    /// service's `run` has returned, then says how it ended.
    public func wait() -> ServiceGroupOutcome {
        allEnded.wait()
        allEnded.signal()
        return state.withLock { $0.outcome ?? .stopped }
    }
}

/// Work done every `interval` on a thread of its own, until stopped: the one way the daemon runs
/// periodic work (the usage ledger's flush, the audit log's, the purge, the storage watch). Work
/// that throws ends the task, and with it the daemon: a periodic job reports what it can live
/// with and throws only what it cannot. A stop waits for a run under way, until its deadline.
public final class PeriodicTask: Service {
    public let name: String
    private let interval: Double
    private let work: @Sendable () throws -> Void
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let phase = Mutex<(running: Bool, stopping: Bool)>((false, false))
    private let life = ServiceLife()

    public init(_ name: String, every interval: Double, _ work: @escaping @Sendable () throws -> Void) {
        self.name = name
        self.interval = interval
        self.work = work
    }

    public func start() {
        let start = phase.withLock { p -> Bool in
            guard !p.running, !p.stopping else { return false }
            p.running = true
            return true
        }
        guard start else { return }
        let thread = Thread { [self] in
            var failure: (any Error)?
            while true {
                _ = wake.wait(timeout: .now() + interval)
                if phase.withLock({ $0.stopping }) { break }
                do { try work() } catch {
                    failure = error
                    break
                }
            }
            finished.signal()
            life.end(failure.map { ServiceEndedError("\(name): \($0)") })
        }
        thread.name = name
        thread.start()
    }

    public func run() throws { try life.wait() }

    public func stop(by deadline: ContinuousClock.Instant) {
        let wasRunning = phase.withLock { p -> Bool in
            p.stopping = true
            return p.running
        }
        guard wasRunning else {
            life.end()
            return
        }
        wake.signal()
        _ = finished.wait(timeout: .now() + seconds(until: deadline))
        life.end()
    }
}
