import Dispatch
import EventLoops
import Foundation
import PostgresStore
import PostgresTestSupport
import Synchronization
import Testing
import TokenService

/// The token check on an event loop's own PostgreSQL connection: it answers what the blocking
/// check answers, several checks share one query, a revocation is seen by the next check, and a
/// broken or stalled connection fails its checks (never the loop) and is replaced.
@Suite(.serialized) struct PostgresLoopTokenCheckTests {
    /// What one check gave back, with the thread it came on.
    struct Answer: Sendable {
        let hash: [UInt8]
        let result: Result<TokenCheck, any Error>
        let onLoop: Bool
    }

    final class Answers: Sendable {
        private let answers = Mutex<[Answer]>([])
        private let arrived = DispatchSemaphore(value: 0)
        func add(_ answer: Answer) {
            answers.withLock { $0.append(answer) }
            arrived.signal()
        }
        var count: Int { answers.withLock { $0.count } }
        /// Waits for `count` answers (the event), failing after a generous bound.
        func wait(for count: Int, seconds: Double = 20) throws -> [Answer] {
            for _ in 0..<count {
                guard arrived.wait(timeout: .now() + seconds) == .success else { throw FixtureError("an answer never came") }
            }
            return answers.withLock { $0 }
        }
    }

    /// Starts the checks of `hashes` in one turn of `loop`, as requests arriving together would.
    func check(_ hashes: [[UInt8]], on loop: EventLoop, with checks: PostgresLoopTokenChecks, mark: Int = 7) throws -> [Answer] {
        let answers = Answers()
        let started = Atomic<Int>(0)
        loop.execute {
            for hash in hashes {
                let taken = checks.check(hash: hash, markBeforeCheck: { mark }) { result in
                    answers.add(Answer(hash: hash, result: result, onLoop: loop.inLoop))
                }
                if taken { started.add(1, ordering: .relaxed) }
            }
        }
        let all = try answers.wait(for: hashes.count)
        #expect(started.load(ordering: .relaxed) == hashes.count)
        return all
    }

    func fixture(callTimeout: Double = 2, serverTimeouts: Int? = nil, applicationName: String = "attestd") throws -> StoreFixture {
        var configuration = PostgresConfiguration(poolSize: 2, callTimeout: callTimeout, applicationName: applicationName)
        if let serverTimeouts {
            configuration.statementTimeoutMilliseconds = serverTimeouts
            configuration.lockTimeoutMilliseconds = serverTimeouts
        }
        return try StoreFixture(.postgres, configuration: configuration)
    }

    @Test func checksAnswerAsTheBlockingCheckDoesAndShareQueries() throws {
        let f = try fixture()
        let store = try #require(f.store as? PostgresTokenStore)
        let app = try f.integration()
        var hashes: [[UInt8]] = []
        for _ in 0..<12 { hashes.append(try f.registered(app).1.tokenHash) }
        // A token of a revoked integration, one nobody issued, and hashes with a NUL and 0xff bytes.
        let gone = try f.integration("Gone")
        let goneHash = try f.registered(gone).1.tokenHash
        #expect(try f.store.revokeIntegration(clientID: gone.clientID, at: StoreFixture.t0))
        hashes += [goneHash, StoreFixture.bytes(), [UInt8](repeating: 0, count: 32), [UInt8](repeating: 0xff, count: 32), hashes[0]]
        let loops = try EventLoopGroup(loops: 1, name: "check-test")
        defer { loops.shutdown() }
        let checks = PostgresLoopTokenChecks(store: store, loops: loops, now: { StoreFixture.t0 })
        defer { checks.shutdown() }
        let answers = try check(hashes, on: loops.loops[0], with: checks)
        #expect(answers.count == hashes.count)
        var live = 0
        for answer in answers {
            let found = try answer.result.get()
            #expect(answer.onLoop, "answered on the loop that asked")
            #expect(found.grant == (try store.liveToken(hash: answer.hash, at: StoreFixture.t0)), "the blocking check agrees")
            #expect(found.checkedAt == StoreFixture.t0 && found.markBeforeCheck == 7)
            if found.grant != nil { live += 1 }
        }
        #expect(live == 13, "the twelve tokens, one of them twice; nothing for the revoked, unknown or made-up hashes")
        // Asked for in one turn of the loop, they went out together, in one query.
        let figures = checks.figures
        #expect(figures.checks == hashes.count)
        #expect(figures.queries == 1, "\(figures.queries) queries for \(figures.checks) checks")
        // Off a loop the checks decline: the caller uses the blocking call.
        let offLoop = checks.check(hash: hashes[0], markBeforeCheck: { 0 }, done: { _ in })
        #expect(!offLoop)
    }

    /// A store with one integration and one device's token, a loop, and the loop's checks.
    final class Setup: Sendable {
        let fixture: StoreFixture
        let app: Integration
        let hash: [UInt8]
        let loops: EventLoopGroup
        let checks: PostgresLoopTokenChecks
        var loop: EventLoop { loops.loops[0] }

        init(_ fixture: StoreFixture) throws {
            self.fixture = fixture
            app = try fixture.integration()
            hash = try fixture.registered(app).1.tokenHash
            loops = try EventLoopGroup(loops: 1, name: "check-test")
            checks = PostgresLoopTokenChecks(store: try requireValue(fixture.store as? PostgresTokenStore), loops: loops, now: { StoreFixture.t0 })
        }

        deinit {
            checks.shutdown()
            loops.shutdown()
        }
    }

    @Test func aPolicyChangeOrARevocationIsSeenByTheNextCheck() throws {
        let setup = try Setup(try fixture())
        let (f, app, hash, loops, checks) = (setup.fixture, setup.app, setup.hash, setup.loops, setup.checks)
        #expect(try check([hash], on: loops.loops[0], with: checks)[0].result.get().grant?.clientID == app.clientID)
        // A grant decoded before is not served once its row changed: a new policy shows at once.
        #expect(try f.store.updatePolicy(clientID: app.clientID, IntegrationPolicy(models: ["claude-test-1"], maxTokens: 77)))
        let changed = try check([hash], on: loops.loops[0], with: checks)[0].result.get().grant?.policy
        #expect(changed?.models == ["claude-test-1"] && changed?.maxTokens == 77)
        #expect(try f.store.revokeIntegration(clientID: app.clientID, at: StoreFixture.t0))
        #expect(try check([hash], on: loops.loops[0], with: checks)[0].result.get().grant == nil)
    }

    @Test func aTerminatedSessionIsReplacedWithoutFailingACheck() throws {
        let name = "attestd-check-\(UUID().uuidString.prefix(8))"
        let setup = try Setup(try fixture(applicationName: name))
        let (f, app, hash, loops, checks) = (setup.fixture, setup.app, setup.hash, setup.loops, setup.checks)
        #expect(try check([hash], on: loops.loops[0], with: checks)[0].result.get().grant != nil)
        let cluster = try PostgresCluster.shared.get()
        let terminated = try cluster.superuser { connection in
            try connection.query("SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity WHERE application_name = $1 AND datname = $2",
                                 [.text(name), .text(f.database!)]).first { try $0.int("n") } ?? 0
        }
        #expect(terminated >= 1)
        // The loop finds the session gone (its socket, watched while idle, turns readable), or a
        // check sent on it meets the loss and goes out once more on a new connection: no check fails.
        var failures = 0
        var grant: TokenGrant?
        for _ in 0..<5 where grant == nil {
            switch try check([hash], on: loops.loops[0], with: checks)[0].result {
            case .success(let found): grant = found.grant
            case .failure(let error):
                failures += 1
                #expect((error as? PostgresError)?.isUnavailable == true, "\(error)")
            }
        }
        #expect(grant?.clientID == app.clientID)
        #expect(failures == 0)
    }

    @Test func aStalledQueryFailsAtTheDeadlineWhileTheLoopRunsOn() throws {
        // The server's statement and lock timeouts above our own deadline: the client's deadline decides.
        let setup = try Setup(try fixture(callTimeout: 2, serverTimeouts: 10_000))
        let (f, hash, checks) = (setup.fixture, setup.hash, setup.checks)
        let loop = setup.loop
        checks.warm(timeout: 10)
        let cluster = try PostgresCluster.shared.get()
        let release = try cluster.lockTable("tokens", in: f.database!)
        var released = false
        defer { if !released { release() } }
        let answers = Answers()
        loop.execute {
            _ = checks.check(hash: hash, markBeforeCheck: { 0 }) { answers.add(Answer(hash: hash, result: $0, onLoop: loop.inLoop)) }
        }
        // While the check waits behind the lock, the loop runs other work at once.
        var waited = 0
        for _ in 0..<500 where waited == 0 {
            waited = try cluster.sessionsWaitingForALock(in: f.database!)
            if waited == 0 { Thread.sleep(forTimeInterval: 0.01) }
        }
        try #require(waited > 0, "the check never reached the lock")
        let order = Mutex<[String]>([])
        let ran = DispatchSemaphore(value: 0)
        loop.execute {
            order.withLock { $0.append(answers.count == 0 ? "task before the answer" : "task after the answer") }
            ran.signal()
        }
        #expect(ran.wait(timeout: .now() + 20) == .success)
        #expect(order.withLock { $0 } == ["task before the answer"], "the loop ran a task while the check waited")
        let stalled = try answers.wait(for: 1)[0]
        guard case .failure(let error) = stalled.result else {
            Issue.record("a check behind a lock answered: \(stalled.result)")
            return
        }
        #expect((error as? PostgresError)?.kind == .timeout, "\(error)")
        release()
        released = true
        // A new connection answers the next check.
        #expect(try check([hash], on: loop, with: checks)[0].result.get().grant != nil)
    }
}
