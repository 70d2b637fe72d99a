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

        // A registration without a quota: the challenge, the device, the token, the older tokens.
        let fresh = F.device(app), issued = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: fresh.keyID, fresh: F.challenge(), at: F.t0)
        let registering = try statements()
        #expect(try store.registerDevice(fresh, receipt: [1], firstToken: F.token(app, keyID: fresh.keyID), redeeming: issued.bytes,
                                         nextChallenge: F.challenge(), at: F.t0) == .committed)
        #expect(try statements() - registering == 4)
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
}
