import Dispatch
import Foundation
import PostgresStore
import PostgresTestSupport
import Synchronization
import Testing
import TokenService

/// What only the PostgreSQL store has: libpq connection strings, secrets in errors, migrations
/// from several instances at once, round trips, deadlines, outages and recovery.
@Suite(.timeLimit(.minutes(3)))
struct PostgresStoreTests {
    typealias F = StoreFixture

    func cluster() throws -> PostgresCluster { try PostgresCluster.shared.get() }

    // MARK: Connection strings

    @Test func redactedDescriptionHidesPasswordsInEveryForm() {
        let cases: [(String, String)] = [
            ("postgresql://attest:s3cret@db.example.com:5432/attest?sslmode=require",
             "postgresql://attest:***@db.example.com:5432/attest?sslmode=require"),
            ("postgres://attest:p%40ss%2Fw0rd@[::1]/attest", "postgres://attest:***@[::1]/attest"),
            ("postgresql://attest:pa/ss@word@host/db", "postgresql://attest:***@host/db"),
            ("postgresql://attest@host/db?password=s3cret&sslmode=verify-full&sslpassword=k3y",
             "postgresql://attest@host/db?password=***&sslmode=verify-full&sslpassword=***"),
            ("postgresql:///attest?host=/run/postgresql", "postgresql:///attest?host=/run/postgresql"),
            ("host=db user=attest password=s3cret dbname=attest", "host=db user=attest password=*** dbname=attest"),
            ("host=db password = 'it\\'s a secret' sslmode=require", "host=db password = *** sslmode=require"),
            ("password='unterminated secret", "password=*** …"),
            ("/var/lib/attestd/attestd.sqlite", "/var/lib/attestd/attestd.sqlite"),
        ]
        for (raw, redacted) in cases {
            let connectionString = PostgresConnectionString(raw)
            #expect(connectionString.redactedDescription == redacted)
            #expect("\(connectionString)" == redacted)
        }
    }

    @Test func postgresStringsAreToldFromPaths() {
        for value in ["postgresql://h/db", "postgres://u:p@h/db", "host=/tmp dbname=x", "dbname=attest"] {
            #expect(PostgresConnectionString.isPostgres(value), "\(value)")
        }
        for value in ["attestd.sqlite", "./a=b.sqlite", "/var/lib/x=y/attestd.sqlite", "", "not a conninfo = ="] {
            #expect(!PostgresConnectionString.isPostgres(value), "\(value)")
        }
    }

    /// A password in the URL must not reach an error, whatever fails: nothing listening, a
    /// malformed URL that libpq quotes back, a wrong password.
    @Test func thePasswordNeverAppearsInAnError() throws {
        let cluster = try cluster()
        let secret = "Sup3rSecretPassw0rd"
        let closed = try closedPort()
        let attempts: [(String, PostgresError.Kind?)] = [
            ("postgresql://attest:\(secret)@127.0.0.1:\(closed)/attest", .connect),
            ("host=127.0.0.1 port=\(closed) user=attest password=\(secret) dbname=attest", .connect),
            ("postgresql://attest:\(secret)@127.0.0.1:\(cluster.port)/attest?connect_timeout=x%zz\(secret)", nil),
            ("postgresql://attest:\(secret)%zz@127.0.0.1:\(cluster.port)/attest", nil),
            ("postgresql://attest:\(secret)@127.0.0.1:\(cluster.port)/attest", .connect),   // wrong password
        ]
        for (url, kind) in attempts {
            let started = Date()
            var caught: (any Error)?
            do { _ = try PostgresTokenStore(connectionString: PostgresConnectionString(url)) } catch { caught = error }
            let error = try #require(caught, "\(PostgresConnectionString(url)) connected")
            #expect(Date().timeIntervalSince(started) < 2.5)
            let text = "\(error) \(String(reflecting: error)) \(error.localizedDescription)"
            #expect(!text.contains(secret), "password in: \(text)")
            #expect(!text.contains("Sup3r"), "part of the password in: \(text)")
            #expect(text.contains("***"), "no redacted target in: \(text)")
            if let kind { #expect((error as? PostgresError)?.kind == kind, "\(text)") }
        }
    }

    /// libpq reads the string itself: `passfile` (.pgpass), PGPASSWORD and `sslmode` all work.
    @Test func libpqReadsPasswordFilesTheEnvironmentAndSSLMode() throws {
        let cluster = try cluster()
        let database = try cluster.createDatabase()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pgpass-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let passfile = directory.appendingPathComponent("pgpass").path
        try "127.0.0.1:\(cluster.port):\(database):attest:\(PostgresCluster.password)\n".write(toFile: passfile, atomically: true, encoding: .utf8)
        chmod(passfile, 0o600)
        let viaPassfile = try PostgresTokenStore(connectionString: PostgresConnectionString(cluster.url(database, password: nil) + "?passfile=\(passfile)"))
        #expect(try viaPassfile.workspace(named: "default") != nil)

        // Without any password: refused (the cluster asks for one over TCP).
        #expect(throws: PostgresError.self) {
            _ = try PostgresTokenStore(connectionString: PostgresConnectionString(cluster.url(database, password: nil) + "?passfile=/nonexistent"))
        }

        setenv("PGPASSWORD", PostgresCluster.password, 1)
        defer { unsetenv("PGPASSWORD") }
        let viaEnvironment = try PostgresTokenStore(connectionString: PostgresConnectionString(cluster.url(database, password: nil) + "?passfile=/nonexistent&sslmode=disable"))
        #expect(try viaEnvironment.workspace(named: "default") != nil)

        // The test server has no TLS: sslmode=require must be honoured, and so refused.
        let error = #expect(throws: PostgresError.self) {
            _ = try PostgresTokenStore(connectionString: PostgresConnectionString(cluster.url(database) + "?sslmode=require"))
        }
        #expect(error?.message.contains("SSL") == true)
        #expect(error?.description.contains(PostgresCluster.password) == false)

        // key=value over the Unix socket works as well.
        #expect(try PostgresTokenStore(connectionString: PostgresConnectionString(cluster.socket(database))).workspace(named: "default") != nil)
    }

    // MARK: Errors

    @Test func serverErrorsCarryTheirSQLState() throws {
        let f = try StoreFixture(.postgres)
        _ = try f.store.createWorkspace(name: "twice", at: F.t0)
        let duplicate = #expect(throws: PostgresError.self) { _ = try f.store.createWorkspace(name: "twice", at: F.t0) }
        #expect(duplicate?.sqlState == "23505" && duplicate?.isUniqueViolation == true && duplicate?.isUnavailable == false)
        // Text is sent with its length: a NUL byte is refused, never cut to a prefix that matches.
        let nul = #expect(throws: PostgresError.self) { _ = try f.store.workspace(named: "default\u{0}suffix") }
        #expect(nul?.sqlState == "22021")
        #expect(try f.store.workspace(named: "default") != nil)
    }

    @Test func aSlowStatementIsCancelledByTheServerAndTheConnectionStaysUsable() throws {
        let cluster = try cluster()
        let pool = PostgresPool(PostgresConnectionString(cluster.url()), configuration: PostgresConfiguration(poolSize: 1))
        let started = Date()
        let error = #expect(throws: PostgresError.self) { try pool.withConnection { try $0.query("SELECT pg_sleep(10)") } }
        #expect(error?.sqlState == "57014" && error?.isUnavailable == true)
        #expect(Date().timeIntervalSince(started) < 2)
        let connects = pool.counters.connects
        #expect(try pool.withConnection { try $0.query("SELECT 1::int8").first { try $0.int(0) } } == 1)
        #expect(pool.counters.connects == connects)   // the same session, still healthy
    }

    @Test func aBusyPoolFailsACallAtItsDeadline() throws {
        let cluster = try cluster()
        let pool = PostgresPool(PostgresConnectionString(cluster.url()), configuration: PostgresConfiguration(poolSize: 1, callTimeout: 0.5))
        let holding = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let holder = Thread {
            _ = try? pool.withConnection(timeout: 10) { _ in
                holding.signal()
                release.wait()
            }
        }
        holder.start()
        #expect(holding.wait(timeout: .now() + 10) == .success)
        let started = Date()
        let error = #expect(throws: PostgresError.self) { try pool.withConnection { try $0.query("SELECT 1") } }
        #expect(error?.kind == .poolExhausted)
        #expect(Date().timeIntervalSince(started) < 1.5)
        release.signal()
    }

    @Test func aConnectionTheServerEndedIsReplaced() throws {
        let f = try StoreFixture(.postgres, poolSize: 1)
        let store = try #require(f.store as? PostgresTokenStore)
        let pid = try store.pool.withConnection { try $0.query("SELECT pg_backend_pid()::int8").first { try $0.int(0) } }
        try cluster().superuser { db in
            _ = try db.query("SELECT pg_terminate_backend($1::int4)", [.int(try #require(pid))])
            // Until the backend has exited (its FATAL message and EOF are then on our socket).
            for _ in 0..<100 {
                guard try db.query("SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int4", [.int(try #require(pid))]).first({ try $0.int(0) }) == 1
                else { break }
                usleep(50_000)
            }
        }
        // The idle session is readable (its FATAL message, then EOF): the next call opens a new one.
        #expect(try store.workspace(named: "default") != nil)
        let newPID = try store.pool.withConnection { try $0.query("SELECT pg_backend_pid()::int8").first { try $0.int(0) } }
        #expect(newPID != pid)
        #expect(store.pool.counters.connects == 2)
    }

    // MARK: Migrations

    @Test func embeddedMigrationsMatchTheFilesInMigrationsPostgres() throws {
        let folder = PostgresCluster.packageRoot.appendingPathComponent("Migrations/postgres")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".sql") }.sorted()
        #expect(files == Migration.postgres.map(\.name), "run scripts/embed-migrations.sh")
        for migration in Migration.postgres {
            let text = try String(contentsOf: folder.appendingPathComponent(migration.name), encoding: .utf8)
            #expect(Migration(name: migration.name, sql: text).checksum == migration.checksum, "run scripts/embed-migrations.sh")
        }
    }

    /// Four instances start at once on an empty database: each migration is applied once. A
    /// slow extra migration widens the window: without the lock, two would create its table.
    @Test func concurrentMigratorsApplyEachMigrationOnce() throws {
        let cluster = try cluster()
        let database = try cluster.createDatabase()
        let url = PostgresConnectionString(cluster.url(database))
        let migrations = Migration.postgres + [Migration(name: "9999_probe.sql", sql: """
            CREATE TABLE probe (applied_by integer NOT NULL DEFAULT pg_backend_pid());
            INSERT INTO probe DEFAULT VALUES;
            SELECT pg_sleep(0.3);
            """)]
        let results = try concurrently(4) { _ in _ = try PostgresTokenStore(connectionString: url, migrations: migrations) }
        for result in results { try result.get() }
        let store = try PostgresTokenStore(connectionString: url, migrations: migrations, mode: .verify)
        let counts = try store.pool.withConnection { db in
            try db.query("SELECT (SELECT count(*) FROM probe), (SELECT count(*) FROM schema_migrations), (SELECT count(*) FROM workspaces)")
                .first { [try $0.int(0), try $0.int(1), try $0.int(2)] }
        }
        #expect(counts == [1, Int64(migrations.count), 1])
    }

    @Test func verifyModeRefusesAnUnmigratedDatabase() throws {
        let cluster = try cluster()
        let url = PostgresConnectionString(cluster.url(try cluster.createDatabase()))
        let error = #expect(throws: PostgresMigrationError.self) { _ = try PostgresTokenStore(connectionString: url, mode: .verify) }
        #expect(error?.description.contains("attestctl migrate") == true)
        _ = try PostgresTokenStore(connectionString: url, migrations: Array(Migration.postgres.prefix(0)))
        let lacking = #expect(throws: PostgresMigrationError.self) { _ = try PostgresTokenStore(connectionString: url, mode: .verify) }
        #expect(lacking?.description.contains("lacks") == true)
    }

    // MARK: Round trips

    /// Each exchange is one statement: one round trip, one transaction.
    @Test func everyExchangeIsOneRoundTrip() throws {
        let f = try StoreFixture(.postgres, poolSize: 1)
        let store = try #require(f.store as? PostgresTokenStore)
        let app = try f.integration()
        let device = F.device(app)
        func trips(_ body: () throws -> Void) rethrows -> Int {
            let before = store.roundTrips
            try body()
            return store.roundTrips - before
        }
        var challenge = IssuedChallenge(bytes: [], expiresAt: F.t0)
        var trip = try trips { challenge = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: device.keyID, fresh: F.challenge(), at: F.t0) }
        #expect(trip == 1)
        trip = try trips { _ = try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: F.t0) }
        #expect(trip == 1)
        let next = F.challenge()
        var outcome = CommitResult.conflict
        trip = try trips {
            outcome = try store.registerDevice(device, receipt: [1], firstToken: F.token(app, keyID: device.keyID), redeeming: challenge.bytes,
                                               nextChallenge: next, at: F.t0)
        }
        #expect(trip == 1 && outcome == .committed)
        trip = try trips { _ = try store.device(clientID: app.clientID, keyID: device.keyID) }
        #expect(trip == 1)
        let token = F.token(app, keyID: device.keyID)
        trip = try trips {
            outcome = try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 1, token: token, redeeming: next.bytes,
                                               nextChallenge: F.challenge(), at: F.t0)
        }
        #expect(trip == 1 && outcome == .committed)
        var grant: TokenGrant?
        trip = try trips { grant = try store.liveToken(hash: token.tokenHash, at: F.t0) }
        #expect(trip == 1 && grant != nil)
        trip = try trips { _ = try store.consumeChallenge(clientID: app.clientID, keyID: device.keyID, at: F.t0) }
        #expect(trip == 1)
        trip = try trips { try store.appendAudit([AuditEvent(at: F.t0, action: "a"), AuditEvent(at: F.t0, action: "b")]) }
        #expect(trip == 1)
        var revoked = false
        trip = try trips { revoked = try store.revokeIntegration(clientID: app.clientID, at: F.t0) }
        #expect(trip == 1 && revoked)
        trip = try trips { _ = try f.integration() }
        #expect(trip == 2)   // the default workspace, then the insert
    }

    /// The token table has no foreign keys (each one locked the integration's and workspace's
    /// rows in every exchange: migration 0012); the exchange's statement and two triggers keep
    /// what they guaranteed. A token for another integration or for a workspace the integration
    /// is not in writes nothing at all, and integrations and workspaces cannot be deleted.
    @Test func tokensKeepTheirIntegrationAndWorkspaceWithoutForeignKeys() throws {
        let f = try StoreFixture(.postgres)
        try f.execute("""
            DO $$ BEGIN
                IF EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'tokens'::regclass AND contype = 'f') THEN
                    RAISE EXCEPTION 'tokens has a foreign key';
                END IF;
            END $$
            """)
        let app = try f.integration()
        let other = try f.integration("Other", workspace: try f.store.createWorkspace(name: "elsewhere", at: F.t0))
        #expect(other.workspaceID != app.workspaceID)
        // Each wrong token on a device of its own: a refused exchange uses up its challenge, as a lost counter race does.
        for (clientID, workspaceID) in [(app.clientID, other.workspaceID), (other.clientID, other.workspaceID), (app.clientID, 1_000_000)] {
            let (device, _, challenge) = try f.registered(app)
            let wrong = TokenRecord(tokenHash: F.bytes(), clientID: clientID, workspaceID: workspaceID, keyID: device.keyID,
                                    issuedAt: F.t0 + 1, expiresAt: F.t0 + 3600)
            let outcome = try f.store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 1, token: wrong,
                                                     redeeming: challenge.bytes, nextChallenge: F.challenge(), at: F.t0 + 1)
            #expect(outcome == .conflict)
            #expect(try f.store.liveToken(hash: wrong.tokenHash, at: F.t0 + 2) == nil)
            #expect(try f.store.device(clientID: app.clientID, keyID: device.keyID)?.counter == 0)
            #expect(try f.store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: F.t0 + 1) == nil)
        }
        let stranger = F.device(app)
        let outcome = try f.store.registerDevice(stranger, receipt: [1], firstToken: TokenRecord(
            tokenHash: F.bytes(), clientID: app.clientID, workspaceID: other.workspaceID, keyID: stranger.keyID, issuedAt: F.t0, expiresAt: F.t0 + 3600),
            redeeming: nil, nextChallenge: F.challenge(), at: F.t0)
        #expect(outcome == .conflict)
        #expect(try f.store.device(clientID: app.clientID, keyID: stranger.keyID) == nil)

        for statement in ["DELETE FROM integrations WHERE client_id = '\(other.clientID)'", "DELETE FROM workspaces WHERE name = 'elsewhere'",
                          "TRUNCATE integrations CASCADE", "TRUNCATE workspaces CASCADE"] {
            let refused = #expect(throws: PostgresError.self, "\(statement)") { try f.execute(statement) }
            #expect(refused?.sqlState == "23001", "\(statement): \(String(describing: refused))")
        }
        #expect(try f.store.integration(clientID: other.clientID) != nil)
    }

    // MARK: Outages

    /// The database stops: calls fail within 2 s with an "unavailable" error; it starts again:
    /// the very next call succeeds, on a new connection, without restarting anything.
    @Test func aStoppedDatabaseFailsCallsFastAndThePoolRecovers() throws {
        let cluster = try PostgresCluster.start()
        defer { cluster.stop() }
        let store = try PostgresTokenStore(connectionString: PostgresConnectionString(cluster.url()), configuration: PostgresConfiguration(poolSize: 4))
        _ = try concurrently(4) { _ in try store.workspace(named: "default") }   // four sessions in the pool

        try cluster.halt()
        for _ in 0..<6 {
            let started = Date()
            let error = #expect(throws: PostgresError.self) { _ = try store.workspace(named: "default") }
            #expect(Date().timeIntervalSince(started) < 2)
            #expect(error?.isUnavailable == true, "\(String(describing: error))")
        }
        try cluster.resume()
        #expect(try store.workspace(named: "default") != nil)
        let written = try store.createWorkspace(name: "after-the-outage", at: StoreFixture.t0)
        #expect(try store.workspace(named: "after-the-outage") == written)
    }

    /// A server that stops answering (every process frozen, the socket still open): no error
    /// comes from the network, so only the call's own deadline ends the wait.
    @Test func aHungDatabaseFailsCallsAtTheDeadlineAndThePoolRecovers() throws {
        let cluster = try PostgresCluster.start()
        defer {
            _ = signalServer(cluster, SIGCONT)
            cluster.stop()
        }
        // A 1.5 s call deadline, to show that the deadline (not some other timer) ends the wait.
        let store = try PostgresTokenStore(connectionString: PostgresConnectionString(cluster.url()),
                                           configuration: PostgresConfiguration(poolSize: 2, callTimeout: 1.5))
        #expect(try store.workspace(named: "default") != nil)

        try #require(signalServer(cluster, SIGSTOP))
        for _ in 0..<2 {   // the first on the pooled session, the second on a new connection
            let started = Date()
            let error = #expect(throws: PostgresError.self) { _ = try store.workspace(named: "default") }
            let elapsed = Date().timeIntervalSince(started)
            #expect(elapsed < 2 && elapsed > 1.4, "\(elapsed) s")
            #expect(error?.kind == .timeout, "\(String(describing: error))")
        }
        try #require(signalServer(cluster, SIGCONT))
        #expect(try store.workspace(named: "default") != nil)
    }

    // MARK: Helpers

    /// A loopback port nothing listens on.
    func closedPort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        try #require(bound == 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return Int(UInt16(bigEndian: address.sin_port))   // bound but not listening: connections are refused
    }
}

/// Sends `signal` to the cluster's postmaster and all its children (processes this test started).
func signalServer(_ cluster: PostgresCluster, _ signal: Int32) -> Bool {
    guard let text = try? String(contentsOfFile: cluster.directory + "/data/postmaster.pid", encoding: .utf8),
          let line = text.split(separator: "\n").first, let postmaster = pid_t(line) else { return false }
    var pids = [postmaster]
    for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
        guard let pid = pid_t(entry), let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { continue }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        if fields.count > 1, pid_t(fields[1]) == postmaster { pids.append(pid) }
    }
    for pid in pids { kill(pid, signal) }
    return true
}
