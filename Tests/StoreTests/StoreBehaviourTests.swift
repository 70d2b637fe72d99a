import AppAttest
import Foundation
import PostgresStore
import Synchronization
import PostgresTestSupport
import SQLiteStore
import Testing
import TokenService

/// Every store behaviour, on SQLite and on PostgreSQL: one suite, one expectation per
/// behaviour, so the two implementations cannot drift apart unnoticed.
@Suite(.timeLimit(.minutes(2)))
struct StoreBehaviourTests {
    typealias F = StoreFixture
    let t0 = StoreFixture.t0

    // MARK: Organisation

    @Test(arguments: Backend.allCases)
    func workspacesAndMembers(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let main = try f.defaultWorkspace
        let team = try store.createWorkspace(name: "team-b", at: t0)
        #expect(team.name == "team-b" && team.id != main.id)
        #expect(try store.workspace(named: "team-b") == team)
        #expect(try store.workspace(named: "nope") == nil)
        #expect(throws: (any Error).self) { _ = try store.createWorkspace(name: "team-b", at: t0) }

        #expect(try store.primaryOwner(workspaceID: team.id) == nil)
        try store.addMember(email: "boss@example.com", role: .primaryOwner, workspaceID: team.id, at: t0)
        try store.addMember(email: "dev@example.com", role: .developer, workspaceID: team.id, at: t0)
        #expect(try store.primaryOwner(workspaceID: team.id) == "boss@example.com")
        #expect(try store.role(of: "dev@example.com", in: team.id) == .developer)
        #expect(try store.role(of: "dev@example.com", in: main.id) == nil)
        // One primary owner per workspace, one row per member: the schema refuses the rest.
        #expect(throws: (any Error).self) { try store.addMember(email: "other@example.com", role: .primaryOwner, workspaceID: team.id, at: self.t0) }
        #expect(throws: (any Error).self) { try store.addMember(email: "dev@example.com", role: .user, workspaceID: team.id, at: self.t0) }
        #expect(try store.role(of: "dev@example.com", in: team.id) == .developer)
    }

    // MARK: Integrations

    @Test(arguments: Backend.allCases)
    func devicePolicyRoundTripsAndIsReplaced(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        #expect(try store.integration(clientID: app.clientID)?.devicePolicy == DevicePolicy())
        let policy = DevicePolicy(distribution: [.production: [.appStore, .developerID], .development: [.development, .other]],
                                  minBundleVersion: BundleVersion("2.10.1"), requireExtensions: true, platforms: [.macos])
        #expect(try store.updateDevicePolicy(clientID: app.clientID, policy))
        let read = try #require(try store.integration(clientID: app.clientID)?.devicePolicy)
        #expect(read == policy)
        #expect(read.minBundleVersion?.description == "2.10.1")
        #expect(try store.integrations(workspaceID: nil).first { $0.clientID == app.clientID }?.devicePolicy == policy)
        #expect(try !store.updateDevicePolicy(clientID: "clid_nobody", policy))
        // The usage policy is a column set of its own: changing one leaves the other.
        #expect(try store.updatePolicy(clientID: app.clientID, IntegrationPolicy(maxTokens: 5)))
        #expect(try store.integration(clientID: app.clientID)?.devicePolicy == policy)
    }

    @Test(arguments: Backend.allCases)
    func inventoryRecordsRegistrationAndEachRefresh(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        let keyID = F.bytes()
        let device = Device(keyID: keyID, clientID: app.clientID, publicKey: [4] + F.bytes(64), counter: 0, environment: .production,
                            appID: "ABCDE12345.com.example.app", platform: .ios, validationCategory: 4, bundleVersion: "1.0", osVersion: "27.0.1")
        #expect(try store.registerDevice(device, receipt: [1], firstToken: F.token(app, keyID: keyID), nextChallenge: F.challenge(), at: t0))
        let registered = try #require(try store.device(keyID: keyID))
        #expect(registered.platform == .ios && registered.validationCategory == 4 && registered.bundleVersion == "1.0")
        #expect(registered.osVersion == "27.0.1")
        #expect(registered.registeredAt == t0 && registered.lastRefreshAt == t0)
        #expect(try store.device(clientID: app.clientID, keyID: keyID) == registered)

        // A refresh updates the bundle version and the time, never the category it registered with.
        let later = t0 + 120
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: keyID, from: 0, to: 1,
                                         refresh: DeviceRefresh(validationCategory: 2, bundleVersion: "1.1", platform: .macos),
                                         token: F.token(app, keyID: keyID, at: later), redeeming: nil, nextChallenge: F.challenge(at: later),
                                         at: later, commitTime: { later }) == .committed)
        let refreshed = try #require(try store.device(keyID: keyID))
        #expect(refreshed.validationCategory == 4 && refreshed.platform == .ios)
        #expect(refreshed.bundleVersion == "1.1" && refreshed.lastRefreshAt == later && refreshed.counter == 1)
        // A device without a category (an older system, or registered before the inventory) takes the first it writes.
        let (old, _, _) = try f.registered(app)
        #expect(try store.device(keyID: old.keyID)?.validationCategory == nil)
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: old.keyID, from: 0, to: 1,
                                         refresh: DeviceRefresh(validationCategory: 3, bundleVersion: nil, platform: .ios),
                                         token: F.token(app, keyID: old.keyID, at: later), redeeming: nil, nextChallenge: F.challenge(at: later),
                                         at: later, commitTime: { later }) == .committed)
        let adopted = try #require(try store.device(keyID: old.keyID))
        #expect(adopted.validationCategory == 3 && adopted.platform == .ios && adopted.bundleVersion == nil)

        let listed = try store.devices(clientID: app.clientID, limit: 10)
        #expect(Set(listed.map(\.keyID)) == [keyID, old.keyID])
        #expect(try store.devices(clientID: app.clientID, limit: 1).count == 1)
        var expected = DeviceCounts()
        expected.byPlatform = ["ios": 2]
        expected.byCategory = ["app-store": 1, "development": 1]
        expected.byBundleVersion = ["1.1": 1, "none": 1]
        expected.byRisk = ["unknown": 2]
        #expect(try store.deviceCounts(clientID: app.clientID) == expected)
        #expect(try store.deviceCounts(clientID: "clid_nobody") == DeviceCounts())
        #expect(try store.device(keyID: F.bytes()) == nil)
    }

    @Test(arguments: Backend.allCases)
    func upstreamKeysAreSetReplacedAndReadWithTheToken(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        #expect(try store.upstreamKey(workspaceID: app.workspaceID) == nil)
        let first = SealedUpstreamKey(sealed: F.bytes(), last4: "aaaa", setAt: t0, setBy: "owner@example.com")
        try store.setUpstreamKey(workspaceID: app.workspaceID, first)
        #expect(try store.upstreamKey(workspaceID: app.workspaceID) == first)
        let second = SealedUpstreamKey(sealed: F.bytes(), last4: "bbbb", setAt: t0 + 60, setBy: "other@example.com")
        try store.setUpstreamKey(workspaceID: app.workspaceID, second)
        #expect(try store.upstreamKey(workspaceID: app.workspaceID) == second)
        // The token check reads it in the same query.
        let device = F.device(app)
        let token = F.token(app, keyID: device.keyID)
        #expect(try store.registerDevice(device, receipt: [1], firstToken: token, nextChallenge: F.challenge(), at: t0))
        #expect(try store.liveToken(hash: token.tokenHash, at: t0)?.upstreamKey == second)
    }

    @Test(arguments: Backend.allCases)
    func integrationsAreStoredAndReadBackExactly(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let team = try store.createWorkspace(name: "team-b", at: t0)
        let first = try f.integration("First", bundleIDs: ["com.example.zeta", "com.example.alpha"], at: t0)
        let second = try f.integration("Second", at: t0 + 1)
        let other = try f.integration("Other", workspace: team, at: t0 + 2)

        #expect(try store.integration(clientID: first.clientID) == first)   // bundle order, environments, dates to the bit
        #expect(try store.integration(clientID: other.clientID)?.workspaceName == "team-b")
        #expect(try store.integration(clientID: "clid_unknown") == nil)
        #expect(try store.integrations(workspaceID: try f.defaultWorkspace.id) == [first, second])
        #expect(try store.integrations(workspaceID: team.id) == [other])
        #expect(try store.integrations(workspaceID: nil).map(\.clientID) == [first, second, other].map(\.clientID))
        #expect(try store.counts(clientID: first.clientID, at: t0) == (0, 0))

        // A client ID is unique, and a failed create leaves nothing behind.
        let duplicate = Integration(clientID: first.clientID, workspaceID: team.id, workspaceName: team.name, name: "Dup", teamID: "ABCDE12345",
                                    bundleIDs: ["com.example.dup"], environments: [.production], createdAt: t0, revokedAt: nil)
        #expect(throws: (any Error).self) { try store.createIntegration(duplicate) }
        #expect(try store.integration(clientID: first.clientID) == first)
    }

    // MARK: Challenges

    @Test(arguments: Backend.allCases)
    func challengesArePendingReissuedAndConsumedOnce(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        let keyID = F.bytes()
        let a = F.challenge(), b = F.challenge()

        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: keyID, at: t0) == nil)
        #expect(try store.pendingOrNewChallenge(clientID: app.clientID, keyID: keyID, fresh: a, at: t0) == a)
        // While `a` is pending it is handed out again, not replaced.
        #expect(try store.pendingOrNewChallenge(clientID: app.clientID, keyID: keyID, fresh: b, at: t0 + 10) == a)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: keyID, at: t0) == a.bytes)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: F.bytes(), at: t0) == nil)

        // Consuming with other bytes changes nothing; with the right ones, exactly once.
        #expect(try store.consumeChallenge(clientID: app.clientID, keyID: keyID, challenge: b.bytes, at: t0) == nil)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: keyID, at: t0) == a.bytes)
        #expect(try store.consumeChallenge(clientID: app.clientID, keyID: keyID, challenge: a.bytes, at: t0) == a.bytes)
        #expect(try store.consumeChallenge(clientID: app.clientID, keyID: keyID, challenge: a.bytes, at: t0) == nil)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: keyID, at: t0) == nil)

        // A used challenge is replaced by a fresh one.
        let c = F.challenge(at: t0 + 20)
        #expect(try store.pendingOrNewChallenge(clientID: app.clientID, keyID: keyID, fresh: c, at: t0 + 20) == c)
        // At its expiry it is no longer pending, and the next request reissues.
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: keyID, at: c.expiresAt) == nil)
        #expect(try store.consumeChallenge(clientID: app.clientID, keyID: keyID, at: c.expiresAt) == nil)
        let d = F.challenge(at: c.expiresAt)
        #expect(try store.pendingOrNewChallenge(clientID: app.clientID, keyID: keyID, fresh: d, at: c.expiresAt) == d)
        // Without bytes, whatever is pending is consumed.
        #expect(try store.consumeChallenge(clientID: app.clientID, keyID: keyID, at: c.expiresAt) == d.bytes)
    }

    // MARK: Registration

    @Test(arguments: Backend.allCases)
    func registrationRedeemsTheChallengeOnceAndConflictsOnASecondRegistration(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        let device = F.device(app)
        let challenge = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: device.keyID, fresh: F.challenge(), at: t0)
        let token = F.token(app, keyID: device.keyID), next = F.challenge()

        #expect(try store.registerDevice(device, receipt: [9, 9], firstToken: token, redeeming: challenge.bytes, nextChallenge: next, at: t0) == .committed)
        // As registered, with the time it registered at.
        let stored = try #require(try store.device(clientID: app.clientID, keyID: device.keyID))
        #expect(stored == F.device(app, keyID: device.keyID, registeredAt: t0, like: device))
        #expect(try store.device(clientID: "clid_other", keyID: device.keyID) == nil)
        #expect(try store.liveToken(hash: token.tokenHash, at: t0) == TokenGrant(clientID: app.clientID, workspaceID: app.workspaceID,
                                                                                 workspaceName: "default", issuedAt: token.issuedAt,
                                                                                 expiresAt: token.expiresAt, keyID: device.keyID))
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: t0) == next.bytes)
        #expect(try store.counts(clientID: app.clientID, at: t0) == (1, 1))

        // The same key again: a conflict, and the challenge it redeemed stays used up.
        let again = F.device(app, keyID: device.keyID), token2 = F.token(app, keyID: device.keyID)
        #expect(try store.registerDevice(again, receipt: [1], firstToken: token2, redeeming: next.bytes, nextChallenge: F.challenge(), at: t0) == .conflict)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: t0) == nil)
        #expect(try store.device(clientID: app.clientID, keyID: device.keyID) == stored)
        #expect(try store.liveToken(hash: token2.tokenHash, at: t0) == nil)

        // A challenge that is not pending: nothing is written.
        let stranger = F.device(app)
        #expect(try store.registerDevice(stranger, receipt: [1], firstToken: F.token(app, keyID: stranger.keyID), redeeming: F.bytes(),
                                         nextChallenge: F.challenge(), at: t0) == .challengeGone)
        #expect(try store.device(clientID: app.clientID, keyID: stranger.keyID) == nil)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: stranger.keyID, at: t0) == nil)

        // A key ID is attested once, for one integration.
        let otherApp = try f.integration("Other")
        let moved = F.device(otherApp, keyID: device.keyID)
        #expect(try store.registerDevice(moved, receipt: [1], firstToken: F.token(otherApp, keyID: device.keyID), redeeming: nil,
                                         nextChallenge: F.challenge(), at: t0) == .conflict)
        #expect(try store.counts(clientID: otherApp.clientID, at: t0) == (0, 0))
    }

    @Test(arguments: Backend.allCases)
    func aRevokedIntegrationRegistersNothing(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let app = try f.integration()
        #expect(try f.store.revokeIntegration(clientID: app.clientID, at: t0))
        let device = F.device(app)
        #expect(try f.store.registerDevice(device, receipt: [1], firstToken: F.token(app, keyID: device.keyID), redeeming: nil,
                                           nextChallenge: F.challenge(), at: t0) == .conflict)
        #expect(try f.store.device(clientID: app.clientID, keyID: device.keyID) == nil)
    }

    // MARK: Counter advance

    @Test(arguments: Backend.allCases)
    func counterAdvancesByCompareAndSet(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        let (device, _, first) = try f.registered(app)

        let token1 = F.token(app, keyID: device.keyID), next1 = F.challenge()
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 5, token: token1, redeeming: first.bytes,
                                         nextChallenge: next1, at: t0) == .committed)
        #expect(try store.device(clientID: app.clientID, keyID: device.keyID)?.counter == 5)
        #expect(try store.liveToken(hash: token1.tokenHash, at: t0) != nil)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: t0) == next1.bytes)

        // A stale `from` (a concurrent request won): conflict, and the challenge is used up.
        let token2 = F.token(app, keyID: device.keyID)
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 6, token: token2, redeeming: next1.bytes,
                                         nextChallenge: F.challenge(), at: t0) == .conflict)
        #expect(try store.device(clientID: app.clientID, keyID: device.keyID)?.counter == 5)
        #expect(try store.liveToken(hash: token2.tokenHash, at: t0) == nil)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: t0) == nil)

        // A challenge that is not pending: nothing changes.
        let pending = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: device.keyID, fresh: F.challenge(), at: t0)
        let token3 = F.token(app, keyID: device.keyID)
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 5, to: 6, token: token3, redeeming: F.bytes(),
                                         nextChallenge: F.challenge(), at: t0) == .challengeGone)
        #expect(try store.device(clientID: app.clientID, keyID: device.keyID)?.counter == 5)
        #expect(try store.liveToken(hash: token3.tokenHash, at: t0) == nil)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: t0) == pending.bytes)
        // An expired challenge is gone too.
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 5, to: 6, token: token3, redeeming: pending.bytes,
                                         nextChallenge: F.challenge(), at: pending.expiresAt) == .challengeGone)

        // Without a challenge (tools): the compare-and-set alone.
        let token4 = F.token(app, keyID: device.keyID)
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 5, to: 7, token: token4,
                                         nextChallenge: F.challenge(), at: t0))
        #expect(try !store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 5, to: 8, token: F.token(app, keyID: device.keyID),
                                          nextChallenge: F.challenge(), at: t0))
        #expect(try store.device(clientID: app.clientID, keyID: device.keyID)?.counter == 7)
        // Three tokens minted, two live: each mint keeps the new token and the newest other one.
        #expect(try store.counts(clientID: app.clientID, at: t0) == (1, 2))
        #expect(try store.liveToken(hash: token4.tokenHash, at: t0) != nil)
    }

    /// 64 requests carrying the same assertion counter (a replay, or a cloned key) at once:
    /// the database lets exactly one through, whether they share the challenge or carry none.
    /// On PostgreSQL a blocker holds the device row until all 64 statements are inside the
    /// database waiting on locks, so they truly overlap (on two cores they would otherwise mostly
    /// run one after another); the limits are raised so that the waits are not cut short.
    @Test(arguments: Backend.allCases, [true, false])
    func sixtyFourConcurrentAdvancesWithTheSameCounterCommitOnce(_ backend: Backend, sharingTheChallenge: Bool) throws {
        let f = try StoreFixture(backend, configuration: PostgresConfiguration(poolSize: 64, callTimeout: 30, statementTimeoutMilliseconds: 20_000,
                                                                                lockTimeoutMilliseconds: 20_000))
        let store = f.store
        let app = try f.integration()
        let (device, _, challenge) = try f.registered(app)
        let tokens = (0..<64).map { _ in F.token(app, keyID: device.keyID) }
        let t0 = self.t0

        var releaser: Thread?
        let released = Mutex<Result<Int, any Error>?>(nil)
        if backend == .postgres {
            _ = try concurrently(64) { _ in try store.workspace(named: "default") }   // 64 sessions ready
            let cluster = try PostgresCluster.shared.get(), database = try #require(f.database)
            let blocker = try PostgresConnection(PostgresConnectionString(cluster.socket(database, user: "postgres")), deadline: .after(seconds: 60))
            let monitor = try PostgresConnection(PostgresConnectionString(cluster.socket(database, user: "postgres")), deadline: .after(seconds: 60))
            try blocker.execute("BEGIN")
            try blocker.query("SELECT 1 FROM devices WHERE key_id = $1 FOR UPDATE", [.bytes(device.keyID)])
            releaser = Thread {
                released.withLock { $0 = Result {
                    // Wait (at most 20 s) until the 64 exchanges are all blocked inside the database.
                    var waiting = 0
                    for _ in 0..<400 where waiting < 64 {
                        waiting = Int(try monitor.query("""
                            SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
                            """).first { try $0.int(0) } ?? 0)
                        usleep(50_000)
                    }
                    try blocker.execute("COMMIT")
                    return waiting
                } }
            }
            releaser?.start()
        }
        let results = try concurrently(64) { index in
            try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 1, token: tokens[index],
                                     redeeming: sharingTheChallenge ? challenge.bytes : nil, nextChallenge: F.challenge(), at: t0)
        }
        if releaser != nil {
            let overlapping = try #require(released.withLock { $0 }).get()
            #expect(overlapping == 64, "only \(overlapping) exchanges were waiting at once")
        }
        let outcomes = try results.map { try $0.get() }
        #expect(outcomes.filter { $0 == .committed }.count == 1)
        // Sharing the challenge, the losers find it redeemed (locked, then re-read); without one,
        // the counter's compare-and-set refuses them.
        #expect(outcomes.filter { $0 != .committed }.allSatisfy { $0 == (sharingTheChallenge ? .challengeGone : .conflict) })
        #expect(try store.device(clientID: app.clientID, keyID: device.keyID)?.counter == 1)
        #expect(try tokens.filter { try store.liveToken(hash: $0.tokenHash, at: t0) != nil }.count == 1)
        #expect(try store.counts(clientID: app.clientID, at: t0) == (1, 2))
    }

    // MARK: Revocation and tokens

    @Test(arguments: Backend.allCases)
    func revokingAnIntegrationKillsItsTokensAndChallenges(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration(), bystander = try f.integration("Bystander")
        let (device, token, next) = try f.registered(app)
        let (_, otherToken, _) = try f.registered(bystander)

        #expect(try store.revokeIntegration(clientID: app.clientID, at: t0 + 5))
        #expect(try !store.revokeIntegration(clientID: app.clientID, at: t0 + 6))
        #expect(try !store.revokeIntegration(clientID: "clid_unknown", at: t0))
        #expect(try store.integration(clientID: app.clientID)?.revokedAt == t0 + 5)
        #expect(try store.liveToken(hash: token.tokenHash, at: t0) == nil)
        #expect(try store.counts(clientID: app.clientID, at: t0) == (1, 0))
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: t0) == nil)
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 1, token: F.token(app, keyID: device.keyID),
                                         redeeming: nil, nextChallenge: next, at: t0) == .conflict)
        // Only that integration.
        #expect(try store.liveToken(hash: otherToken.tokenHash, at: t0) != nil)
        #expect(try store.integration(clientID: bystander.clientID)?.isRevoked == false)
    }

    @Test(arguments: Backend.allCases)
    func liveTokenIsUnexpiredUnrevokedAndExact(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let app = try f.integration()
        let (_, token, _) = try f.registered(app)
        #expect(try f.store.liveToken(hash: token.tokenHash, at: token.expiresAt - 0.001)?.clientID == app.clientID)
        #expect(try f.store.liveToken(hash: token.tokenHash, at: token.expiresAt) == nil)
        #expect(try f.store.liveToken(hash: F.bytes(), at: t0) == nil)
        #expect(try f.store.liveToken(hash: Array(token.tokenHash.prefix(31)), at: t0) == nil)
        #expect(try f.store.counts(clientID: app.clientID, at: token.expiresAt) == (1, 0))
    }

    // MARK: Audit and purge

    @Test(arguments: Backend.allCases)
    func auditEventsAreAppendedInOrder(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let keyID = F.bytes()
        try f.store.appendAudit([])
        try f.store.appendAudit([
            AuditEvent(at: t0, actor: "boss@example.com", action: "integration.created", clientID: "clid_a"),
            AuditEvent(at: t0 + 1, action: "device.rejected", clientID: "clid_a", keyID: keyID, reason: "nonceMismatch",
                       detail: String(repeating: "é", count: 1500)),
            AuditEvent(at: t0 + 2, action: "audit.overflow"),
        ])
        let events = try f.auditEvents(limit: 10)
        #expect(events.map(\.action) == ["audit.overflow", "device.rejected", "integration.created"])
        #expect(events.map(\.at) == [t0 + 2, t0 + 1, t0])
        #expect(events[1].keyID == keyID && events[1].reason == "nonceMismatch" && events[1].actor == nil)
        #expect(events[1].detail == String(repeating: "é", count: 1000))
        #expect(events[2].actor == "boss@example.com" && events[2].keyID == nil && events[2].detail == nil)
        #expect(events[0].clientID == nil)
        #expect(try f.auditEvents(limit: 10, clientID: "clid_a").count == 2)
        #expect(try f.auditEvents(limit: 1).map(\.action) == ["audit.overflow"])

        // Control characters from a request (PostgreSQL refuses NUL in text) are replaced, so the
        // event and the batch around it are written.
        try f.store.appendAudit([AuditEvent(at: t0 + 3, action: "token.rejected", clientID: "clid_\u{0}x\u{1b}[2J",
                                            detail: "client_id clid_\u{0}x\u{1b}[2J is unknown"),
                                 AuditEvent(at: t0 + 4, action: "after")])
        let hostile = try f.auditEvents(limit: 2)
        #expect(hostile.map(\.action) == ["after", "token.rejected"])
        #expect(hostile[1].clientID == "clid_\u{FFFD}x\u{FFFD}[2J")
        #expect(hostile[1].detail == "client_id clid_\u{FFFD}x\u{FFFD}[2J is unknown")

        // A large batch (the buffered log writes up to 50,000 at once) arrives whole.
        try f.store.appendAudit((0..<1234).map { AuditEvent(at: t0 + Double($0), action: "bulk", detail: "\($0)") })
        let bulk = try f.auditEvents(limit: 2000).filter { $0.action == "bulk" }
        #expect(bulk.count == 1234)
        #expect(bulk.first?.detail == "1233")
    }

    @Test(arguments: Backend.allCases)
    func purgeDeletesUsedAndExpiredChallengesOnly(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        let used = F.bytes(), expired = F.bytes(), pending = F.bytes()
        let c = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: used, fresh: F.challenge(), at: t0)
        #expect(try store.consumeChallenge(clientID: app.clientID, keyID: used, challenge: c.bytes, at: t0) != nil)
        _ = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: expired, fresh: F.challenge(ttl: 10), at: t0)
        let keep = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: pending, fresh: F.challenge(ttl: 600), at: t0)

        #expect(try store.purgeChallenges(before: t0 + 100) == 2)
        #expect(try store.purgeChallenges(before: t0 + 100) == 0)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: pending, at: t0 + 100) == keep.bytes)
        // A purged key simply gets a fresh challenge.
        let fresh = F.challenge(at: t0 + 100)
        #expect(try store.pendingOrNewChallenge(clientID: app.clientID, keyID: expired, fresh: fresh, at: t0 + 100) == fresh)
    }

    // MARK: Migrations

    @Test(arguments: Backend.allCases)
    func aChangedOrUnknownMigrationIsRefused(_ backend: Backend) throws {
        switch backend {
        case .sqlite:
            let f = try StoreFixture(.sqlite)
            let path = f.directory!.appendingPathComponent("s.sqlite").path
            _ = try SQLiteTokenStore(path: path)   // reopening applies nothing
            let changed = Migration.sqlite.map { Migration(name: $0.name, sql: $0.sql + "\n-- edited after release") }
            #expect(throws: MigrationError.self) { _ = try SQLiteTokenStore(path: path, migrations: changed) }
            #expect(throws: MigrationError.self) { _ = try SQLiteTokenStore(path: path, migrations: []) }
        case .postgres:
            let f = try StoreFixture(.postgres)
            let url = PostgresConnectionString(try PostgresCluster.shared.get().url(f.database!))
            _ = try PostgresTokenStore(connectionString: url)
            _ = try PostgresTokenStore(connectionString: url, mode: .verify)
            let changed = Migration.postgres.map { Migration(name: $0.name, sql: $0.sql + "\n-- edited after release") }
            let error = #expect(throws: PostgresMigrationError.self) { _ = try PostgresTokenStore(connectionString: url, migrations: changed) }
            #expect(error?.description.contains("checksum") == true)
            let unknown = #expect(throws: PostgresMigrationError.self) { _ = try PostgresTokenStore(connectionString: url, migrations: []) }
            #expect(unknown?.description.contains("newer version") == true)
            // The refusals changed nothing: the store still opens and works.
            let store = try PostgresTokenStore(connectionString: url, mode: .verify)
            #expect(try store.workspace(named: "default") != nil)
        }
    }

    // MARK: Usage and policy

    /// The policy round-trips and is read with the token; usage batches add up (increments, not
    /// overwrites); the token check sees the month's tokens and the device's two minutes;
    /// old device minutes are purged; the filter selects by workspace, integration and hours.
    @Test(arguments: Backend.allCases)
    func usageBatchesAddUpAndTheTokenCheckReadsThemWithThePolicy(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        let other = try f.integration("Other", workspace: try store.createWorkspace(name: "team-b", at: t0))
        #expect(try store.integration(clientID: app.clientID)?.policy == IntegrationPolicy())
        let policy = IntegrationPolicy(models: ["claude-a", "claude-b"], maxTokens: 512, deviceRequestsPerMinute: 7, monthlyTokenBudget: 10_000)
        #expect(try store.updatePolicy(clientID: app.clientID, policy))
        #expect(try store.updatePolicy(clientID: "clid_nobody", policy) == false)
        #expect(try store.integration(clientID: app.clientID)?.policy == policy)

        let device = F.device(app)
        let token = F.token(app, keyID: device.keyID)
        #expect(try store.registerDevice(device, receipt: [1], firstToken: token, nextChallenge: F.challenge(), at: t0))
        let minute = UsageClock.minute(t0), hour = UsageClock.hour(t0), month = UsageClock.month(t0)
        var batch = UsageBatch()
        var counters = UsageCounters()
        counters.requests = 3; counters.inputTokens = 100; counters.outputTokens = 20; counters.cacheCreationInputTokens = 5
        counters.cacheReadInputTokens = 6; counters.incomplete = 1; counters.errors = [529: 1]; counters.refusals = ["model_not_allowed": 2]
        batch.usage[UsageKey(clientID: app.clientID, model: "claude-a", hour: hour)] = counters
        batch.usage[UsageKey(clientID: other.clientID, model: "claude-z", hour: hour - 7200)] = counters
        batch.monthTokens[MonthKey(clientID: app.clientID, month: month)] = 120
        batch.deviceMinutes[DeviceMinuteKey(clientID: app.clientID, keyID: device.keyID, minute: minute)] = 2
        batch.deviceMinutes[DeviceMinuteKey(clientID: app.clientID, keyID: device.keyID, minute: minute - 1)] = 4
        batch.deviceMinutes[DeviceMinuteKey(clientID: app.clientID, keyID: device.keyID, minute: minute - 5)] = 9
        try store.recordUsage(batch, purgeDeviceMinutesBefore: minute - 10)
        try store.recordUsage(batch, purgeDeviceMinutesBefore: minute - 2)

        let grant = try #require(try store.liveToken(hash: token.tokenHash, at: t0))
        #expect(grant.policy == policy)
        #expect(grant.keyID == device.keyID)
        #expect(grant.recorded == RecordedUsage(monthTokens: 240, deviceRequestsThisMinute: 4, deviceRequestsLastMinute: 8))
        // A minute later the old "this minute" is the last one.
        #expect(try store.liveToken(hash: token.tokenHash, at: t0 + 60)?.recorded.deviceRequestsLastMinute == 4)

        var doubled = counters
        doubled += counters
        let rows = try store.usage(UsageFilter())
        #expect(rows.count == 2)
        let row = try #require(rows.first { $0.key.clientID == app.clientID })
        #expect(row.counters == doubled && row.workspace == "default" && row.key.model == "claude-a" && row.key.hour == hour)
        #expect(try store.usage(UsageFilter(clientID: other.clientID)).map(\.workspace) == ["team-b"])
        #expect(try store.usage(UsageFilter(workspaceID: other.workspaceID)).count == 1)
        #expect(try store.usage(UsageFilter(since: hour)).map(\.key.clientID) == [app.clientID])
        #expect(try store.usage(UsageFilter(until: hour)).map(\.key.clientID) == [other.clientID])
        // A model name with quotes and commas is kept as it is (array parameters are escaped).
        var odd = UsageBatch()
        odd.usage[UsageKey(clientID: app.clientID, model: #"we"ird,{model}\"#, hour: hour)] = counters
        try store.recordUsage(odd, purgeDeviceMinutesBefore: 0)
        #expect(try store.usage(UsageFilter(clientID: app.clientID)).contains { $0.key.model == #"we"ird,{model}\"# })
    }

    /// The refresh job's claims, as the database enforces them: each due device goes to one
    /// claimer however many ask at once, a claim lapses after its lease, a lapsed claimer's late
    /// answer is refused, and a 200 replaces the receipt while a 304 keeps it.
    @Test(arguments: Backend.allCases)
    func receiptClaimsAreExclusiveAndLapse(_ backend: Backend) async throws {
        let f = try StoreFixture(backend, poolSize: 8)
        let store = f.store
        let app = try f.integration()
        var keys: [[UInt8]] = []
        for index in 0..<40 {
            let keyID = F.bytes()
            let receipt = DeviceReceipt(der: [7, UInt8(index)], credentialCertificate: [9, UInt8(index)],
                                        risk: DeviceRisk(receiptCreatedAt: t0, receiptExpiresAt: t0 + 90 * 86_400), refreshDueAt: t0 + 10)
            #expect(try store.registerDevice(F.device(app, keyID: keyID), receipt: receipt, firstToken: F.token(app, keyID: keyID),
                                             redeeming: nil, nextChallenge: F.challenge(), quota: nil, at: t0, commitTime: { t0 }) == .committed)
            keys.append(keyID)
        }
        // A device without a validated receipt (receipts unchecked) is never due.
        _ = try f.registered(app)
        #expect(try store.claimDueReceipts(at: t0 + 5, lease: 60, limit: 100, claim: "early").isEmpty)
        #expect(try store.oldestDueReceipt(at: t0 + 30) == t0 + 10)

        // Eight claimers at once, five devices each at most: every device exactly once.
        let claims = try await withThrowingTaskGroup(of: [DueReceipt].self) { group in
            for worker in 0..<8 {
                group.addTask { try store.claimDueReceipts(at: t0 + 30, lease: 60, limit: 5, claim: "worker-\(worker)") }
            }
            var all: [DueReceipt] = []
            for try await batch in group { all += batch }
            return all
        }
        #expect(claims.count == 40)
        #expect(Set(claims.map(\.keyID)) == Set(keys))
        let first = try #require(claims.first)
        #expect(first.teamID == "ABCDE12345" && first.riskLimit == 0 && first.credentialCertificate.first == 9)
        #expect(try store.claimDueReceipts(at: t0 + 31, lease: 60, limit: 100, claim: "late").isEmpty, "live claims are skipped")

        // A 200 for the first: the receipt and metric stored, the claim released, due again later.
        let stored = try store.finishReceiptRefresh(ReceiptRefreshOutcome(
            keyID: first.keyID, claim: first.claim,
            receipt: .init(der: [8, 8], createdAt: t0 + 31, notBefore: t0 + 86_431, expiresAt: t0 + 90 * 86_400, riskMetric: 12, overLimit: true),
            checkedAt: t0 + 31, nextDue: t0 + 86_431))
        #expect(stored)
        let refreshed = try #require(try store.device(keyID: first.keyID))
        #expect(try store.devices(clientID: app.clientID, limit: 10, riskOver: 11).map(\.keyID) == [first.keyID])
        #expect(try store.devices(clientID: app.clientID, limit: 10, riskOver: 12).isEmpty)
        #expect(refreshed.risk?.metric == 12 && refreshed.risk?.checkedAt == t0 + 31 && refreshed.risk?.overLimitAt == t0 + 31)
        #expect(refreshed.risk?.receiptNotBefore == t0 + 86_431)
        // A 304 for the second keeps its receipt and sets only the next due time.
        let second = claims[1]
        #expect(try store.finishReceiptRefresh(ReceiptRefreshOutcome(keyID: second.keyID, claim: second.claim, receipt: nil,
                                                                    checkedAt: t0 + 31, nextDue: t0 + 40)))
        #expect(try store.device(keyID: second.keyID)?.risk?.metric == nil)
        // After the lease, the others are claimed again (a killed claimer's work is taken over), and
        // the lapsed claimer's late answer no longer lands.
        let retaken = try store.claimDueReceipts(at: t0 + 100, lease: 60, limit: 100, claim: "successor")
        #expect(Set(retaken.map(\.keyID)) == Set(keys.filter { $0 != first.keyID }))
        let third = try #require(claims.first { $0.keyID != first.keyID && $0.keyID != second.keyID })
        #expect(try !store.finishReceiptRefresh(ReceiptRefreshOutcome(keyID: third.keyID, claim: third.claim, receipt: nil,
                                                                     checkedAt: t0 + 101, nextDue: t0 + 200)))
        // A revoked integration's devices are never due.
        let other = try f.integration("Other")
        let keyID = F.bytes()
        _ = try store.registerDevice(F.device(other, keyID: keyID),
                                     receipt: DeviceReceipt(der: [1], credentialCertificate: [2], risk: DeviceRisk(receiptCreatedAt: t0), refreshDueAt: t0),
                                     firstToken: F.token(other, keyID: keyID), redeeming: nil, nextChallenge: F.challenge(), quota: nil, at: t0,
                                     commitTime: { t0 })
        _ = try store.revokeIntegration(clientID: other.clientID, at: t0 + 1)
        #expect(try store.claimDueReceipts(at: t0 + 300, lease: 60, limit: 100, claim: "after-revoke").allSatisfy { $0.clientID == app.clientID })
    }
}
