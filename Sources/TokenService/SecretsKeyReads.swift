import AttestCrypto
import Foundation
import Lifecycle
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// What one attestd last read from its secrets key files, as it reported it to the database: an
/// instance is its host and its key file (a restart updates the same row; instances on one host
/// that share a key file share it, since they read the same files). Key IDs only, never a key.
public struct SecretsKeyRead: Sendable, Equatable {
    /// The host name the instance runs on (`gethostname`).
    public var host: String
    /// The current key's file, as an absolute path (the previous key's is it plus `.previous`).
    public var keyFile: String
    /// The key IDs it holds (`SecretBox.describe(keyID:)`); nil: none (no key file read yet, or
    /// no rotation under way for the previous one).
    public var currentKey: String?
    public var previousKey: String?
    /// When it read the key files it holds (nil: none read yet).
    public var readAt: Date?
    /// Its last report: at start, whenever what it holds or its problem changes, and every
    /// `reportInterval` otherwise.
    public var reportedAt: Date
    public var processID: Int64
    /// Why the files on disk were not taken at its last look (it kept the keys above), or nil.
    public var problem: String?

    /// An instance reports at least this often while it runs.
    public static let reportInterval: TimeInterval = 300
    /// A row not reported for this long is stale: its instance stopped, or cannot reach the database.
    public static let staleAfter: TimeInterval = 900
    /// Rows not reported for this long are deleted by the running instances' purge.
    public static let keptFor: TimeInterval = 30 * 86_400

    public init(host: String, keyFile: String, currentKey: String?, previousKey: String?, readAt: Date?, reportedAt: Date,
                processID: Int64, problem: String?) {
        self.host = host
        self.keyFile = keyFile
        self.currentKey = currentKey
        self.previousKey = previousKey
        self.readAt = readAt
        self.reportedAt = reportedAt
        self.processID = processID
        self.problem = problem
    }

    public func isStale(at time: Date) -> Bool { time.timeIntervalSince(reportedAt) > Self.staleAfter }

    /// This machine's host name.
    public static func hostName() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "unknown" }
        let name = String(cString: buffer)
        return name.isEmpty ? "unknown" : name
    }

    /// `path` as an absolute path (relative to the working directory), `.` and `..` removed;
    /// symbolic links are kept: it is the path the operator configured.
    public static func absolutePath(_ path: String) -> String {
        let absolute = path.hasPrefix("/") ? path : (FileManager.default.currentDirectoryPath as NSString).appendingPathComponent(path)
        return (absolute as NSString).standardizingPath
    }
}

/// attestd's report of its secrets key files: looks at them once a second (the key source reads
/// them again when they changed), logs a file that is refused or stops being refused, and writes
/// its row (`SecretsKeyRead`) at start, whenever what it holds or the refusal changes, and every
/// `SecretsKeyRead.reportInterval` otherwise, on a thread of its own (never an event loop). A
/// failed write is logged and retried at the next look; it never stops the service.
public final class SecretsKeyReadReporter: Service {
    public let name = "secrets-key-reads"
    private let source: SecretsKeySource
    private let store: any SecretsKeyReadStore
    private let host: String
    private let keyFile: String
    private let interval: TimeInterval
    private let reportInterval: TimeInterval
    private let now: @Sendable () -> Date
    private let log: @Sendable (_ event: String, _ fields: [(String, String)], _ isError: Bool) -> Void

    private struct Last {
        /// What the last successful write said (its time apart).
        var written: SecretsKeyRead?
        /// The problem last logged.
        var loggedProblem: String?
        /// What was held at the last look.
        var loggedHolding: SecretsKeySource.Holding?
        /// The write failure last logged (logged once until a write succeeds).
        var loggedFailure: String?
    }
    private let last = Mutex(Last())
    private let timer = Mutex<PeriodicTask?>(nil)

    /// - Parameters:
    ///   - host: the host name it reports (this machine's by default).
    ///   - interval: how often it looks at the files.
    ///   - log: an event, its fields (no key, no key ID), and whether it is an error.
    public init(source: SecretsKeySource, store: any SecretsKeyReadStore, host: String = SecretsKeyRead.hostName(), interval: TimeInterval = 1,
                reportInterval: TimeInterval = SecretsKeyRead.reportInterval, now: @escaping @Sendable () -> Date = { Date() },
                log: @escaping @Sendable (_ event: String, _ fields: [(String, String)], _ isError: Bool) -> Void) {
        self.source = source
        self.store = store
        self.host = host
        keyFile = SecretsKeyRead.absolutePath(source.path)
        self.interval = interval
        self.reportInterval = reportInterval
        self.now = now
        self.log = log
    }

    /// Reports once (the row exists before the listeners open), then looks every `interval`.
    public func start() {
        look()
        let task = PeriodicTask("secrets-key-reads", every: interval) { [weak self] in self?.look() }
        guard timer.withLock({ current -> Bool in
            guard current == nil else { return false }
            current = task
            return true
        }) else { return }
        task.start()
    }

    public func run() throws { try timer.withLock { $0 }?.run() }

    public func stop(by deadline: ContinuousClock.Instant) {
        if let task = timer.withLock({ $0 }) { task.stop(by: deadline) }
    }

    /// One look at the files: logs what changed, and writes the row when it is due.
    public func look() {
        let holding = source.holding()
        let time = now()
        let read = SecretsKeyRead(host: host, keyFile: keyFile, currentKey: holding.currentKey, previousKey: holding.previousKey,
                                  readAt: holding.readAt, reportedAt: time, processID: Int64(getpid()), problem: holding.problem)
        let (due, logProblem, logLoaded) = last.withLock { last -> (Bool, Bool, Bool) in
            var unchanged = read
            if let written = last.written { unchanged.reportedAt = written.reportedAt }
            let due = last.written != unchanged || time.timeIntervalSince(last.written?.reportedAt ?? .distantPast) >= reportInterval
            let logProblem = holding.problem != last.loggedProblem
            last.loggedProblem = holding.problem
            // Loaded: other keys read (not at the first look, at start; not the same keys read again).
            let logLoaded = last.loggedHolding.map { $0.currentKey != holding.currentKey || $0.previousKey != holding.previousKey } == true
                && holding.currentKey != nil
            last.loggedHolding = holding
            return (due, logProblem, logLoaded)
        }
        if logProblem {
            if let problem = holding.problem {
                log("secrets_key_refused", [("file", source.path), ("error", problem),
                                            ("note", holding.currentKey == nil ? "no secrets key is held: sealed values do not open until the file loads"
                                                                               : "the keys read before are kept until the files load")], true)
            } else {
                log("secrets_key_accepted", [("file", source.path)], false)
            }
        }
        if logLoaded {
            log("secrets_key_loaded", [("file", source.path), ("rotation_under_way", holding.previousKey == nil ? "false" : "true")], false)
        }
        guard due else { return }
        do {
            try store.recordSecretsKeyRead(read)
            last.withLock {
                $0.written = read
                $0.loggedFailure = nil
            }
        } catch {
            let failure = "\(error)"
            let first = last.withLock { last -> Bool in
                defer { last.loggedFailure = failure }
                return last.loggedFailure != failure
            }
            if first { log("secrets_key_report_failed", [("error", failure), ("note", "retried every look")], true) }
        }
    }
}
