import AttestWire
import Foundation
import Synchronization

/// One JSON object per line on stderr. Callers pass only non-secret fields: never a token, a
/// key, a challenge or an attestation (the routes log client IDs, statuses and reasons).
public final class Logger: Sendable {
    /// The writer, reached only under the lock so that lines never interleave.
    private let write: Mutex<@Sendable (String) -> Void>

    public init(write: @escaping @Sendable (String) -> Void = { line in FileHandle.standardError.write(Data((line + "\n").utf8)) }) {
        self.write = Mutex(write)
    }

    public func log(_ level: String, _ event: String, _ fields: [(String, Any)] = []) {
        let timestamp = Logger.timestamp()
        let line = JSONText.object([("ts", timestamp), ("level", level), ("event", event)] + fields)
        write.withLock { $0(line) }
    }

    /// UTC ISO 8601 with milliseconds, formatted by hand: DateFormatter goes through ICU and
    /// cost more per request than the assertion's ECDSA verification.
    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func pad(_ value: Int32, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(now.tv_nsec / 1_000_000), 3))Z"
    }

    public func info(_ event: String, _ fields: [(String, Any)] = []) { log("info", event, fields) }
    public func warning(_ event: String, _ fields: [(String, Any)] = []) { log("warning", event, fields) }
    public func error(_ event: String, _ fields: [(String, Any)] = []) { log("error", event, fields) }
}
