import Foundation
import Testing
import TokenService

/// Where each attestd listens, on SQLite and on PostgreSQL: a row per host and public listener,
/// replaced when that instance starts again, read newest start first.
@Suite(.timeLimit(.minutes(2)))
struct AttestdInstanceStoreTests {
    @Test(arguments: Backend.allCases)
    func aRestartReplacesItsRowAndTheNewestStartComesFirst(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let t0 = StoreFixture.t0
        #expect(try f.store.attestdInstances().isEmpty)
        var a = AttestdInstance(host: "host-a", publicAddress: "127.0.0.1:8080", adminAddress: "127.0.0.1:9090", baseURLs: [],
                                version: "1.0.0 (commit 0123abcd)", startedAt: t0 - 60, processID: 41)
        let b = AttestdInstance(host: "host-b", publicAddress: "[::1]:8080", adminAddress: nil,
                                baseURLs: ["https://attest-admin.example.com", "https://admin.internal"], version: "1.0.0 (commit unknown)",
                                startedAt: t0 - 30, processID: 7)
        for instance in [a, b] { try f.store.recordInstance(instance) }
        // Every field as written (times to the bit, the URLs in order, no admin listener as nil).
        #expect(try f.store.attestdInstances() == [b, a])
        // host-a restarts with another admin port: its row changes, no row is added, and it is now the newest.
        a.adminAddress = "127.0.0.1:9091"
        a.startedAt = t0
        a.processID = 42
        try f.store.recordInstance(a)
        #expect(try f.store.attestdInstances() == [a, b])
        // The console a command on host-b links to is host-b's (its first --base-url); elsewhere, the newest.
        #expect(AttestdInstance.likelyConsole(among: try f.store.attestdInstances(), host: "host-b")?.consoleBaseURL == "https://attest-admin.example.com")
        #expect(AttestdInstance.likelyConsole(among: try f.store.attestdInstances(), host: "host-c")?.consoleBaseURL == "http://127.0.0.1:9091")
    }

    @Test func aWildcardAdminListenerIsLinkedOnLoopback() {
        func instance(_ admin: String) -> AttestdInstance {
            AttestdInstance(host: "h", publicAddress: "0.0.0.0:8080", adminAddress: admin, baseURLs: [], version: "v", startedAt: Date(), processID: 1)
        }
        #expect(instance("0.0.0.0:9090").consoleBaseURL == "http://127.0.0.1:9090")
        #expect(instance("[::]:9090").consoleBaseURL == "http://[::1]:9090")
        #expect(instance("[::1]:9443").consoleBaseURL == "http://[::1]:9443")
        #expect(AttestdInstance.address(host: "::1", port: 9090) == "[::1]:9090")
    }
}
