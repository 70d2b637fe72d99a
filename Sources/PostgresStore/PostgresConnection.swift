import CPostgres
import Dispatch
import Foundation
import Synchronization
import StoreRecords
import TokenService

/// A value bound to a statement parameter. Every parameter is sent in binary format with an
/// explicit length and type, so text with a NUL byte is an error rather than a prefix match,
/// and bytes never pass through an escaping step.
public enum PostgresValue: Sendable, Equatable {
    case int(Int64)
    case double(Double)
    case text(String)
    case bytes([UInt8])
    case bool(Bool)
    /// A `bytea[]` (the token check's batch of hashes).
    case byteaArray([[UInt8]])
    /// SQL NULL of the given type (`nullBytes` for a missing challenge, …).
    case null(PostgresType)

    public static let nullText = PostgresValue.null(.text)
    public static let nullBytes = PostgresValue.null(.bytea)
    public static let nullInt = PostgresValue.null(.int8)
}

/// The type OIDs the store uses (from `pg_type`; fixed since PostgreSQL 7).
public enum PostgresType: UInt32, Sendable {
    case bool = 16, bytea = 17, int8 = 20, int2 = 21, int4 = 23, text = 25, float4 = 700, float8 = 701, varchar = 1043, name = 19, byteaArray = 1001
}

/// A point in monotonic time after which a call gives up.
public struct PostgresDeadline: Sendable {
    let time: DispatchTime
    public static func after(seconds: Double) -> PostgresDeadline {
        PostgresDeadline(time: .now() + .nanoseconds(Int(seconds * 1_000_000_000)))
    }
    /// Milliseconds left, at least 0.
    var remainingMilliseconds: Int {
        let now = DispatchTime.now().uptimeNanoseconds
        return time.uptimeNanoseconds > now ? Int((time.uptimeNanoseconds - now + 999_999) / 1_000_000) : 0
    }
}

/// Round trips and connections made by a pool, for measurements and tests.
public final class PostgresCounters: Sendable {
    let roundTripCount = Atomic<Int>(0)
    let connectCount = Atomic<Int>(0)
    let preparationCount = Atomic<Int>(0)
    public init() {}
    /// Request/response cycles with the server (a statement, or a `BEGIN`/`COMMIT`); a statement's
    /// preparation, once per connection, is counted in `preparations` instead.
    public var roundTrips: Int { roundTripCount.load(ordering: .relaxed) }
    /// Statements prepared (each once per connection; a round trip of its own).
    public var preparations: Int { preparationCount.load(ordering: .relaxed) }
    /// Connections opened (each costs a few round trips of its own, not counted above).
    public var connects: Int { connectCount.load(ordering: .relaxed) }
}

/// Session limits and timeouts, applied to every connection.
public struct PostgresConfiguration: Sendable {
    /// Connections in the pool: the number of worker threads that call the store.
    public var poolSize: Int
    /// Every store call (waiting for a connection, connecting, running) gives up after this many
    /// seconds, so a dead or hung database fails requests fast instead of holding threads.
    public var callTimeout: Double
    /// Server-side bounds, set on every new session; below `callTimeout`, so the server usually
    /// cancels a slow statement cleanly (SQLSTATE 57014 / 55P03) and the connection stays usable.
    public var statementTimeoutMilliseconds: Int
    public var lockTimeoutMilliseconds: Int
    /// A session idle inside a transaction this long (a client that died mid-transaction) is
    /// ended by the server, releasing its locks.
    public var idleInTransactionTimeoutMilliseconds: Int
    /// TCP: unacknowledged data fails the connection after this long (Linux `TCP_USER_TIMEOUT`),
    /// and keepalives find a silent peer on an idle connection.
    public var tcpUserTimeoutMilliseconds: Int
    public var keepalivesIdleSeconds: Int
    public var keepalivesIntervalSeconds: Int
    public var keepalivesCount: Int
    /// Migrations may wait for another instance's migration and run long DDL.
    public var migrationTimeout: Double
    public var applicationName: String

    public init(poolSize: Int = 4, callTimeout: Double = 2, statementTimeoutMilliseconds: Int = 1500, lockTimeoutMilliseconds: Int = 1000,
                idleInTransactionTimeoutMilliseconds: Int = 10_000, tcpUserTimeoutMilliseconds: Int = 2000, keepalivesIdleSeconds: Int = 5,
                keepalivesIntervalSeconds: Int = 1, keepalivesCount: Int = 3, migrationTimeout: Double = 120, applicationName: String = "attestd") {
        self.poolSize = poolSize
        self.callTimeout = callTimeout
        self.statementTimeoutMilliseconds = statementTimeoutMilliseconds
        self.lockTimeoutMilliseconds = lockTimeoutMilliseconds
        self.idleInTransactionTimeoutMilliseconds = idleInTransactionTimeoutMilliseconds
        self.tcpUserTimeoutMilliseconds = tcpUserTimeoutMilliseconds
        self.keepalivesIdleSeconds = keepalivesIdleSeconds
        self.keepalivesIntervalSeconds = keepalivesIntervalSeconds
        self.keepalivesCount = keepalivesCount
        self.migrationTimeout = migrationTimeout
        self.applicationName = applicationName
    }
}

/// One libpq connection in non-blocking mode: every wait is a `poll` bounded by the deadline of
/// the current call, so no call blocks longer than that whatever the server or network does.
public final class PostgresConnection: @unchecked Sendable {
    // @unchecked Sendable: the only mutable state is the PGconn pointer and the current deadline;
    // libpq allows a connection on one thread at a time, and the pool lends it to one caller at a
    // time (it is never reachable from two threads at once).
    private var conn: OpaquePointer?
    /// The deadline of the call that currently holds this connection (the pool sets it per call;
    /// a caller holding a connection of its own gives it at `init`, or with `extendDeadline`).
    var deadline: PostgresDeadline
    let target: String
    private let secrets: [String]
    private let counters: PostgresCounters

    /// Connects with `connectionString` exactly as libpq reads it. Our defaults (connect and TCP
    /// timeouts, keepalives, application name) come first, so the string may override them.
    public init(_ connectionString: PostgresConnectionString, configuration: PostgresConfiguration = .init(),
                deadline: PostgresDeadline, counters: PostgresCounters = PostgresCounters()) throws {
        self.deadline = deadline
        self.counters = counters
        target = connectionString.redactedDescription
        secrets = connectionString.secrets(environmentPassword: ProcessInfo.processInfo.environment["PGPASSWORD"])
        let parameters: [(String, String)] = [
            ("connect_timeout", "2"),   // libpq's minimum; PQconnectPoll ignores it, our deadline rules
            ("keepalives", "1"),
            ("keepalives_idle", String(configuration.keepalivesIdleSeconds)),
            ("keepalives_interval", String(configuration.keepalivesIntervalSeconds)),
            ("keepalives_count", String(configuration.keepalivesCount)),
            ("tcp_user_timeout", String(configuration.tcpUserTimeoutMilliseconds)),
            ("application_name", configuration.applicationName),
            ("dbname", connectionString.raw),   // expanded: a URL or key=value string overrides the above
        ]
        conn = Self.withCStrings(parameters.map(\.0)) { keywords in
            Self.withCStrings(parameters.map(\.1)) { values in PQconnectStartParams(keywords, values, 1) }
        }
        guard let conn else { throw PostgresError(.connect, message: "out of memory", target: target) }
        guard PQstatus(conn) != CONNECTION_BAD else { throw closing(.connect) }
        var polling = PGRES_POLLING_WRITING
        while polling != PGRES_POLLING_OK {
            switch polling {
            case PGRES_POLLING_READING: try wait(for: Int16(POLLIN), connecting: true)
            case PGRES_POLLING_WRITING: try wait(for: Int16(POLLOUT), connecting: true)
            case PGRES_POLLING_FAILED: throw closing(.connect)
            default: break
            }
            polling = PQconnectPoll(conn)
        }
        guard PQsetnonblocking(conn, 1) == 0 else { throw closing(.connect) }
        counters.connectCount.add(1, ordering: .relaxed)
        try execute("""
            SET statement_timeout = \(configuration.statementTimeoutMilliseconds); \
            SET lock_timeout = \(configuration.lockTimeoutMilliseconds); \
            SET idle_in_transaction_session_timeout = \(configuration.idleInTransactionTimeoutMilliseconds)
            """)
    }

    deinit { close() }

    /// A new deadline for the calls that follow (a connection held outside the pool).
    public func extendDeadline(_ deadline: PostgresDeadline) { self.deadline = deadline }

    /// Ends the session (non-blocking: never waits on a dead server).
    public func close() {
        discardPartialResult()
        if let conn { PQfinish(conn) }
        conn = nil
    }

    /// Whether the pool may hand this connection out again: open, outside any transaction, and
    /// with nothing unread on its socket. An idle session that became readable was closed or
    /// sent a fatal error (server shutdown, `pg_terminate_backend`); we never LISTEN, so no
    /// legitimate message arrives unasked.
    var isReusable: Bool {
        guard let conn, PQstatus(conn) == CONNECTION_OK, PQtransactionStatus(conn) == PQTRANS_IDLE else { return false }
        var descriptor = pollfd(fd: PQsocket(conn), events: Int16(POLLIN), revents: 0)
        return poll(&descriptor, 1, 0) == 0
    }

    // MARK: On an event loop: nothing here waits

    /// The socket, for an event loop to watch (-1 when closed).
    var socket: Int32 { conn.map { PQsocket($0) } ?? -1 }

    /// Sends what libpq holds, as far as the socket takes it now: true when all of it went.
    func flushWithoutWaiting() throws -> Bool {
        guard let conn else { throw PostgresError(.connectionLost, message: "connection closed", target: target) }
        let flushed = PQflush(conn)
        if flushed == 0 { return true }
        guard flushed == 1 else { throw closing(.connectionLost) }
        return false
    }

    /// A statement's answer read so far: its first result and first error.
    private var partialResult: OpaquePointer?
    private var partialFailure: PostgresError?

    /// Reads what has arrived for the statement `send` sent: its result once the server is done
    /// with it, or nil while more is to come. An error result is thrown once the answer is whole
    /// (the connection stays usable); a broken connection is thrown at once (and closed).
    func readWithoutWaiting() throws -> PostgresResult? {
        guard let conn else { throw PostgresError(.connectionLost, message: "connection closed", target: target) }
        guard PQconsumeInput(conn) == 1 else {
            discardPartialResult()
            throw closing(.connectionLost)
        }
        while PQisBusy(conn) == 0 {
            guard let result = PQgetResult(conn) else {
                counters.roundTripCount.add(1, ordering: .relaxed)
                return try takeAnswer()
            }
            absorb(result)
        }
        return nil
    }

    /// Keeps a statement's first result and first error; frees the rest.
    private func absorb(_ result: OpaquePointer) {
        let status = PQresultStatus(result)
        if status == PGRES_FATAL_ERROR || status == PGRES_BAD_RESPONSE || status == PGRES_NONFATAL_ERROR {
            if partialFailure == nil { partialFailure = error(from: result) }
            PQclear(result)
        } else if partialResult == nil {
            partialResult = result
        } else {
            PQclear(result)
        }
    }

    /// The whole answer `absorb` kept: its result, or its first error thrown.
    private func takeAnswer() throws -> PostgresResult {
        let (kept, failure) = (partialResult, partialFailure)
        (partialResult, partialFailure) = (nil, nil)
        if let failure {
            if let kept { PQclear(kept) }
            throw failure
        }
        guard let kept else { throw PostgresError(.server, message: "no result", target: target) }
        return PostgresResult(kept, target: target)
    }

    private func discardPartialResult() {
        if let partialResult { PQclear(partialResult) }
        (partialResult, partialFailure) = (nil, nil)
    }

    /// Prepares `sql` now (waiting, within the deadline), so that `send` never waits later.
    func prepare(_ sql: String, types: [PostgresType]) throws {
        _ = try preparedName(sql, types.map(\.rawValue))
    }

    /// The server's version number (150018 for 15.18).
    public var serverVersion: Int { conn.map { Int(PQserverVersion($0)) } ?? 0 }

    // MARK: Running statements

    /// Runs one statement with `values` bound to `$1…` and returns its rows (binary format).
    @discardableResult
    public func query(_ sql: String, _ values: [PostgresValue] = []) throws -> PostgresResult {
        try send(sql, values)
        return try collect()
    }

    /// Sends one statement (prepared on first use, which waits for its own round trip) without
    /// waiting for the answer: `query`'s first half, and the event loop's way in.
    func send(_ sql: String, _ values: [PostgresValue]) throws {
        guard let conn else { throw PostgresError(.connectionLost, message: "connection closed", target: target) }
        var types: [UInt32] = []
        var lengths: [Int32] = []
        var offsets: [Int?] = []
        var storage: [UInt8] = []
        types.reserveCapacity(values.count)
        for value in values {
            let start = storage.count
            switch value {
            case .int(let v): types.append(PostgresType.int8.rawValue); withUnsafeBytes(of: v.bigEndian) { storage += $0 }
            case .double(let v): types.append(PostgresType.float8.rawValue); withUnsafeBytes(of: v.bitPattern.bigEndian) { storage += $0 }
            case .text(let v): types.append(PostgresType.text.rawValue); storage += v.utf8
            case .bytes(let v): types.append(PostgresType.bytea.rawValue); storage += v
            case .bool(let v): types.append(PostgresType.bool.rawValue); storage.append(v ? 1 : 0)
            case .byteaArray(let elements): types.append(PostgresType.byteaArray.rawValue); Self.appendArray(elements, to: &storage)
            case .null(let type): types.append(type.rawValue)
            }
            if case .null = value {
                offsets.append(nil)
                lengths.append(0)
            } else {
                offsets.append(start)
                lengths.append(Int32(storage.count - start))
            }
        }
        storage.append(0)   // never empty, so an empty value still has a non-NULL pointer
        let formats = [Int32](repeating: 1, count: values.count)
        let name = try preparedName(sql, types)
        let sent = storage.withUnsafeBufferPointer { buffer -> Int32 in
            let base = UnsafeRawPointer(buffer.baseAddress!)
            let pointers: [UnsafePointer<CChar>?] = offsets.map { $0.map { (base + $0).assumingMemoryBound(to: CChar.self) } }
            if let name { return PQsendQueryPrepared(conn, name, Int32(values.count), pointers, lengths, formats, 1) }
            return PQsendQueryParams(conn, sql, Int32(values.count), types, pointers, lengths, formats, 1)
        }
        guard sent == 1 else { throw closing(.connectionLost) }
    }

    /// A one-dimensional `bytea[]` in PostgreSQL's binary array format: dimensions, no NULLs,
    /// the element type, then each element's length and bytes.
    static func appendArray(_ elements: [[UInt8]], to storage: inout [UInt8]) {
        func int32(_ value: Int) { withUnsafeBytes(of: Int32(value).bigEndian) { storage += $0 } }
        int32(elements.isEmpty ? 0 : 1)
        int32(0)
        int32(Int(PostgresType.bytea.rawValue))
        if !elements.isEmpty {
            int32(elements.count)
            int32(1)
        }
        for element in elements {
            int32(element.count)
            storage += element
        }
    }

    /// Statements this connection has prepared, by SQL and parameter types: the server parses
    /// and plans each once per connection instead of on every call. Bounded: SQL made per call
    /// (a multi-row INSERT of N rows) beyond it runs unprepared, as before.
    private var prepared: [PreparedKey: String] = [:]
    static let maxPrepared = 128
    private struct PreparedKey: Hashable {
        let sql: String
        let types: [UInt32]
    }

    /// The name of the prepared statement for `sql` (preparing it now, one round trip of its own,
    /// counted apart), or nil to run it unprepared.
    private func preparedName(_ sql: String, _ types: [UInt32]) throws -> String? {
        guard let conn else { throw PostgresError(.connectionLost, message: "connection closed", target: target) }
        let key = PreparedKey(sql: sql, types: types)
        if let name = prepared[key] { return name }
        guard prepared.count < Self.maxPrepared else { return nil }
        let name = "attestd_\(prepared.count)"
        guard PQsendPrepare(conn, name, sql, Int32(types.count), types) == 1 else { throw closing(.connectionLost) }
        counters.preparationCount.add(1, ordering: .relaxed)
        _ = try collect(countingRoundTrip: false)
        prepared[key] = name
        return name
    }

    /// Runs SQL text that may hold several statements (simple protocol, text results discarded):
    /// migrations, `BEGIN`, `COMMIT`, `SET`.
    public func execute(_ sql: String) throws {
        guard let conn else { throw PostgresError(.connectionLost, message: "connection closed", target: target) }
        guard PQsendQuery(conn, sql) == 1 else { throw closing(.connectionLost) }
        _ = try collect()
    }

    /// Runs `body` between `BEGIN` and `COMMIT`; rolls back if it throws.
    public func transaction<T>(_ body: () throws -> T) throws -> T {
        try execute("BEGIN")
        do {
            let result = try body()
            try execute("COMMIT")
            return result
        } catch {
            if conn != nil, PQstatus(conn) == CONNECTION_OK { try? execute("ROLLBACK") }
            throw error
        }
    }

    /// Sends what is buffered, then reads results until the server is done with this query.
    /// Keeps the first result (or the first error) and discards the rest.
    private func collect(countingRoundTrip: Bool = true) throws -> PostgresResult {
        guard let conn else { throw PostgresError(.connectionLost, message: "connection closed", target: target) }
        if countingRoundTrip { counters.roundTripCount.add(1, ordering: .relaxed) }
        while true {
            let flushed = PQflush(conn)
            if flushed == 0 { break }
            guard flushed == 1 else { throw closing(.connectionLost) }
            try wait(for: Int16(POLLIN | POLLOUT))
            guard PQconsumeInput(conn) == 1 else { throw closing(.connectionLost) }
        }
        while true {
            while PQisBusy(conn) == 1 {
                do {
                    try wait(for: Int16(POLLIN))
                    guard PQconsumeInput(conn) == 1 else { throw closing(.connectionLost) }
                } catch {
                    discardPartialResult()
                    throw error
                }
            }
            guard let result = PQgetResult(conn) else { break }
            absorb(result)
        }
        return try takeAnswer()
    }

    private func error(from result: OpaquePointer) -> PostgresError {
        func field(_ code: Int32) -> String? { PQresultErrorField(result, code).map { String(cString: $0) } }
        let sqlState = field(attest_pg_diag_sqlstate())
        var message = field(attest_pg_diag_message_primary()) ?? String(cString: PQresultErrorMessage(result))
        if let detail = field(attest_pg_diag_message_detail()) { message += " (\(detail))" }
        message = scrub(message.trimmingCharacters(in: .whitespacesAndNewlines), secrets: secrets)
        // A result error with the session gone (server shutdown, network) is a lost connection.
        if let conn, PQstatus(conn) != CONNECTION_OK {
            return PostgresError(.connectionLost, sqlState: sqlState, message: message, target: target)
        }
        return PostgresError(.server, sqlState: sqlState, message: message, target: target)
    }

    /// Closes the connection and describes why, from libpq's message (passwords scrubbed).
    private func closing(_ kind: PostgresError.Kind, _ reason: String? = nil) -> PostgresError {
        let text = reason ?? conn.map { String(cString: PQerrorMessage($0)) } ?? "connection closed"
        close()
        let message = scrub(text.trimmingCharacters(in: .whitespacesAndNewlines), secrets: secrets)
        return PostgresError(kind, message: message.isEmpty ? "connection failed" : message, target: target)
    }

    /// Waits for the socket to be ready for `events`, until the deadline.
    private func wait(for events: Int16, connecting: Bool = false) throws {
        guard let conn, PQsocket(conn) >= 0 else { throw closing(connecting ? .connect : .connectionLost) }
        while true {
            let remaining = deadline.remainingMilliseconds
            guard remaining > 0 else {
                throw closing(.timeout, connecting ? "no connection within the call's deadline" : "no answer within the call's deadline")
            }
            var descriptor = pollfd(fd: PQsocket(conn), events: events, revents: 0)
            let ready = poll(&descriptor, 1, Int32(min(remaining, 1000)))
            if ready > 0 { return }
            if ready < 0 && errno != EINTR { throw closing(connecting ? .connect : .connectionLost, "poll: errno \(errno)") }
        }
    }

    private static func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R) -> R {
        let copies = strings.map { strdup($0) }
        defer { copies.forEach { free($0) } }
        let pointers = copies.map { UnsafePointer<CChar>($0) } + [nil]
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }
}

/// A statement's result in binary format. Owns the libpq result until released.
public final class PostgresResult {
    private let result: OpaquePointer
    private let target: String

    init(_ result: OpaquePointer, target: String) {
        self.result = result
        self.target = target
    }

    deinit { PQclear(result) }

    public var count: Int { Int(PQntuples(result)) }
    /// The position of a result column, or nil when the query selects none of that name.
    func columnIndex(_ name: String) -> Int32? { try? column(name) }
    /// Whether a value is exactly `expected`'s bytes (binary format), compared in place.
    func value(_ row: Int, _ column: Int32, equals expected: [UInt8]) -> Bool {
        guard PQgetisnull(result, Int32(row), column) == 0 else { return false }
        let value = bytes(Int32(row), column)
        return value.count == expected.count && expected.withUnsafeBytes { memcmp($0.baseAddress!, value.baseAddress!, value.count) == 0 }
    }

    /// Whether a row is exactly what `rawRow` gave for it before, compared in place.
    func row(_ row: Int, equals raw: [UInt8]) -> Bool {
        var offset = 0
        return raw.withUnsafeBytes { raw in
            for column in 0..<PQnfields(result) {
                let length = PQgetisnull(result, Int32(row), column) == 1 ? -1 : PQgetlength(result, Int32(row), column)
                let width = MemoryLayout<Int32>.size
                guard offset + width <= raw.count, raw.loadUnaligned(fromByteOffset: offset, as: Int32.self) == length else { return false }
                offset += width
                guard length > 0 else { continue }
                guard offset + Int(length) <= raw.count, let value = PQgetvalue(result, Int32(row), column),
                      memcmp(raw.baseAddress! + offset, value, Int(length)) == 0 else { return false }
                offset += Int(length)
            }
            return offset == raw.count
        }
    }
    /// A whole row as the server sent it, each value with its length (-1: NULL): two rows with
    /// the same bytes hold the same values.
    func rawRow(_ row: Int) -> [UInt8] {
        var raw: [UInt8] = []
        raw.reserveCapacity(512)
        for column in 0..<PQnfields(result) {
            let length = PQgetisnull(result, Int32(row), column) == 1 ? -1 : PQgetlength(result, Int32(row), column)
            withUnsafeBytes(of: length) { raw += $0 }
            if length > 0 { raw += bytes(Int32(row), column) }
        }
        return raw
    }
    /// Rows changed by an INSERT, UPDATE or DELETE.
    public var affectedRows: Int { Int(String(cString: PQcmdTuples(result))) ?? 0 }
    public subscript(row: Int) -> PostgresRow { PostgresRow(result: self, row: Int32(row)) }
    public var rows: [PostgresRow] { (0..<count).map { self[$0] } }
    /// The first row mapped by `map`, or nil when there is none.
    public func first<T>(_ map: (PostgresRow) throws -> T) throws -> T? { count > 0 ? try map(self[0]) : nil }

    /// The position of the result column `name` (an `AS` alias, else the column's).
    fileprivate func column(_ name: String) throws -> Int32 {
        let index = PQfnumber(result, "\"" + name + "\"")
        guard index >= 0 else { throw PostgresError(.decoding, message: "the query selects no column \(name)", target: target) }
        return index
    }

    fileprivate func isNull(_ row: Int32, _ column: Int32) -> Bool { PQgetisnull(result, row, column) == 1 }
    fileprivate func type(_ column: Int32) -> UInt32 { PQftype(result, column) }
    fileprivate func bytes(_ row: Int32, _ column: Int32) -> UnsafeRawBufferPointer {
        let length = Int(PQgetlength(result, row, column))
        guard length > 0, let value = PQgetvalue(result, row, column) else { return UnsafeRawBufferPointer(start: nil, count: 0) }
        return UnsafeRawBufferPointer(start: value, count: length)
    }
    fileprivate func mismatch(_ column: Int32, _ wanted: String) -> PostgresError {
        PostgresError(.decoding, message: "column \(column) has type OID \(type(column)), not \(wanted)", target: target)
    }
}

/// One row of a `PostgresResult`; columns by position, decoded from PostgreSQL's binary format.
public struct PostgresRow {
    let result: PostgresResult
    let row: Int32

    public func isNull(_ column: Int32) -> Bool { result.isNull(row, column) }

    private func bigEndian(_ column: Int32, width: Int) throws -> UInt64 {
        let raw = result.bytes(row, column)
        guard raw.count == width else { throw result.mismatch(column, "\(width)-byte integer") }
        return raw.reduce(0) { $0 << 8 | UInt64($1) }
    }

    public func int(_ column: Int32) throws -> Int64 {
        switch result.type(column) {
        case PostgresType.int8.rawValue: return Int64(bitPattern: try bigEndian(column, width: 8))
        case PostgresType.int4.rawValue: return Int64(Int32(bitPattern: UInt32(try bigEndian(column, width: 4))))
        case PostgresType.int2.rawValue: return Int64(Int16(bitPattern: UInt16(try bigEndian(column, width: 2))))
        default: throw result.mismatch(column, "an integer")
        }
    }

    public func double(_ column: Int32) throws -> Double {
        switch result.type(column) {
        case PostgresType.float8.rawValue: return Double(bitPattern: try bigEndian(column, width: 8))
        case PostgresType.float4.rawValue: return Double(Float(bitPattern: UInt32(try bigEndian(column, width: 4))))
        default: return Double(try int(column))
        }
    }

    public func bool(_ column: Int32) throws -> Bool {
        guard result.type(column) == PostgresType.bool.rawValue else { throw result.mismatch(column, "bool") }
        return try bigEndian(column, width: 1) != 0
    }

    public func text(_ column: Int32) throws -> String {
        switch result.type(column) {
        case PostgresType.text.rawValue, PostgresType.varchar.rawValue, PostgresType.name.rawValue:
            return String(decoding: result.bytes(row, column), as: UTF8.self)
        default: throw result.mismatch(column, "text")
        }
    }

    public func bytes(_ column: Int32) throws -> [UInt8] {
        guard result.type(column) == PostgresType.bytea.rawValue else { throw result.mismatch(column, "bytea") }
        return Array(result.bytes(row, column))
    }
}

/// Rows read by column name: the records both stores share (`StoreColumns`).
extension PostgresRow: StoreRow {
    public func isNull(_ column: String) throws -> Bool { isNull(try result.column(column)) }
    public func int(_ column: String) throws -> Int64 { try int(try result.column(column)) }
    public func double(_ column: String) throws -> Double { try double(try result.column(column)) }
    public func text(_ column: String) throws -> String { try text(try result.column(column)) }
    public func bytes(_ column: String) throws -> [UInt8] { try bytes(try result.column(column)) }
}
