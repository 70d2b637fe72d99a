import Foundation

/// A value and the lock that guards it, as one object, so no caller can reach the value without
/// holding the lock. (Server targets use `Synchronization.Mutex`; this module also builds for
/// iOS 16, which predates it.)
final class LockedValueBox<Value> {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

// Safe: `value` is only ever touched inside `withLock`, under `lock`.
extension LockedValueBox: @unchecked Sendable where Value: Sendable {}
