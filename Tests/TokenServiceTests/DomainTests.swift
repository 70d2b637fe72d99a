import AppAttest
import AttestCrypto
import Foundation
import SQLiteStore
import Testing
import TokenService

@Suite struct ValidationTests {
    @Test func teamIDsAreTenUppercaseAlphanumerics() throws {
        #expect(try Validate.teamID("ABCDE12345") == "ABCDE12345")
        // Typed in lowercase, it is the same ID.
        #expect(try Validate.teamID("abcde12345") == "ABCDE12345")
        for bad in ["ABCDE1234", "ABCDE123456", "ABCDE-1234", "ABCDÉ12345", ""] {
            #expect(throws: AdminError.self) { try Validate.teamID(bad) }
        }
        // The message names the real problem.
        do {
            _ = try Validate.teamID("ABCDÉ12345")
            Issue.record("accepted")
        } catch {
            #expect("\(error)".contains("may hold only the letters A-Z and the digits 0-9"))
        }
    }

    @Test func bundleIDsAreOneToThirtyTwoDistinctReverseDNSNames() throws {
        #expect(try Validate.bundleIDs(["com.example.app", "com.example.app-2"]).count == 2)
        #expect(try Validate.bundleIDs((0..<32).map { "com.example.a\($0)" }).count == 32)
        #expect(throws: AdminError.self) { try Validate.bundleIDs([]) }
        #expect(throws: AdminError.self) { try Validate.bundleIDs((0..<33).map { "com.example.a\($0)" }) }
        #expect(throws: AdminError.self) { try Validate.bundleIDs(["com.example.app", "com.example.app"]) }
        #expect(throws: AdminError.self) { try Validate.bundleIDs(["com.example.app", "COM.example.APP"]) }
        #expect(throws: AdminError.self) { try Validate.bundleIDs(["com.example/app"]) }
        #expect(throws: AdminError.self) { try Validate.bundleIDs(["com..example"]) }
        #expect(throws: AdminError.self) { try Validate.bundleIDs([".com.example"]) }
        #expect(throws: AdminError.self) { try Validate.bundleIDs([String(repeating: "a", count: 156)]) }
        #expect(try Validate.bundleIDs([String(repeating: "a", count: 155)]).count == 1)
    }

    @Test func environmentsParse() throws {
        #expect(try Validate.environments("development,production") == [.development, .production])
        #expect(try Validate.environments("production") == [.production])
        #expect(throws: AdminError.self) { try Validate.environments("staging") }
        #expect(throws: AdminError.self) { try Validate.environments("") }
    }
}


@Suite struct AdminServiceTests {
    func makeAdmin() throws -> (AdminService, SQLiteTokenStore, URL) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("admin-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let store = try SQLiteTokenStore(path: directory.appendingPathComponent("a.sqlite").path)
        return (AdminService(store: store), store, directory)
    }

    @Test func rolesGateIntegrationsAndRevocationIsPermanent() throws {
        let (admin, store, directory) = try makeAdmin()
        defer { try? FileManager.default.removeItem(at: directory) }
        #expect(try admin.initialize(owner: "Boss@Example.com") == .created)
        #expect(try admin.initialize(owner: "someone@example.com") == .unchanged(primaryOwner: "boss@example.com"))
        for (email, role) in [("o@example.com", Role.owner), ("a@example.com", .admin), ("d@example.com", .developer), ("u@example.com", .user)] {
            try admin.addMember(actor: "boss@example.com", email: email, role: role)
        }
        #expect(throws: AdminError.self) { try admin.addMember(actor: "a@example.com", email: "x@example.com", role: .owner) }
        #expect(throws: AdminError.self) { try admin.addMember(actor: "boss@example.com", email: "y@example.com", role: .primaryOwner) }
        for actor in ["boss@example.com", "o@example.com", "a@example.com"] {
            let integration = try admin.createIntegration(actor: actor, name: "App", teamID: "ABCDE12345", bundleIDs: ["com.example.app"])
            #expect(integration.clientID.hasPrefix("clid_") && integration.clientID.count == 5 + 24)
        }
        for actor in ["d@example.com", "u@example.com", "nobody@example.com"] {
            #expect(throws: AdminError.self) { _ = try admin.createIntegration(actor: actor, name: "App", teamID: "ABCDE12345", bundleIDs: ["com.example.app"]) }
        }
        let target = try admin.integrations().first!
        #expect(throws: AdminError.self) { try admin.revokeIntegration(actor: "u@example.com", clientID: target.clientID) }
        try admin.revokeIntegration(actor: "a@example.com", clientID: target.clientID)
        #expect(try admin.integration(target.clientID).isRevoked)
        #expect(throws: AdminError.self) { try admin.revokeIntegration(actor: "boss@example.com", clientID: target.clientID) }
        let actions = try store.auditEvents(limit: 100).map(\.action)
        #expect(actions.filter { $0 == "integration.created" }.count == 3)
        #expect(actions.contains("integration.revoked"))
    }

    @Test func clientIDsAreUniqueAndUnguessable() throws {
        let (admin, _, directory) = try makeAdmin()
        defer { try? FileManager.default.removeItem(at: directory) }
        _ = try admin.initialize(owner: "boss@example.com")
        let ids = try (0..<50).map { _ in try admin.createIntegration(actor: "boss@example.com", name: "App", teamID: "ABCDE12345", bundleIDs: ["a.b"]).clientID }
        #expect(Set(ids).count == 50)
    }

    @Test func workspacesScopeIntegrationsAndTheirRoles() throws {
        let (admin, _, directory) = try makeAdmin()
        defer { try? FileManager.default.removeItem(at: directory) }
        _ = try admin.initialize(owner: "boss@example.com")
        try admin.addMember(actor: "boss@example.com", email: "a@example.com", role: .admin)
        _ = try admin.createWorkspace(actor: "boss@example.com", name: "team-b")
        // An admin of `default` has no role in team-b.
        #expect(throws: AdminError.self) { _ = try admin.createIntegration(actor: "a@example.com", workspace: "team-b", name: "B", teamID: "ABCDE12345", bundleIDs: ["b.c"]) }
        let b = try admin.createIntegration(actor: "boss@example.com", workspace: "team-b", name: "B", teamID: "ABCDE12345", bundleIDs: ["b.c"])
        #expect(b.workspaceName == "team-b")
        #expect(try admin.integrations(workspace: "default").isEmpty)
        #expect(try admin.integrations(workspace: "team-b").count == 1)
    }
}

/// Every App Attest verification step has a rejection reason of the same name: the mapping the
/// service logs and counts by is total, so no verification failure is reported as another.
@Suite struct RejectionReasonMappingTests {
    @Test func everyVerificationReasonHasARejectionReason() {
        for reason in VerificationReason.allCases {
            #expect(RejectionReason(rawValue: reason.rawValue) != nil, "\(reason.rawValue)")
            #expect(RejectionReason(reason).rawValue == reason.rawValue)
        }
    }
}
