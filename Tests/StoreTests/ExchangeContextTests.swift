import Foundation
import PostgresStore
import Testing
import TokenService

/// The one read an exchange starts from, on SQLite and PostgreSQL: the same answers as the three
/// reads it replaces, in every combination, and one round trip on PostgreSQL.
@Suite(.timeLimit(.minutes(2)))
struct ExchangeContextTests {
    typealias F = StoreFixture

    @Test(arguments: Backend.allCases)
    func theOneReadAnswersAsTheThreeDid(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let store = f.store
        let app = try f.integration()
        let keyID = F.bytes()
        func check(_ what: String, at time: Date = F.t0) throws {
            let context = try store.exchangeContext(clientID: app.clientID, keyID: keyID, at: time)
            #expect(context.integration == (try store.integration(clientID: app.clientID)), "\(what)")
            #expect(context.challenge == (try store.pendingChallenge(clientID: app.clientID, keyID: keyID, at: time)), "\(what)")
            #expect(context.device == (try store.device(clientID: app.clientID, keyID: keyID)), "\(what)")
        }
        try check("nothing yet")
        let unknown = try store.exchangeContext(clientID: "clid_nobody", keyID: keyID, at: F.t0)
        #expect(unknown.integration == nil && unknown.challenge == nil && unknown.device == nil)

        let issued = try store.pendingOrNewChallenge(clientID: app.clientID, keyID: keyID, fresh: F.challenge(), at: F.t0)
        try check("a pending challenge, no device")
        #expect(try store.exchangeContext(clientID: app.clientID, keyID: keyID, at: F.t0).challenge == issued.bytes)
        try check("the challenge expired", at: F.t0 + 301)
        #expect(try store.exchangeContext(clientID: app.clientID, keyID: keyID, at: F.t0 + 301).challenge == nil)

        let next = F.challenge()
        #expect(try store.registerDevice(F.device(app, keyID: keyID), receipt: [1], firstToken: F.token(app, keyID: keyID), redeeming: issued.bytes,
                                         nextChallenge: next, at: F.t0) == .committed)
        try check("registered, with the next challenge")
        let context = try store.exchangeContext(clientID: app.clientID, keyID: keyID, at: F.t0)
        #expect(context.device?.keyID == keyID && context.challenge == next.bytes && context.integration?.clientID == app.clientID)
        _ = try store.consumeChallenge(clientID: app.clientID, keyID: keyID, at: F.t0)
        try check("registered, challenge used")
        // Another integration's device with the same key ID is not this one's.
        let other = try f.integration("Other")
        let elsewhere = try store.exchangeContext(clientID: other.clientID, keyID: keyID, at: F.t0)
        #expect(elsewhere.integration?.clientID == other.clientID && elsewhere.device == nil && elsewhere.challenge == nil)
        _ = try store.revokeIntegration(clientID: app.clientID, at: F.t0)
        #expect(try store.exchangeContext(clientID: app.clientID, keyID: keyID, at: F.t0).integration?.isRevoked == true)
    }

    @Test func onPostgreSQLItIsOneRoundTrip() throws {
        let f = try StoreFixture(.postgres, poolSize: 1)
        let store = try #require(f.store as? PostgresTokenStore)
        let app = try f.integration()
        _ = try store.exchangeContext(clientID: app.clientID, keyID: F.bytes(), at: F.t0)   // the connection is open
        let before = store.roundTrips, prepared = store.preparations
        let context = try store.exchangeContext(clientID: app.clientID, keyID: F.bytes(), at: F.t0)
        #expect(store.roundTrips - before == 1 && context.integration?.clientID == app.clientID)
        // Prepared once on this connection: not parsed and planned again.
        #expect(store.preparations == prepared && prepared > 0)
    }
}
