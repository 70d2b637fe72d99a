import Foundation
import Synchronization

/// A fixed-window counter per key: at most `limit` events per `window`. In memory on purpose —
/// a restart forgets the windows, which at worst lets one window's worth through again.
/// The number of keys tracked is capped: when full of live windows, unknown keys are refused
/// (fail closed) rather than letting the table grow without bound.
public final class RateLimiter: Sendable {
    public let limit: Int
    public let window: TimeInterval
    private struct Table {
        var windows: [String: (start: Date, count: Int)] = [:]
        var lastSweep = Date.distantPast
    }
    private let table = Mutex(Table())
    private let maxKeys: Int

    public init(limit: Int, window: TimeInterval, maxKeys: Int = 200_000) {
        self.limit = limit
        self.window = window
        self.maxKeys = maxKeys
    }

    /// Records one event; nil when allowed, else seconds until the window resets.
    public func acquire(_ key: String, at now: Date) -> Int? {
        update(key, at: now, record: true)
    }

    /// Whether one more event would be allowed now, without recording it: nil when allowed.
    public func check(_ key: String, at now: Date) -> Int? {
        update(key, at: now, record: false)
    }

    private func update(_ key: String, at now: Date, record: Bool) -> Int? {
        guard limit > 0 else { return nil }  // 0 disables the limit
        return table.withLock { table in update(&table, key, at: now, record: record) }
    }

    private func update(_ table: inout Table, _ key: String, at now: Date, record: Bool) -> Int? {
        var entry = table.windows[key] ?? (now, 0)
        if now.timeIntervalSince(entry.start) >= window { entry = (now, 0) }
        guard entry.count < limit else {
            return max(1, Int((window - now.timeIntervalSince(entry.start)).rounded(.up)))
        }
        guard record else { return nil }
        if table.windows[key] == nil && table.windows.count >= maxKeys {
            // Sweep expired windows at most once a window; if still full, refuse the newcomer.
            if now.timeIntervalSince(table.lastSweep) >= window {
                table.windows = table.windows.filter { now.timeIntervalSince($0.value.start) < window }
                table.lastSweep = now
            }
            if table.windows.count >= maxKeys { return max(1, Int(window)) }
        }
        entry.count += 1
        table.windows[key] = entry
        return nil
    }
}
