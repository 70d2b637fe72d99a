import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The second hardening round's findings on cloud upstreams, through the shipped binaries and the
/// TLS stubs of Bedrock and Vertex AI: no body shape stops the process, `stream` is a boolean,
/// betas in the body meet the policy, and a cloud's own words never reach the device.
@Suite(.serialized) struct CloudHardeningTests {
    typealias Fixture = CloudUpstreamTests.Fixture

    /// `model` and `stream` first, in both orders, with any spacing: the edit that takes them out
    /// once shared a comma between them and crashed attestd (a reversed range).
    static let reorderedBodies = [
        #"{"model":"claude-test","stream":false,"max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}"#,
        #"{"stream":false,"model":"claude-test","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}"#,
        "{ \"stream\" : false ,\n\t\"model\" : \"claude-test\" , \"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}] }",
        #"{"max_tokens":5,"messages":[{"role":"user","content":"Hi"}],"model":"claude-test","stream":true}"#,
        #"{"max_tokens":5,"stream":true,"messages":[{"role":"user","content":"Hi"}],"model":"claude-test"}"#,
        #"{"anthropic_version":"x","stream":false,"model":"claude-test","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}"#,
    ]

    @Test func bodiesWithTheRemovedMembersAnywhereAreRelayedAndTheProcessLives() async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        for workspace in ["aws", "gcp"] {
            for body in Self.reorderedBodies {
                let reply = try await fixture.post(workspace, body)
                #expect(reply.status == 200, "\(workspace) \(body): \(reply.status) \(String(decoding: reply.body, as: UTF8.self))")
                #expect(fixture.server.process.isRunning, "attestd died on \(body): \(fixture.server.log.suffix(2000))")
            }
        }
        // Bedrock saw no `model`, `stream` or second `anthropic_version` in any of them.
        _ = await fixture.bedrock.waitForLog { _ in fixture.bedrock.log.filter { $0["grant"] == nil }.count >= Self.reorderedBodies.count }
        let bodies = fixture.bedrock.log.compactMap { $0["body"] as? [String: Any] }
        #expect(bodies.count == Self.reorderedBodies.count)
        #expect(bodies.allSatisfy { $0["model"] == nil && $0["stream"] == nil && $0["anthropic_version"] as? String == "bedrock-2023-05-31" })
        #expect(!fixture.server.log.contains("Swift runtime failure"))
    }

    @Test(arguments: ["default", "aws", "gcp"])
    func streamMustBeABoolean(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        for value in [#""false""#, "null", "0", "1", #""true""#, "{}"] {
            let reply = try await fixture.post(workspace, #"{"model":"claude-test","max_tokens":5,"stream":\#(value),"messages":[{"role":"user","content":"Hi"}]}"#)
            #expect(reply.status == 400, "\(value): \(reply.status)")
            let error = reply.json["error"] as? [String: Any]
            #expect(error?["type"] as? String == "invalid_request_error")
            #expect((error?["message"] as? String)?.contains("stream") == true, "\(reply.json)")
        }
        let stub = workspace == "aws" ? fixture.bedrock : fixture.vertex
        #expect(workspace == "default" ? fixture.anthropic.requests.isEmpty : stub.log.filter { $0["grant"] == nil }.isEmpty)
    }

    /// Bedrock takes betas in the body; the policy reads them there too, and only an allowed one
    /// reaches the cloud.
    @Test(arguments: ["default", "aws", "gcp"])
    func aBetaInTheBodyMeetsThePolicy(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        try fixture.ctl(["integrations", "update", fixture.clients[workspace] ?? "", "--actor", "owner@example.com", "--betas", "context-1m-2025-08-07"])
        let refused = try await fixture.post(workspace, #"{"model":"claude-test","max_tokens":5,"anthropic_beta":["secret-beta-2"],"messages":[{"role":"user","content":"Hi"}]}"#)
        #expect(refused.status == 400)
        #expect(((refused.json["error"] as? [String: Any])?["message"] as? String)?.contains("secret-beta-2") == true, "\(refused.json)")
        let malformed = try await fixture.post(workspace, #"{"model":"claude-test","max_tokens":5,"anthropic_beta":"context-1m-2025-08-07","messages":[]}"#)
        #expect(malformed.status == 400)
        let header = try await fixture.post(workspace, #"{"model":"claude-test","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}"#,
                                            headers: ["anthropic-beta": "secret-beta-2"])
        #expect(header.status == 400)
        guard workspace != "default" else { return }
        let allowed = try await fixture.post(workspace, #"{"model":"claude-test","max_tokens":5,"anthropic_beta":["context-1m-2025-08-07"],"messages":[{"role":"user","content":"Hi"}]}"#)
        #expect(allowed.status == 200, "\(String(decoding: allowed.body, as: UTF8.self))")
        let stub = workspace == "aws" ? fixture.bedrock : fixture.vertex
        let logged = try #require(await stub.waitForLog { $0["grant"] == nil })
        #expect(stub.log.filter { $0["grant"] == nil }.count == 1, "only the allowed request reached the cloud")
        if workspace == "aws" {
            #expect((logged["body"] as? [String: Any])?["anthropic_beta"] as? [String] == ["context-1m-2025-08-07"])
        } else {
            #expect((logged["body"] as? [String: Any])?["anthropic_beta"] == nil)
        }
    }

    /// A cloud's refusal names its IAM principal, account or project: the device gets the type and
    /// this service's words (a credential refusal as 503, never one that makes it attest again),
    /// and the log gets the cloud's.
    @Test(arguments: ["aws", "gcp"])
    func aCloudsErrorReachesTheDeviceWithoutItsAccount(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        for stream in [false, true] {
            let reply = try await fixture.post(workspace, CloudUpstreamTests.request(model: "claude-denied", stream: stream))
            let text = String(decoding: reply.body, as: UTF8.self)
            #expect(reply.status == 503, "\(text)")
            #expect((reply.json["error"] as? [String: Any])?["type"] as? String == "api_error")
            #expect((reply.json["error"] as? [String: Any])?["message"] as? String == "the upstream refused this service's credentials")
            for secret in ["arn:aws", "123456789012", CloudUpstreamTests.project, "assumed-role"] {
                #expect(!text.contains(secret), "\(secret) in \(text)")
            }
        }
        let secret = workspace == "aws" ? "123456789012" : CloudUpstreamTests.project + "/locations"
        #expect(await fixture.server.waitForLog(containing: secret), "the operator's log has the cloud's own words")
        let throttled = try await fixture.post(workspace, CloudUpstreamTests.request(model: "claude-throttled"))
        #expect(throttled.status == 429)
        #expect(!String(decoding: throttled.body, as: UTF8.self).contains("aiplatform.googleapis.com"))
    }
}

/// Someone who can write the database but not read the secrets key moves a cloud upstream's
/// endpoint or token URL to a listener of theirs: the credentials no longer open, nothing is sent
/// there, the device gets 503 and the log names the workspace.
@Suite(.serialized) struct SealedSettingsTests {
    typealias Fixture = CloudUpstreamTests.Fixture

    /// A TCP listener on loopback that counts the connections it accepts (an attacker's).
    final class Bait: @unchecked Sendable {
        let fd: Int32
        let port: UInt16
        private let lock = NSLock()
        private var accepted = 0
        private var thread: Thread?

        init() throws {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            self.fd = fd
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = 0
            let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            guard bound == 0, listen(fd, 16) == 0 else { throw HTTPTestError("bait: cannot listen") }
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
            port = UInt16(bigEndian: address.sin_port)
        }

        func start() {
            let thread = Thread { [self] in
                while true {
                    let client = accept(fd, nil, nil)
                    if client < 0 { return }
                    lock.lock(); accepted += 1; lock.unlock()
                    close(client)
                }
            }
            thread.start()
            self.thread = thread
        }

        var connections: Int { lock.lock(); defer { lock.unlock() }; return accepted }
        func stop() { shutdown(fd, Int32(SHUT_RDWR)); close(fd) }
    }

    static func sqlite(_ db: String, _ sql: String) throws {
        let (status, output) = try ServerProcess.run("/usr/bin/sqlite3", [db, sql])
        guard status == 0 else { throw HTTPTestError("sqlite3: \(output)") }
    }

    @Test(arguments: [("aws", "endpoint_url"), ("gcp", "token_url"), ("gcp", "endpoint_url"), ("aws", "region")])
    func settingsEditedInTheDatabaseSendNothing(workspace: String, setting: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let bait = try Bait()
        bait.start()
        defer { bait.stop() }
        // It works before.
        #expect(try await fixture.post(workspace, CloudUpstreamTests.request()).status == 200)
        let value = setting == "region" ? "us-west-2" : "http://127.0.0.1:\(bait.port)" + (setting == "token_url" ? "/token" : "")
        try Self.sqlite(fixture.db, """
            UPDATE workspace_upstream_keys SET settings = json_set(settings, '$.\(setting)', '\(value)')
            WHERE workspace_id = (SELECT id FROM workspaces WHERE name = '\(workspace)')
            """)
        for stream in [false, true] {
            let reply = try await fixture.post(workspace, CloudUpstreamTests.request(stream: stream))
            #expect(reply.status == 503, "\(String(decoding: reply.body, as: UTF8.self))")
            #expect((reply.json["error"] as? [String: Any])?["type"] as? String == "api_error")
        }
        #expect(await fixture.server.waitForLog(containing: "do not open with their settings"))
        #expect(fixture.server.log.contains(#""workspace":"\#(workspace)""#))
        // And after a restart, as before: nothing reaches the changed endpoint.
        fixture.server.stop()
        fixture.server = try ServerProcess(db: fixture.db, extraArguments: ["--upstream-url", fixture.anthropic.baseURL,
                                                                            "--upstream-ca-file", fixture.certificates.caPath])
        #expect(try await fixture.post(workspace, CloudUpstreamTests.request()).status == 503)
        #expect(bait.connections == 0, "a credential went to the changed endpoint")
        // The other cloud workspace is untouched.
        let other = workspace == "aws" ? "gcp" : "aws"
        #expect(try await fixture.post(other, CloudUpstreamTests.request()).status == 200)
    }

    /// The deployment's pinned hosts: an upstream on another host is refused when set, and one
    /// set before the pin is refused when used.
    @Test func pinnedHostsAreCheckedWhenSetAndWhenUsed() async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let set = try ServerProcess.attestctl(["cloud-endpoints", "allow", "--actor", "owner@example.com", "--cloud-endpoint-allow",
                                               "bedrock.internal.example", "--db", fixture.db])
        #expect(set.0 == 0, "\(set.1)")
        let shown = try fixture.ctl(["cloud-endpoints", "show", "--json"])
        #expect(shown.contains("bedrock.internal.example"))
        // attestd reads the pin within 10 s: the cloud workspaces' 127.0.0.1 endpoints are refused.
        let deadline = Date() + 20
        var status = 0
        while Date() < deadline {
            status = try await fixture.post("aws", CloudUpstreamTests.request()).status
            if status == 503 { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(status == 503)
        #expect(await fixture.server.waitForLog(containing: "does not allow cloud credentials to go to"))
        // Setting one on another host is refused with the reason.
        let refused = try ServerProcess.attestctl(["workspaces", "set-upstream-bedrock", "--actor", "owner@example.com", "--workspace", "aws",
                                                   "--region", "us-east-1", "--access-key-id", CloudUpstreamTests.accessKeyID,
                                                   "--secret-key-file", fixture.directory.appendingPathComponent("aws-secret").path,
                                                   "--endpoint-url", fixture.bedrock.origin, "--model", "claude-test=claude-test", "--db", fixture.db])
        #expect(refused.0 == 2)
        _ = try fixture.ctl(["cloud-endpoints", "allow", "--actor", "owner@example.com", "--cloud-endpoint-allow", "127.0.0.1",
                             "--cloud-endpoint-allow", "*.amazonaws.com"])
        let deadline2 = Date() + 20
        while Date() < deadline2 {
            status = try await fixture.post("aws", CloudUpstreamTests.request()).status
            if status == 200 { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(status == 200)
    }
}
