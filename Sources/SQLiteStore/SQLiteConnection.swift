import CSQLite
import Foundation
import StoreRecords
import TokenService

/// A SQLite error with the database's own message.
public struct SQLiteError: StoreAvailabilityError, CustomStringConvertible, Sendable {
    public let code: Int32
    public let message: String
    public var description: String { "SQLite error \(code): \(message)" }
    public var isConstraintViolation: Bool { code & 0xff == SQLITE_CONSTRAINT }
    /// Busy or locked past the busy timeout (another process holds the write lock), or the disk
    /// is full or failing: the service answers 503 and tries again on the next request.
    public var isUnavailable: Bool {
        [SQLITE_BUSY, SQLITE_LOCKED, SQLITE_FULL, SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_READONLY].contains(code & 0xff)
    }
}

/// Values bound to statement parameters.
enum SQLValue {
    case int(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])
    case null
}

/// A connection that can only be used with its lock held: the store reaches its connections
/// through these, so no code path can touch SQLite from two threads at once.
// Safe: `connection` is private and only handed out inside `withConnection`, under `lock`.
// (A Mutex cannot lend a non-Sendable class reference to a closure under strict checking.)
final class LockedSQLiteConnection: @unchecked Sendable {
    private let lock = NSLock()
    private let connection: SQLiteConnection

    init(_ connection: SQLiteConnection) {
        self.connection = connection
    }

    func withConnection<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(connection)
    }
}

/// One connection, used by one thread at a time (see `LockedSQLiteConnection`). Prepared
/// statements are cached by SQL text, so the hot paths never re-parse SQL.
final class SQLiteConnection {
    private let db: OpaquePointer
    /// The token check's answers on this connection (readers only use it).
    let grantCache = GrantCache()
    /// Integrations this connection decoded, by the bytes they were decoded from (readers only).
    let decodedIntegrations = DecodedIntegrations()
    private var statements: [String: OpaquePointer] = [:]
    private var dataVersionStatement: OpaquePointer?

    init(path: String, synchronous: String = "FULL", busyTimeoutMilliseconds: Int32 = 1000) throws {
        // A new database is created 0600 (SQLite would make it 0644, world-readable); its -wal and
        // -shm files take the database file's mode.
        if path != ":memory:", !path.isEmpty {
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            if fd >= 0 { close(fd) }
        }
        _ = Self.configured
        var handle: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let status = sqlite3_open_v2(path, &handle, flags, nil)
        guard status == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open"
            if let handle { sqlite3_close(handle) }
            throw SQLiteError(code: status, message: "\(path): \(message)")
        }
        db = handle
        guard sqlite3_db_readonly(db, "main") != 1 else {
            throw SQLiteError(code: SQLITE_READONLY, message: "\(path) can only be read by this process: the service needs to write it")
        }
        sqlite3_extended_result_codes(db, 1)
        // Short for the service: a write lock held elsewhere (attestctl, another attestd) makes
        // requests wait at most this long and then answer 503, within the 2 s a client should wait
        // for an answer. attestctl waits longer: an operator's command must not fail because the
        // server was writing a batch at that moment.
        sqlite3_busy_timeout(db, busyTimeoutMilliseconds)
        try execute("PRAGMA journal_mode = WAL")
        try execute("PRAGMA foreign_keys = ON")
        try execute("PRAGMA synchronous = \(synchronous)")
        // No mmap (mmap_size stays 0): in WAL mode SQLite drops a connection's mapping at the
        // start of every read transaction that follows another connection's commit, so under
        // writes each read cost a munmap and an mmap of the whole file and a TLB shootdown on
        // every core, dearer than the preads it saved.
    }

    /// Process-wide settings, once, before SQLite initialises: no memory statistics, so that an
    /// allocation takes no global mutex (every connection allocates pages and cells all the time).
    private static let configured: Bool = attest_sqlite_disable_memstatus() == SQLITE_OK

    deinit {
        for statement in statements.values { sqlite3_finalize(statement) }
        if let dataVersionStatement { sqlite3_finalize(dataVersionStatement) }
        sqlite3_close_v2(db)
    }

    private func error(_ code: Int32) -> SQLiteError {
        SQLiteError(code: code, message: String(cString: sqlite3_errmsg(db)))
    }

    /// Runs one or more statements without results.
    /// Inside a transaction (SQLite rolls one back by itself on some errors).
    var inTransaction: Bool { sqlite3_get_autocommit(db) == 0 }

    func execute(_ sql: String) throws {
        var message: UnsafeMutablePointer<CChar>?
        let status = sqlite3_exec(db, sql, nil, nil, &message)
        guard status == SQLITE_OK else {
            let text = message.map { String(cString: $0) } ?? "error"
            sqlite3_free(message)
            throw SQLiteError(code: status, message: text)
        }
    }

    private func prepared(_ sql: String) throws -> (statement: OpaquePointer, columns: ColumnIndex) {
        if let statement = statements[sql] { return (statement, columnIndexes[statement]!) }
        var statement: OpaquePointer?
        let status = sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard status == SQLITE_OK, let statement else { throw error(status) }
        statements[sql] = statement
        // The result's column names (an `AS` alias, else the column's), read once per statement.
        var names: [String: Int32] = [:]
        for index in 0..<sqlite3_column_count(statement) {
            if let name = sqlite3_column_name(statement, index) { names[String(cString: name)] = index }
        }
        let columns = ColumnIndex(names)
        columnIndexes[statement] = columns
        return (statement, columns)
    }

    /// Column positions by name, per prepared statement.
    private var columnIndexes: [OpaquePointer: ColumnIndex] = [:]

    /// Prepared statements run on this connection so far (not `execute`'s BEGIN and COMMIT): what
    /// an exchange costs the writer, whose batches run one at a time.
    private(set) var statementsRun = 0

    /// Pages this connection has looked for in its cache and had to read from the file, so far.
    var cacheMisses: Int {
        var current: Int32 = 0, highest: Int32 = 0
        sqlite3_db_status(db, SQLITE_DBSTATUS_CACHE_MISS, &current, &highest, 0)
        return Int(current)
    }

    /// `PRAGMA data_version`: the same number as on this connection's last call means no other
    /// connection, in this process or another, has committed since. Its own statement, so the
    /// per-request check hashes no SQL text.
    func dataVersion() throws -> Int64 {
        if dataVersionStatement == nil {
            var statement: OpaquePointer?
            let status = sqlite3_prepare_v3(db, "PRAGMA data_version", -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
            guard status == SQLITE_OK, let statement else { throw error(status) }
            dataVersionStatement = statement
        }
        let statement = dataVersionStatement!
        defer { sqlite3_reset(statement) }
        let status = sqlite3_step(statement)
        guard status == SQLITE_ROW else { throw error(status) }
        return sqlite3_column_int64(statement, 0)
    }

    /// Runs `sql` with `values` bound and hands each result row to `row`.
    func query(_ sql: String, _ values: [SQLValue] = [], row: (Row) throws -> Void = { _ in }) throws {
        let (statement, columns) = try prepared(sql)
        statementsRun &+= 1
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        for (index, value) in values.enumerated() {
            let position = Int32(index + 1)
            let status: Int32
            switch value {
            case .int(let v): status = sqlite3_bind_int64(statement, position, v)
            case .real(let v): status = sqlite3_bind_double(statement, position, v)
            // Explicit byte length: with -1 SQLite would stop at an embedded NUL and match a prefix.
            case .text(let v): status = v.withCString { sqlite3_bind_text(statement, position, $0, Int32(v.utf8.count), attest_sqlite_transient()) }
            case .blob(let v): status = v.withUnsafeBytes { sqlite3_bind_blob(statement, position, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32($0.count), attest_sqlite_transient()) }
            case .null: status = sqlite3_bind_null(statement, position)
            }
            guard status == SQLITE_OK else { throw error(status) }
        }
        while true {
            let status = sqlite3_step(statement)
            if status == SQLITE_DONE { return }
            guard status == SQLITE_ROW else { throw error(status) }
            try row(Row(statement: statement, columns: columns))
        }
    }

    /// Runs a statement and returns how many rows it changed.
    @discardableResult
    func run(_ sql: String, _ values: [SQLValue] = []) throws -> Int {
        try query(sql, values)
        return Int(sqlite3_changes(db))
    }

    /// The first row mapped by `map`, or nil.
    func first<T>(_ sql: String, _ values: [SQLValue] = [], _ map: (Row) throws -> T) throws -> T? {
        var result: T?
        try query(sql, values) { row in if result == nil { result = try map(row) } }
        return result
    }

    /// `body` inside BEGIN IMMEDIATE … COMMIT: the write lock is taken up front, so the
    /// transaction cannot fail half-way on a lock upgrade. Rolled back if `body` throws.
    func transaction<T>(_ body: () throws -> T) throws -> T {
        try execute("BEGIN IMMEDIATE")
        do {
            let result = try body()
            try execute("COMMIT")
            return result
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    /// A result row's columns, by position or by name (`StoreRow`).
    struct Row: StoreRow {
        let statement: OpaquePointer
        let columns: ColumnIndex

        private func at(_ name: String) throws -> Int32 {
            guard let index = columns.names[name] else { throw MissingColumn(name) }
            return index
        }
        func isNull(_ column: String) throws -> Bool { isNull(try at(column)) }
        func int(_ column: String) throws -> Int64 { int(try at(column)) }
        func double(_ column: String) throws -> Double { real(try at(column)) }
        func text(_ column: String) throws -> String { text(try at(column)) }
        func bytes(_ column: String) throws -> [UInt8] { blob(try at(column)) }

        func int(_ i: Int32) -> Int64 { sqlite3_column_int64(statement, i) }
        func real(_ i: Int32) -> Double { sqlite3_column_double(statement, i) }
        func isNull(_ i: Int32) -> Bool { sqlite3_column_type(statement, i) == SQLITE_NULL }
        func text(_ i: Int32) -> String {
            guard let pointer = sqlite3_column_text(statement, i) else { return "" }
            return String(cString: pointer)
        }
        func blob(_ i: Int32) -> [UInt8] {
            let count = Int(sqlite3_column_bytes(statement, i))
            guard count > 0, let pointer = sqlite3_column_blob(statement, i) else { return [] }
            return Array(UnsafeRawBufferPointer(start: pointer, count: count))
        }

        /// The first `count` columns' names in order (tests: which columns `rawValues` covers).
        func names(count: Int32) -> [String] {
            (0..<count).map { sqlite3_column_name(statement, $0).map { String(cString: $0) } ?? "" }
        }

        /// The first `count` columns exactly as stored, in one buffer: each column's type, then
        /// its 8-byte value (integer, real) or its length and bytes (text, blob). Two rows with the
        /// same buffer hold the same values.
        func rawValues(count: Int32, into buffer: inout [UInt8]) {
            buffer.removeAll(keepingCapacity: true)
            func append(_ value: UInt64) { withUnsafeBytes(of: value.littleEndian) { buffer.append(contentsOf: $0) } }
            for i in 0..<count {
                let type = sqlite3_column_type(statement, i)
                buffer.append(UInt8(truncatingIfNeeded: type))
                switch type {
                case SQLITE_INTEGER: append(UInt64(bitPattern: sqlite3_column_int64(statement, i)))
                case SQLITE_FLOAT: append(sqlite3_column_double(statement, i).bitPattern)
                case SQLITE_NULL: break
                default:
                    // The bytes first, then their length (the length describes the form last asked for).
                    let pointer = sqlite3_column_blob(statement, i)
                    let length = Int(sqlite3_column_bytes(statement, i))
                    append(UInt64(length))
                    if length > 0, let pointer { buffer.append(contentsOf: UnsafeRawBufferPointer(start: pointer, count: length)) }
                }
            }
        }
    }
}

/// Integrations a reader decoded, by the exact column values they were decoded from. Every
/// exchange reads its integration's row, and decoding it (bundle IDs, environments, both
/// policies) cost about 4% of the service's CPU at 64 devices; the same values always decode to
/// the same integration, so a changed row (a revocation, a new policy) is decoded afresh by
/// construction. Each connection has its own, used by whoever holds the connection.
final class DecodedIntegrations {
    static let capacity = 64
    private var entries: [[UInt8]: Integration] = [:]
    private var scratch: [UInt8] = []
    /// Rows decoded rather than found (tests).
    private(set) var decoded = 0

    /// The integration in `row`'s first `count` columns (`StoreColumns.integration`), decoded once per distinct value.
    func integration(_ row: SQLiteConnection.Row, columns count: Int32) throws -> Integration {
        row.rawValues(count: count, into: &scratch)
        if let found = entries[scratch] { return found }
        let integration = try Integration(row: row)
        if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
        entries[scratch] = integration
        decoded += 1
        return integration
    }
}

/// A statement's result columns by name (a class: shared by every row without copying).
final class ColumnIndex {
    let names: [String: Int32]
    init(_ names: [String: Int32]) { self.names = names }
}

/// Reader connections, lent most recently returned first. In WAL mode a connection drops its
/// whole page cache when its next read transaction finds a commit made by another connection,
/// so reads spread over every connection in turn nearly all start cold (one `pread` per page).
/// Reusing the connection that read last keeps its cache warm for every read until the next
/// commit; connections beyond the reads in flight stay idle. A borrower waits only when all are lent.
// Safe: the connections are only touched under `condition`, or by the one borrower lent each.
final class SQLiteReaderPool: @unchecked Sendable {
    private let condition = NSCondition()
    /// Idle connections; the last is the warmest.
    private var idle: [SQLiteConnection]
    private var borrowersWaiting = 0

    init(_ connections: [SQLiteConnection]) {
        precondition(!connections.isEmpty, "a reader pool needs a connection")
        idle = connections
    }

    func withConnection<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        condition.lock()
        while idle.isEmpty {
            borrowersWaiting += 1
            condition.wait()
            borrowersWaiting -= 1
        }
        let connection = idle.removeLast()
        condition.unlock()
        defer {
            condition.lock()
            idle.append(connection)
            condition.signal()
            condition.unlock()
        }
        return try body(connection)
    }

    /// How many borrowers wait for a connection now (tests watch it).
    var waiting: Int {
        condition.lock()
        defer { condition.unlock() }
        return borrowersWaiting
    }

    /// The idle connections, warmest last (tests read their statistics while none is lent).
    func idleConnections<T>(_ body: ([SQLiteConnection]) throws -> T) rethrows -> T {
        condition.lock()
        defer { condition.unlock() }
        return try body(idle)
    }
}
