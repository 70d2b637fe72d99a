import Foundation
import Synchronization
import Testing
import TokenService
@testable import SQLiteStore

/// SQLite's reader connections are lent most recently returned first: in WAL mode a connection
/// whose next read finds another connection's commit drops its whole page cache, so reads spread
/// over every connection in turn start cold almost every time, and reads on the connection used
/// last start warm until the next commit.
@Suite(.timeLimit(.minutes(2)))
struct SQLiteReaderPoolTests {
    typealias F = StoreFixture

    static func connections(_ count: Int) throws -> [SQLiteConnection] {
        try (0..<count).map { _ in try SQLiteConnection(path: ":memory:") }
    }

    static func lent(_ pool: SQLiteReaderPool) throws -> ObjectIdentifier {
        try pool.withConnection { ObjectIdentifier($0) }
    }

    @Test func theConnectionReturnedLastIsLentNext() throws {
        let connections = try Self.connections(4)
        let pool = SQLiteReaderPool(connections)
        let first = try Self.lent(pool)
        for _ in 0..<10 { #expect(try Self.lent(pool) == first) }
        // While it is lent another is lent beside it; once both are back, the one returned last comes first.
        let (outer, inner) = try pool.withConnection { outer in (ObjectIdentifier(outer), try Self.lent(pool)) }
        #expect(outer == first && inner != first)
        #expect(try Self.lent(pool) == first)
        #expect(connections.contains { ObjectIdentifier($0) == inner })
    }

    @Test func aBorrowerWaitsWhileEveryConnectionIsLentAndGetsTheOneReturned() throws {
        let pool = SQLiteReaderPool(try Self.connections(2))
        let holding = DispatchSemaphore(value: 0)
        let releases = [DispatchSemaphore(value: 0), DispatchSemaphore(value: 0)]
        let held = Mutex<[Int: ObjectIdentifier]>([:])
        let holders = DispatchGroup()
        for (index, release) in releases.enumerated() {
            holders.enter()
            Thread {
                _ = try? pool.withConnection { connection in
                    held.withLock { $0[index] = ObjectIdentifier(connection) }
                    holding.signal()
                    release.wait()
                }
                holders.leave()
            }.start()
        }
        holding.wait(); holding.wait()
        let got = Mutex<ObjectIdentifier?>(nil)
        let borrowed = DispatchSemaphore(value: 0)
        Thread {
            let connection = try? Self.lent(pool)
            got.withLock { $0 = connection }
            borrowed.signal()
        }.start()
        let deadline = Date() + 30
        while pool.waiting == 0 && Date() < deadline { Thread.sleep(forTimeInterval: 0.002) }
        #expect(pool.waiting == 1)
        #expect(got.withLock { $0 } == nil)

        releases[1].signal()   // the second holder returns its connection: the borrower gets that one
        #expect(borrowed.wait(timeout: .now() + 30) == .success)
        releases[0].signal()
        #expect(holders.wait(timeout: .now() + 30) == .success)
        let second = held.withLock { $0[1] }
        #expect(second != nil && second != held.withLock { $0[0] })
        #expect(got.withLock { $0 } == second)
        #expect(pool.waiting == 0)
    }

    /// The store's own reads: after a commit, a run of exchange reads misses the cache on one
    /// connection only (round-robin over eight readers missed on each of them).
    @Test func readsAfterACommitStartColdOnOneReaderOnly() throws {
        let f = try StoreFixture(.sqlite, sqliteReaders: 8)
        let store = try #require(f.store as? SQLiteTokenStore)
        let app = try f.integration()
        let devices = try (0..<8).map { _ in try f.registered(app) }
        func misses() -> [Int] { store.readers.idleConnections { $0.map(\.cacheMisses) } }

        for (device, _, _) in devices { _ = try store.exchangeContext(clientID: app.clientID, keyID: device.keyID, at: F.t0) }
        // A commit by the writer: every reader's next read finds the database changed.
        let (device, _, challenge) = devices[0]
        #expect(try store.advanceCounter(clientID: app.clientID, keyID: device.keyID, from: 0, to: 1,
                                         token: F.token(app, keyID: device.keyID, at: F.t0 + 1), redeeming: challenge.bytes,
                                         nextChallenge: F.challenge(), at: F.t0 + 1) == .committed)
        let before = misses()
        for (device, _, _) in devices {
            let context = try store.exchangeContext(clientID: app.clientID, keyID: device.keyID, at: F.t0 + 1)
            #expect(context.device?.keyID == device.keyID)
        }
        let after = misses()
        let cold = zip(before, after).filter { $0 != $1 }.count
        #expect(cold == 1, "readers that read pages from the file after the commit: \(cold) of 8")
    }
}
