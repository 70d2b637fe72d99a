import AppAttest
import Foundation
import PostgresStore
import PostgresTestSupport
import SQLiteStore
import Synchronization
import Testing
import TokenService

/// What a store checks when it commits, not when the request began, on both databases: the
/// registration quota under concurrent registrations, a challenge that expires while its request
/// is verified, a usage batch retried after its commit went through, and an audit batch the
/// store refuses because of one event.
@Suite(.timeLimit(.minutes(3)))
struct CommitTimeChecksTests {
    typealias F = StoreFixture
    let t0 = StoreFixture.t0

    /// 12 registrations at once against a quota of 5: exactly 5 commit, the rest are refused with
    /// `.quotaExceeded` (their challenges used up all the same); a later window has room again.
    @Test(arguments: Backend.allCases)
    func theRegistrationQuotaHoldsUnderConcurrentRegistrations(_ backend: Backend) throws {
        let f = try StoreFixture(backend, poolSize: 12)
        let store = f.store
        let app = try f.integration()
        let quota = RegistrationQuota(limit: 5, window: 3600)
        let devices = (0..<12).map { _ in F.device(app) }
        let t0 = self.t0
        let challenges = try devices.map { device in
            try store.pendingOrNewChallenge(clientID: app.clientID, keyID: device.keyID, fresh: F.challenge(), at: t0)
        }
        let outcomes = try concurrently(12) { index in
            try store.registerDevice(devices[index], receipt: [1], firstToken: F.token(app, keyID: devices[index].keyID),
                                     redeeming: challenges[index].bytes, nextChallenge: F.challenge(), quota: quota, at: t0,
                                     commitTime: { t0 })
        }
        let results = try outcomes.map { try $0.get() }
        #expect(results.filter { $0 == .committed }.count == 5, "\(results)")
        #expect(results.filter { $0 == .quotaExceeded }.count == 7, "\(results)")
        #expect(try store.registrationsSince(clientID: app.clientID, since: t0 - 3600).count == 5)
        // A refused registration used its challenge up.
        for (index, result) in results.enumerated() where result == .quotaExceeded {
            #expect(try store.pendingChallenge(clientID: app.clientID, keyID: devices[index].keyID, at: t0) == nil)
        }
        // An hour on, the window has room again.
        let later = t0 + 3601
        let late = F.device(app)
        #expect(try store.registerDevice(late, receipt: [1], firstToken: F.token(app, keyID: late.keyID, at: later), redeeming: nil,
                                         nextChallenge: F.challenge(at: later), quota: quota, at: later, commitTime: { later }) == .committed)
    }

    /// The challenge is pending when the request begins and expired when it commits: refused, on
    /// registration and on refresh alike.
    @Test(arguments: Backend.allCases)
    func aChallengeThatExpiresBeforeTheCommitIsNotRedeemed(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        let device = F.device(app)
        let challenge = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: device.keyID, fresh: F.challenge(ttl: 300), at: t0)
        let expired = t0 + 301
        #expect(try store.registerDevice(device, receipt: [1], firstToken: F.token(app, keyID: device.keyID), redeeming: challenge.bytes,
                                         nextChallenge: F.challenge(), quota: nil, at: t0, commitTime: { expired }) == .challengeGone)
        #expect(try store.device(clientID: app.clientID, keyID: device.keyID) == nil)
        // The same at a time it is still pending commits.
        let fresh = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: device.keyID, fresh: F.challenge(at: expired), at: expired)
        let next = F.challenge(at: expired, ttl: 300)
        #expect(try store.registerDevice(device, receipt: [1], firstToken: F.token(app, keyID: device.keyID, at: expired), redeeming: fresh.bytes,
                                         nextChallenge: next, quota: nil, at: expired, commitTime: { expired + 299 }) == .committed)
        // Refresh: the next challenge (300 s) has expired by the time the assertion commits.
        let tooLate = expired + 301
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 1, refresh: nil,
                                         token: F.token(app, keyID: device.keyID, at: expired), redeeming: next.bytes,
                                         nextChallenge: F.challenge(at: expired), at: expired, commitTime: { tooLate }) == .challengeGone)
        #expect(try store.device(clientID: app.clientID, keyID: device.keyID)?.counter == 0)
    }

    /// A batch with an ID is added once, however often it is written.
    @Test(arguments: Backend.allCases)
    func aUsageBatchIsAddedOnceUnderItsID(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        var batch = UsageBatch()
        batch.id = "batch-\(UUID().uuidString)"
        var counters = UsageCounters()
        counters.requests = 2; counters.inputTokens = 10; counters.outputTokens = 3; counters.abandoned = 1
        let hour = UsageClock.hour(t0)
        batch.usage[UsageKey(clientID: app.clientID, model: "claude-a", hour: hour)] = counters
        batch.monthTokens[MonthKey(clientID: app.clientID, month: UsageClock.month(t0))] = 13
        let minute = UsageClock.minute(t0)
        #expect(try store.recordUsage(batch, purgeDeviceMinutesBefore: minute - 2))
        #expect(try !store.recordUsage(batch, purgeDeviceMinutesBefore: minute - 2))
        #expect(try store.usage(UsageFilter(clientID: app.clientID)).first?.counters == counters)
        // Another ID adds again.
        batch.id = "batch-\(UUID().uuidString)"
        #expect(try store.recordUsage(batch, purgeDeviceMinutesBefore: minute - 2))
        #expect(try store.usage(UsageFilter(clientID: app.clientID)).first?.counters.requests == 4)
    }

    /// One event the store refuses (here a trigger refuses some, as a constraint or a changed
    /// schema would) does not hold back the others: they are written one by one, the refused one
    /// again with its text reduced to ASCII, and one refused even then is reported in full.
    @Test(arguments: Backend.allCases)
    func anAuditBatchTheStoreRefusesIsWrittenEventByEvent(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        try f.execute(backend == .sqlite ? """
            CREATE TRIGGER refuse_some BEFORE INSERT ON audit_log
            WHEN NEW.action = 'poison' OR NEW.detail LIKE '%é%'
            BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END
            """ : """
            CREATE FUNCTION refuse_some() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF NEW.action = 'poison' OR NEW.detail LIKE '%é%' THEN RAISE EXCEPTION 'refused by the test trigger'; END IF;
              RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_some BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION refuse_some();
            """)
        let reports = Mutex<[String]>([])
        let log = BufferedAuditLog(store: f.store, interval: 3600, onError: { line in reports.withLock { $0.append(line) } })
        log.record(AuditEvent(at: t0, action: "first"))
        log.record(AuditEvent(at: t0, action: "accented", detail: "café"))
        log.record(AuditEvent(at: t0, action: "poison", detail: "never storable"))
        log.record(AuditEvent(at: t0, action: "last"))
        log.flush()
        #expect(log.pendingCount == 0)
        let stored = try f.auditEvents().reversed().map { ($0.action, $0.detail) }
        #expect(stored.map(\.0) == ["first", "accented", "last"])
        #expect(stored[1].1 == #"caf\u{e9}"#)
        let lines = reports.withLock { $0 }
        #expect(lines.contains { $0.contains("reduced to ASCII") && $0.contains("action=accented") })
        #expect(lines.contains { $0.contains("not stored") && $0.contains("action=poison") && $0.contains("detail=never storable") })
    }
}

/// A usage flush whose COMMIT went through but whose answer never came back (the connection cut
/// right after the server committed) is retried under its batch ID and counted once.
@Suite(.timeLimit(.minutes(2)))
struct IdempotentUsageFlushTests {
    @Test func aFlushRetriedAfterItsCommitReplyWasLostCountsOnce() throws {
        let f = try StoreFixture(.postgres)
        let app = try f.integration()
        let cluster = try PostgresCluster.shared.get()
        let proxy = try CommitReplyDropper(forwardingTo: cluster.port)
        defer { proxy.stop() }
        let store = try PostgresTokenStore(connectionString: PostgresConnectionString(cluster.url(f.database!, port: proxy.port)),
                                           configuration: PostgresConfiguration(poolSize: 2))
        let reports = Mutex<[String]>([])
        let ledger = UsageLedger(store: store, metrics: Metrics(), report: { line in reports.withLock { $0.append(line) } })
        let time = Date()
        let grant = TokenGrant(clientID: app.clientID, workspaceID: app.workspaceID, workspaceName: "default", issuedAt: time,
                               expiresAt: time + 3600, keyID: StoreFixture.bytes())
        func relay(_ count: Int) {
            for _ in 0..<count {
                guard case .success(let ticket) = ledger.admit(grant, PolicyInput(model: "claude-a"), commitsBeforeRead: ledger.commitCount, at: time)
                else { Issue.record("refused"); return }
                ledger.finish(ticket, RelayOutcome(status: 200, usage: TokenUsage(inputTokens: 10, outputTokens: 5), incomplete: false))
            }
        }
        relay(3)
        proxy.arm()
        #expect(!ledger.flush(at: time), "the flush whose answer was dropped must count as failed")
        #expect(proxy.dropped == 1)
        #expect(reports.withLock { $0 }.count == 1)
        // It did commit: the rows are there once.
        #expect(try f.store.usage(UsageFilter(clientID: app.clientID)).first?.counters.requests == 3)
        // Requests meanwhile go into the next batch; the retry adds the first one nothing twice.
        relay(1)
        #expect(ledger.flush(at: time))
        let row = try #require(try f.store.usage(UsageFilter(clientID: app.clientID)).first)
        #expect(row.counters.requests == 4)
        #expect(row.counters.inputTokens == 40 && row.counters.outputTokens == 20)
        #expect(ledger.flush(at: time))
        #expect(try f.store.usage(UsageFilter(clientID: app.clientID)).first?.counters.requests == 4)
    }
}
