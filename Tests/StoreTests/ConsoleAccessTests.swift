import Foundation
import Synchronization
import Testing
import TokenService

/// The console's sign-in links and sessions, on SQLite and on PostgreSQL, with the service's
/// clock moved by hand: a link works once and for 10 minutes; a session ends after 30 minutes
/// idle, after 12 hours whatever, on sign-out and when its membership goes.
@Suite(.timeLimit(.minutes(2)))
struct ConsoleAccessTests {
    final class Clock: Sendable {
        let now = Mutex(StoreFixture.t0)
        func advance(_ seconds: TimeInterval) { now.withLock { $0 += seconds } }
    }

    func service(_ backend: Backend) throws -> (AdminService, Clock, StoreFixture) {
        let f = try StoreFixture(backend)
        let clock = Clock()
        let admin = AdminService(store: f.store, now: { clock.now.withLock { $0 } })
        _ = try admin.initialize(owner: "owner@example.com")
        try admin.addMember(actor: "owner@example.com", email: "dev@example.com", role: .developer)
        return (admin, clock, f)
    }

    func signIn(_ admin: AdminService, _ email: String) throws -> String {
        guard case .signedIn(let token, _) = try admin.signIn(linkToken: try admin.createSignInLink(for: email)) else {
            throw FixtureError("sign-in refused")
        }
        return token
    }

    @Test(arguments: Backend.allCases)
    func aLinkWorksOnceWithinTenMinutesAndOnlyForMembers(_ backend: Backend) throws {
        let (admin, clock, _) = try service(backend)
        let link = try admin.createSignInLink(for: "dev@example.com")
        clock.advance(9 * 60 + 59)
        guard case .signedIn(let token, let session) = try admin.signIn(linkToken: link) else {
            Issue.record("a link 9:59 old was refused")
            return
        }
        #expect(session.email == "dev@example.com" && session.role == .developer && session.workspace.name == "default")
        #expect(try admin.consoleSession(token: token) == session)
        #expect(try admin.signIn(linkToken: link) == .refused(.alreadyUsed))

        let late = try admin.createSignInLink(for: "dev@example.com")
        clock.advance(10 * 60)
        #expect(try admin.signIn(linkToken: late) == .refused(.expired))
        #expect(try admin.signIn(linkToken: String(repeating: "A", count: 43)) == .refused(.unknown))
        #expect(try admin.signIn(linkToken: "short") == .refused(.unknown))
        #expect(throws: AdminError.self) { _ = try admin.createSignInLink(for: "stranger@example.com") }
    }

    @Test(arguments: Backend.allCases)
    func ofConcurrentUsesOfOneLinkExactlyOneSignsIn(_ backend: Backend) throws {
        let (admin, _, _) = try service(backend)
        let link = try admin.createSignInLink(for: "owner@example.com")
        let results = try concurrently(8) { _ in try admin.signIn(linkToken: link) }
        let signedIn = results.filter { if case .success(.signedIn) = $0 { true } else { false } }
        let refused = results.filter { if case .success(.refused(.alreadyUsed)) = $0 { true } else { false } }
        #expect(signedIn.count == 1 && refused.count == 7)
    }

    @Test(arguments: Backend.allCases)
    func aSessionEndsIdleAfterThirtyMinutesAndInAllAfterTwelveHours(_ backend: Backend) throws {
        let (admin, clock, _) = try service(backend)
        let idle = try signIn(admin, "owner@example.com")
        clock.advance(29 * 60)
        #expect(try admin.consoleSession(token: idle) != nil)   // seen: the idle clock restarts
        clock.advance(29 * 60)
        #expect(try admin.consoleSession(token: idle) != nil)
        clock.advance(30 * 60 + 1)
        #expect(try admin.consoleSession(token: idle) == nil)
        // A busy session still ends 12 hours after it began.
        let busy = try signIn(admin, "owner@example.com")
        for _ in 0..<24 {   // seen every 29 minutes: 11 h 36 min
            clock.advance(29 * 60)
            #expect(try admin.consoleSession(token: busy) != nil)
        }
        clock.advance(23 * 60)   // 11 h 59 min
        #expect(try admin.consoleSession(token: busy) != nil)
        clock.advance(61)   // 12 h 00 min 01 s
        #expect(try admin.consoleSession(token: busy) == nil)
    }

    @Test(arguments: Backend.allCases)
    func anIntegrationsHistoryIsFoundAmongAllItsDevicesEvents(_ backend: Backend) throws {
        let (admin, _, f) = try service(backend)
        let app = try admin.createIntegration(actor: "owner@example.com", name: "App", teamID: "ABCDE12345", bundleIDs: ["com.example.app"])
        #expect(try admin.history(app.clientID).revoked == nil)
        try f.store.appendAudit((0..<600).map { _ in AuditEvent(at: StoreFixture.t0, action: "device.registered", clientID: app.clientID) })
        try admin.revokeIntegration(actor: "owner@example.com", clientID: app.clientID)
        let (created, revoked) = try admin.history(app.clientID)
        #expect(created?.actor == "owner@example.com" && created?.action == "integration.created")
        #expect(revoked?.actor == "owner@example.com" && revoked?.action == "integration.revoked")
        // Pages by key: the second page starts after the first page's last row, with no row twice.
        let first = try admin.auditPage(app.clientID, beforeID: nil, perPage: 50)
        let second = try admin.auditPage(app.clientID, beforeID: first.last?.id, perPage: 50)
        #expect(first.count == 50 && second.count == 50)
        #expect(Set(first.compactMap(\.id)).isDisjoint(with: second.compactMap(\.id)))
        #expect((second.first?.id ?? .max) < (first.last?.id ?? 0))
    }

    @Test(arguments: Backend.allCases)
    func signingOutAndRemovingTheMemberEndTheirSessionsAndARoleChangeShowsAtOnce(_ backend: Backend) throws {
        let (admin, _, f) = try service(backend)
        let first = try signIn(admin, "dev@example.com"), second = try signIn(admin, "dev@example.com")
        try admin.signOut(token: first, actor: "dev@example.com")
        #expect(try admin.consoleSession(token: first) == nil)
        #expect(try admin.consoleSession(token: second)?.role == .developer)
        #expect(try admin.members().map(\.email).sorted() == ["dev@example.com", "owner@example.com"])

        // An admin may not remove an owner; nobody removes the primary owner.
        try admin.addMember(actor: "owner@example.com", email: "admin@example.com", role: .admin)
        try admin.addMember(actor: "owner@example.com", email: "owner2@example.com", role: .owner)
        #expect(throws: AdminError.self) { try admin.removeMember(actor: "admin@example.com", email: "owner2@example.com") }
        #expect(throws: AdminError.self) { try admin.removeMember(actor: "owner2@example.com", email: "owner@example.com") }
        #expect(throws: AdminError.self) { try admin.removeMember(actor: "dev@example.com", email: "admin@example.com") }

        try admin.removeMember(actor: "admin@example.com", email: "dev@example.com")
        #expect(try admin.consoleSession(token: second) == nil)
        // Added back, the old session stays ended.
        try admin.addMember(actor: "owner@example.com", email: "dev@example.com", role: .admin)
        #expect(try admin.consoleSession(token: second) == nil)
        let fresh = try signIn(admin, "dev@example.com")
        #expect(try admin.consoleSession(token: fresh)?.role == .admin)
        #expect(try f.auditEvents().contains { $0.action == "member.removed" && $0.actor == "admin@example.com" })
        // Purged once past their ends: the ended sessions and used links go, the live session stays.
        #expect(try f.store.purgeConsoleAccess(before: StoreFixture.t0 + 1) >= 2)
        #expect(try admin.consoleSession(token: fresh) != nil)
    }
}
