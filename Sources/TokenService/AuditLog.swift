import Foundation
import Lifecycle
import Synchronization

/// Where audit events go.
public protocol AuditSink: Sendable {
    func record(_ event: AuditEvent)
}

/// Buffers device-side audit events and writes them in batches off the request path, so a flood
/// of bad requests costs one insert batch per interval rather than one transaction each (once
/// `run`; `flush` and `close` write at once). Admin actions are written synchronously by
/// `AdminService` instead.
///
/// Device refusals (`*.rejected`, no actor: anyone on the network can cause them) are counted,
/// not journaled one by one: one row per action, client ID, reason and minute, whose count grows
/// (the first refusal's time, key and detail stay). Client IDs with no integration, and more than
/// `clientsPerMinute` client IDs in a minute, share the row of client ID "" — so a flood adds a
/// bounded number of rows whatever it sends. State changes keep a row each.
public final class BufferedAuditLog: AuditSink, Service {
    public let name = "audit-log"
    /// Distinct client IDs whose refusals get rows of their own in one minute.
    public static let clientsPerMinute = 16

    struct RefusalKey: Hashable {
        let action: String
        let clientID: String
        let reason: String
        let minute: Int64
    }

    private struct Buffer {
        var pending: [AuditEvent] = []
        /// Refusals counted since the last flush, by row.
        var refusals: [RefusalKey: AuditEvent] = [:]
        /// The client IDs given rows of their own, per minute (this minute and the last).
        var clientsByMinute: [Int64: Set<String>] = [:]
        /// Taken by a flush that is writing them now.
        var inFlight = 0
    }

    private let store: AuditStore
    private let buffer = Mutex(Buffer())
    /// Above this many events waiting (the store has refused them for a while), `record` writes
    /// synchronously instead: memory stays bounded and no event is ever dropped.
    private let maxPending: Int
    /// The periodic flush, while it runs.
    private let timer = Mutex<PeriodicTask?>(nil)
    private let onError: @Sendable (String) -> Void
    private let interval: TimeInterval

    public init(store: AuditStore, interval: TimeInterval = 0.25, maxPending: Int = 50_000,
                onError: @escaping @Sendable (String) -> Void = { _ in }) {
        self.store = store
        self.maxPending = maxPending
        self.onError = onError
        self.interval = interval
    }

    /// Lasts until stopped (the flush's task ends then).
    public func run() throws { try timer.withLock { $0 }?.run() }

    /// Flushes every `interval` until stopped.
    public func start() {
        let task = PeriodicTask("audit-flush", every: interval) { [weak self] in self?.flush() }
        guard timer.withLock({ current -> Bool in
            guard current == nil else { return false }
            current = task
            return true
        }) else { return }
        task.start()
    }

    /// The last flush (after the last request that records events has ended), retried until
    /// `deadline` while the store refuses it.
    public func stop(by deadline: ContinuousClock.Instant) { close(by: deadline) }

    /// Events waiting to be written (a gauge for /metrics: it grows only while the store refuses them).
    public var pendingCount: Int { buffer.withLock { $0.pending.count + $0.refusals.count + $0.inFlight } }

    public func record(_ event: AuditEvent) {
        if event.actor == nil, event.action.hasSuffix(".rejected") {
            count(event)
            return
        }
        let limit = maxPending
        let queued = buffer.withLock { buffer -> Bool in
            guard buffer.pending.count < limit else { return false }
            buffer.pending.append(event)
            return true
        }
        guard !queued else { return }
        // The buffer is full because the store keeps failing: write this one now, or keep it.
        do { try store.appendAudit([event]) } catch {
            buffer.withLock { $0.pending.append(event) }
            onError("audit write failed with \(limit) events waiting: \(error)")
        }
    }

    /// Adds a refusal to its minute's row.
    private func count(_ event: AuditEvent) {
        let minute = Int64((event.at.timeIntervalSince1970 / 60).rounded(.down))
        buffer.withLock { buffer in
            var clientID = event.reason == RejectionReason.unknownClient.rawValue ? "" : event.clientID ?? ""
            if !clientID.isEmpty {
                var seen = buffer.clientsByMinute[minute, default: []]
                if !seen.contains(clientID) {
                    if seen.count < Self.clientsPerMinute { seen.insert(clientID) } else { clientID = "" }
                    buffer.clientsByMinute[minute] = seen
                    if buffer.clientsByMinute.count > 2 { buffer.clientsByMinute = buffer.clientsByMinute.filter { $0.key >= minute - 1 } }
                }
            }
            let key = RefusalKey(action: event.action, clientID: clientID, reason: event.reason ?? "", minute: minute)
            if buffer.refusals[key] != nil {
                buffer.refusals[key]!.count += 1
                return
            }
            // The row names the client ID it counts ("" when folded); the detail keeps the first one's words.
            let folded = clientID.isEmpty && !(event.clientID ?? "").isEmpty
            let detail = folded ? "client ID \(event.clientID!.prefix(64)): " + (event.detail ?? "") : event.detail
            var row = AuditEvent(at: event.at, action: event.action, clientID: clientID, keyID: event.keyID, reason: key.reason, detail: detail)
            row.minute = minute
            buffer.refusals[key] = row
        }
    }

    /// Writes everything buffered so far. When the store is unavailable the events go back to the
    /// front of the buffer and are retried at the next flush. When it refuses the batch itself
    /// (an event it cannot store), they are written one by one, so one bad event cannot hold back
    /// the rest forever: an event refused on its own is written again with every text field
    /// reduced to printable ASCII, and one refused even then is logged in full, never silently lost.
    public func flush() {
        let events = buffer.withLock { buffer in
            // The counted refusal rows go with the journaled events, and count as in flight with them.
            let taken = buffer.pending + buffer.refusals.values.sorted { $0.at < $1.at }
            buffer.refusals.removeAll(keepingCapacity: true)
            buffer.pending.removeAll(keepingCapacity: true)
            buffer.inFlight = taken.count
            return taken
        }
        guard !events.isEmpty else { return }
        do {
            try store.appendAudit(events)
            buffer.withLock { $0.inFlight = 0 }
        } catch where Self.isUnavailable(error) {
            keep(events, error)
        } catch {
            onError("audit batch of \(events.count) events refused, writing them one by one: \(error)")
            for (index, event) in events.enumerated() {
                do {
                    try store.appendAudit([event])
                } catch where Self.isUnavailable(error) {
                    // The store went away meanwhile: what is not written yet waits for the next flush.
                    keep(Array(events[index...]), error)
                    return
                } catch {
                    let plain = event.asciiOnly
                    do {
                        try store.appendAudit([plain])
                        onError("audit event stored with its text reduced to ASCII (\(error)): \(event.logText)")
                    } catch {
                        onError("audit event refused by the store and not stored (\(error)): \(event.logText)")
                    }
                }
            }
            buffer.withLock { $0.inFlight = 0 }
        }
    }

    private func keep(_ events: [AuditEvent], _ error: any Error) {
        buffer.withLock { $0.pending.insert(contentsOf: events, at: 0); $0.inFlight = 0 }
        onError("audit write failed, \(events.count) events kept for the next attempt: \(error)")
    }

    /// The store could not be reached or was busy (try again later), as against refusing what was sent.
    static func isUnavailable(_ error: any Error) -> Bool {
        (error as? any StoreAvailabilityError)?.isUnavailable ?? false
    }

    /// Stops the periodic flush (one under way ends first) and writes what is left, trying
    /// again with growing pauses until `deadline`; what is still unwritten then is reported.
    public func close(by deadline: ContinuousClock.Instant = .now + .seconds(5)) {
        timer.withLock { $0 }?.stop(by: deadline)
        guard !retry(until: deadline, { flush(); return pendingCount == 0 }) else { return }
        onError("\(pendingCount) audit events not written at shutdown: the store refused them until the deadline")
    }
}

/// Writes each event at once (the CLI, tests).
public final class DirectAuditLog: AuditSink {
    private let store: AuditStore
    public init(store: AuditStore) { self.store = store }
    public func record(_ event: AuditEvent) { try? store.appendAudit([event]) }
}
