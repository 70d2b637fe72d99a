import AttestWire
import AttestCrypto
import Foundation
import Synchronization
import SQLiteStore
import Testing
import TokenService

/// The real binaries, as an operator runs them: crash safety, secrets at rest and in logs,
/// and revocation by attestctl reaching a running server.
@Suite(.serialized) struct DurabilityTests {
    func makeDatabase() throws -> (directory: URL, db: String, clientID: String) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-proc-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let db = directory.appendingPathComponent("attestd.sqlite").path
        #expect(try ServerProcess.attestctl(["init", "--db", db, "--owner", "owner@example.com"]).0 == 0)
        let (status, output) = try ServerProcess.attestctl(["integrations", "create", "--db", db, "--actor", "owner@example.com", "--name", "App",
                                                            "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
        #expect(status == 0)
        let json = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any]
        return (directory, db, try #require(json?["client_id"] as? String))
    }

    @Test func killDashNineLosesNoAcknowledgedTokenAndNoSecretReachesDiskOrLogs() async throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        var server: ServerProcess? = try ServerProcess(db: db, extraArguments: ["--mint-limit", "0"])
        let http = TestHTTP(baseURL: server!.baseURL)

        let devices = try (0..<4).map { _ in try ManualDevice(clientID: clientID) }
        var secrets: [String] = devices.map(\.keyIDBase64)
        for device in devices {
            let registered = try await http.registerFresh(device)
            #expect(registered.status == 200)
        }

        // A burst of refreshes from all devices; kill -9 the server in the middle of it.
        let collector = TokenCollector()
        let burst = Task {
            await withTaskGroup(of: Void.self) { group in
                for device in devices {
                    group.addTask {
                        while !collector.stopped {
                            do {
                                let challenge = try await http.challengeBytes(device)
                                collector.add(secret: Data(challenge).base64EncodedString())
                                let result = try await http.token(device, assertion: try device.assertion(challenge: challenge))
                                if result.status == 200, let token = result.json["access_token"] as? String {
                                    collector.add(token: token, device: device.keyIDBase64)
                                }
                            } catch { return }  // the server is gone
                        }
                    }
                }
            }
        }
        let deadline = Date() + 60
        while collector.tokens.count < 40 && Date() < deadline { try await Task.sleep(nanoseconds: 10_000_000) }
        server!.kill9()
        let log = server!.log
        server = nil
        // Stop by flag, not Task.cancel(): cancelling a task group while its children finish has
        // deadlocked the Swift 6.3 concurrency runtime here (seen in a gdb backtrace).
        collector.stop()
        await burst.value
        let acknowledged = collector.tokens
        #expect(acknowledged.count >= 40)

        // Restart on the same file: every token a client received is in the database, and each
        // device's newest acknowledged token still authenticates (older ones were revoked by the
        // mints that followed them: a device keeps two live tokens).
        let stored = Set(try Self.storedTokenHashes(db))
        for token in acknowledged {
            #expect(stored.contains(hexString(sha256(Array(token.utf8)))), "token lost by the crash")
        }
        let restarted = try ServerProcess(db: db)
        let after = TestHTTP(baseURL: restarted.baseURL)
        for token in collector.newestByDevice.values {
            let status = try await after.messages(token: token).status
            #expect(status == 503, "newest token of a device does not authenticate after the crash")
        }
        #expect(try SQLiteTokenStore(path: db).integrityCheck() == "ok")

        // No issued token anywhere in the database files, byte by byte.
        restarted.stop()
        var files = Data()
        for suffix in ["", "-wal", "-shm"] { files.append((try? Data(contentsOf: URL(fileURLWithPath: db + suffix))) ?? Data()) }
        #expect(files.count > 0)
        for token in acknowledged {
            #expect(files.range(of: Data(token.utf8)) == nil, "a token is stored in clear")
            #expect(files.range(of: Data(token.dropFirst(4).utf8)) == nil)
        }
        // Nor in the logs: no token, key ID or challenge.
        secrets += collector.secrets
        let logs = log + restarted.log
        #expect(logs.contains(#""event":"request""#))
        for secret in acknowledged + secrets { #expect(!logs.contains(secret), "a secret reached the logs") }
    }

    @Test func aLockedDatabaseAnswers503WithinTwoSecondsAndRecovers() async throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(db: db)
        let http = TestHTTP(baseURL: server.baseURL)
        let device = try ManualDevice(clientID: clientID)
        #expect(try await http.registerFresh(device).status == 200)
        // Another process holds the write lock (an operator's sqlite3 shell in a transaction).
        let lock = try WriteLockHolder(db)
        let started = Date()
        let refused = try await http.challenge(device)
        #expect(refused.status == 503 && refused.error == "server_error")
        #expect(Date().timeIntervalSince(started) < 2, "the request waited \(Date().timeIntervalSince(started)) s")
        lock.release()
        #expect(try await http.challenge(device).status == 200)
    }

    @Test func auditEventsAreKeptAndRetriedWhileTheStoreRefusesThem() async throws {
        let (directory, db, _) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteTokenStore(path: db, readers: 1)
        let before = try store.auditEvents(limit: 10_000, clientID: nil).count
        let failures = Mutex(0)
        let audit = BufferedAuditLog(store: store, interval: 0.05, onError: { _ in failures.withLock { $0 += 1 } })
        audit.start()
        // Another process holds the write lock for a while: every flush in that time fails.
        let lock = try WriteLockHolder(db)
        for index in 0..<50 { audit.record(AuditEvent(at: Date(), action: "test.event", detail: "event \(index)")) }
        // Three flushes have failed (each waits out the busy timeout), and the events are all still here.
        let deadline = Date() + 30
        while failures.withLock({ $0 }) < 3, Date() < deadline { try await Task.sleep(for: .milliseconds(10)) }
        #expect(failures.withLock { $0 } >= 3)
        #expect(audit.pendingCount == 50, "events were dropped or written through the lock")
        lock.release()
        audit.close()
        #expect(audit.pendingCount == 0)
        #expect(try store.auditEvents(limit: 10_000, clientID: nil).count == before + 50)
    }

    /// A token check whose database read began before two flushes committed (a slow read) saw
    /// neither: the limit counts both batches, not only the last.
    @Test func aReadThatSpansTwoFlushesStillCountsBoth() throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteTokenStore(path: db, readers: 1)
        let ledger = UsageLedger(store: store, metrics: Metrics())
        let grant = TokenGrant(clientID: clientID, workspaceName: "default", issuedAt: Date(), expiresAt: Date() + 3600,
                               keyID: Array(repeating: 7, count: 32), policy: IntegrationPolicy(deviceRequestsPerMinute: 4))
        let now = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 / 60).rounded(.down) * 60 + 1)  // early in a minute
        let readBegan = ledger.commitCount  // the read's snapshot holds none of what follows
        for _ in 0..<2 {
            for _ in 0..<2 {
                guard case .success(let ticket) = ledger.admit(grant, PolicyInput(model: "claude-x"), commitsBeforeRead: ledger.commitCount, at: now) else {
                    Issue.record("refused under the limit"); return
                }
                ledger.finish(ticket, RelayOutcome(status: 200, usage: TokenUsage(inputTokens: 1, outputTokens: 1), incomplete: false))
            }
            #expect(ledger.flush(at: now))
        }
        guard case .failure(.deviceRateLimited) = ledger.admit(grant, PolicyInput(model: "claude-x"), commitsBeforeRead: readBegan, at: now) else {
            Issue.record("a fifth request in the minute was admitted: the first flushed batch was missed"); return
        }
    }

    /// Usage at the bound (2^40 of every kind, as an upstream claiming 2^63 is read) recorded again
    /// and again: the sums and the budget saturate instead of trapping, written and read back.
    @Test func extremeUsageSaturatesInTheLedgerAndTheStore() throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteTokenStore(path: db, readers: 1)
        let ledger = UsageLedger(store: store, metrics: Metrics())
        let grant = TokenGrant(clientID: clientID, workspaceName: "default", issuedAt: Date(), expiresAt: Date() + 3600,
                               keyID: Array(repeating: 7, count: 32), policy: IntegrationPolicy(monthlyTokenBudget: 1_000_000))
        let now = Date()
        let huge = TokenUsage(inputTokens: TokenUsage.maxCount, outputTokens: TokenUsage.maxCount, cacheCreationInputTokens: TokenUsage.maxCount,
                              cacheReadInputTokens: TokenUsage.maxCount, serverToolUse: ["web_search_requests": TokenUsage.maxCount])
        let readBegan = ledger.commitCount  // the grant was read before any of this was flushed
        guard case .success(let ticket) = ledger.admit(grant, PolicyInput(model: "claude-x"), commitsBeforeRead: readBegan, at: now) else {
            Issue.record("refused"); return
        }
        ledger.finish(ticket, RelayOutcome(status: 200, usage: huge, incomplete: false))
        #expect(ledger.flush(at: now))
        // Over budget now: refused, not trapped, however large the counts read back.
        guard case .failure(.monthlyBudgetSpent) = ledger.admit(grant, PolicyInput(model: "claude-x"), commitsBeforeRead: readBegan, at: now) else {
            Issue.record("admitted over the budget"); return
        }
        let rows = try store.usage(UsageFilter(clientID: clientID))
        #expect(rows.map(\.counters.inputTokens) == [TokenUsage.maxCount])
    }

    /// At shutdown a refused flush is retried for a while rather than lost: the store is locked
    /// when the ledger stops and unlocked once two attempts have failed, and the usage is still written.
    @Test func theLastFlushIsRetriedAtShutdown() async throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteTokenStore(path: db, readers: 1)
        let metrics = Metrics()
        let ledger = UsageLedger(store: store, metrics: metrics)
        let grant = TokenGrant(clientID: clientID, workspaceName: "default", issuedAt: Date(), expiresAt: Date() + 3600,
                               keyID: Array(repeating: 7, count: 32), policy: IntegrationPolicy())
        guard case .success(let ticket) = ledger.admit(grant, PolicyInput(model: "claude-x"), commitsBeforeRead: ledger.commitCount, at: Date()) else {
            Issue.record("refused"); return
        }
        ledger.finish(ticket, RelayOutcome(status: 200, usage: TokenUsage(inputTokens: 10, outputTokens: 5), incomplete: false))
        let lock = try WriteLockHolder(db)
        let stopped = Task.detached { ledger.stop(retryFor: 30) }
        // Released once the last flush has been refused twice: it is being retried.
        let deadline = Date() + 30
        // At least two: a busy machine may see the count only after a third attempt failed.
        func failures() -> Double {
            metrics.prometheusText().split(separator: "\n").first { $0.hasPrefix("attestd_usage_flush_failures_total ") }
                .flatMap { Double($0.split(separator: " ").last ?? "") } ?? 0
        }
        while failures() < 2, Date() < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        lock.release()
        #expect(await stopped.value, "the last flush was given up")
        #expect(try store.usage(UsageFilter(clientID: clientID)).map(\.counters.requests) == [1])
    }

    /// A flush the store refuses keeps its batch: the usage is written once the lock is gone, once
    /// (not twice), and the limits meanwhile still count it.
    @Test func usageIsKeptAndRetriedWhileTheStoreRefusesIt() async throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteTokenStore(path: db, readers: 1)
        let metrics = Metrics()
        let ledger = UsageLedger(store: store, metrics: metrics)
        let grant = TokenGrant(clientID: clientID, workspaceName: "default", issuedAt: Date(), expiresAt: Date() + 3600,
                               keyID: Array(repeating: 7, count: 32), policy: IntegrationPolicy(deviceRequestsPerMinute: 3))
        let now = Date()
        var tickets: [UsageTicket] = []
        for _ in 0..<3 {
            guard case .success(let ticket) = ledger.admit(grant, PolicyInput(model: "claude-x"), commitsBeforeRead: ledger.commitCount, at: now) else {
                Issue.record("refused under the limit"); return
            }
            tickets.append(ticket)
        }
        for ticket in tickets {
            ledger.finish(ticket, RelayOutcome(status: 200, usage: TokenUsage(inputTokens: 10, outputTokens: 5), incomplete: false))
        }
        let lock = try WriteLockHolder(db)
        #expect(ledger.flush() == false)
        #expect(metrics.prometheusText().contains("attestd_usage_flush_failures_total 1"))
        // Still counted by the limit while unwritten.
        guard case .failure(.deviceRateLimited) = ledger.admit(grant, PolicyInput(model: "claude-x"), commitsBeforeRead: ledger.commitCount, at: now) else {
            Issue.record("the unwritten requests were forgotten by the limit"); return
        }
        lock.release()
        #expect(ledger.flush())
        #expect(ledger.flush())   // nothing left: the batch is not written twice
        let rows = try store.usage(UsageFilter(clientID: clientID))
        // The refusal is kept under `refused` (the integration lists no models, so the name it
        // asked for is not minted), the requests under the model that was asked and answered.
        let served = rows.first { $0.key.model == "claude-x" }, refused = rows.first { $0.key.model == "refused" }
        #expect(rows.count == 2 && served?.counters.requests == 3 && refused?.counters.requests == 0)
        #expect(served?.counters.inputTokens == 30 && served?.counters.outputTokens == 15)
        #expect(refused?.counters.refusals == ["device_rate_limited": 1])
    }

    @Test func aDeletedDatabaseFileStopsWritesAndReadinessWhileLivenessStays() async throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(db: db)
        let http = TestHTTP(baseURL: server.baseURL)
        let admin = TestHTTP(baseURL: server.adminBaseURL)
        let device = try ManualDevice(clientID: clientID)
        #expect(try await http.registerFresh(device).status == 200)
        #expect(try await http.send("GET", "/readyz").status == 200)
        // Created 0600, and so are the -wal and -shm files: tokens' hashes are nobody else's business.
        for suffix in ["", "-wal", "-shm"] {
            let mode = (try FileManager.default.attributesOfItem(atPath: db + suffix)[.posixPermissions] as? NSNumber)?.intValue
            #expect(mode == 0o600, "\(db + suffix) has mode \(String(mode ?? 0, radix: 8))")
        }

        try FileManager.default.removeItem(atPath: db)
        // The file is checked about once a second: the public probe turns 503 then.
        var ready = try await http.send("GET", "/readyz")
        let deadline = Date() + 30
        while ready.status == 200, Date() < deadline {
            try await Task.sleep(for: .milliseconds(20))
            ready = try await http.send("GET", "/readyz")
        }
        // The internet learns only that this instance is unavailable; the path is for the operator.
        #expect(ready.status == 503)
        #expect(String(decoding: ready.body, as: UTF8.self) == #"{"status":"unavailable"}"#)
        let reason = try await admin.send("GET", "/readyz")
        #expect(reason.status == 503 && (reason.json["reason"] as? String)?.contains("deleted") == true)
        // Every exchange writes (a challenge, a token): all refused, nothing acknowledged into an unlinked file.
        let refused = try await http.challenge(device)
        #expect(refused.status == 503 && refused.error == "server_error")
        #expect(try await http.send("GET", "/healthz").status == 200)
        #expect(await server.waitForLog(containing: "was deleted since it was opened"))
    }

    @Test func anAdminListenerTakesMetricsAndIntrospectionOffThePublicOne() async throws {
        let (directory, db, _) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(db: db, extraArguments: ["--admin-listen", "127.0.0.1:0"])
        #expect(await server.waitForLog(containing: "admin_listening"))
        let line = try #require(server.log.split(separator: "\n").first { $0.contains("admin_listening") })
        let address = try #require((try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["address"] as? String)
        let admin = TestHTTP(baseURL: URL(string: "http://\(address)")!)
        let public_ = TestHTTP(baseURL: server.baseURL)
        #expect(try await public_.send("GET", "/metrics").status == 404)
        #expect(try await public_.send("POST", "/v1/oauth/introspect", body: Data("token=x".utf8)).status == 404)
        #expect(try await public_.send("GET", "/healthz").status == 200)
        let metrics = try await admin.send("GET", "/metrics")
        #expect(metrics.status == 200 && String(decoding: metrics.body, as: UTF8.self).contains("attestd_connections"))
        #expect(try await admin.send("POST", "/v1/oauth/introspect", body: Data("token=x".utf8)).status == 401)
        #expect(try await admin.send("POST", "/v1/oauth/app-attest/challenge", body: Data("{}".utf8)).status == 404)
        #expect(try await admin.send("GET", "/readyz").status == 200)
    }

    @Test func noMigrateRefusesAnUnmigratedDatabaseUntilAttestctlMigrates() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-migrate-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("attestd.sqlite").path
        #expect(throws: HTTPTestError.self) { try ServerProcess(db: db, extraArguments: ["--no-migrate"]) }
        #expect(try ServerProcess.attestctl(["migrate", "--db", db]).0 == 0)
        let server = try ServerProcess(db: db, extraArguments: ["--no-migrate"])
        server.stop()
    }

    /// Another process (an operator's sqlite3 shell) holding the database's write lock.
    /// The sqlite3 shell in an exclusive transaction; returns once the shell says it holds the lock.
    struct WriteLockHolder {
        let process = Process()
        let input = Pipe()

        init(_ db: String) throws {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
            process.arguments = [db]
            process.standardInput = input
            let output = Pipe()
            process.standardOutput = output
            try process.run()
            input.fileHandleForWriting.write(Data(".bail on\nBEGIN EXCLUSIVE;\nSELECT 'locked';\n".utf8))
            var said = Data()
            while !String(decoding: said, as: UTF8.self).contains("locked") {
                let more = output.fileHandleForReading.availableData
                guard !more.isEmpty else { throw LockNotTaken() }   // the shell exited: BEGIN EXCLUSIVE failed
                said += more
            }
        }

        struct LockNotTaken: Error {}

        func release() {
            input.fileHandleForWriting.write(Data("ROLLBACK;\n.quit\n".utf8))
            process.waitUntilExit()
        }
    }

    /// Hex SHA-256 of every token row, read with the sqlite3 shell (a separate reader of the file).
    static func storedTokenHashes(_ db: String) throws -> [String] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        process.arguments = [db, "SELECT lower(hex(token_hash)) FROM tokens"]
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        return String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
    }

    /// `attestctl backup` while 16 devices refresh their tokens at full speed: the copy is whole
    /// (integrity check), private (0600), and attestd started on it knows every token acknowledged
    /// before the backup began, each as live as the copy's own later tokens of its device make it
    /// (a device keeps its newest two).
    @Test func anOnlineBackupUnderLoadHoldsEveryTokenAcknowledgedBeforeIt() async throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(db: db, extraArguments: ["--mint-limit", "0"])
        let http = TestHTTP(baseURL: server.baseURL)
        let devices = try (0..<16).map { _ in try ManualDevice(clientID: clientID) }
        for device in devices { #expect(try await http.registerFresh(device).status == 200) }

        let collector = TokenCollector()
        let load = Task {
            await withTaskGroup(of: Void.self) { group in
                for device in devices {
                    group.addTask {
                        while !collector.stopped {
                            guard let challenge = try? await http.challengeBytes(device),
                                  let result = try? await http.token(device, assertion: try device.assertion(challenge: challenge)) else { return }
                            if result.status == 200, let token = result.json["access_token"] as? String {
                                collector.add(token: token, device: device.keyIDBase64)
                            }
                        }
                    }
                }
            }
        }
        let warm = Date() + 60
        while collector.tokens.count < 64, Date() < warm { try await Task.sleep(nanoseconds: 10_000_000) }
        let before = collector.newestByDevice
        let acknowledged = collector.tokens
        let copy = directory.appendingPathComponent("backup.sqlite").path
        // The devices go on exchanging while the backup runs, and stop only after it has ended.
        let (status, output) = try ServerProcess.attestctl(["backup", "--db", db, "--to", copy])
        collector.stop()
        await load.value
        server.stop()
        #expect(status == 0, "\(output)")
        #expect(output.contains("pages") && output.contains(" s"))
        #expect(before.count == devices.count && acknowledged.count >= 64)
        let mode = try FileManager.default.attributesOfItem(atPath: copy)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        #expect(!FileManager.default.fileExists(atPath: copy + "-wal"))
        #expect(try SQLiteTokenStore(path: copy).integrityCheck() == "ok")

        let stored = Set(try Self.storedTokenHashes(copy))
        for token in acknowledged { #expect(stored.contains(hexString(sha256(Array(token.utf8)))), "an acknowledged token is not in the backup") }
        let restored = try ServerProcess(db: copy)
        let after = TestHTTP(baseURL: restored.baseURL)
        for (device, token) in before {
            let hash = hexString(sha256(Array(token.utf8)))
            let newer = try Self.query(copy, """
                SELECT count(*) FROM tokens WHERE key_id = (SELECT key_id FROM tokens WHERE token_hash = X'\(hash)')
                AND issued_at > (SELECT issued_at FROM tokens WHERE token_hash = X'\(hash)')
                """)
            #expect(Int(newer) != nil, "\(newer)")
            let answer = try await after.messages(token: token).status
            // 503: accepted (no upstream key here); 401: superseded by two newer tokens in the copy.
            #expect(answer == ((Int(newer) ?? 0) < 2 ? 503 : 401), "device \(device.prefix(8)): \(newer) newer tokens, got \(answer)")
        }
    }

    /// The development tour's trap: `make run` trusts Apple's root only, so a simulated device is
    /// refused; attest-sim says which flag the server needs, not only "401 invalid_grant".
    @Test func aSimulatedDeviceRefusedForItsTestCertificatesIsToldWhichFlagTheServerNeeds() throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(db: db, trustingTestAuthority: false)
        defer { server.stop() }
        let (status, output) = try ServerProcess.attestSim(["simulate-device", "--base-url", server.baseURL.absoluteString, "--client-id", clientID,
                                                            "--state-dir", directory.appendingPathComponent("device").path,
                                                            "--app-id", "ABCDE12345.com.example.app"])
        #expect(status != 0)
        #expect(output.contains("attestationFailed") && output.contains("--trust-anchor Fixtures/test-authority/root.pem"), "\(output)")
    }

    /// One value from `sqlite3`.
    static func query(_ db: String, _ sql: String) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        process.arguments = [db, sql]
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test func revocationByAttestctlStopsARunningServerAtOnce() async throws {
        let (directory, db, clientID) = try makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(db: db)
        let http = TestHTTP(baseURL: server.baseURL)
        let device = try ManualDevice(clientID: clientID)
        let token = try #require(try await http.registerFresh(device).json["access_token"] as? String)
        #expect(try await http.messages(token: token).status == 503)

        #expect(try ServerProcess.attestctl(["integrations", "revoke", clientID, "--db", db, "--actor", "owner@example.com", "--yes"]).0 == 0)
        #expect(try await http.messages(token: token).status == 401)
        let challenge = try await http.challenge(device)
        #expect(challenge.status == 401 && challenge.error == "invalid_client")
    }

    @Test func migrationsAreAppliedOnceAndAChangedMigrationRefusesToStart() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-mig-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("m.sqlite").path
        _ = try SQLiteTokenStore(path: db)
        _ = try SQLiteTokenStore(path: db)  // second open applies nothing and succeeds
        let changed = Migration.sqlite.map { Migration(name: $0.name, sql: $0.sql + "\n-- edited after release") }
        #expect(throws: MigrationError.self) { _ = try SQLiteTokenStore(path: db, migrations: changed) }
        let older = Array(Migration.sqlite.dropLast())
        if Migration.sqlite.count == 1 {
            #expect(throws: MigrationError.self) { _ = try SQLiteTokenStore(path: db, migrations: older) }
        }
        // And the server says why, with a non-zero exit.
        let process = Process()
        process.executableURL = URL(fileURLWithPath: ServerProcess.attestd)
        process.arguments = ["serve", "--db", "/nonexistent-dir/x.sqlite", "--listen", "127.0.0.1:0"]
        let err = Pipe()
        process.standardError = err
        try process.run()
        let text = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        #expect(process.terminationStatus == 2)
        #expect(text.contains("startup_failed"))
    }

    @Test func embeddedMigrationsMatchTheFilesInMigrations() throws {
        let folder = ServerProcess.packageRoot.appendingPathComponent("Migrations/sqlite")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".sql") }.sorted()
        #expect(files == Migration.sqlite.map(\.name), "run scripts/embed-migrations.sh")
        for migration in Migration.sqlite {
            let text = try String(contentsOf: folder.appendingPathComponent(migration.name), encoding: .utf8)
            #expect(Migration(name: migration.name, sql: text).checksum == migration.checksum, "run scripts/embed-migrations.sh")
        }
    }
}

final class TokenCollector: @unchecked Sendable {
    private let lock = NSLock()
    private var _tokens: [String] = []
    private var _newest: [String: String] = [:]
    private var _secrets: [String] = []
    private var _stopped = false
    var stopped: Bool { lock.lock(); defer { lock.unlock() }; return _stopped }
    func stop() { lock.lock(); _stopped = true; lock.unlock() }
    var tokens: [String] { lock.lock(); defer { lock.unlock() }; return _tokens }
    var secrets: [String] { lock.lock(); defer { lock.unlock() }; return _secrets }
    /// The newest acknowledged token of each device (by key ID).
    var newestByDevice: [String: String] { lock.lock(); defer { lock.unlock() }; return _newest }
    func add(token: String, device: String) { lock.lock(); _tokens.append(token); _newest[device] = token; lock.unlock() }
    func add(secret: String) { lock.lock(); _secrets.append(secret); lock.unlock() }
}
