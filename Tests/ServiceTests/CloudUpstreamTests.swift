import Foundation
import Testing
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// A workspace whose upstream is Amazon Bedrock or Google Vertex AI, on the shipped binaries:
/// attestd relays to TLS stubs of both clouds (Tests/Support/cloud-stubs, run by the venv `make`
/// creates) that check each request's SigV4 signature or OAuth token themselves with botocore and
/// cryptography, and forward to the Anthropic stub, whose replies they translate into their own
/// shapes. The device must see what the Anthropic API would have sent.
@Suite(.serialized) struct CloudUpstreamTests {
    static let anthropicKey = "test-key-cloud-suite-0000-aaaa"
    static let accessKeyID = "AKIACLOUDSUITE00001"
    static let secretKey = "cloud-suite/SECRET+key0000000000000000000"
    static let sessionToken = "IQoJb3JpZ2luX2VjEcloudSuiteSessionToken=="
    static let project = "cloud-suite-project"
    static let clientEmail = "relay@cloud-suite-project.iam.gserviceaccount.com"

    /// One stub process: started with the venv's Python, its port read from its first line.
    final class CloudStub {
        let process = Process()
        let port: UInt16
        let logPath: String

        init(script: String, arguments: [String], directory: URL, logName: String? = nil) throws {
            let python = ServerProcess.packageRoot.appendingPathComponent(".venv/bin/python").path
            guard FileManager.default.isExecutableFile(atPath: python) else {
                throw HTTPTestError("\(python) is missing: `make venv` (which `make test` runs) creates it")
            }
            logPath = directory.appendingPathComponent("\(logName ?? script).log").path
            process.executableURL = URL(fileURLWithPath: python)
            process.arguments = [ServerProcess.packageRoot.appendingPathComponent("Tests/Support/cloud-stubs/\(script).py").path]
                + arguments + ["--log", logPath]
            let output = Pipe()
            process.standardOutput = output
            process.standardError = FileHandle(forWritingAtPath: "/dev/null")
            try process.run()
            // The first line is `PORT n`; reading blocks until the stub has bound its socket.
            var line: [UInt8] = []
            while let byte = try output.fileHandleForReading.read(upToCount: 1)?.first, byte != 0x0A { line.append(byte) }
            let text = String(decoding: line, as: UTF8.self)
            guard text.hasPrefix("PORT "), let port = UInt16(text.dropFirst(5)) else {
                process.terminate()
                throw HTTPTestError("\(script) did not start: \(text)")
            }
            self.port = port
        }

        var origin: String { "https://127.0.0.1:\(port)" }

        /// The requests it handled, one JSON object each.
        var log: [[String: Any]] {
            let text = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
            return text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        }

        /// Waits until a logged request satisfies `matches`.
        func waitForLog(timeout: TimeInterval = 10, _ matches: ([String: Any]) -> Bool) async -> [String: Any]? {
            let deadline = Date() + timeout
            while Date() < deadline {
                if let found = log.first(where: matches) { return found }
                try? await Task.sleep(for: .milliseconds(50))
            }
            return nil
        }

        /// SIGTERM, then SIGKILL if it is still there after 5 s.
        func stop() {
            guard process.isRunning else { return }
            process.terminate()
            let deadline = Date() + 5
            while process.isRunning, Date() < deadline { usleep(20_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
    }

    /// Three workspaces on one attestd: `default` on the Anthropic stub, `aws` on the Bedrock
    /// stub, `gcp` on the Vertex stub; one integration and one registered device in each.
    final class Fixture {
        let directory: URL
        let db: String
        let anthropic: UpstreamStubServer
        let certificates: StubCertificates
        let bedrock: CloudStub
        let vertex: CloudStub
        var server: ServerProcess!
        var tokens: [String: String] = [:]
        var clients: [String: String] = [:]
        var serviceAccount = ""

        init(tokenLifetime: Int = 3600) throws {
            let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-cloud-\(UUID().uuidString)")
            directory = scratch
            try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
            func path(_ name: String) -> String { scratch.appendingPathComponent(name).path }
            db = path("attestd.sqlite")
            anthropic = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: [CloudUpstreamTests.anthropicKey]))
            certificates = try StubCertificates.generate()
            try Data(CloudUpstreamTests.anthropicKey.utf8).write(to: URL(fileURLWithPath: path("anthropic.key")))
            try Data((CloudUpstreamTests.secretKey + "\n").utf8).write(to: URL(fileURLWithPath: path("aws-secret")))
            try Data(CloudUpstreamTests.sessionToken.utf8).write(to: URL(fileURLWithPath: path("aws-session")))
            try Self.openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", path("sa.pem")])
            try Self.openssl(["pkey", "-in", path("sa.pem"), "-pubout", "-out", path("sa.pub")])

            let common = ["--cert", certificates.certificatePath, "--key", certificates.keyPath,
                          "--anthropic-url", anthropic.baseURL, "--anthropic-key", CloudUpstreamTests.anthropicKey]
            bedrock = try CloudStub(script: "bedrock_stub", arguments: common + [
                "--region", "us-east-1", "--access-key-id", CloudUpstreamTests.accessKeyID, "--secret-key-file", path("aws-secret"),
                "--session-token-file", path("aws-session")], directory: scratch)
            vertex = try CloudStub(script: "vertex_stub", arguments: common + [
                "--project", CloudUpstreamTests.project, "--region", "us-east5", "--public-key-file", path("sa.pub"),
                "--client-email", CloudUpstreamTests.clientEmail, "--token-lifetime", String(tokenLifetime)], directory: scratch)
            do {
                try configure(path: path)
            } catch {
                stop()
                throw error
            }
        }

        /// The workspaces, their upstreams, integrations and devices (the stubs are running).
        private func configure(path: (String) -> String) throws {
            let privateKey = try String(contentsOfFile: path("sa.pem"), encoding: .utf8)
            serviceAccount = String(decoding: try JSONSerialization.data(withJSONObject: [
                "type": "service_account", "project_id": CloudUpstreamTests.project, "private_key_id": "0123456789abcdef0123",
                "private_key": privateKey, "client_email": CloudUpstreamTests.clientEmail,
                "token_uri": "https://oauth2.googleapis.com/token",
            ]), as: UTF8.self)
            try Data(serviceAccount.utf8).write(to: URL(fileURLWithPath: path("sa.json")))

            _ = try ctl(["init", "--owner", "owner@example.com"])
            _ = try ctl(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", path("anthropic.key")])
            for name in ["aws", "gcp"] { _ = try ctl(["workspaces", "create", "--actor", "owner@example.com", "--name", name]) }
            let models = ["--model", "claude-test=claude-test", "--model", "claude-slow=stub-slow-stream-30"]
            _ = try ctl(["workspaces", "set-upstream-bedrock", "--actor", "owner@example.com", "--workspace", "aws", "--region", "us-east-1", "--api", "invoke",
                         "--access-key-id", CloudUpstreamTests.accessKeyID, "--secret-key-file", path("aws-secret"),
                         "--session-token-file", path("aws-session"), "--endpoint-url", bedrock.origin] + models
                        + ["--model", "claude-throttled=anthropic.throttle-v1:0", "--model", "claude-versioned=anthropic.claude-test-v2:0",
                           "--model", "claude-denied=anthropic.denied-v1:0",
                           "--model", "claude-exception=midstream-exception"]
                        + CloudUpstreamTests.malformedFrames.flatMap { ["--model", "claude-\($0)=\($0)", "--model", "claude-first-\($0)=first-\($0)"] })
            _ = try ctl(["workspaces", "set-upstream-vertex", "--actor", "owner@example.com", "--workspace", "gcp", "--project", CloudUpstreamTests.project,
                         "--region", "us-east5", "--service-account-file", path("sa.json"), "--endpoint-url", vertex.origin,
                         "--token-url", vertex.origin + "/token"] + models + ["--model", "claude-throttled=throttle@2026",
                                                                              "--model", "claude-denied=denied@2026"])
            var clients: [String: String] = [:]
            for workspace in ["default", "aws", "gcp"] {
                let output = try ctl(["integrations", "create", "--actor", "owner@example.com", "--workspace", workspace, "--name", "App",
                                      "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
                clients[workspace] = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
            }
            server = try ServerProcess(db: db, extraArguments: ["--upstream-url", anthropic.baseURL, "--upstream-ca-file", certificates.caPath])
            self.clients = clients
        }

        /// Registers one device per workspace.
        func register() async throws -> Fixture {
            let http = TestHTTP(baseURL: server.baseURL)
            do {
                for (workspace, client) in clients {
                    tokens[workspace] = try #require(try await http.registerFresh(try ManualDevice(clientID: client)).json["access_token"] as? String)
                }
            } catch {
                stop()
                throw error
            }
            return self
        }

        @discardableResult
        func ctl(_ arguments: [String]) throws -> String { try ServerProcess.succeeding(arguments, db: db) }

        static func openssl(_ arguments: [String]) throws {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = ["openssl"] + arguments
            process.standardOutput = FileHandle(forWritingAtPath: "/dev/null")
            process.standardError = FileHandle(forWritingAtPath: "/dev/null")
            try process.run()
            process.waitUntilExit()
            guard process.terminationStatus == 0 else { throw HTTPTestError("openssl \(arguments[0]) failed") }
        }

        func stop() {
            server?.stop()
            bedrock.stop()
            vertex.stop()
            anthropic.stop()
            certificates.remove()
            try? FileManager.default.removeItem(at: directory)
        }

        func post(_ workspace: String, _ body: String, path: String = "/v1/messages", headers: [String: String] = [:]) async throws -> HTTPResult {
            try await TestHTTP(baseURL: server.baseURL).send("POST", path, body: Data(body.utf8), contentType: "application/json",
                                                             headers: ["authorization": "Bearer \(tokens[workspace] ?? "")"].merging(headers) { $1 })
        }
    }

    static func request(model: String = "claude-test", stream: Bool = false) -> String {
        #"{"model":"\#(model)","max_tokens":64,"stream":\#(stream),"messages":[{"role":"user","content":"Hello"}]}"#
    }

    /// The reply with what the Anthropic stub derives from each request taken out: the ids it
    /// numbers per request, and `input_tokens`, which it counts from the body's size (a cloud's
    /// body is not the device's: no `model`, an `anthropic_version`).
    static func comparable(_ body: Data) -> String {
        String(decoding: body, as: UTF8.self)
            .replacingOccurrences(of: #"(msg|req|toolu)_[A-Za-z0-9]+"#, with: "$1_X", options: .regularExpression)
            .replacingOccurrences(of: #""input_tokens":[0-9]+"#, with: #""input_tokens":N"#, options: .regularExpression)
            // Bedrock's `message_stop` carries the usage and its invocation metrics too.
            .replacingOccurrences(of: #"data: \{"type":"message_stop",[^\n]*\}"#, with: #"data: {"type":"message_stop"}"#, options: .regularExpression)
    }

    @Test(arguments: ["aws", "gcp"])
    func jsonAndStreamsArriveAsTheAnthropicAPISendsThem(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        for stream in [false, true] {
            let direct = try await fixture.post("default", Self.request(stream: stream), headers: ["anthropic-beta": "interleaved-thinking-2025-05-14"])
            let cloud = try await fixture.post(workspace, Self.request(stream: stream), headers: ["anthropic-beta": "interleaved-thinking-2025-05-14"])
            #expect(direct.status == 200 && cloud.status == 200)
            #expect(!direct.body.isEmpty)
            #expect(Self.comparable(cloud.body) == Self.comparable(direct.body), "\(workspace), stream \(stream)")
            #expect(cloud.header("content-type")?.hasPrefix(stream ? "text/event-stream" : "application/json") == true)
        }
        // The cloud stub verified every request itself and saw the cloud's own body.
        let stub = workspace == "aws" ? fixture.bedrock : fixture.vertex
        // A stub logs a request once it has answered it, which may be just after the client read the answer.
        _ = await stub.waitForLog { _ in stub.log.filter { $0["grant"] == nil }.count >= 2 }
        let requests = stub.log.filter { $0["grant"] == nil }
        #expect(requests.count == 2 && requests.allSatisfy { $0["verified"] as? Bool == true && $0["status"] as? Int == 200 }, "\(stub.log)")
        let body = try #require(requests.first?["body"] as? [String: Any])
        #expect(body["model"] == nil)
        if workspace == "aws" {
            #expect(body["anthropic_version"] as? String == "bedrock-2023-05-31")
            #expect(body["stream"] == nil && body["anthropic_beta"] as? [String] == ["interleaved-thinking-2025-05-14"])
        } else {
            #expect(body["anthropic_version"] as? String == "vertex-2023-10-16")
        }
        // Usage is recorded against the cloud workspace as for the Anthropic API.
        let usage = try await UsageTests.waitForCloudRequests(fixture, workspace: workspace, 2)
        #expect(UsageTests.total(usage, "requests") == 2 && UsageTests.total(usage, "output_tokens") > 0)
    }

    /// The device as the published client runs it: attest-sim registers by attestation, then
    /// sends a Messages request as JSON and as a stream, through a cloud workspace.
    @Test(arguments: ["aws", "gcp"])
    func aSimulatedDeviceRegistersAndTalksToClaudeOnTheCloud(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let state = fixture.directory.appendingPathComponent("device").path
        for stream in [false, true] {
            let (status, output) = try ServerProcess.attestSim(["simulate-device", "--base-url", fixture.server.baseURL.absoluteString,
                                                                "--client-id", fixture.clients[workspace] ?? "", "--state-dir", state,
                                                                "--app-id", "ABCDE12345.com.example.app", "--messages", "--model", "claude-test"]
                                                               + (stream ? ["--stream"] : []))
            #expect(status == 0, "\(output)")
            #expect(output.contains(#""messages_status":200"#), "\(output)")
            #expect(output.contains("Hello from the upstream stub"), "\(output)")
        }
        let stub = workspace == "aws" ? fixture.bedrock : fixture.vertex
        _ = await stub.waitForLog { _ in stub.log.filter { $0["grant"] == nil && $0["verified"] as? Bool == true }.count >= 2 }
        #expect(stub.log.filter { $0["grant"] == nil && $0["verified"] as? Bool == true }.count == 2)
    }

    @Test func aBedrockModelIDWithAColonIsSignedAsAWSComputesIt() async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let reply = try await fixture.post("aws", Self.request(model: "claude-versioned"))
        #expect(reply.status == 200)
        // The stub logs a request once it has answered it.
        let logged = try #require(await fixture.bedrock.waitForLog { $0["model"] as? String == "anthropic.claude-test-v2:0" })
        #expect(logged["model"] as? String == "anthropic.claude-test-v2:0" && logged["verified"] as? Bool == true)
        #expect((logged["path"] as? String)?.contains("%3A0/invoke") == true)
    }

    @Test(arguments: ["aws", "gcp"])
    func anUnmappedModelIsRefusedBeforeAnythingIsSent(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let reply = try await fixture.post(workspace, Self.request(model: "claude-unmapped"))
        #expect(reply.status == 400)
        let error = try #require(reply.json["error"] as? [String: Any])
        #expect(error["type"] as? String == "invalid_request_error")
        #expect((error["message"] as? String)?.contains("claude-unmapped") == true)
        #expect(fixture.bedrock.log.isEmpty && fixture.vertex.log.filter { $0["grant"] == nil }.isEmpty)
        let count = try await fixture.post(workspace, Self.request(model: "claude-unmapped"), path: "/v1/messages/count_tokens")
        #expect(count.status == 400)
        #expect(fixture.bedrock.log.isEmpty && fixture.vertex.log.filter { $0["grant"] == nil }.isEmpty)
    }

    /// The integration's policy judges the request before its cloud sees it, as on the Anthropic API.
    @Test(arguments: ["aws", "gcp"])
    func theIntegrationsPolicyAppliesAsOnTheAnthropicAPI(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        try fixture.ctl(["integrations", "update", fixture.clients[workspace] ?? "", "--actor", "owner@example.com",
                     "--models", "claude-test", "--max-tokens", "32"])
        let tooMany = try await fixture.post(workspace, Self.request())   // max_tokens 64
        #expect(tooMany.status == 400)
        #expect((tooMany.json["error"] as? [String: Any])?["type"] as? String == "invalid_request_error")
        let otherModel = try await fixture.post(workspace, Self.request(model: "claude-slow").replacingOccurrences(of: "64", with: "16"))
        #expect(otherModel.status == 400)
        let allowed = try await fixture.post(workspace, Self.request().replacingOccurrences(of: "64", with: "16"))
        #expect(allowed.status == 200)
        let stub = workspace == "aws" ? fixture.bedrock : fixture.vertex
        _ = await stub.waitForLog { _ in stub.log.contains { $0["grant"] == nil } }
        #expect(stub.log.filter { $0["grant"] == nil }.count == 1)
    }

    @Test(arguments: ["aws", "gcp"])
    func throttlingIsTheAPIsRateLimitError(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let reply = try await fixture.post(workspace, Self.request(model: "claude-throttled"))
        #expect(reply.status == 429)
        #expect((reply.json["error"] as? [String: Any])?["type"] as? String == "rate_limit_error")
        #expect(reply.json["type"] as? String == "error")
        if workspace == "aws" { #expect(reply.header("retry-after") == "7") }
    }

    @Test func aBedrockExceptionMidStreamIsAnSSEErrorEvent() async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let reply = try await fixture.post("aws", Self.request(model: "claude-exception", stream: true))
        #expect(reply.status == 200)
        let text = String(decoding: reply.body, as: UTF8.self)
        #expect(text.hasPrefix("event: message_start\n"))
        // The type, in this service's words; Bedrock's own go to the log.
        #expect(text.hasSuffix("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"Bedrock is limiting this workspace's requests; retry later\"}}\n\n"))
        #expect(await fixture.server.waitForLog(containing: "Too many tokens, please wait before trying again."))
    }

    /// What the Bedrock stub sends after two good chunks when its model ID names it.
    static let malformedFrames = ["bad-prelude-crc", "bad-message-crc", "truncated-frame", "oversized-frame", "headers-past-frame"]

    @Test(arguments: malformedFrames)
    func aFrameThatDoesNotDecodeEndsTheStreamCleanly(frame: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let reply = try await fixture.post("aws", Self.request(model: "claude-\(frame)", stream: true))
        #expect(reply.status == 200)
        let text = String(decoding: reply.body, as: UTF8.self)
        // Two good events went out; then the API's own error event ends the stream.
        #expect(text.hasPrefix("event: message_start\n"))
        #expect(text.contains("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\""))
        #expect(await fixture.server.waitForLog(containing: frame == "truncated-frame" ? "ended inside a frame" : "does not decode"))
        // The service goes on serving.
        #expect(try await fixture.post("aws", Self.request()).status == 200)
    }

    /// A stream whose very first frame does not decode has sent nothing yet: a clean 502 in the
    /// API's error shape.
    @Test(arguments: malformedFrames)
    func aFirstFrameThatDoesNotDecodeIsA502(frame: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let reply = try await fixture.post("aws", Self.request(model: "claude-first-\(frame)", stream: true))
        #expect(reply.status == 502)
        #expect(reply.json["type"] as? String == "error")
        #expect((reply.json["error"] as? [String: Any])?["type"] as? String == "api_error")
        #expect(try await fixture.post("aws", Self.request()).status == 200)
    }

    @Test(arguments: ["aws", "gcp"])
    func aClientThatLeavesMidStreamCancelsTheCloudTransfer(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let stream = try RawStream(port: fixture.server.port, path: "/v1/messages", token: fixture.tokens[workspace] ?? "",
                                   body: Self.request(model: "claude-slow", stream: true))
        _ = try stream.read(until: "event: content_block_delta", timeout: 15)
        stream.close()
        let stub = workspace == "aws" ? fixture.bedrock : fixture.vertex
        let cancelled = await stub.waitForLog(timeout: 20) { $0["cancelled"] as? Bool == true }
        #expect(cancelled != nil, "the \(workspace) stub never saw the transfer cancelled")
    }

    @Test func vertexTokensAreSharedThenRenewedBeforeTheyExpire() async throws {
        let fixture = try await Fixture(tokenLifetime: 4).register()
        defer { fixture.stop() }
        for _ in 0..<5 { #expect(try await fixture.post("gcp", Self.request()).status == 200) }
        let grants = { fixture.vertex.log.filter { $0["grant"] as? Bool == true && $0["status"] as? Int == 200 }.count }
        _ = await fixture.vertex.waitForLog { $0["grant"] as? Bool == true }
        // Shared, not fetched per request (one renewal may already have begun on a slow machine).
        #expect(grants() >= 1 && grants() <= 2)
        // Past half its life the token is renewed in the background; requests never fail meanwhile.
        let deadline = Date() + 20
        while grants() < 3, Date() < deadline {
            #expect(try await fixture.post("gcp", Self.request()).status == 200)
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(grants() >= 3)
        #expect(fixture.vertex.log.filter { $0["grant"] == nil && $0["status"] as? Int == 401 }.isEmpty)
    }

    @Test func aFailingTokenEndpointIsA503WithALogLineThatSaysWhy() async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        // The stub's control endpoint, over its TLS, with curl.
        let curl = Process()
        curl.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        curl.arguments = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", fixture.certificates.caPath, "-X", "POST",
                          fixture.vertex.origin + "/_stub/token-endpoint?fail=1"]
        let output = Pipe()
        curl.standardOutput = output
        try curl.run()
        let status = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        curl.waitUntilExit()
        #expect(status == "200")
        let reply = try await fixture.post("gcp", Self.request())
        #expect(reply.status == 503)
        #expect((reply.json["error"] as? [String: Any])?["type"] as? String == "api_error")
        #expect(await fixture.server.waitForLog(containing: "cloud_credentials_unavailable"))
        #expect(fixture.server.log.contains("token endpoint answered HTTP 500"))
        // Requests right after are refused from memory, not each by another call to the endpoint.
        _ = await fixture.vertex.waitForLog { $0["grant"] as? Bool == true && $0["status"] as? Int == 500 }
        let asked = fixture.vertex.log.filter { $0["grant"] as? Bool == true }.count
        #expect(asked >= 1)
        for _ in 0..<2 { #expect(try await fixture.post("gcp", Self.request()).status == 503) }
        #expect(fixture.vertex.log.filter { $0["grant"] as? Bool == true }.count == asked)
    }

    @Test func theCredentialsAreNeitherInTheDatabaseNorInAnyLogLine() async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        #expect(try await fixture.post("aws", Self.request()).status == 200)
        #expect(try await fixture.post("gcp", Self.request()).status == 200)
        let show = try fixture.ctl(["workspaces", "show", "aws", "--json"])
        let keyLine = fixture.serviceAccount.components(separatedBy: "\\n").dropFirst(2).first ?? "missing"
        let secrets = [Self.secretKey, Self.sessionToken, "BEGIN PRIVATE KEY", keyLine]
        #expect(keyLine.count >= 40)
        for file in [fixture.db, fixture.db + "-wal"] {
            let bytes = (try? Data(contentsOf: URL(fileURLWithPath: file))) ?? Data()
            for secret in secrets { #expect(bytes.range(of: Data(secret.utf8)) == nil, "\(secret.prefix(12))… in \(file)") }
        }
        for secret in secrets {
            #expect(!fixture.server.log.contains(secret))
            #expect(!show.contains(secret))
        }
        let shown = try #require(try JSONSerialization.jsonObject(with: Data(show.utf8)) as? [String: Any])
        let upstream = try #require(shown["upstream"] as? [String: Any])
        #expect(upstream["kind"] as? String == "bedrock" && upstream["region"] as? String == "us-east-1")
        #expect((upstream["models"] as? [String: String])?["claude-test"] == "claude-test")
    }
}

extension UsageTests {
    /// Waits until attestctl's usage report holds `requests` relayed requests.
    static func waitForCloudRequests(_ fixture: CloudUpstreamTests.Fixture, workspace: String, _ requests: Int,
                                     timeout: TimeInterval = 6) async throws -> [[String: Any]] {
        let deadline = Date() + timeout
        while true {
            let lines = try fixture.ctl(["usage", "--json", "--workspace", workspace]).split(separator: "\n").compactMap {
                try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
            }
            if total(lines, "requests") >= requests { return lines }
            guard Date() <= deadline else {
                Issue.record("the ledger never held \(requests) requests within \(timeout) s: \(total(lines, "requests"))")
                return lines
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }
}
