import AttestWire
import Foundation
import Synchronization

/// One JSON object per line on stderr. Callers pass only non-secret fields: never a token, a
/// key, a challenge or an attestation (the routes log client IDs, statuses and reasons).
public final class Logger: Sendable {
    /// The writer, reached only under the lock so that lines never interleave.
    private let write: Mutex<@Sendable (String) -> Void>
    /// With a writer thread: the lines waiting for it.
    private let queue: LineQueue?

    /// Lines waiting for the writer thread, and its wake-up.
    private final class LineQueue: Sendable {
        let lines = Mutex<[String]>([])
        let wake = DispatchSemaphore(value: 0)
        /// The writer is blocked on `wake` (the queue was empty): only then does a line wake it.
        let sleeping = Atomic<Bool>(false)
        let maxPending: Int
        init(maxPending: Int) { self.maxPending = maxPending }
    }

    public init(write: @escaping @Sendable (String) -> Void = { line in FileHandle.standardError.write(Data((line + "\n").utf8)) }) {
        self.write = Mutex(write)
        queue = nil
    }

    /// Lines to standard error from a writer thread of their own: the request path (the event loops and
    /// the exchange workers) only formats and queues, and a burst costs one write() per batch. A
    /// queue past `maxPending` lines is written by the caller, so memory stays bounded and no line
    /// is dropped. A line queued when the process is killed outright may be lost.
    public static func standardErrorWithWriterThread(maxPending: Int = 10_000) -> Logger {
        Logger(descriptor: 2, maxPending: maxPending)
    }

    private init(descriptor: Int32, maxPending: Int) {
        let writeAll: @Sendable (String) -> Void = { text in
            var text = text
            text.withUTF8 { bytes in
                var offset = 0
                while offset < bytes.count {
                    let written = Foundation.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                    if written < 0 { if errno == EINTR { continue }; return }
                    offset += written
                }
            }
        }
        let writeLine: @Sendable (String) -> Void = { line in writeAll(line + "\n") }
        write = Mutex(writeLine)
        let queue = LineQueue(maxPending: maxPending)
        self.queue = queue
        // Under load the writer writes a batch, naps 10 ms and takes the next one: request threads
        // never wake it (a wake-up per request was a context switch per request). Idle, it blocks,
        // and the first new line wakes it.
        let thread = Thread {
            while true {
                let lines = queue.lines.withLock { lines -> [String] in defer { lines.removeAll(keepingCapacity: true) }; return lines }
                if !lines.isEmpty {
                    writeAll(lines.joined(separator: "\n") + "\n")
                    usleep(10_000)
                    continue
                }
                queue.sleeping.store(true, ordering: .sequentiallyConsistent)
                // A line queued before the flag was set did not wake us: look once more.
                if queue.lines.withLock({ !$0.isEmpty }) {
                    queue.sleeping.store(false, ordering: .sequentiallyConsistent)
                    continue
                }
                queue.wake.wait()
                queue.sleeping.store(false, ordering: .sequentiallyConsistent)
            }
        }
        thread.name = "log-writer"
        thread.start()
    }

    public func log(_ level: String, _ event: String, _ fields: [(String, Any)] = []) {
        // The object's members without its braces.
        log(level, event, renderedFields: fields.isEmpty ? "" : String(JSONText.object(fields).dropFirst().dropLast()))
    }

    /// A line whose fields the caller rendered already (`"name":value,…`, valid JSON members).
    func log(_ level: String, _ event: String, renderedFields: String) {
        log(level, event, capacity: renderedFields.utf8.count) { line in
            if !renderedFields.isEmpty {
                line += ","
                line += renderedFields
            }
        }
    }

    /// A line whose fields `appendFields` writes straight into it (each as `,"name":value`): the
    /// access log's path, which runs once per request and so builds one string, not two.
    public func log(_ level: String, _ event: String, capacity: Int, appendFields: (inout String) -> Void) {
        var line = "{\"ts\":\""
        line.reserveCapacity(96 + capacity)
        line += Logger.timestamp()
        line += "\",\"level\":"
        line += JSONText.string(level)
        line += ",\"event\":"
        line += JSONText.string(event)
        appendFields(&line)
        line += "}"
        emit(line)
    }

    private func emit(_ line: String) {
        if let queue {
            let queued = queue.lines.withLock { lines -> Int? in
                guard lines.count < queue.maxPending else { return nil }
                lines.append(line)
                return lines.count
            }
            if let queued {
                if queued == 1 && queue.sleeping.load(ordering: .sequentiallyConsistent) { queue.wake.signal() }
                return
            }
        }
        write.withLock { $0(line) }
    }

    /// Waits until the writer thread has written what is queued (shutdown), at most `timeout`.
    public func drain(timeout: TimeInterval = 1) {
        guard let queue else { return }
        let deadline = Date() + timeout
        while Date() < deadline, queue.lines.withLock({ !$0.isEmpty }) { usleep(1000) }
        usleep(1000)
    }

    /// UTC ISO 8601 with milliseconds, formatted by hand: DateFormatter goes through ICU and
    /// cost more per request than the assertion's ECDSA verification.
    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        // "YYYY-MM-DDTHH:MM:SS.mmmZ", digit by digit into the string's own storage.
        return String(unsafeUninitializedCapacity: 24) { out in
            var at = 0
            func put(_ value: Int, _ width: Int) {
                var divisor = 1
                for _ in 1..<width { divisor *= 10 }
                var rest = value
                for _ in 0..<width {
                    out[at] = UInt8(0x30 + (rest / divisor) % 10)
                    rest %= divisor
                    divisor /= 10
                    at += 1
                }
            }
            func mark(_ byte: UInt8) { out[at] = byte; at += 1 }
            put(Int(parts.tm_year) + 1900, 4); mark(0x2d); put(Int(parts.tm_mon) + 1, 2); mark(0x2d); put(Int(parts.tm_mday), 2)
            mark(0x54); put(Int(parts.tm_hour), 2); mark(0x3a); put(Int(parts.tm_min), 2); mark(0x3a); put(Int(parts.tm_sec), 2)
            mark(0x2e); put(Int(now.tv_nsec / 1_000_000), 3); mark(0x5a)
            return at
        }
    }

    public func info(_ event: String, _ fields: [(String, Any)] = []) { log("info", event, fields) }
    public func warning(_ event: String, _ fields: [(String, Any)] = []) { log("warning", event, fields) }
    public func error(_ event: String, _ fields: [(String, Any)] = []) { log("error", event, fields) }
}
