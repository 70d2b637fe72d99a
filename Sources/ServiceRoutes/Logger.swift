import Foundation

/// One JSON object per line on stderr. Callers pass only non-secret fields: never a token, a
/// key, a challenge or an attestation (the routes log client IDs, statuses and reasons).
public final class Logger: @unchecked Sendable {
    private let lock = NSLock()
    private let write: (String) -> Void

    public init(write: @escaping (String) -> Void = { line in FileHandle.standardError.write(Data((line + "\n").utf8)) }) {
        self.write = write
    }

    public func log(_ level: String, _ event: String, _ fields: [(String, Any)] = []) {
        let timestamp = ISO8601DateFormatter.string(from: Date(), timeZone: TimeZone(identifier: "UTC")!,
                                                    formatOptions: [.withInternetDateTime, .withFractionalSeconds])
        let line = JSONBody.object([("ts", timestamp), ("level", level), ("event", event)] + fields)
        lock.lock()
        write(line)
        lock.unlock()
    }

    public func info(_ event: String, _ fields: [(String, Any)] = []) { log("info", event, fields) }
    public func warning(_ event: String, _ fields: [(String, Any)] = []) { log("warning", event, fields) }
    public func error(_ event: String, _ fields: [(String, Any)] = []) { log("error", event, fields) }
}
