import Dispatch
import Synchronization

/// A fixed number of connections, one per worker thread, opened on demand. A connection that
/// broke (`PQstatus` not OK, left inside a transaction, or readable while idle: the server shut it
/// down) is closed and replaced by a new one on the next call. Every call has one deadline
/// (`callTimeout`) covering the wait for a free connection, connecting and running.
public final class PostgresPool: Sendable {
    public let connectionString: PostgresConnectionString
    public let configuration: PostgresConfiguration
    public let counters = PostgresCounters()
    private let idle = Mutex<[PostgresConnection]>([])
    /// One permit per connection the pool may have open.
    private let permits: DispatchSemaphore

    public init(_ connectionString: PostgresConnectionString, configuration: PostgresConfiguration = .init()) {
        self.connectionString = connectionString
        self.configuration = configuration
        permits = DispatchSemaphore(value: max(1, configuration.poolSize))
    }

    /// The redacted connection string, for logs.
    public var target: String { connectionString.redactedDescription }

    /// Lends `body` a healthy connection for the length of one call, bounded by `timeout`
    /// seconds (default: the configuration's `callTimeout`).
    public func withConnection<T>(timeout: Double? = nil, _ body: (PostgresConnection) throws -> T) throws -> T {
        let deadline = PostgresDeadline.after(seconds: timeout ?? configuration.callTimeout)
        guard permits.wait(timeout: deadline.time) == .success else {
            throw PostgresError(.poolExhausted, message: "all \(configuration.poolSize) connections stayed busy until the call's deadline",
                                target: target)
        }
        defer { permits.signal() }
        var connection: PostgresConnection
        if let pooled = idle.withLock({ $0.popLast() }), pooled.isReusable {
            connection = pooled
            connection.deadline = deadline
        } else {
            connection = try PostgresConnection(connectionString, configuration: configuration, deadline: deadline, counters: counters)
        }
        do {
            let result = try body(connection)
            release(connection)
            return result
        } catch let error as PostgresError {
            release(connection)
            // A lost or silent server took the idle sessions with it: drop them now rather than
            // let each later call discover that on its own.
            if error.kind == .connectionLost || error.kind == .timeout { closeIdleConnections() }
            throw error
        } catch {
            release(connection)
            throw error
        }
    }

    private func release(_ connection: PostgresConnection) {
        if connection.isReusable {
            idle.withLock { $0.append(connection) }
        } else {
            connection.close()
        }
    }

    /// Opens connections up to the pool's size before any call needs them, each within `timeout`
    /// (a server's start, before it listens): the first requests then do not pay for connecting,
    /// which on a loaded machine alone can outlast their 2-s call deadline. Failures are left to
    /// the calls, which open connections on demand as always.
    public func warm(timeout: Double) {
        let missing = max(0, configuration.poolSize - idle.withLock { $0.count })
        var opened: [PostgresConnection] = []
        for _ in 0..<missing {
            guard let connection = try? PostgresConnection(connectionString, configuration: configuration,
                                                           deadline: .after(seconds: timeout), counters: counters) else { break }
            opened.append(connection)
        }
        idle.withLock { $0 += opened }
    }

    /// Closes every connection not in use (they reopen on demand).
    public func closeIdleConnections() {
        let closing = idle.withLock { connections -> [PostgresConnection] in
            defer { connections.removeAll() }
            return connections
        }
        closing.forEach { $0.close() }
    }
}
