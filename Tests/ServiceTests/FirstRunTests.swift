import Foundation
import Testing
import UpstreamStub

/// The README's first run, in its order: attestd started on a new database, then `attestctl init`
/// (which creates the secrets key file), then a workspace key and an integration: the running
/// server opens the key without a restart.
@Suite(.serialized) struct FirstRunTests {
    @Test func aKeySetAfterTheServerStartedOpensWithoutARestart() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-first-run-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("attestd.sqlite").path
        let stub = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: [RelayTests.keyA]))
        defer { stub.stop() }
        let server = try ServerProcess(db: db, extraArguments: ["--upstream-url", stub.baseURL])
        defer { server.stop() }
        #expect(await server.waitForLog(containing: "no_secrets_key"))

        func ctl(_ arguments: [String]) throws -> String {
            let (status, output) = try ServerProcess.attestctl(arguments + ["--db", db])
            guard status == 0 else { throw HTTPTestError("attestctl \(arguments.joined(separator: " ")) exited \(status): \(output)") }
            return output
        }
        _ = try ctl(["init", "--owner", "owner@example.com"])
        #expect(FileManager.default.fileExists(atPath: directory.appendingPathComponent("attestd.key").path))
        let keyFile = directory.appendingPathComponent("upstream.key").path
        try Data("\(RelayTests.keyA)\n".utf8).write(to: URL(fileURLWithPath: keyFile))
        _ = try ctl(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", keyFile])
        let created = try ctl(["integrations", "create", "--actor", "owner@example.com", "--name", "App", "--team-id", "ABCDE12345",
                               "--bundle-id", "com.example.app", "--json"])
        let clientID = try #require((try JSONSerialization.jsonObject(with: Data(created.utf8)) as? [String: Any])?["client_id"] as? String)

        let http = TestHTTP(baseURL: server.baseURL)
        let token = try #require(try await http.registerFresh(try ManualDevice(clientID: clientID)).json["access_token"] as? String)
        let reply = try await http.send("POST", "/v1/messages", body: Data(RelayTests.request().utf8), contentType: "application/json",
                                        headers: ["authorization": "Bearer \(token)"])
        #expect(reply.status == 200)
        #expect(stub.requests.last?.headerValues("x-api-key") == [RelayTests.keyA])
    }
}
