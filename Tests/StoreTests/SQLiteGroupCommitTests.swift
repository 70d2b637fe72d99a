import Foundation
import Synchronization
import Testing
import TokenService
@testable import SQLiteStore

/// The exchange's commits on SQLite are batched: while the writer is busy, the exchanges that
/// arrive wait together and commit in one transaction, each in its own savepoint. Each must come
/// out exactly as if it had committed alone: one that fails is rolled back alone (its challenge
/// stays pending), a lost counter race still reads `.conflict`, the others commit.
@Suite(.timeLimit(.minutes(2)))
struct SQLiteGroupCommitTests {
    typealias F = StoreFixture

    /// The writer's batches run one at a time, so each statement of an exchange is paid in series:
    /// redeeming the challenge and storing the next one is one statement, as is each of the rest.
    @Test func aRefreshIsFourStatementsOnTheWriter() throws {
        let f = try StoreFixture(.sqlite)
        let store = try #require(f.store as? SQLiteTokenStore)
        let app = try f.integration()
        let (device, _, challenge) = try f.registered(app)
        func statements() throws -> Int { try store.writer.withConnection { $0.statementsRun } }

        let before = try statements(), next = F.challenge()
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 1, token: F.token(app, keyID: device.keyID, at: F.t0 + 1),
                                         redeeming: challenge.bytes, nextChallenge: next, at: F.t0 + 1) == .committed)
        // The challenge redeemed and the next stored, the counter, the token, the device's older tokens.
        #expect(try statements() - before == 4)
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: F.t0 + 1) == next.bytes)

        // A registration without a quota: the challenge, the device, its receipt (beside the row since
        // migration 0012: a device's searches stay off overflow pages), the token, the older tokens.
        let fresh = F.device(app), issued = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: fresh.keyID, fresh: F.challenge(), at: F.t0)
        let registering = try statements()
        #expect(try store.registerDevice(fresh, receipt: [1], firstToken: F.token(app, keyID: fresh.keyID), redeeming: issued.bytes,
                                         nextChallenge: F.challenge(), at: F.t0) == .committed)
        #expect(try statements() - registering == 5)
    }

    @Test func exchangesThatWaitTogetherCommitTogetherAndEachAsIfAlone() throws {
        let f = try StoreFixture(.sqlite)
        let store = try #require(f.store as? SQLiteTokenStore)
        let app = try f.integration()
        let devices = try (0..<8).map { _ in try f.registered(app) }
        let taken = devices[0].1.tokenHash   // a token hash already stored: the insert that reuses it fails

        // Hold the writer, so that every exchange below has to wait for it.
        let holding = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let holder = Thread { _ = try? store.write { _ in holding.signal(); release.wait() } }
        holder.start()
        holding.wait()
        let before = store.groupCommit.counts

        let results = Mutex<[Int: Result<CommitResult, any Error>]>([:])
        let done = DispatchGroup()
        for index in 0..<8 {
            done.enter()
            Thread {
                let (device, _, challenge) = devices[index]
                var token = F.token(app, keyID: device.keyID, at: F.t0 + 1)
                if index == 5 { token = TokenRecord(tokenHash: taken, clientID: app.clientID, workspaceID: app.workspaceID, keyID: device.keyID,
                                                     issuedAt: F.t0 + 1, expiresAt: F.t0 + 3600) }
                let result = Result {
                    try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: index == 3 ? 7 : 0, to: 9, token: token,
                                             redeeming: challenge.bytes, nextChallenge: F.challenge(), at: F.t0 + 1)
                }
                results.withLock { $0[index] = result }
                done.leave()
            }.start()
        }
        // One of them commits for the first batch and waits for the writer; the other seven queue.
        let deadline = Date() + 30
        while store.groupCommit.waiting < 7 && Date() < deadline { Thread.sleep(forTimeInterval: 0.005) }
        #expect(store.groupCommit.waiting == 7)
        release.signal()
        #expect(done.wait(timeout: .now() + 30) == .success)

        let after = store.groupCommit.counts
        #expect(after.jobs - before.jobs == 8 && after.batches - before.batches == 2)
        let outcome = results.withLock { $0 }
        for index in 0..<8 {
            let (device, _, challenge) = devices[index]
            let stored = try #require(try store.device(clientID: app.clientID, keyID: device.keyID))
            switch index {
            case 3:
                // Lost the race: the challenge is used up all the same, the counter stays.
                #expect(try outcome[index]?.get() == .conflict)
                let pending = try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: F.t0 + 1)
                #expect(stored.counter == 0 && pending == nil)
            case 5:
                // Failed: rolled back alone, as if it had never run.
                #expect(throws: (any Error).self) { try outcome[index]?.get() }
                let pending = try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: F.t0 + 1)
                #expect(stored.counter == 0 && pending == challenge.bytes)
            default:
                #expect(try outcome[index]?.get() == .committed)
                #expect(stored.counter == 9)
            }
        }
    }

    @Test func aLoneExchangeCommitsWithoutASavepointAndAFailureRollsItBack() throws {
        let f = try StoreFixture(.sqlite)
        let store = try #require(f.store as? SQLiteTokenStore)
        let app = try f.integration()
        let (device, token, challenge) = try f.registered(app)
        let before = store.groupCommit.counts
        // The first token's hash again: the insert fails, and the redeemed challenge comes back.
        #expect(throws: (any Error).self) {
            try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 1, token: token, redeeming: challenge.bytes,
                                     nextChallenge: F.challenge(), at: F.t0 + 1)
        }
        #expect(try store.pendingChallenge(clientID: app.clientID, keyID: device.keyID, at: F.t0 + 1) == challenge.bytes)
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 1, token: F.token(app, keyID: device.keyID),
                                         redeeming: challenge.bytes, nextChallenge: F.challenge(), at: F.t0 + 1) == .committed)
        let after = store.groupCommit.counts
        #expect(after.batches - before.batches == 2 && after.jobs - before.jobs == 2)
    }

    /// Nobody is held for a batch: while one thread commits (held up here by the writer's lock),
    /// `submit` from another thread returns at once, and the committing thread answers every
    /// transaction after the COMMIT that holds it. A completion that writes again through the
    /// group, on the committing thread between two batches, commits at once instead of waiting
    /// for itself.
    @Test func submittersAreNotHeldAndTheCommittingThreadAnswersEach() throws {
        let f = try StoreFixture(.sqlite)
        let store = try #require(f.store as? SQLiteTokenStore)
        let app = try f.integration()
        let devices = try (0..<9).map { _ in try f.registered(app) }
        @Sendable func refresh(_ index: Int, completion: @escaping @Sendable (Result<CommitResult, any Error>) -> Void) {
            let (device, _, challenge) = devices[index]
            store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 5, refresh: nil, token: F.token(app, keyID: device.keyID, at: F.t0 + 1),
                                 redeeming: challenge.bytes, nextChallenge: F.challenge(), at: F.t0 + 1, commitTime: { F.t0 + 1 }, completion: completion)
        }

        let holding = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let holder = Thread { _ = try? store.write { _ in holding.signal(); release.wait() } }
        holder.start()
        holding.wait()
        let before = store.groupCommit.counts

        // Each answer: its result and the thread that gave it.
        let answers = Mutex<[Int: (result: Result<CommitResult, any Error>, thread: pthread_t)]>([:])
        let nested = Mutex<Result<CommitResult, any Error>?>(nil)
        let answered = DispatchSemaphore(value: 0)
        let committer = Mutex<pthread_t?>(nil)
        let first = Thread {
            committer.withLock { $0 = pthread_self() }
            refresh(0) { result in
                // On the committing thread, with seven more queued: the waiting form commits at once.
                let (device, _, challenge) = devices[8]
                nested.withLock {
                    $0 = Result {
                        try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 5, token: F.token(app, keyID: device.keyID, at: F.t0 + 1),
                                                 redeeming: challenge.bytes, nextChallenge: F.challenge(), at: F.t0 + 1)
                    }
                }
                answers.withLock { $0[0] = (result, pthread_self()) }
                answered.signal()
            }
        }
        first.start()
        let deadline = Date() + 30
        while !store.groupCommit.isCommitting && Date() < deadline { Thread.sleep(forTimeInterval: 0.005) }
        // The first is committing now, blocked by the writer's lock; these return without it.
        for index in 1..<8 {
            refresh(index) { result in
                answers.withLock { $0[index] = (result, pthread_self()) }
                answered.signal()
            }
        }
        #expect(answers.withLock { $0.isEmpty })
        #expect(store.groupCommit.waiting == 7)
        release.signal()
        for _ in 0..<8 { #expect(answered.wait(timeout: .now() + 30) == .success) }

        let thread = try #require(committer.withLock { $0 })
        for (index, answer) in answers.withLock({ $0 }).sorted(by: { $0.key < $1.key }) {
            #expect(try answer.result.get() == .committed, "\(index)")
            #expect(pthread_equal(answer.thread, thread) != 0, "\(index) answered on the committing thread")
            #expect(try store.device(clientID: app.clientID, keyID: devices[index].0.keyID)?.counter == 5)
        }
        #expect(try nested.withLock { $0 }?.get() == .committed)
        #expect(try store.device(clientID: app.clientID, keyID: devices[8].0.keyID)?.counter == 5)
        // The first alone, the nested one at once, then the seven together.
        let after = store.groupCommit.counts
        #expect(after.batches - before.batches == 3 && after.jobs - before.jobs == 9)
    }
}
