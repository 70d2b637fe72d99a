import Foundation
import PostgresTestSupport
import Testing
import UpstreamStub

/// Anthropic-compatible upstreams (Microsoft Foundry, Claude Platform on AWS) and failover
/// between a workspace's upstreams, on the shipped binaries: attestd relays to TLS stubs of
/// Foundry and Claude Platform on AWS (Tests/Support/cloud-stubs/compatible_stub.py, which checks
/// the key, the SigV4 signature for `aws-external-anthropic` with botocore, the workspace header
/// and what each service refuses) and of Bedrock, all in front of one Anthropic stub; the
/// workspace's own upstream is another Anthropic stub, scripted to fail.
@Suite(.serialized) struct UpstreamFailoverTests {
    static let primaryKey = "test-key-failover-primary-0000"
    static let backendKey = "test-key-failover-backend-0000"
    static let foundryKey = "foundry-key-0123456789abcdef0123"
    static let platformKey = "test-only-platform-aws-key-9876"
    static let accessKeyID = "AKIAFAILOVERSUITE01"
    static let secretKey = "failover/SECRET+key00000000000000000000"
    static let anthropicWorkspaceID = "wrkspc_01FailoverSuite"
    static let owner = "owner@example.com"

    final class Fixture {
        let directory: URL
        let db: String
        /// The workspaces' own upstream (the Anthropic API), scripted to fail.
        let primary: UpstreamStubServer
        /// What the cloud stubs forward to.
        let backend: UpstreamStubServer
        let certificates: StubCertificates
        let bedrock: CloudUpstreamTests.CloudStub
        let foundry: CloudUpstreamTests.CloudStub
        let platform: CloudUpstreamTests.CloudStub
        var servers: [ServerProcess] = []
        var tokens: [String: String] = [:]
        var clients: [String: String] = [:]

        init(database: String? = nil) throws {
            let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-failover-\(UUID().uuidString)")
            directory = scratch
            try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
            func path(_ name: String) -> String { scratch.appendingPathComponent(name).path }
            db = database ?? path("attestd.sqlite")
            primary = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: [UpstreamFailoverTests.primaryKey]))
            backend = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: [UpstreamFailoverTests.backendKey]))
            certificates = try StubCertificates.generate()
            for (name, value) in [("primary.key", UpstreamFailoverTests.primaryKey), ("foundry.key", UpstreamFailoverTests.foundryKey),
                                  ("platform.key", UpstreamFailoverTests.platformKey), ("aws-secret", UpstreamFailoverTests.secretKey + "\n")] {
                try Data(value.utf8).write(to: URL(fileURLWithPath: path(name)))
            }
            let common = ["--cert", certificates.certificatePath, "--key", certificates.keyPath, "--anthropic-url", backend.baseURL,
                          "--anthropic-key", UpstreamFailoverTests.backendKey]
            let aws = ["--region", "us-east-1", "--access-key-id", UpstreamFailoverTests.accessKeyID, "--secret-key-file", path("aws-secret")]
            bedrock = try CloudUpstreamTests.CloudStub(script: "bedrock_stub", arguments: common + aws, directory: scratch)
            foundry = try CloudUpstreamTests.CloudStub(script: "compatible_stub", arguments: common + [
                "--service", "foundry", "--api-key-file", path("foundry.key"), "--deployment", "claude-deployment=claude-test",
                "--deployment", "overloaded-deployment=claude-test"], directory: scratch, logName: "foundry")
            platform = try CloudUpstreamTests.CloudStub(script: "compatible_stub", arguments: common + aws + [
                "--service", "claude-platform-aws", "--api-key-file", path("platform.key"),
                "--anthropic-workspace-id", UpstreamFailoverTests.anthropicWorkspaceID], directory: scratch, logName: "platform")
        }

        func path(_ name: String) -> String { directory.appendingPathComponent(name).path }

        var server: ServerProcess { servers[0] }

        /// `default` on the primary stub; `foundry`, `platform`, `platform-key` on their services;
        /// `failover`: its own upstream the primary stub, then Bedrock (`--upstream bedrock`).
        func configure() throws -> Fixture {
            try ctl(["init", "--owner", UpstreamFailoverTests.owner])
            for name in ["foundry", "platform", "platform-key", "failover"] { try ctl(["workspaces", "create", "--actor", UpstreamFailoverTests.owner, "--name", name]) }
            let actor = ["--actor", UpstreamFailoverTests.owner]
            try ctl(["workspaces", "set-upstream-key"] + actor + ["--workspace", "default", "--key-file", path("primary.key")])
            try ctl(["workspaces", "set-upstream-foundry"] + actor + ["--workspace", "foundry", "--resource", "contoso-ai",
                     "--api-key-file", path("foundry.key"), "--endpoint-url", foundry.origin, "--model", "claude-test=claude-deployment",
                     "--model", "claude-busy=overloaded-deployment"])
            try ctl(["workspaces", "set-upstream-claude-platform-aws"] + actor + ["--workspace", "platform", "--region", "us-east-1",
                     "--anthropic-workspace-id", UpstreamFailoverTests.anthropicWorkspaceID, "--access-key-id", UpstreamFailoverTests.accessKeyID,
                     "--secret-key-file", path("aws-secret"), "--endpoint-url", platform.origin, "--model", "claude-test=claude-test"])
            try ctl(["workspaces", "set-upstream-claude-platform-aws"] + actor + ["--workspace", "platform-key", "--region", "us-east-1",
                     "--anthropic-workspace-id", UpstreamFailoverTests.anthropicWorkspaceID, "--api-key-file", path("platform.key"),
                     "--endpoint-url", platform.origin, "--model", "claude-test=claude-test"])
            try ctl(["workspaces", "set-upstream-key"] + actor + ["--workspace", "failover", "--key-file", path("primary.key")])
            try ctl(["workspaces", "set-upstream-bedrock"] + actor + ["--workspace", "failover", "--upstream", "bedrock", "--priority", "10",
                     "--region", "us-east-1", "--access-key-id", UpstreamFailoverTests.accessKeyID, "--secret-key-file", path("aws-secret"),
                     "--endpoint-url", bedrock.origin, "--model", "claude-test=anthropic.claude-test-v1:0"])
            for workspace in ["default", "foundry", "platform", "platform-key", "failover"] {
                let output = try ctl(["integrations", "create"] + actor + ["--workspace", workspace, "--name", "App", "--team-id", "ABCDE12345",
                                                                          "--bundle-id", "com.example.app", "--json"])
                clients[workspace] = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
            }
            return self
        }

        /// One attestd (more for the scale-out test), each with a short cool-down.
        func start(instances: Int = 1, cooldown: String = "2") async throws -> Fixture {
            for _ in 0..<instances {
                servers.append(try ServerProcess(db: db, extraArguments: ["--secrets-key-file", path("attestd.key"),
                                                                          "--upstream-url", primary.baseURL, "--upstream-ca-file", certificates.caPath,
                                                                          "--upstream-cooldown", cooldown, "--upstream-cooldown-max", cooldown]))
            }
            let http = TestHTTP(baseURL: server.baseURL)
            for (workspace, client) in clients {
                tokens[workspace] = try #require(try await http.registerFresh(try ManualDevice(clientID: client)).json["access_token"] as? String)
            }
            return self
        }

        @discardableResult
        func ctl(_ arguments: [String]) throws -> String {
            let (status, output) = try ServerProcess.attestctl(arguments + ["--db", db, "--secrets-key-file", path("attestd.key")])
            guard status == 0 else { throw HTTPTestError("attestctl \(arguments.prefix(2).joined(separator: " ")) exited \(status): \(output)") }
            return output
        }

        func post(_ workspace: String, _ body: String, instance: Int = 0, path: String = "/v1/messages", headers: [String: String] = [:]) async throws -> HTTPResult {
            try await TestHTTP(baseURL: servers[instance].baseURL).send("POST", path, body: Data(body.utf8), contentType: "application/json",
                                                                        headers: ["authorization": "Bearer \(tokens[workspace] ?? "")"].merging(headers) { $1 })
        }

        func metrics(instance: Int = 0) async throws -> String {
            String(decoding: try await TestHTTP(baseURL: servers[instance].adminBaseURL).send("GET", "/metrics").body, as: UTF8.self)
        }

        /// `usage --by upstream --json` once the ledger holds `requests` for the workspace.
        func usageByUpstream(_ workspace: String, requests: Int, timeout: TimeInterval = 8) async throws -> [[String: Any]] {
            let deadline = Date() + timeout
            while true {
                let lines = try ctl(["usage", "--by", "upstream", "--json", "--workspace", workspace]).split(separator: "\n").compactMap {
                    try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
                }
                if UsageTests.total(lines, "requests") >= requests || Date() > deadline { return lines }
                try await Task.sleep(for: .milliseconds(100))
            }
        }

        func stop() {
            for server in servers { server.stop() }
            bedrock.stop()
            foundry.stop()
            platform.stop()
            primary.stop()
            backend.stop()
            certificates.remove()
            try? FileManager.default.removeItem(at: directory)
        }
    }

    static func request(model: String = "claude-test", stream: Bool = false) -> String {
        #"{"model":"\#(model)","max_tokens":64,"stream":\#(stream),"messages":[{"role":"user","content":"Hello"}]}"#
    }

    // MARK: Microsoft Foundry and Claude Platform on AWS

    @Test func foundryWithAnAPIKeyAnswersAsTheAnthropicAPI() async throws {
        let fixture = try await Fixture().configure().start()
        defer { fixture.stop() }
        for stream in [false, true] {
            let direct = try await fixture.post("default", Self.request(stream: stream))
            let reply = try await fixture.post("foundry", Self.request(stream: stream))
            #expect(direct.status == 200 && reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
            #expect(CloudUpstreamTests.comparable(reply.body) == CloudUpstreamTests.comparable(direct.body))
        }
        // The stub checked the key and saw the deployment's name as the model, at Foundry's path.
        _ = await fixture.foundry.waitForLog { _ in fixture.foundry.log.count >= 2 }
        let logged = fixture.foundry.log
        #expect(logged.count == 2 && logged.allSatisfy { $0["verified"] as? Bool == true && $0["auth"] as? String == "api-key" }, "\(logged)")
        #expect(logged.allSatisfy { $0["path"] as? String == "/anthropic/v1/messages" && $0["model"] as? String == "claude-deployment" })
        // What Foundry does not take is refused here, by name, before anything is sent.
        let beta = try await fixture.post("foundry", Self.request(), headers: ["anthropic-beta": "fast-mode-2026-02-01"])
        #expect(beta.status == 400)
        #expect(((beta.json["error"] as? [String: Any])?["message"] as? String)?.contains("fast-mode-2026-02-01") == true)
        #expect(fixture.foundry.log.count == 2)
        // Foundry's own errors come back in the API's shape.
        let busy = try await fixture.post("foundry", Self.request(model: "claude-busy"))
        #expect(busy.status == 529 && (busy.json["error"] as? [String: Any])?["type"] as? String == "overloaded_error")
    }

    @Test func foundryRefusesAWrongKeyAndTheDeviceGets503() async throws {
        let fixture = try await Fixture().configure()
        defer { fixture.stop() }
        try Data("not-the-foundry-key-000000000000".utf8).write(to: URL(fileURLWithPath: fixture.path("wrong.key")))
        try fixture.ctl(["workspaces", "set-upstream-foundry", "--actor", Self.owner, "--workspace", "foundry", "--resource", "contoso-ai",
                         "--api-key-file", fixture.path("wrong.key"), "--endpoint-url", fixture.foundry.origin, "--model", "claude-test=claude-deployment"])
        _ = try await fixture.start()
        let reply = try await fixture.post("foundry", Self.request())
        // Never a 401 (the device would attest again): the service's credentials were refused.
        #expect(reply.status == 503 && (reply.json["error"] as? [String: Any])?["type"] as? String == "api_error")
        #expect(await fixture.server.waitForLog(containing: "upstream_credentials_refused"))
    }

    @Test(arguments: ["platform", "platform-key"])
    func claudePlatformOnAWSSignsForItsServiceAndNamesTheWorkspace(workspace: String) async throws {
        let fixture = try await Fixture().configure().start()
        defer { fixture.stop() }
        for stream in [false, true] {
            let reply = try await fixture.post(workspace, Self.request(stream: stream), headers: ["anthropic-beta": "fast-mode-2026-02-01"])
            #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
            #expect(String(decoding: reply.body, as: UTF8.self).contains(stream ? "event: message_stop" : "Hello from the upstream stub"))
        }
        _ = await fixture.platform.waitForLog { _ in fixture.platform.log.count >= 2 }
        let logged = fixture.platform.log
        #expect(logged.count == 2, "\(logged)")
        #expect(logged.allSatisfy { $0["verified"] as? Bool == true && $0["path"] as? String == "/v1/messages" })
        #expect(logged.allSatisfy { ($0["header_names"] as? [String])?.contains("anthropic-workspace-id") == true })
        // Anthropic's own stack takes the API's betas as they are.
        #expect(logged.allSatisfy { $0["beta_header"] as? [String] == ["fast-mode-2026-02-01"] })
        #expect(logged.allSatisfy { $0["auth"] as? String == (workspace == "platform" ? "sigv4" : "api-key") })
        if workspace == "platform" { #expect(logged.allSatisfy { $0["access_key_id"] as? String == Self.accessKeyID }) }
    }

    @Test func claudePlatformOnAWSRefusesASignatureForAnotherServiceOrWorkspace() async throws {
        let fixture = try await Fixture().configure()
        defer { fixture.stop() }
        // The stub expects another Anthropic workspace: the request is refused upstream, nothing served.
        try fixture.ctl(["workspaces", "set-upstream-claude-platform-aws", "--actor", Self.owner, "--workspace", "platform", "--region", "us-east-1",
                         "--anthropic-workspace-id", "wrkspc_someone_else", "--access-key-id", Self.accessKeyID, "--secret-key-file", fixture.path("aws-secret"),
                         "--endpoint-url", fixture.platform.origin, "--model", "claude-test=claude-test"])
        _ = try await fixture.start()
        let reply = try await fixture.post("platform", Self.request())
        #expect(reply.status == 400)
        let logged = try #require(await fixture.platform.waitForLog { _ in true })
        #expect((logged["reason"] as? String)?.contains("anthropic-workspace-id") == true && fixture.backend.requests.isEmpty)
    }

    /// bedrock-mantle through the same kind: SigV4 for `bedrock-mantle`, its own betas.
    @Test func bedrockMantleSignsForItsOwnService() async throws {
        let fixture = try await Fixture().configure()
        defer { fixture.stop() }
        let mantle = try CloudUpstreamTests.CloudStub(script: "compatible_stub", arguments: [
            "--cert", fixture.certificates.certificatePath, "--key", fixture.certificates.keyPath, "--anthropic-url", fixture.backend.baseURL,
            "--anthropic-key", Self.backendKey, "--service", "bedrock-mantle", "--region", "us-west-2", "--access-key-id", Self.accessKeyID,
            "--secret-key-file", fixture.path("aws-secret")], directory: fixture.directory, logName: "mantle")
        defer { mantle.stop() }
        try fixture.ctl(["workspaces", "set-upstream-bedrock", "--actor", Self.owner, "--workspace", "platform", "--api", "mantle", "--region", "us-west-2",
                         "--access-key-id", Self.accessKeyID, "--secret-key-file", fixture.path("aws-secret"), "--endpoint-url", mantle.origin,
                         "--model", "claude-test=anthropic.claude-test"])
        _ = try await fixture.start()
        let reply = try await fixture.post("platform", Self.request(), headers: ["anthropic-beta": "token-efficient-tools-2025-02-19"])
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
        let logged = try #require(await mantle.waitForLog { _ in true })
        #expect(logged["verified"] as? Bool == true && logged["auth"] as? String == "sigv4" && logged["path"] as? String == "/anthropic/v1/messages")
        #expect(logged["model"] as? String == "anthropic.claude-test")
        // A beta bedrock-mantle does not take is refused here.
        let refused = try await fixture.post("platform", Self.request(), headers: ["anthropic-beta": "files-api-2025-04-14"])
        #expect(refused.status == 400 && mantle.log.count == 1)
    }

    /// The Anthropic API itself at another base URL, through the same kind: its key as
    /// `x-api-key`, the mapped model, every beta as the API takes it.
    @Test func theAnthropicAPIAtAnotherBaseURL() async throws {
        let fixture = try await Fixture().configure()
        defer { fixture.stop() }
        try Data(Self.backendKey.utf8).write(to: URL(fileURLWithPath: fixture.path("backend.key")))
        try fixture.ctl(["workspaces", "set-upstream-key", "--actor", Self.owner, "--workspace", "platform", "--key-file", fixture.path("backend.key"),
                         "--base-url", fixture.backend.baseURL, "--model", "claude-alias=claude-test"])
        _ = try await fixture.start()
        let reply = try await fixture.post("platform", Self.request(model: "claude-alias"), headers: ["anthropic-beta": "fast-mode-2026-02-01"])
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
        let seen = try #require(fixture.backend.requests.last)
        #expect(seen.path == "/v1/messages" && seen.headers.contains { $0.name == "x-api-key" && $0.value == Self.backendKey })
        #expect(seen.headers.contains { $0.name == "anthropic-beta" && $0.value == "fast-mode-2026-02-01" })
        #expect(String(decoding: seen.body ?? [], as: UTF8.self).contains(#""model":"claude-test""#))
        #expect(try await fixture.post("platform", Self.request(model: "claude-test")).status == 400, "a model outside its map is refused")
    }

    // MARK: Failover

    @Test func anOverloadedAnthropicAPIFailsOverToBedrock() async throws {
        let fixture = try await Fixture().configure().start()
        defer { fixture.stop() }
        fixture.primary.enqueue(.error(529))
        // Bedrock's regional endpoint (the model ID is not a global. profile) adds its uplift; the
        // workspace's own upstream, the Anthropic API, does not: the request is priced by the one that served.
        let prices = fixture.path("prices.json")
        try Data(#"{"models":{"claude-test":{"input":3,"output":15,"cache_write_5m":3.75,"cache_write_1h":6,"cache_read":0.3,"regional_uplift_percent":10}}}"#.utf8)
            .write(to: URL(fileURLWithPath: prices))
        _ = try fixture.ctl(["prices", "import", "--actor", Self.owner, "--workspace", "failover", prices])
        let reply = try await fixture.post("failover", Self.request())
        // The device sees one answer: Bedrock's 200.
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
        #expect(String(decoding: reply.body, as: UTF8.self).contains("Hello from the upstream stub"))
        #expect(fixture.primary.requests.count == 1)
        _ = await fixture.bedrock.waitForLog { $0["verified"] as? Bool == true }
        #expect(fixture.bedrock.log.filter { $0["verified"] as? Bool == true }.count == 1)
        // The ledger names the upstream that served; the log shows each try under one request ID.
        let usage = try await fixture.usageByUpstream("failover", requests: 1)
        #expect(usage.count == 1 && usage.first?["upstream"] as? String == "bedrock" && usage.first?["requests"] as? Int == 1, "\(usage)")
        #expect(usage.first?["failovers"] as? Int == 1)
        let ledger = try fixture.ctl(["usage", "--json", "--workspace", "failover"]).split(separator: "\n").compactMap {
            try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }.filter { $0["forecast"] == nil }
        #expect(UsageTests.total(ledger, "requests") == 1, "a retry never counts twice")
        // Money beside tokens by upstream too: the row's cost is the ledger's, priced once.
        let cost = try #require(usage.first?["cost_micro_usd"] as? Int)
        #expect(cost > 0 && cost == UsageTests.total(ledger, "cost_micro_usd"), "\(usage) \(ledger)")
        let base = Double(UsageTests.total(ledger, "input_tokens")) * 3 + Double(UsageTests.total(ledger, "output_tokens")) * 15
            + Double(UsageTests.total(ledger, "cache_read_input_tokens")) * 0.3
        #expect(UsageTests.total(ledger, "cache_creation_input_tokens") == 0 && abs(Double(cost) - base * 1.1) <= 1, "\(cost) vs \(base) × 1.1")
        let requestID = try #require(reply.header("request-id"))
        let tries = fixture.server.log.split(separator: "\n").filter { $0.contains("\"upstream_try\"") }
        #expect(tries.count == 2 && tries.allSatisfy { $0.contains(requestID) }, "\(tries)")
        #expect(tries.first?.contains("\"default\"") == true && tries.first?.contains("failed over") == true)
        #expect(tries.last?.contains("\"bedrock\"") == true && tries.last?.contains("answered 200") == true)
        let metrics = try await fixture.metrics()
        #expect(metrics.contains(#"attestd_upstream_state{workspace="failover",upstream="default"} 1"#), "\(metrics)")
        // Listed with attestctl, in the order they are tried.
        let listed = try JSONSerialization.jsonObject(with: Data(try fixture.ctl(["workspaces", "upstreams", "failover", "--json"]).utf8)) as? [String: Any]
        let upstreams = try #require(listed?["upstreams"] as? [[String: Any]])
        #expect(upstreams.map { $0["label"] as? String } == ["default", "bedrock"] && upstreams.allSatisfy { $0["state"] as? String == "sealed" })
    }

    @Test func aStreamCutAfterItsFirstByteIsNotReplayed() async throws {
        let fixture = try await Fixture().configure().start()
        defer { fixture.stop() }
        var cut = StubBehavior()
        cut.dropAfterDeltas = 1
        fixture.primary.enqueue(cut)
        let reply = try await fixture.post("failover", Self.request(stream: true))
        #expect(reply.status == 200)
        let text = String(decoding: reply.body, as: UTF8.self)
        #expect(text.contains("event: message_start") && text.contains("event: error"), "\(text)")
        try await Task.sleep(for: .milliseconds(300))
        #expect(fixture.bedrock.log.filter { $0["verified"] as? Bool == true }.isEmpty, "Bedrock was never asked")
        let usage = try await fixture.usageByUpstream("failover", requests: 1)
        #expect(usage.first?["upstream"] as? String == "default" && usage.first?["failovers"] as? Int == 0, "\(usage)")
    }

    @Test func aCooledDownUpstreamIsSkippedThenTriedAgain() async throws {
        let fixture = try await Fixture().configure().start(cooldown: "2")
        defer { fixture.stop() }
        fixture.primary.enqueue(.error(503))
        #expect(try await fixture.post("failover", Self.request()).status == 200)
        #expect(fixture.primary.requests.count == 1)
        // Cooling down: the next request goes straight to Bedrock.
        #expect(try await fixture.post("failover", Self.request()).status == 200)
        #expect(fixture.primary.requests.count == 1)
        // After the cool-down the Anthropic API is tried again, and serves.
        let deadline = Date() + 10
        while fixture.primary.requests.count == 1, Date() < deadline {
            #expect(try await fixture.post("failover", Self.request()).status == 200)
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(fixture.primary.requests.count == 2)
        let metrics = try await fixture.metrics()
        #expect(metrics.contains(#"attestd_upstream_state{workspace="failover",upstream="default"} 0"#), "\(metrics)")
    }

    @Test func aConnectFailureFailsOverAndRemovingAnUpstreamTakesEffect() async throws {
        let fixture = try await Fixture().configure()
        defer { fixture.stop() }
        // An upstream nobody listens at, first in the list.
        try fixture.ctl(["workspaces", "set-upstream-foundry", "--actor", Self.owner, "--workspace", "failover", "--upstream", "nowhere", "--priority", "0",
                         "--resource", "contoso-ai", "--api-key-file", fixture.path("foundry.key"), "--endpoint-url", "https://127.0.0.1:9",
                         "--model", "claude-test=claude-deployment"])
        try fixture.ctl(["workspaces", "upstreams", "failover", "order", "--actor", Self.owner, "--upstream", "nowhere", "--upstream", "bedrock",
                         "--upstream", "default"])
        _ = try await fixture.start()
        #expect(try await fixture.post("failover", Self.request()).status == 200)
        #expect(fixture.primary.requests.isEmpty)
        _ = try await fixture.usageByUpstream("failover", requests: 1)
        #expect(try fixture.ctl(["usage", "--by", "upstream", "--workspace", "failover"]).contains("bedrock"))
        // Removed: the next request goes to the rest of the list, at once.
        try fixture.ctl(["workspaces", "remove-upstream", "--actor", Self.owner, "--workspace", "failover", "--upstream", "bedrock"])
        try fixture.ctl(["workspaces", "remove-upstream", "--actor", Self.owner, "--workspace", "failover", "--upstream", "nowhere"])
        #expect(try await fixture.post("failover", Self.request()).status == 200)
        #expect(fixture.primary.requests.count == 1)
        let audit = try fixture.ctl(["audit", "--limit", "20"])
        #expect(audit.contains("workspace.upstream_removed") && audit.contains("workspace.upstreams_ordered"))
        // A list of one labelled upstream, the workspace's own removed: that one serves.
        try fixture.ctl(["workspaces", "set-upstream-foundry", "--actor", Self.owner, "--workspace", "failover", "--upstream", "solo",
                         "--resource", "contoso-ai", "--api-key-file", fixture.path("foundry.key"), "--endpoint-url", fixture.foundry.origin,
                         "--model", "claude-test=claude-deployment"])
        try fixture.ctl(["workspaces", "remove-upstream", "--actor", Self.owner, "--workspace", "failover", "--upstream", "default"])
        #expect(try await fixture.post("failover", Self.request()).status == 200)
        #expect(fixture.primary.requests.count == 1)
        #expect(await fixture.foundry.waitForLog { $0["verified"] as? Bool == true } != nil)
    }

    /// Two attestd on one PostgreSQL database: each cools its own upstreams down and fails over
    /// on its own (nothing about it is shared), and the ledger they share names what served.
    @Test func twoInstancesOnPostgreSQLEachFailOverOnTheirOwn() async throws {
        let cluster = try PostgresCluster.shared.get()
        let fixture = try await Fixture(database: cluster.url(try cluster.createDatabase())).configure().start(instances: 2, cooldown: "60")
        defer { fixture.stop() }
        fixture.primary.enqueue(.error(529))
        #expect(try await fixture.post("failover", Self.request(), instance: 0).status == 200)
        #expect(fixture.primary.requests.count == 1)
        // The other instance knows nothing of it: it tries the Anthropic API first, which serves.
        #expect(try await fixture.post("failover", Self.request(), instance: 1).status == 200)
        #expect(fixture.primary.requests.count == 2)
        // The first still skips it while it cools down.
        #expect(try await fixture.post("failover", Self.request(), instance: 0).status == 200)
        #expect(fixture.primary.requests.count == 2)
        #expect(try await fixture.metrics(instance: 0).contains(#"attestd_upstream_state{workspace="failover",upstream="default"} 1"#))
        #expect(!(try await fixture.metrics(instance: 1)).contains(#"attestd_upstream_state{workspace="failover",upstream="default"} 1"#))
        let usage = try await fixture.usageByUpstream("failover", requests: 3)
        let served = Dictionary(uniqueKeysWithValues: usage.compactMap { row in (row["upstream"] as? String).map { ($0, row["requests"] as? Int ?? 0) } })
        #expect(served == ["default": 1, "bedrock": 2], "\(usage)")
    }

    /// Workspace settings list the upstreams in the order they are tried, with this instance's
    /// state of each; an owner moves one up and removes one (audited), and a developer may not.
    @Test func theConsoleListsTheUpstreamsAndAnOwnerReordersAndRemovesThem() throws {
        let fixture = try ConsoleFixture()
        defer { fixture.stop() }
        let key = fixture.directory.appendingPathComponent("foundry.key").path
        try Data(Self.foundryKey.utf8).write(to: URL(fileURLWithPath: key))
        try fixture.ctl(["workspaces", "set-upstream-key", "--actor", ConsoleFixture.owner, "--workspace", "default", "--key-file", key])
        try fixture.ctl(["workspaces", "set-upstream-foundry", "--actor", ConsoleFixture.owner, "--workspace", "default", "--upstream", "azure",
                         "--priority", "5", "--resource", "contoso-ai", "--api-key-file", key, "--model", "claude-test=claude-deployment"])
        let owner = try fixture.signIn()
        let page = try fixture.request("GET", "/console/settings", headers: [("Cookie", "attestd_console=\(owner)")])
        #expect(page.status == 200 && page.text.contains("id=\"upstreams\""))
        let defaultAt = try #require(page.text.range(of: "<code>default</code>")), azureAt = try #require(page.text.range(of: "<code>azure</code>"))
        #expect(defaultAt.lowerBound < azureAt.lowerBound && page.text.contains("Microsoft Foundry"))
        #expect(page.text.contains("data-label=\"azure\">Ready<") && !page.text.contains(Self.foundryKey))
        let csrf = try fixture.csrf(owner, on: "/console/settings")
        let moved = try fixture.post("/console/settings/upstreams/move", cookie: owner, [("label", "azure"), ("direction", "up")], csrf: csrf)
        #expect(moved.status == 303 && moved.headers["location"] == "/console/settings?upstreams=1")
        func labels() throws -> [String] {
            let listed = try JSONSerialization.jsonObject(with: Data(try fixture.ctl(["workspaces", "upstreams", "default", "--json"]).utf8)) as? [String: Any]
            return (listed?["upstreams"] as? [[String: Any]] ?? []).compactMap { $0["label"] as? String }
        }
        #expect(try labels() == ["azure", "default"])
        let removed = try fixture.post("/console/settings/upstreams/remove", cookie: owner, [("label", "azure")], csrf: csrf)
        #expect(removed.status == 303)
        #expect(try labels() == ["default"])
        let audit = try fixture.ctl(["audit", "--limit", "10"])
        #expect(audit.contains("workspace.upstreams_ordered") && audit.contains("workspace.upstream_removed"))
        try fixture.ctl(["members", "add", "--actor", ConsoleFixture.owner, "--email", "dev@example.com", "--role", "developer"])
        let developer = try fixture.signIn("dev@example.com")
        let refused = try fixture.post("/console/settings/upstreams/remove", cookie: developer, [("label", "default")],
                                       csrf: try fixture.csrf(developer, on: "/console/settings"))
        let after = try labels()
        #expect(refused.status == 403 && after == ["default"])
    }

    /// No credential of the new kinds is written anywhere: database (and its WAL), logs, metrics,
    /// `show --json`, `upstreams --json`.
    @Test func noCredentialLeaks() async throws {
        let fixture = try await Fixture().configure().start()
        defer { fixture.stop() }
        fixture.primary.enqueue(.error(529))
        for workspace in ["foundry", "platform", "platform-key", "failover"] { _ = try await fixture.post(workspace, Self.request()) }
        _ = try await fixture.usageByUpstream("failover", requests: 1)
        var haystacks = [fixture.server.log, try await fixture.metrics()]
        for workspace in ["foundry", "platform", "platform-key", "failover"] {
            haystacks.append(try fixture.ctl(["workspaces", "show", workspace, "--json"]))
            haystacks.append(try fixture.ctl(["workspaces", "upstreams", workspace, "--json"]))
            haystacks.append(try fixture.ctl(["workspaces", "upstreams", workspace]))
        }
        for suffix in ["", "-wal", "-shm"] {
            if let data = FileManager.default.contents(atPath: fixture.db + suffix) { haystacks.append(String(decoding: data, as: UTF8.self)) }
        }
        for secret in [Self.foundryKey, Self.platformKey, Self.secretKey, Self.primaryKey] {
            #expect(!haystacks.contains { $0.contains(secret) }, "a credential was written out")
        }
    }
}
