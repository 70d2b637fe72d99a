import Foundation
import Synchronization

/// Where audit events go.
public protocol AuditSink: Sendable {
    func record(_ event: AuditEvent)
}

/// Buffers device-side audit events and writes them in batches off the request path, so a flood
/// of bad requests costs one insert batch per interval rather than one transaction each. Admin
/// actions are written synchronously by `AdminService` instead.
public final class BufferedAuditLog: AuditSink, Sendable {
    private struct Buffer {
        var pending: [AuditEvent] = []
        var dropped = 0
    }

    private let store: TokenStore
    private let buffer = Mutex(Buffer())
    private let maxPending: Int
    private let interval: TimeInterval
    private let closed = Atomic<Bool>(false)
    private let queue = DispatchQueue(label: "audit-log")
    private let onError: @Sendable (String) -> Void

    public init(store: TokenStore, interval: TimeInterval = 0.25, maxPending: Int = 50_000,
                onError: @escaping @Sendable (String) -> Void = { _ in }) {
        self.store = store
        self.maxPending = maxPending
        self.onError = onError
        self.interval = interval
        scheduleFlush()
    }

    public func record(_ event: AuditEvent) {
        let limit = maxPending
        buffer.withLock { buffer in
            if buffer.pending.count < limit { buffer.pending.append(event) } else { buffer.dropped += 1 }
        }
    }

    /// Writes everything buffered so far.
    public func flush() {
        let (batch, lost) = buffer.withLock { buffer in
            defer { buffer.pending.removeAll(keepingCapacity: true); buffer.dropped = 0 }
            return (buffer.pending, buffer.dropped)
        }
        var events = batch
        if lost > 0 {
            events.append(AuditEvent(at: Date(), action: "audit.overflow", detail: "\(lost) events dropped: buffer full"))
        }
        guard !events.isEmpty else { return }
        do { try store.appendAudit(events) } catch { onError("audit write failed: \(error)") }
    }

    /// The next flush, one interval from now, on the log's own queue (until closed).
    private func scheduleFlush() {
        queue.asyncAfter(deadline: .now() + interval) { [weak self] in
            guard let self, !self.closed.load(ordering: .acquiring) else { return }
            self.flush()
            self.scheduleFlush()
        }
    }

    public func close() {
        closed.store(true, ordering: .releasing)
        queue.sync { flush() }
    }
}

/// Writes each event at once (the CLI, tests).
public final class DirectAuditLog: AuditSink {
    private let store: TokenStore
    public init(store: TokenStore) { self.store = store }
    public func record(_ event: AuditEvent) { try? store.appendAudit([event]) }
}
