import Foundation

/// A fixed-window counter per key: at most `limit` events per `window`. In memory on purpose —
/// a restart forgets the windows, which at worst lets one window's worth through again.
public final class RateLimiter: @unchecked Sendable {
    public let limit: Int
    public let window: TimeInterval
    private var windows: [String: (start: Date, count: Int)] = [:]
    private let lock = NSLock()
    private let maxKeys: Int

    public init(limit: Int, window: TimeInterval, maxKeys: Int = 200_000) {
        self.limit = limit
        self.window = window
        self.maxKeys = maxKeys
    }

    /// Records one event; nil when allowed, else seconds until the window resets.
    public func acquire(_ key: String, at now: Date) -> Int? {
        guard limit > 0 else { return nil }  // 0 disables the limit
        lock.lock()
        defer { lock.unlock() }
        if windows.count >= maxKeys { windows = windows.filter { now.timeIntervalSince($0.value.start) < window } }
        var entry = windows[key] ?? (now, 0)
        if now.timeIntervalSince(entry.start) >= window { entry = (now, 0) }
        guard entry.count < limit else {
            return max(1, Int((window - now.timeIntervalSince(entry.start)).rounded(.up)))
        }
        entry.count += 1
        windows[key] = entry
        return nil
    }
}
