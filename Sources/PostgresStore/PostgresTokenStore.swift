import AppAttest
import AttestCrypto
import AttestWire
import Foundation
import StoreRecords
import TokenService

/// `TokenStore` on PostgreSQL, for several attestd instances on one database. Behaves as
/// `SQLiteTokenStore` does; everything that must not race is decided by the database, never by
/// this process's memory:
/// - a challenge is redeemed by locking its row (`SELECT … FOR UPDATE`) and checking it is still
///   pending and still the same bytes; of concurrent redeemers exactly one sees it so;
/// - a counter advances by a compare-and-set `UPDATE … WHERE sign_counter = $from`;
/// - a key registers once (`devices` primary key, `ON CONFLICT DO NOTHING`);
/// - each exchange (redeem, advance or register, token, next challenge) is one statement built
///   from data-modifying CTEs: one transaction and one round trip.
public final class PostgresTokenStore: Database {
    public let pool: PostgresPool

    /// Connects, then applies (or with `.verify` only checks) the migrations.
    public init(connectionString: PostgresConnectionString, configuration: PostgresConfiguration = .init(),
                migrations: [Migration] = Migration.postgres, mode: MigrationMode = .apply) throws {
        pool = PostgresPool(connectionString, configuration: configuration)
        try PostgresMigrator.migrate(pool, migrations, mode: mode)
    }

    public convenience init(_ connectionString: String, poolSize: Int = 4, mode: MigrationMode = .apply) throws {
        try self.init(connectionString: PostgresConnectionString(connectionString), configuration: PostgresConfiguration(poolSize: poolSize), mode: mode)
    }

    /// Round trips to the server so far (for measurement: one per exchange).
    public var roundTrips: Int { pool.counters.roundTrips }
    /// Statements prepared so far (each once per pooled connection).
    public var preparations: Int { pool.counters.preparations }

    /// Opens the pool's connections now (a server, before it listens).
    public func warm(timeout: Double = 10) { pool.warm(timeout: timeout) }

    /// Closes the idle connections (they reopen on demand); for tools about to exit.
    public func close() { pool.closeIdleConnections() }

    func run<T>(_ body: (PostgresConnection) throws -> T) throws -> T { try pool.withConnection(body) }

    static func seconds(_ date: Date) -> PostgresValue { .double(date.timeIntervalSince1970) }
    static func date(_ row: PostgresRow, _ column: Int32) throws -> Date { Date(timeIntervalSince1970: try row.double(column)) }
    static func optional(_ value: String?) -> PostgresValue { value.map { .text($0) } ?? .nullText }
    static func optional(_ value: [UInt8]?) -> PostgresValue { value.map { .bytes($0) } ?? .nullBytes }
    static func optional(_ value: UInt32?) -> PostgresValue { value.map { .int(Int64($0)) } ?? .nullInt }
    static func optional(_ value: Int?) -> PostgresValue { value.map { .int(Int64($0)) } ?? .nullInt }
    static func optional(_ value: Date?) -> PostgresValue { value.map(seconds) ?? .null(.float8) }
}
