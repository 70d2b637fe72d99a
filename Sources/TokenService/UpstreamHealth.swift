import Dispatch
import Synchronization

/// How long a failing upstream is skipped: `base` after its first failure, doubling with each
/// failure in a row, never more than `cap` (attestd's `--upstream-cooldown` and
/// `--upstream-cooldown-max`). Per instance and in memory: instances agree on nothing here.
public struct UpstreamCooldown: Sendable, Equatable {
    public var base: Duration
    public var cap: Duration

    public init(base: Duration = .seconds(5), cap: Duration = .seconds(300)) {
        self.base = base
        self.cap = max(cap, base)
    }

    /// The cool-down after `failures` failures in a row (1 or more): checked arithmetic, capped.
    public func duration(afterFailures failures: Int) -> Duration {
        let doublings = min(max(failures - 1, 0), 30)
        let (scaled, overflow) = base.components.seconds.multipliedReportingOverflow(by: Int64(1) << doublings)
        if overflow || scaled >= cap.components.seconds { return cap }
        return min(base * (1 << doublings), cap)
    }
}

/// The state of each upstream of each workspace's list on this instance: how many tries failed
/// in a row and until when it is skipped. `attestd_upstream_state{workspace,upstream}` and the
/// console show it: 0 ready, 1 cooling down (its last try failed; skipped until the cool-down
/// ends, then tried again), 2 unavailable (its credentials cannot be opened or its settings are
/// refused: nothing can be sent to it until an owner sets it again).
public final class UpstreamHealth: Sendable {
    public enum State: Int, Sendable {
        case ready = 0
        case coolingDown = 1
        case unavailable = 2

        public var name: String {
            switch self {
            case .ready: "ready"
            case .coolingDown: "cooling down"
            case .unavailable: "unavailable"
            }
        }
    }

    struct Key: Hashable {
        let workspace: Int64
        let label: String
    }

    private struct Entry {
        var failures = 0
        var coolUntil: UInt64 = 0
        var state = State.ready
        var workspaceName = ""
    }

    public static let metric = "attestd_upstream_state"
    let cooldown: UpstreamCooldown
    private let entries = Mutex<[Key: Entry]>([:])

    public init(cooldown: UpstreamCooldown = UpstreamCooldown()) {
        self.cooldown = cooldown
    }

    public static func now() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

    /// Whether the upstream is being skipped now (its cool-down has not ended).
    public func isCool(workspace: Int64, label: String, at now: UInt64 = now()) -> Bool {
        entries.withLock { ($0[Key(workspace: workspace, label: label)]?.coolUntil ?? 0) > now }
    }

    /// A try failed: the upstream cools down for longer with each failure in a row. Returns the
    /// cool-down and the state to publish.
    @discardableResult
    public func failed(workspace: Int64, workspaceName: String, label: String, unavailable: Bool = false, at now: UInt64 = now()) -> Duration {
        entries.withLock { entries in
            var entry = entries[Key(workspace: workspace, label: label)] ?? Entry()
            entry.failures = min(entry.failures + 1, 64)
            let pause = cooldown.duration(afterFailures: entry.failures)
            let (seconds, attoseconds) = pause.components
            let nanos = UInt64(clamping: seconds) &* 1_000_000_000 &+ UInt64(clamping: attoseconds / 1_000_000_000)
            entry.coolUntil = now &+ nanos
            entry.state = unavailable ? .unavailable : .coolingDown
            entry.workspaceName = workspaceName
            entries[Key(workspace: workspace, label: label)] = entry
            return pause
        }
    }

    /// A try succeeded: ready again. True when that changed its state (publish it).
    @discardableResult
    public func succeeded(workspace: Int64, label: String) -> Bool {
        entries.withLock { entries in
            guard let entry = entries[Key(workspace: workspace, label: label)] else { return false }
            entries[Key(workspace: workspace, label: label)] = nil
            return entry.state != .ready
        }
    }

    /// Each upstream's state as this instance sees it (ready when it has none).
    public func state(workspace: Int64, label: String, at now: UInt64 = now()) -> (state: State, failures: Int, coolsFor: Duration?) {
        entries.withLock { entries in
            guard let entry = entries[Key(workspace: workspace, label: label)] else { return (.ready, 0, nil) }
            let left = entry.coolUntil > now ? Duration.nanoseconds(Int64(clamping: entry.coolUntil - now)) : nil
            return (entry.state, entry.failures, left)
        }
    }

    /// Publishes one upstream's state as `attestd_upstream_state`.
    public func publish(_ metrics: Metrics, workspace: String, label: String, state: State) {
        metrics.set(Self.metric, Double(state.rawValue), labels: [("workspace", workspace), ("upstream", label)])
    }

    public static func describe(_ metrics: Metrics) {
        metrics.describe(metric, "Each upstream of a workspace's list on this instance: 0 ready, 1 cooling down after a failed try "
                         + "(skipped until its cool-down ends), 2 unavailable (its credentials or settings cannot be used).")
    }
}

