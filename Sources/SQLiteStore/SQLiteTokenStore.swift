import AppAttest
import AttestCrypto
import CSQLite
import Foundation
import Lifecycle
import Synchronization
import StoreRecords
import TokenService

/// `TokenStore` on SQLite: WAL mode, foreign keys on, one writer connection and a few readers.
/// Everything that must not race is one conditional statement or one IMMEDIATE transaction on
/// the writer. Another process (attestctl) may write the same file; SQLite's locks serialise it.
public final class SQLiteTokenStore: Database {
    public let path: String
    let writer: LockedSQLiteConnection
    /// The database file's device and inode when it was opened: a file deleted or replaced under
    /// the running server is noticed (about once a second) and writes stop with 503, rather than
    /// acknowledging tokens written to an unlinked file.
    let identity: (device: UInt64, inode: UInt64)?
    let fault = Mutex<String?>(nil)
    /// Background writes (audit batches, purges) on a connection of their own, so that one waiting
    /// out a lock never holds the request path's writer: a request waits for the file lock once.
    let background: LockedSQLiteConnection
    let readers: SQLiteReaderPool
    /// The exchange's commits, batched (see `GroupCommit`).
    let groupCommit: GroupCommit

    /// Opens (creating if needed) and migrates the database.
    /// - Parameter synchronous: `FULL` (default) makes every acknowledged commit survive power loss,
    ///   `NORMAL` only process crashes.
    public init(path: String, readers readerCount: Int = 4, synchronous: String = "FULL",
                migrations: [Migration] = Migration.sqlite, mode: MigrationMode = .apply, busyTimeoutMilliseconds: Int32 = 1000) throws {
        self.path = path
        let connection = try SQLiteConnection(path: path, synchronous: synchronous, busyTimeoutMilliseconds: busyTimeoutMilliseconds)
        try Migrator.migrate(connection, migrations, mode: mode)
        writer = LockedSQLiteConnection(connection)
        groupCommit = GroupCommit(writer: writer)
        identity = Self.fileIdentity(path)
        background = LockedSQLiteConnection(try SQLiteConnection(path: path, synchronous: synchronous, busyTimeoutMilliseconds: busyTimeoutMilliseconds))
        readers = SQLiteReaderPool(try (0..<max(1, readerCount)).map { _ in try SQLiteConnection(path: path, synchronous: synchronous, busyTimeoutMilliseconds: busyTimeoutMilliseconds) })
    }

    func writeInBackground<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        try refuseIfFaulted()
        return try background.withConnection(body)
    }

    func write<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        try refuseIfFaulted()
        return try writer.withConnection(body)
    }

    /// `body` as one transaction, committed with whichever other exchanges are waiting (see
    /// `GroupCommit`); it returns once committed. `body` opens no transaction of its own.
    func writeInGroup<T: Sendable>(_ body: @Sendable (SQLiteConnection) throws -> T) throws -> T {
        try refuseIfFaulted()
        // `run` returns only after the body has run (on this thread or the batch's), so it does not escape.
        return try withoutActuallyEscaping(body) { body in try groupCommit.run(body) }
    }

    /// `writeInGroup` without waiting: `completion` gets the result once the batch holding `body`
    /// has committed, on the thread that committed it (see `GroupCommit.submit`).
    func submitInGroup<T: Sendable>(_ body: @escaping @Sendable (SQLiteConnection) throws -> T,
                                    completion: @escaping @Sendable (Result<T, any Error>) -> Void) {
        do { try refuseIfFaulted() } catch { return completion(.failure(error)) }
        groupCommit.submit(body, completion: completion)
    }

    /// A reader, the most recently used idle one (see `SQLiteReaderPool`), for one read.
    func read<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        try readWithCache { db, _ in try body(db) }
    }

    func readWithCache<T>(_ body: (SQLiteConnection, GrantCache) throws -> T) throws -> T {
        try readers.withConnection { db in try body(db, db.grantCache) }
    }

    static func fileIdentity(_ path: String) -> (device: UInt64, inode: UInt64)? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return (UInt64(info.st_dev), UInt64(info.st_ino))
    }

    /// Compares the path's file with the one opened, and checks the disk has room; remembers a
    /// fault so that writes stop. Runs on a timer (`startWatching`) and for /readyz.
    @discardableResult
    public func checkStorage() -> String? {
        var problem: String?
        if let identity, path != ":memory:" {
            if let now = Self.fileIdentity(path) {
                if now.device != identity.device || now.inode != identity.inode {
                    problem = "the database file \(path) was replaced since it was opened"
                }
            } else {
                problem = "the database file \(path) was deleted since it was opened"
            }
        }
        if problem != nil { fault.withLock { if $0 == nil { $0 = problem } } }
        if let fault = fault.withLock({ $0 }) { return fault }
        var space = statvfs()
        let directory = (path as NSString).deletingLastPathComponent
        if statvfs(directory.isEmpty ? "." : directory, &space) == 0 {
            let free = UInt64(space.f_bavail) * UInt64(space.f_frsize)
            if free < 16 << 20 { return "the disk holding \(path) has \(free >> 20) MB free" }
        }
        return nil
    }

    /// A check of the file about once a second while the service runs.
    public var backgroundServices: [any Service] { [storageWatch()] }
    /// Reads are local: the token check stays on the event loop (see `TokenStore`).
    public var readsCrossTheNetwork: Bool { false }

    func refuseIfFaulted() throws {
        if let fault = fault.withLock({ $0 }) { throw SQLiteError(code: SQLITE_CANTOPEN, message: fault + "; writes stopped") }
    }

    public func readinessProblem() -> String? {
        if let problem = checkStorage() { return problem }
        do { _ = try read { try $0.first("SELECT 1") { $0.int(0) } } } catch { return "the database does not answer: \(error)" }
        return nil
    }

    /// Runs `PRAGMA integrity_check` and returns its verdict ("ok" when sound).
    public func integrityCheck() throws -> String {
        try write { try $0.first("PRAGMA integrity_check") { $0.text(0) } ?? "no answer" }
    }
}

/// A reader's live-token answers for one database version (see `SQLiteTokenStore.liveToken`).
/// Only tokens found live are kept, so unknown tokens cannot fill it; it is bounded all the same.
/// Each connection has its own, used under the connection's lock like the connection itself.
final class GrantCache {
    private struct Entry {
        let hash: [UInt8]
        let minute: Int64
        let grant: TokenGrant
    }
    /// A user profile's recorded usage, as `recordedProfileUsage` read it (its minute and month).
    struct ProfileKey: Hashable {
        let clientID: String
        let profile: String
        let month: Int64
        let minute: Int64
    }
    static let capacity = 4096
    private var version: Int64 = -1
    /// Keyed by the hash's first 8 bytes; the whole hash is compared on a hit.
    private var entries: [UInt64: Entry] = [:]
    private var profiles: [ProfileKey: RecordedProfileUsage] = [:]

    /// Empties the cache when the database is no longer at `version`; false then.
    private func isCurrent(_ version: Int64) -> Bool {
        guard version == self.version else {
            entries.removeAll(keepingCapacity: true)
            profiles.removeAll(keepingCapacity: true)
            self.version = version
            return false
        }
        return true
    }

    /// The kept grant when the database is still at `version`, the usage counts are for `minute`
    /// and the token has not expired by `time`. A new version empties the cache.
    func grant(hash: [UInt8], minute: Int64, version: Int64, at time: Date) -> TokenGrant? {
        guard isCurrent(version) else { return nil }
        guard let entry = entries[Self.slot(hash)], entry.minute == minute, constantTimeEquals(entry.hash, hash),
              time < entry.grant.expiresAt else { return nil }
        return entry.grant
    }

    func keep(_ grant: TokenGrant, hash: [UInt8], minute: Int64) {
        if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
        entries[Self.slot(hash)] = Entry(hash: hash, minute: minute, grant: grant)
    }

    /// A profile's usage as read while the database was at `version` (the same rule as grants:
    /// any commit, a usage flush included, empties the cache).
    func profileUsage(_ key: ProfileKey, version: Int64) -> RecordedProfileUsage? {
        guard isCurrent(version) else { return nil }
        return profiles[key]
    }

    func keep(_ usage: RecordedProfileUsage, for key: ProfileKey) {
        if profiles.count >= Self.capacity { profiles.removeAll(keepingCapacity: true) }
        profiles[key] = usage
    }

    private static func slot(_ hash: [UInt8]) -> UInt64 {
        hash.prefix(8).reduce(0) { $0 << 8 | UInt64($1) }
    }
}

extension SQLiteTokenStore {
    /// Compares the database's path with the file opened, about once a second (`checkStorage`).
    func storageWatch(every interval: Double = 1) -> PeriodicTask {
        PeriodicTask("storage-watch", every: interval) { [self] in checkStorage() }
    }
}
