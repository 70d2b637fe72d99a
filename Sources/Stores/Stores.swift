import EventLoops
import Foundation
import PostgresStore
import SQLiteStore
import TokenService

/// Opens the store a `--db` value names: a `postgresql://` or `postgres://` URL (or a libpq
/// key=value string) is PostgreSQL, anything else a SQLite file.
public enum Stores {
    public static func isPostgres(_ database: String) -> Bool { PostgresConnectionString.isPostgres(database) }

    /// The value with any password removed, for logs and errors.
    public static func redacted(_ database: String) -> String {
        isPostgres(database) ? PostgresConnectionString(database).redactedDescription : database
    }

    /// - Parameters:
    ///   - connections: PostgreSQL pool size (one per worker thread); SQLite reader connections.
    ///   - synchronous: SQLite's `synchronous` pragma (PostgreSQL commits durably either way).
    /// - Parameter busyTimeoutMilliseconds: how long SQLite waits for a lock held elsewhere (the
    ///   service: 1 s, then 503; the operator's tool longer).
    /// - Parameter warm: open a PostgreSQL pool's connections now (a server, before it listens).
    public static func open(_ database: String, connections: Int = 4, synchronous: String = "FULL",
                            mode: MigrationMode = .apply, busyTimeoutMilliseconds: Int32 = 1000, warm: Bool = false) throws -> any Database {
        if isPostgres(database) {
            let store = try PostgresTokenStore(connectionString: PostgresConnectionString(database),
                                               configuration: PostgresConfiguration(poolSize: max(1, connections)), mode: mode)
            if warm { store.warm() }
            return store
        }
        return try SQLiteTokenStore(path: database, readers: max(1, connections), synchronous: synchronous, mode: mode,
                                    busyTimeoutMilliseconds: busyTimeoutMilliseconds)
    }

    /// The token check that never blocks an event loop, for a store whose reads cross the
    /// network (a connection per loop); nil for SQLite, whose reads stay on the loop anyway.
    public static func nonBlockingTokenChecks(_ store: any Database, loops: EventLoopGroup,
                                              now: @escaping @Sendable () -> Date) -> (any NonBlockingTokenChecks)? {
        guard let postgres = store as? PostgresTokenStore else { return nil }
        return PostgresLoopTokenChecks(store: postgres, loops: loops, now: now)
    }
}
