import AttestDaemon
import Foundation
import Testing
import UpstreamStub

/// attestd reaching a cloud by its real host name: `--upstream-connect-to` (tests only) sends
/// the connection to a stub on 127.0.0.1 while TLS checks the certificate against the real name,
/// and the stubs, started with `--check-host`, refuse any other Host as their cloud's front end
/// does (Google's HTML 404 for a host it does not serve).
@Suite(.serialized) struct CloudHostTests {
    typealias CloudStub = CloudUpstreamTests.CloudStub

    // MARK: The option

    @Test func theOptionTakesHostPortAddressPortWithALoopbackAddress() throws {
        let options = try ServeOptions(["--upstream-connect-to", "bedrock-runtime.us-east-1.amazonaws.com:443:127.0.0.1:8443",
                                        "--upstream-connect-to", "oauth2.googleapis.com:443:[::1]:9443",
                                        "--upstream-connect-to", "aiplatform.googleapis.com:443:127.0.0.2:9444"])
        #expect(options.upstreamConnectTo == ["bedrock-runtime.us-east-1.amazonaws.com:443:127.0.0.1:8443",
                                              "oauth2.googleapis.com:443:[::1]:9443", "aiplatform.googleapis.com:443:127.0.0.2:9444"])
        #expect(try ServeOptions([]).upstreamConnectTo.isEmpty)
    }

    @Test(arguments: [("bedrock-runtime.us-east-1.amazonaws.com", "HOST:PORT:ADDRESS:PORT"),
                      ("bedrock-runtime.us-east-1.amazonaws.com:443:127.0.0.1", "HOST:PORT:ADDRESS:PORT"),
                      ("bedrock-runtime.us-east-1.amazonaws.com:https:127.0.0.1:8443", "HOST:PORT:ADDRESS:PORT"),
                      (":443:127.0.0.1:8443", "HOST:PORT:ADDRESS:PORT"),
                      ("bedrock-runtime.us-east-1.amazonaws.com:443:10.0.0.5:8443", "loopback"),
                      ("bedrock-runtime.us-east-1.amazonaws.com:443:stub.example.com:8443", "loopback"),
                      ("bedrock-runtime.us-east-1.amazonaws.com:443:localhost:8443", "loopback"),
                      ("bedrock-runtime.us-east-1.amazonaws.com:443:[::2]:8443", "loopback"),
                      ("bedrock-runtime.us-east-1.amazonaws.com:443:128.0.0.1:8443", "loopback")])
    func aMalformedOrNonLoopbackValueIsRefusedSayingWhy(value: String, says: String) {
        do {
            _ = try ServeOptions(["--upstream-connect-to", value])
            Issue.record("\(value) was accepted")
        } catch {
            #expect("\(error)".contains("--upstream-connect-to"), "\(error)")
            #expect("\(error)".contains(says), "\(error)")
        }
    }

    // MARK: End to end

    /// attestd, the Anthropic stub, and a workspace per cloud upstream with no endpoint or token
    /// URL of its own: every request goes to the cloud's real host name.
    final class Fixture {
        let directory: URL
        let db: String
        let anthropic: UpstreamStubServer
        let certificates: StubCertificates
        var stubs: [CloudStub] = []
        var server: ServerProcess?
        var caFile: String
        var connectTo: [String] = []
        var clients: [String: String] = [:]
        var tokens: [String: String] = [:]

        init(extraCertificate: StubCertificates? = nil) throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-cloud-host-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            db = directory.appendingPathComponent("attestd.sqlite").path
            anthropic = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: [CloudUpstreamTests.anthropicKey]))
            // The real names, and every *.googleapis.com name, as Google's own certificate covers them.
            certificates = try StubCertificates.generate(dnsNames: StubCertificates.cloudHostNames + ["*.googleapis.com"])
            // attestd takes one CA file: both test CAs when a second certificate is in play.
            caFile = certificates.caPath
            if let extraCertificate {
                caFile = directory.appendingPathComponent("cas.pem").path
                let both = try String(contentsOfFile: certificates.caPath, encoding: .utf8) + "\n"
                    + String(contentsOfFile: extraCertificate.caPath, encoding: .utf8)
                try both.write(toFile: caFile, atomically: true, encoding: .utf8)
            }
            try Data((CloudUpstreamTests.secretKey + "\n").utf8).write(to: url("aws-secret"))
            try Data(CloudUpstreamTests.sessionToken.utf8).write(to: url("aws-session"))
            _ = try ctl(["init", "--owner", "owner@example.com"])
        }

        func url(_ name: String) -> URL { directory.appendingPathComponent(name) }
        func path(_ name: String) -> String { url(name).path }

        func stub(_ script: String, _ arguments: [String], certificate: StubCertificates? = nil) throws -> CloudStub {
            let tls = certificate ?? certificates
            let logs = directory.appendingPathComponent("\(script)-\(stubs.count)")
            try FileManager.default.createDirectory(at: logs, withIntermediateDirectories: true)
            let stub = try CloudStub(script: script, arguments: ["--cert", tls.certificatePath, "--key", tls.keyPath,
                                                                  "--anthropic-url", anthropic.baseURL,
                                                                  "--anthropic-key", CloudUpstreamTests.anthropicKey, "--check-host"] + arguments,
                                     directory: logs)
            stubs.append(stub)
            return stub
        }

        /// A workspace on Bedrock in `region`, its stub reached as bedrock-runtime.REGION.amazonaws.com.
        func bedrock(_ workspace: String, region: String, certificate: StubCertificates? = nil) throws -> CloudStub {
            let stub = try self.stub("bedrock_stub", ["--region", region, "--access-key-id", CloudUpstreamTests.accessKeyID,
                                                      "--secret-key-file", path("aws-secret"), "--session-token-file", path("aws-session")],
                                     certificate: certificate)
            connectTo.append("bedrock-runtime.\(region).amazonaws.com:443:127.0.0.1:\(stub.port)")
            _ = try ctl(["workspaces", "create", "--actor", "owner@example.com", "--name", workspace])
            _ = try ctl(["workspaces", "set-upstream-bedrock", "--actor", "owner@example.com", "--workspace", workspace, "--region", region,
                         "--access-key-id", CloudUpstreamTests.accessKeyID, "--secret-key-file", path("aws-secret"),
                         "--session-token-file", path("aws-session"), "--model", "claude-test=claude-test"])
            try integration(workspace)
            return stub
        }

        /// A workspace on Vertex AI in `region`; the stub stands in for the region's API host, for
        /// oauth2.googleapis.com (the service account's token_uri), and for `alsoHosts`.
        func vertex(_ workspace: String, region: String, alsoHosts: [String] = []) throws -> CloudStub {
            try Fixture.openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", path("sa-\(workspace).pem")])
            try Fixture.openssl(["pkey", "-in", path("sa-\(workspace).pem"), "-pubout", "-out", path("sa-\(workspace).pub")])
            let stub = try self.stub("vertex_stub", ["--project", CloudUpstreamTests.project, "--region", region,
                                                     "--public-key-file", path("sa-\(workspace).pub"), "--client-email", CloudUpstreamTests.clientEmail])
            let apiHost = ["global": "aiplatform.googleapis.com", "us": "aiplatform.us.rep.googleapis.com",
                           "eu": "aiplatform.eu.rep.googleapis.com"][region] ?? "\(region)-aiplatform.googleapis.com"
            for host in [apiHost, "oauth2.googleapis.com"] + alsoHosts.filter({ $0 != apiHost }) {
                connectTo.append("\(host):443:127.0.0.1:\(stub.port)")
            }
            let account = try JSONSerialization.data(withJSONObject: [
                "type": "service_account", "project_id": CloudUpstreamTests.project, "private_key_id": "0123456789abcdef0123",
                "private_key": try String(contentsOfFile: path("sa-\(workspace).pem"), encoding: .utf8),
                "client_email": CloudUpstreamTests.clientEmail, "token_uri": "https://oauth2.googleapis.com/token",
            ])
            try account.write(to: url("sa-\(workspace).json"))
            _ = try ctl(["workspaces", "create", "--actor", "owner@example.com", "--name", workspace])
            _ = try ctl(["workspaces", "set-upstream-vertex", "--actor", "owner@example.com", "--workspace", workspace,
                         "--project", CloudUpstreamTests.project, "--region", region, "--service-account-file", path("sa-\(workspace).json"),
                         "--model", "claude-test=claude-test@20260101"])
            try integration(workspace)
            return stub
        }

        private func integration(_ workspace: String) throws {
            let output = try ctl(["integrations", "create", "--actor", "owner@example.com", "--workspace", workspace, "--name", "App",
                                  "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
            clients[workspace] = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
        }

        /// Starts attestd with every `--upstream-connect-to` and registers a device per workspace.
        func start() async throws {
            let server = try ServerProcess(db: db, extraArguments: ["--upstream-url", anthropic.baseURL, "--upstream-ca-file", caFile]
                                           + connectTo.flatMap { ["--upstream-connect-to", $0] })
            self.server = server
            let http = TestHTTP(baseURL: server.baseURL)
            for (workspace, client) in clients {
                tokens[workspace] = try #require(try await http.registerFresh(try ManualDevice(clientID: client)).json["access_token"] as? String)
            }
        }

        func post(_ workspace: String, stream: Bool = false) async throws -> HTTPResult {
            let body = #"{"model":"claude-test","max_tokens":16,"stream":\#(stream),"messages":[{"role":"user","content":"Hello"}]}"#
            return try await TestHTTP(baseURL: try #require(server).baseURL).send("POST", "/v1/messages", body: Data(body.utf8),
                                                                                    contentType: "application/json",
                                                                                    headers: ["authorization": "Bearer \(tokens[workspace] ?? "")"])
        }

        @discardableResult
        func ctl(_ arguments: [String]) throws -> String {
            let (status, output) = try ServerProcess.attestctl(arguments + ["--db", db])
            guard status == 0 else { throw HTTPTestError("attestctl \(arguments.prefix(2).joined(separator: " ")) exited \(status): \(output)") }
            return output
        }

        static func openssl(_ arguments: [String]) throws { try CloudUpstreamTests.Fixture.openssl(arguments) }

        func stop() {
            server?.stop()
            for stub in stubs { stub.stop() }
            anthropic.stop()
            certificates.remove()
            try? FileManager.default.removeItem(at: directory)
        }
    }

    @Test func bedrockIsReachedByItsRealHostAndItsCertificateIsCheckedAgainstIt() async throws {
        // A second stub whose certificate names 127.0.0.1 and localhost only, for eu-west-1.
        let wrongCertificate = try StubCertificates.generate()
        defer { wrongCertificate.remove() }
        let fixture = try Fixture(extraCertificate: wrongCertificate)
        defer { fixture.stop() }
        let bedrock = try fixture.bedrock("aws", region: "us-east-1")
        let impostor = try fixture.bedrock("aws-eu", region: "eu-west-1", certificate: wrongCertificate)
        try await fixture.start()

        for stream in [false, true] {
            let reply = try await fixture.post("aws", stream: stream)
            let text = String(decoding: reply.body, as: UTF8.self)
            #expect(reply.status == 200, "\(text)")
            #expect(stream ? text.contains("event: message_stop") : text.contains("Hello from the upstream stub"), "\(text)")
        }
        // The stub verified the SigV4 signature over the real host, which it checked.
        _ = await bedrock.waitForLog { _ in bedrock.log.count >= 2 }
        #expect(bedrock.log.count == 2)
        #expect(bedrock.log.allSatisfy { $0["host"] as? String == "bedrock-runtime.us-east-1.amazonaws.com"
                                         && $0["verified"] as? Bool == true && $0["status"] as? Int == 200 }, "\(bedrock.log)")
        #expect(await fixture.server?.waitForLog(containing: "upstream_connect_to") == true)

        // The eu-west-1 stub's certificate does not name bedrock-runtime.eu-west-1.amazonaws.com:
        // TLS refuses it, nothing is sent, the device gets the API's error.
        let refused = try await fixture.post("aws-eu")
        #expect(refused.status == 502, "\(String(decoding: refused.body, as: UTF8.self))")
        #expect((refused.json["error"] as? [String: Any])?["type"] as? String == "api_error")
        #expect(impostor.log.isEmpty)
    }

    /// Vertex AI's hosts by location (anthropic-sdk-python lib/vertex/_client.py): `global` is
    /// aiplatform.googleapis.com, `us` and `eu` aiplatform.{us,eu}.rep.googleapis.com, others
    /// REGION-aiplatform.googleapis.com; global-aiplatform.googleapis.com (and us-…, eu-…) answer
    /// Google's HTML 404, so the stub stands in for them too and answers that.
    @Test(arguments: ["us-east5", "global", "us", "eu"])
    func vertexIsReachedByTheLocationsHostAndTheTokenByOauth2(region: String) async throws {
        let fixture = try Fixture()
        defer { fixture.stop() }
        let vertex = try fixture.vertex("gcp", region: region, alsoHosts: ["\(region)-aiplatform.googleapis.com"])
        try await fixture.start()

        for stream in [false, true] {
            let reply = try await fixture.post("gcp", stream: stream)
            #expect(reply.status == 200, "\(region): \(reply.status) \(String(decoding: reply.body, as: UTF8.self)); stub log: \(vertex.log.map { ($0["host"] ?? "-", $0["path"] ?? "-", $0["reason"] ?? "-") })")
        }
        let grants = vertex.log.filter { $0["grant"] as? Bool == true }
        #expect(grants.contains { $0["host"] as? String == "oauth2.googleapis.com" && $0["status"] as? Int == 200 }, "\(grants)")
        let apiHost = ["global": "aiplatform.googleapis.com", "us": "aiplatform.us.rep.googleapis.com",
                       "eu": "aiplatform.eu.rep.googleapis.com"][region] ?? "\(region)-aiplatform.googleapis.com"
        let predictions = vertex.log.filter { $0["grant"] == nil }
        #expect(!predictions.isEmpty && predictions.allSatisfy { $0["host"] as? String == apiHost && $0["verified"] as? Bool == true
                                                                 && $0["status"] as? Int == 200 },
                "\(predictions.map { ($0["host"] ?? "-", $0["status"] ?? "-", $0["reason"] ?? "-") })")
    }
}
