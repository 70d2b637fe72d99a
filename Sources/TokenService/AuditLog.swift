import Foundation

/// Where audit events go.
public protocol AuditSink: Sendable {
    func record(_ event: AuditEvent)
}

/// Buffers device-side audit events and writes them in batches off the request path, so a flood
/// of bad requests costs one insert batch per interval rather than one transaction each. Admin
/// actions are written synchronously by `AdminService` instead.
public final class BufferedAuditLog: AuditSink, @unchecked Sendable {
    private let store: TokenStore
    private let lock = NSLock()
    private var pending: [AuditEvent] = []
    private var dropped = 0
    private let maxPending: Int
    private var timer: DispatchSourceTimer?
    private let queue = DispatchQueue(label: "audit-log")
    private let onError: @Sendable (String) -> Void

    public init(store: TokenStore, interval: TimeInterval = 0.25, maxPending: Int = 50_000,
                onError: @escaping @Sendable (String) -> Void = { _ in }) {
        self.store = store
        self.maxPending = maxPending
        self.onError = onError
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + interval, repeating: interval)
        timer.setEventHandler { [weak self] in self?.flush() }
        timer.resume()
        self.timer = timer
    }

    public func record(_ event: AuditEvent) {
        lock.lock()
        if pending.count < maxPending { pending.append(event) } else { dropped += 1 }
        lock.unlock()
    }

    /// Writes everything buffered so far.
    public func flush() {
        lock.lock()
        let batch = pending
        let lost = dropped
        pending.removeAll(keepingCapacity: true)
        dropped = 0
        lock.unlock()
        var events = batch
        if lost > 0 {
            events.append(AuditEvent(at: Date(), action: "audit.overflow", detail: "\(lost) events dropped: buffer full"))
        }
        guard !events.isEmpty else { return }
        do { try store.appendAudit(events) } catch { onError("audit write failed: \(error)") }
    }

    public func close() {
        timer?.cancel()
        timer = nil
        queue.sync { flush() }
    }
}

/// Writes each event at once (the CLI, tests).
public final class DirectAuditLog: AuditSink, @unchecked Sendable {
    private let store: TokenStore
    public init(store: TokenStore) { self.store = store }
    public func record(_ event: AuditEvent) { try? store.appendAudit([event]) }
}
