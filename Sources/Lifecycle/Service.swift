import Foundation
import Synchronization

/// Something that runs in the background of the daemon and must stop in order: a listener, a
/// periodic flush, a job.
public protocol Service: AnyObject, Sendable {
    /// For the log and the stop order's record.
    var name: String { get }
    /// Starts it; returns once it runs (its work goes on on threads of its own).
    func run() throws
    /// Stops it gracefully: what is in flight finishes (by `deadline`, for what can wait), what
    /// must be written is written. Returns when it has stopped. Called once, after `run`.
    func stop(by deadline: ContinuousClock.Instant)
}

/// A service made of two closures (for what already has a start and a stop of its own).
public final class BasicService: Service {
    public let name: String
    private let start: @Sendable () throws -> Void
    private let end: @Sendable (ContinuousClock.Instant) -> Void

    public init(_ name: String, run: @escaping @Sendable () throws -> Void = {}, stop: @escaping @Sendable (ContinuousClock.Instant) -> Void) {
        self.name = name
        start = run
        end = stop
    }

    public func run() throws { try start() }
    public func stop(by deadline: ContinuousClock.Instant) { end(deadline) }
}

/// What a group did, in order (the log; tests read the stop order).
public struct LifecycleEvent: Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable { case started, stopping, stopped, failed }
    public let kind: Kind
    public let service: String
    public var description: String { "\(service) \(kind.rawValue)" }
    public init(kind: Kind, service: String) {
        self.kind = kind
        self.service = service
    }
}

/// Services started in order and stopped in reverse, within one shutdown grace: the listeners
/// (started last) stop first, so that nothing new arrives, and what they had in flight finishes;
/// the flushes (started first) stop last, after the last request has ended, so its usage and
/// audit events are in their final write.
public final class ServiceGroup: Sendable {
    private let services: [any Service]
    private let report: @Sendable (LifecycleEvent) -> Void
    private let state = Mutex<(started: Int, stopped: Bool, events: [LifecycleEvent])>((0, false, []))

    public init(_ services: [any Service], report: @escaping @Sendable (LifecycleEvent) -> Void = { _ in }) {
        self.services = services
        self.report = report
    }

    /// Every event so far, in order.
    public var events: [LifecycleEvent] { state.withLock { $0.events } }

    private func record(_ kind: LifecycleEvent.Kind, _ service: any Service) {
        let event = LifecycleEvent(kind: kind, service: service.name)
        state.withLock { $0.events.append(event) }
        report(event)
    }

    /// Starts each service in order. If one fails, those started are stopped (in reverse, at once)
    /// and the error is rethrown.
    public func run() throws {
        for (index, service) in services.enumerated() {
            do {
                try service.run()
            } catch {
                record(.failed, service)
                stop(grace: .zero)
                throw error
            }
            state.withLock { $0.started = index + 1 }
            record(.started, service)
        }
    }

    /// Stops the started services in reverse order; each may use what is left of `grace`.
    /// Idempotent: a second call returns at once.
    public func stop(grace: Duration) {
        let started = state.withLock { s -> Int in
            defer { s.stopped = true }
            return s.stopped ? 0 : s.started
        }
        let deadline = ContinuousClock.now + grace
        for service in services.prefix(started).reversed() {
            record(.stopping, service)
            service.stop(by: deadline)
            record(.stopped, service)
        }
    }
}

/// Work done every `interval` on a thread of its own, until stopped: the one way the daemon runs
/// periodic work (the usage ledger's flush, the audit log's, the purge, the storage watch). A
/// stop waits for a run under way, then returns.
public final class PeriodicTask: Service {
    public let name: String
    private let interval: Double
    private let work: @Sendable () -> Void
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let phase = Mutex<(running: Bool, stopping: Bool)>((false, false))

    public init(_ name: String, every interval: Double, _ work: @escaping @Sendable () -> Void) {
        self.name = name
        self.interval = interval
        self.work = work
    }

    public func run() {
        let start = phase.withLock { p -> Bool in
            guard !p.running, !p.stopping else { return false }
            p.running = true
            return true
        }
        guard start else { return }
        let thread = Thread { [self] in
            while true {
                _ = wake.wait(timeout: .now() + interval)
                if phase.withLock({ $0.stopping }) { break }
                work()
            }
            finished.signal()
        }
        thread.name = name
        thread.start()
    }

    public func stop(by deadline: ContinuousClock.Instant) {
        let wasRunning = phase.withLock { p -> Bool in
            p.stopping = true
            return p.running
        }
        guard wasRunning else { return }
        wake.signal()
        finished.wait()
    }
}
