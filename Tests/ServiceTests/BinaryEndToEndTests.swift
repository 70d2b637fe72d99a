import AppAttest
import AttestClient
import Foundation
import SimulatedDevice
import Testing

/// The whole product as shipped: the real attestd binary (test authority trusted), integrations
/// made with the real attestctl, and AttestClient with a simulated device over loopback.
@Suite(.serialized) struct BinaryEndToEndTests {
    @Test func clientAgainstTheRealBinaries() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attest-e2e-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("attestd.sqlite").path
        #expect(try ServerProcess.attestctl(["init", "--db", db, "--owner", "owner@example.com"]).0 == 0)
        let (status, output) = try ServerProcess.attestctl(["integrations", "create", "--db", db, "--actor", "owner@example.com", "--name", "E2E",
                                                            "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
        #expect(status == 0)
        let clientID = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
        let server = try ServerProcess(db: db)

        let attester = CountingAttester(SoftwareAttester(appID: AppID(teamID: "ABCDE12345", bundleID: "com.example.app"),
                                                         keyDirectory: directory.appendingPathComponent("keys")))
        let store = try FileCredentialStore(directory: directory.appendingPathComponent("credentials"))
        let clock = ClientClock()
        func makeClient(_ transport: CountingTransport) -> AppAttestClient {
            AppAttestClient(clientID: clientID, baseURL: server.baseURL, attester: attester, store: store, transport: transport, now: { clock.now })
        }

        // A fresh install registers.
        let first = CountingTransport()
        #expect(try await makeClient(first).authenticateIfNeeded() == .registered)
        #expect(attester.attestations == 1)

        // A relaunch (new client object, same store) uses the stored token, then refreshes by
        // assertion without attesting once the token nears expiry.
        let second = CountingTransport()
        let relaunched = makeClient(second)
        #expect(try await relaunched.authenticateIfNeeded() == .cached)
        #expect(second.total == 0)
        clock.advance(3600 - 30)
        #expect(try await relaunched.authenticateIfNeeded() == .refreshed)
        #expect(attester.attestations == 1)

        // An expired token is refreshed; 50 concurrent callers share one exchange.
        clock.advance(3600 + 5)
        let before = second.count("/oauth/token")
        let tokens = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<50 { group.addTask { try await relaunched.currentToken() } }
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(tokens.count == 1)
        #expect(second.count("/oauth/token") - before == 1)
        #expect(try await TestHTTP(baseURL: server.baseURL).messages(token: tokens.first!).status == 503)

        // Revoked with attestctl: the next refresh fails with attestationFailed.
        #expect(try ServerProcess.attestctl(["integrations", "revoke", clientID, "--db", db, "--actor", "owner@example.com", "--yes"]).0 == 0)
        #expect(try await TestHTTP(baseURL: server.baseURL).messages(token: tokens.first!).status == 401)
        clock.advance(3600 + 5)
        do {
            _ = try await relaunched.currentToken()
            Issue.record("a revoked integration still minted")
        } catch AttestClientError.attestationFailed {
        }
    }

    @Test func simulateDeviceRegistersThenUsesItsCachedToken() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attest-sim-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("attestd.sqlite").path
        #expect(try ServerProcess.attestctl(["init", "--db", db, "--owner", "owner@example.com"]).0 == 0)
        let created = try ServerProcess.attestctl(["integrations", "create", "--db", db, "--actor", "owner@example.com", "--name", "Sim",
                                                   "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"]).1
        let clientID = try #require((try JSONSerialization.jsonObject(with: Data(created.utf8)) as? [String: Any])?["client_id"] as? String)
        let server = try ServerProcess(db: db)
        let state = directory.appendingPathComponent("device").path
        let base = ["simulate-device", "--base-url", server.baseURL.absoluteString, "--client-id", clientID, "--state-dir", state]

        func run(_ extra: [String]) throws -> (Int32, [String: Any]) {
            let (status, output) = try ServerProcess.attestSim(base + extra)
            let line = output.split(separator: "\n").first.map(String.init) ?? ""
            return (status, (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]) ?? [:])
        }
        let registered = try run(["--app-id", "ABCDE12345.com.example.app"])
        #expect(registered.0 == 0)
        #expect(registered.1["source"] as? String == "registered")
        #expect(registered.1["client_id"] as? String == clientID)
        #expect(registered.1["token_expires_at"] != nil)
        #expect(registered.1["access_token"] == nil)
        let cached = try run(["--messages"])
        #expect(cached.0 == 0)
        #expect(cached.1["source"] as? String == "cached")
        #expect(cached.1["key_id"] as? String == registered.1["key_id"] as? String)
        #expect(try ServerProcess.attestSim(base + ["--messages"]).1.contains(#""messages_status":503"#))
        // The token is never printed.
        #expect(!(try ServerProcess.attestSim(base).1.contains("aat_")))

        // After revocation the Messages call is refused, the retry's refresh fails: exit 1, attestationFailed.
        #expect(try ServerProcess.attestctl(["integrations", "revoke", clientID, "--db", db, "--actor", "owner@example.com", "--yes"]).0 == 0)
        let revoked = try ServerProcess.attestSim(base + ["--messages"])
        #expect(revoked.0 == 1)
        #expect(revoked.1.contains(#""error":"attestationFailed""#))
        let again = try ServerProcess.attestSim(base)
        #expect(again.0 == 1)
        #expect(again.1.contains(#""error":"attestationFailed""#))
    }
}
