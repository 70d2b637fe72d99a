import Foundation
import PostgresStore
import Synchronization

/// A throwaway PostgreSQL 15 cluster in a temporary directory, run by `scripts/pg-test-cluster.sh`
/// (initdb + pg_ctl; as the `postgres` user when we are root). `shared` is started once per test
/// process and stopped at exit; tests that stop the server start a private one. When the server
/// cannot start, `shared.get()` throws and every test using it fails with the reason: no test
/// skips silently.
public final class PostgresCluster: Sendable {
    /// Tests/Support/PostgresCluster/PostgresCluster.swift → the package root.
    public static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()
    public static let script = packageRoot.appendingPathComponent("scripts/pg-test-cluster.sh").path
    public static let role = "attest"
    public static let password = "attest-test-password"

    public let directory: String
    public let port: Int

    /// Started on first use, stopped by an `atexit` handler.
    public static let shared: Result<PostgresCluster, ClusterError> = {
        do { return .success(try PostgresCluster.start()) } catch { return .failure(error as? ClusterError ?? ClusterError("\(error)")) }
    }()

    /// Starts a new cluster (initdb, start, role `attest` owning database `attest`).
    public static func start() throws(ClusterError) -> PostgresCluster {
        registerExitHandler()
        removeLeftovers()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attest-pg-\(UUID().uuidString.prefix(8))").path
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try "\(getpid())\n".write(toFile: directory + "/owner.pid", atomically: true, encoding: .utf8)
        } catch {
            throw ClusterError("cannot create \(directory): \(error)")
        }
        running.withLock { $0.append(directory) }
        let output = try run([script, "start", directory])
        guard let portText = try? String(contentsOfFile: directory + "/port", encoding: .utf8),
              let port = Int(portText.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw ClusterError("pg-test-cluster.sh start wrote no port: \(output)")
        }
        return PostgresCluster(directory: directory, port: port)
    }

    private init(directory: String, port: Int) {
        self.directory = directory
        self.port = port
    }

    /// A URL for `database` over TCP, as the `attest` role with its password.
    public func url(_ database: String = "attest", password: String? = PostgresCluster.password, port: Int? = nil) -> String {
        "postgresql://\(Self.role)\(password.map { ":\($0)" } ?? "")@127.0.0.1:\(port ?? self.port)/\(database)"
    }

    /// key=value form over the Unix socket in the cluster's directory (trust authentication).
    public func socket(_ database: String = "attest", user: String = PostgresCluster.role) -> String {
        "host=\(directory) port=\(port) user=\(user) dbname=\(database)"
    }

    private static let databaseCounter = Atomic<Int>(0)

    /// A new, empty database owned by the non-superuser role `attest`.
    public func createDatabase() throws -> String {
        let name = "t\(getpid())_\(Self.databaseCounter.add(1, ordering: .relaxed).newValue)"
        try superuser { try $0.execute("CREATE DATABASE \(name) OWNER \(Self.role)") }
        return name
    }

    /// Runs `body` on a superuser connection to the `postgres` database (the socket, trust), with
    /// the service's short statement and lock timeouts lifted: CREATE DATABASE copies and fsyncs a
    /// template, which on a loaded machine outlasts the 1.5 s the service allows a statement.
    public func superuser<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        let generous = PostgresConfiguration(callTimeout: 30, statementTimeoutMilliseconds: 30_000, lockTimeoutMilliseconds: 30_000)
        let connection = try PostgresConnection(PostgresConnectionString(socket("postgres", user: "postgres")), configuration: generous,
                                                deadline: .after(seconds: 30))
        defer { connection.close() }
        return try body(connection)
    }

    /// Takes `LOCK TABLE table IN ACCESS EXCLUSIVE MODE` in `database` and holds it until the
    /// returned closure is called: a stall that every query on the table waits behind.
    public func lockTable(_ table: String, in database: String) throws -> () -> Void {
        try holdLocks("LOCK TABLE \(table) IN ACCESS EXCLUSIVE MODE", in: database)
    }

    /// Runs `statement` (a `SELECT … FOR UPDATE`, a `LOCK TABLE`) in a transaction of its own in
    /// `database` and keeps it open, with the locks it took, until the returned closure is called.
    public func holdLocks(_ statement: String, in database: String) throws -> () -> Void {
        let generous = PostgresConfiguration(callTimeout: 30, statementTimeoutMilliseconds: 30_000, lockTimeoutMilliseconds: 30_000)
        let connection = try PostgresConnection(PostgresConnectionString(socket(database, user: "postgres")), configuration: generous,
                                                deadline: .after(seconds: 30))
        do {
            try connection.execute("BEGIN")
            try connection.execute(statement)
        } catch {
            connection.close()
            throw error
        }
        return {
            try? connection.execute("COMMIT")
            connection.close()
        }
    }

    /// How many sessions in `database` wait for a lock now.
    public func sessionsWaitingForALock(in database: String) throws -> Int {
        try superuser { connection in
            try connection.query("SELECT count(*) AS waiting FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
                                 [.text(database)]).first { try $0.int("waiting") }.map(Int.init) ?? 0
        }
    }

    /// Stops the server and keeps its data: a database outage.
    public func halt() throws { _ = try Self.run([Self.script, "halt", directory]) }
    /// Starts it again after `halt`.
    public func resume() throws { _ = try Self.run([Self.script, "start", directory]) }

    /// Stops the server and deletes the directory.
    public func stop() {
        _ = try? Self.run([Self.script, "stop", directory])
        Self.running.withLock { $0.removeAll { $0 == directory } }
    }

    // MARK: Process plumbing

    private static let running = Mutex<[String]>([])
    private static let exitHandler = Mutex(false)

    /// At exit, stop every cluster this process started (the shared one included).
    private static func registerExitHandler() {
        guard exitHandler.withLock({ registered in defer { registered = true }; return !registered }) else { return }
        atexit {
            for directory in PostgresCluster.running.withLock({ $0 }) {
                _ = try? PostgresCluster.run([PostgresCluster.script, "stop", directory])
            }
        }
    }

    /// Clusters left by test processes that died before their exit handler ran (`kill -9`).
    private static func removeLeftovers() {
        let temp = FileManager.default.temporaryDirectory.path
        for name in (try? FileManager.default.contentsOfDirectory(atPath: temp)) ?? [] where name.hasPrefix("attest-pg-") {
            let directory = temp + "/" + name
            guard let text = try? String(contentsOfFile: directory + "/owner.pid", encoding: .utf8),
                  let pid = pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines)) else { continue }
            if kill(pid, 0) != 0 && errno == ESRCH { _ = try? run([script, "stop", directory]) }
        }
    }

    /// Runs a command (killed after 120 s) and returns its output; throws with the output on failure.
    /// posix_spawn and waitpid rather than Foundation's Process: pg_ctl leaves a daemon behind,
    /// and Process has been seen never to report such a child's exit here.
    @discardableResult
    public static func run(_ arguments: [String]) throws(ClusterError) -> String {
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("pg-cluster-\(UUID().uuidString).log").path
        defer { unlink(output) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        // pg_ctl leaves the server running for the whole test process: without this it inherits
        // every descriptor open at that instant (Foundation's Pipe is not close-on-exec; Process
        // closes them in its own children, a bare posix_spawn does not), and a test reading
        // another tool's output to its end of file waited forever (seen: openssl's pipe).
        // (glibc 2.34's posix_spawn_file_actions_addclosefrom_np, which Swift's Glibc does not import.)
        typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np"),
              unsafeBitCast(symbol, to: AddCloseFrom.self)(&actions, 3) == 0
        else { throw ClusterError("posix_spawn_file_actions_addclosefrom_np is missing (glibc 2.34 or later is needed)") }
        let argv = (["/usr/bin/env"] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, "/usr/bin/env", &actions, nil, argv, environ)
        guard spawned == 0 else { throw ClusterError("\(arguments.joined(separator: " ")): posix_spawn failed with \(spawned)") }
        var status: Int32 = 0
        let deadline = Date() + 120
        var finished = false
        while Date() < deadline {
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid { finished = true; break }
            if reaped < 0 && errno != EINTR { break }
            usleep(10_000)
        }
        if !finished {
            kill(pid, SIGKILL)
            _ = waitpid(pid, &status, 0)
        }
        let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        // WIFEXITED and WEXITSTATUS are macros: exited normally is (status & 0x7f) == 0.
        guard finished, status & 0x7f == 0, (status >> 8) & 0xff == 0 else {
            throw ClusterError("\(arguments.joined(separator: " ")) failed (\(finished ? "status \(status)" : "killed after 120 s")): \(text)")
        }
        return text
    }
}

public struct ClusterError: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ description: String) { self.description = "PostgreSQL test cluster: " + description }
}
