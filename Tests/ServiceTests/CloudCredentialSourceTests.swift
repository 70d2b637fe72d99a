import CloudUpstreams
import Foundation
import Synchronization
import Testing
import UpstreamClient
import UpstreamStub
@testable import RelayRoutes

extension ServerProcess {
    /// attestctl's output for `arguments` on `db`; a failure throws with what it said.
    static func succeeding(_ arguments: [String], db: String) throws -> String {
        let (status, output) = try attestctl(arguments + ["--db", db])
        guard status == 0 else { throw HTTPTestError("attestctl \(arguments.prefix(2).joined(separator: " ")) exited \(status): \(output)") }
        return output
    }
}

/// Credentials that renew, on the shipped binaries: attestd gets its AWS keys from STS
/// (AssumeRoleWithWebIdentity with a token file), a container-credentials endpoint or IMDSv2,
/// optionally with a role assumed on top, and its Google token from the metadata server, all
/// played by `credentials_stub.py` over loopback with short lifetimes. The Bedrock and Vertex
/// TLS stubs accept what it issued, and refuse it once expired, so a request signed with an
/// expired key would fail. Entra ID's client credentials (secret and certificate) and managed
/// identity are driven through the relay's credential cache over real sockets.
@Suite(.serialized) struct CloudCredentialSourceTests {
    typealias CloudStub = CloudUpstreamTests.CloudStub
    static let roleARN = "arn:aws:iam::123456789012:role/relay"
    static let assumedRoleARN = "arn:aws:iam::123456789012:role/bedrock"
    static let webIdentityToken = "eyJhbGciOiJSUzI1NiJ9.web-identity-token-of-the-pod.c2lnbmF0dXJl"
    static let containerToken = "container-authorization-token-0123456789"
    static let bedrockAPIKey = "ABSKQmVkcm9ja0FQSUtleS1zdHViLWtleQ==stubsecret"
    static let anthropicKey = "test-key-credential-sources-0000"
    static let models = ["--model", "claude-test=claude-test"]
    static let tenant = "contoso.onmicrosoft.com"
    static let clientID = "8f0e2a4c-1b3d-4e5f-9a7b-0c1d2e3f4a5b"
    static let clientSecret = "entra~client~secret~fixture~0123456789"

    final class Fixture {
        let directory: URL
        let db: String
        let anthropic: UpstreamStubServer
        let certificates: StubCertificates
        let credentials: CloudStub
        let cloud: CloudStub
        var server: ServerProcess!
        var token = ""
        let issuedPath: String

        /// - Parameters:
        ///   - cloud: `bedrock` or `vertex`.
        ///   - upstream: the `set-upstream-…` arguments after the workspace.
        ///   - environment: attestd's environment, given the credentials stub's origin and the scratch directory.
        init(cloud kind: String, lifetime: Int, upstream: ((String) -> String) -> [String], environment: (String, (String) -> String) -> [String: String]) throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-credsrc-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let scratch = directory
            func path(_ name: String) -> String { scratch.appendingPathComponent(name).path }
            db = path("attestd.sqlite")
            issuedPath = path("issued.json")
            try Data(CloudCredentialSourceTests.webIdentityToken.utf8).write(to: URL(fileURLWithPath: path("web-identity-token")))
            try Data(CloudCredentialSourceTests.containerToken.utf8).write(to: URL(fileURLWithPath: path("container-token")))
            try Data((CloudCredentialSourceTests.bedrockAPIKey + "\n").utf8).write(to: URL(fileURLWithPath: path("bedrock-api-key")))
            try Data("static-secret-never-used-00000000000".utf8).write(to: URL(fileURLWithPath: path("static-secret")))
            try Data(CloudCredentialSourceTests.clientSecret.utf8).write(to: URL(fileURLWithPath: path("client-secret")))
            if kind == "foundry" {
                try CloudUpstreamTests.Fixture.openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=relay",
                                                        "-keyout", path("client-key.pem"), "-out", path("client-cert.pem")])
                try (Data(contentsOf: URL(fileURLWithPath: path("client-cert.pem"))) + Data(contentsOf: URL(fileURLWithPath: path("client-key.pem"))))
                    .write(to: URL(fileURLWithPath: path("client.pem")))
            }
            anthropic = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: [CloudCredentialSourceTests.anthropicKey]))
            certificates = try StubCertificates.generate()
            credentials = try CloudStub(script: "credentials_stub", arguments: [
                "--issued", issuedPath, "--lifetime", String(lifetime), "--role-arn", CloudCredentialSourceTests.roleARN,
                "--assume-role-arn", CloudCredentialSourceTests.assumedRoleARN, "--web-identity-token-file", path("web-identity-token"),
                "--container-token-file", path("container-token"), "--tenant", CloudCredentialSourceTests.tenant,
                "--client-id", CloudCredentialSourceTests.clientID, "--client-secret-file", path("client-secret"),
                "--client-certificate-file", path("client-cert.pem"), "--identity-header", "app-service-header"], directory: scratch)
            let common = ["--cert", certificates.certificatePath, "--key", certificates.keyPath, "--anthropic-url", anthropic.baseURL,
                          "--anthropic-key", CloudCredentialSourceTests.anthropicKey, "--issued-credentials", issuedPath]
            if kind == "bedrock" {
                cloud = try CloudStub(script: "bedrock_stub", arguments: common + [
                    "--region", "us-east-1", "--access-key-id", "AKIASTATICNEVERUSED0", "--secret-key-file", path("static-secret"),
                    "--api-key-file", path("bedrock-api-key")], directory: scratch)
            } else if kind == "foundry" {
                cloud = try CloudStub(script: "compatible_stub", arguments: common + ["--service", "foundry", "--deployment", "claude-test=claude-test"],
                                      directory: scratch)
            } else {
                try CloudUpstreamTests.Fixture.openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", path("sa.pem")])
                try CloudUpstreamTests.Fixture.openssl(["pkey", "-in", path("sa.pem"), "-pubout", "-out", path("sa.pub")])
                cloud = try CloudStub(script: "vertex_stub", arguments: common + [
                    "--project", CloudUpstreamTests.project, "--region", "us-east5", "--public-key-file", path("sa.pub"),
                    "--client-email", CloudUpstreamTests.clientEmail], directory: scratch)
            }
            let credentialsOrigin = "http://127.0.0.1:\(credentials.port)"
            do {
                try ctl(["init", "--owner", "owner@example.com"])
                try ctl(["workspaces", "create", "--actor", "owner@example.com", "--name", "cloud"])
                try ctl(["workspaces", "set-upstream-\(kind)", "--actor", "owner@example.com",
                         "--workspace", "cloud", "--endpoint-url", cloud.origin] + upstream(path) + CloudCredentialSourceTests.models)
                let output = try ctl(["integrations", "create", "--actor", "owner@example.com", "--workspace", "cloud", "--name", "App",
                                      "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
                let client = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
                server = try ServerProcess(db: db, extraArguments: ["--upstream-url", anthropic.baseURL, "--upstream-ca-file", certificates.caPath],
                                           environment: environment(credentialsOrigin, path))
                self.client = client
            } catch {
                stop()
                throw error
            }
        }

        private(set) var client = ""

        func register() async throws -> Fixture {
            do {
                token = try #require(try await TestHTTP(baseURL: server.baseURL).registerFresh(try ManualDevice(clientID: client)).json["access_token"] as? String)
            } catch {
                stop()
                throw error
            }
            return self
        }

        @discardableResult
        func ctl(_ arguments: [String]) throws -> String { try ServerProcess.succeeding(arguments, db: db) }

        func post() async throws -> HTTPResult {
            try await TestHTTP(baseURL: server.baseURL).send("POST", "/v1/messages", body: Data(CloudUpstreamTests.request().utf8),
                                                             contentType: "application/json", headers: ["authorization": "Bearer \(token)"])
        }

        /// POSTs to the credentials stub's control endpoint.
        func control(_ pathAndQuery: String) throws {
            let curl = Process()
            curl.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            curl.arguments = ["curl", "-sf", "-o", "/dev/null", "-X", "POST", "http://127.0.0.1:\(credentials.port)\(pathAndQuery)"]
            try curl.run()
            curl.waitUntilExit()
            guard curl.terminationStatus == 0 else { throw HTTPTestError("control \(pathAndQuery) failed") }
        }

        /// Every secret the stub issued so far (keys, session tokens, bearer tokens).
        var issuedSecrets: [String] {
            guard let data = FileManager.default.contents(atPath: issuedPath),
                  let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return [] }
            let aws = (object["aws"] as? [String: [String: Any]] ?? [:]).values.flatMap { [$0["secret"] as? String, $0["token"] as? String].compactMap { $0 } }
            return aws + (object["bearer"] as? [String: Any] ?? [:]).keys
        }

        func stop() {
            server?.stop()
            credentials.stop()
            cloud.stop()
            anthropic.stop()
            certificates.remove()
            try? FileManager.default.removeItem(at: directory)
        }

        /// Sends a request every 200 ms until `seconds` have passed and the stub issued `issues`
        /// credentials, each answered 200; returns how many were sent.
        func keepAsking(atLeast seconds: TimeInterval, issues: Int, endpoint: String) async throws -> Int {
            let started = Date()
            var sent = 0
            while Date().timeIntervalSince(started) < seconds || issued(endpoint) < issues {
                guard Date().timeIntervalSince(started) < seconds + 20 else { break }
                let reply = try await post()
                sent += 1
                #expect(reply.status == 200, "request \(sent) after \(Date().timeIntervalSince(started)) s: \(reply.status) \(String(decoding: reply.body, as: UTF8.self))")
                if reply.status != 200 { break }
                try await Task.sleep(for: .milliseconds(200))
            }
            return sent
        }

        /// Credentials the stub issued from one endpoint.
        func issued(_ endpoint: String) -> Int {
            credentials.log.filter { $0["endpoint"] as? String == endpoint && $0["status"] as? Int == 200 && $0["path"] as? String != "/latest/api/token"
                && $0["path"] as? String != "/latest/meta-data/iam/security-credentials/" }.count
        }
    }

    static func awsEnvironment(_ origin: String, _ path: (String) -> String) -> [String: String] {
        ["AWS_WEB_IDENTITY_TOKEN_FILE": path("web-identity-token"), "AWS_ROLE_ARN": roleARN, "AWS_ENDPOINT_URL_STS": origin,
         "AWS_CONTAINER_CREDENTIALS_FULL_URI": origin + "/container/credentials", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": path("container-token"),
         "AWS_EC2_METADATA_SERVICE_ENDPOINT": origin]
    }

    static func endpoint(of source: String) -> String {
        ["web-identity": "sts", "container": "container", "instance": "imds"][source] ?? source
    }

    /// Each AWS source: credentials that live 4 s, asked for over 9 s, so the first expires
    /// mid-test; every request is answered 200, and Bedrock never refused a key (none went out expired).
    @Test(arguments: ["web-identity", "container", "instance"])
    func awsCredentialsRenewBeforeTheyExpire(source: String) async throws {
        let fixture = try await Fixture(cloud: "bedrock", lifetime: 4, upstream: { _ in ["--region", "us-east-1", "--aws-credentials", source] },
                                        environment: Self.awsEnvironment).register()
        defer { fixture.stop() }
        let endpoint = Self.endpoint(of: source)
        // The first request waits for the fetch; the next ones use the cached keys (figures for the report).
        let cold = Date()
        #expect(try await fixture.post().status == 200)
        let coldSeconds = Date().timeIntervalSince(cold)
        var warm: [TimeInterval] = []
        for _ in 0..<5 {
            let started = Date()
            #expect(try await fixture.post().status == 200)
            warm.append(Date().timeIntervalSince(started))
        }
        let sent = try await fixture.keepAsking(atLeast: 9, issues: 3, endpoint: endpoint) + 6
        let elapsed = Date().timeIntervalSince(cold)
        print("credential source \(source): first request \(Int(coldSeconds * 1000)) ms (fetch included), then median "
              + "\(Int(warm.sorted()[2] * 1000)) ms; \(fixture.issued(endpoint)) fetches for \(sent) requests")
        #expect(fixture.issued(endpoint) >= 3, "\(fixture.credentials.log)")
        // Shared, not fetched per request: at most one fetch per half-life (2 s), however many requests.
        #expect(fixture.issued(endpoint) <= Int(elapsed / 2) + 2, "\(fixture.issued(endpoint)) fetches in \(elapsed) s for \(sent) requests")
        _ = await fixture.cloud.waitForLog { _ in fixture.cloud.log.count >= sent }
        let requests = fixture.cloud.log
        #expect(requests.allSatisfy { $0["status"] as? Int == 200 && $0["verified"] as? Bool == true }, "\(requests.filter { $0["status"] as? Int != 200 })")
        // Signed with the issued keys (ASIA…), several of them in turn.
        let keys = Set(requests.compactMap { $0["access_key_id"] as? String })
        #expect(keys.count >= 2 && keys.allSatisfy { $0.hasPrefix("ASIA") })
        if source == "instance" {
            // IMDSv2: a PUT for the token came before each credential.
            #expect(fixture.credentials.log.contains { $0["path"] as? String == "/latest/api/token" && $0["method"] as? String == "PUT" })
        }
        try Self.expectNoLeaks(fixture, extra: [Self.webIdentityToken, Self.containerToken])
    }

    /// `--assume-role` on top of the container source: STS AssumeRole is signed with the
    /// container's keys (the stub checks the signature with botocore), and Bedrock sees the
    /// assumed role's keys, renewed as they expire.
    @Test func aRoleIsAssumedOnTopOfTheContainerCredentials() async throws {
        let fixture = try await Fixture(cloud: "bedrock", lifetime: 4, upstream: { _ in
            ["--region", "us-east-1", "--aws-credentials", "container", "--assume-role", Self.assumedRoleARN]
        }, environment: Self.awsEnvironment).register()
        defer { fixture.stop() }
        _ = try await fixture.keepAsking(atLeast: 6, issues: 2, endpoint: "sts")
        let assumed = fixture.credentials.log.filter { $0["action"] as? String == "AssumeRole" && $0["status"] as? Int == 200 }
        #expect(assumed.count >= 2 && assumed.allSatisfy { $0["verified"] as? Bool == true })
        // The container's keys signed AssumeRole; Bedrock saw only the role's.
        let containerKeys = Set(fixture.credentials.log.filter { $0["endpoint"] as? String == "container" }.compactMap { $0["issued"] as? String })
        let roleKeys = Set(assumed.compactMap { $0["issued"] as? String })
        let usedKeys = Set(fixture.cloud.log.compactMap { $0["access_key_id"] as? String })
        #expect(!usedKeys.isEmpty && usedKeys.isSubset(of: roleKeys) && usedKeys.isDisjoint(with: containerKeys))
        let shown = try fixture.ctl(["workspaces", "show", "cloud", "--json"])
        let upstream = try #require((try JSONSerialization.jsonObject(with: Data(shown.utf8)) as? [String: Any])?["upstream"] as? [String: Any])
        #expect(upstream["credential_source"] as? String == "container" && upstream["assume_role"] as? String == Self.assumedRoleARN)
        try Self.expectNoLeaks(fixture, extra: [Self.containerToken])
    }

    /// The source and its role are bound into the seal: a row whose `credential_source` or
    /// `assume_role` was edited in the database alone no longer opens (503, logged), and no
    /// credential is fetched for the edited settings.
    @Test(arguments: [("assume_role", "arn:aws:iam::123456789012:role/other"), ("credential_source", "instance")])
    func anEditedSourceNoLongerOpens(setting: String, value: String) async throws {
        let fixture = try await Fixture(cloud: "bedrock", lifetime: 3600, upstream: { _ in
            ["--region", "us-east-1", "--aws-credentials", "container", "--assume-role", Self.assumedRoleARN]
        }, environment: Self.awsEnvironment).register()
        defer { fixture.stop() }
        #expect(try await fixture.post().status == 200)
        let asked = fixture.credentials.log.count
        let (status, output) = try ServerProcess.run("/usr/bin/sqlite3", [fixture.db, """
            UPDATE workspace_upstream_keys SET settings = json_set(settings, '$.\(setting)', '\(value)')
            WHERE workspace_id = (SELECT id FROM workspaces WHERE name = 'cloud')
            """])
        #expect(status == 0, "\(output)")
        let reply = try await fixture.post()
        #expect(reply.status == 503)
        #expect(await fixture.server.waitForLog(containing: "do not open with their settings"))
        #expect(fixture.credentials.log.count == asked, "a credential was fetched for edited settings")
    }

    /// Vertex AI on the metadata server's token: renewed as it expires; revoked, the 401 drops it
    /// and exactly one fresh fetch follows, the request still answered 200.
    @Test func vertexUsesTheMetadataServerAndARefusalFetchesOnce() async throws {
        let fixture = try await Fixture(cloud: "vertex", lifetime: 4, upstream: { _ in
            ["--project", CloudUpstreamTests.project, "--region", "us-east5", "--metadata-server"]
        }, environment: { origin, _ in ["GCE_METADATA_HOST": String(origin.dropFirst("http://".count))] }).register()
        defer { fixture.stop() }
        _ = try await fixture.keepAsking(atLeast: 6, issues: 2, endpoint: "metadata")
        #expect(fixture.issued("metadata") >= 2)
        #expect(fixture.cloud.log.allSatisfy { $0["status"] as? Int == 200 })
        let before = fixture.issued("metadata")
        try fixture.control("/_stub/revoke")
        let reply = try await fixture.post()
        #expect(reply.status == 200)
        #expect(fixture.issued("metadata") == before + 1)
        #expect(await fixture.server.waitForLog(containing: "cloud_credentials_dropped"))
        #expect(fixture.cloud.log.filter { $0["status"] as? Int == 401 }.count == 1)
        let shown = try fixture.ctl(["workspaces", "show", "cloud", "--json"])
        #expect(shown.contains(#""credential_source":"metadata-server""#) || shown.contains(#""credential_source" : "metadata-server""#))
        try Self.expectNoLeaks(fixture, extra: [])
    }

    /// Microsoft Foundry on an Entra ID token (client secret, certificate assertion, or App
    /// Service's managed identity) from the token endpoint's stub: tokens that live 4 s are renewed
    /// before any request fails; revoked, the 401 drops the token and one fresh fetch follows.
    @Test(arguments: ["client-secret", "client-certificate", "managed-identity"])
    func foundryOnEntraTokensThatRenew(source: String) async throws {
        let fixture = try await Fixture(cloud: "foundry", lifetime: 4, upstream: { path in
            let entra = switch source {
            case "client-secret": ["--tenant-id", Self.tenant, "--client-id", Self.clientID, "--client-secret-file", path("client-secret")]
            case "client-certificate": ["--tenant-id", Self.tenant, "--client-id", Self.clientID, "--client-certificate-file", path("client.pem")]
            default: ["--managed-identity", "--client-id", Self.clientID]
            }
            return ["--resource", "contoso-ai"] + entra
        }, environment: { origin, _ in
            ["AZURE_AUTHORITY_HOST": origin, "IDENTITY_ENDPOINT": origin + "/msi/token", "IDENTITY_HEADER": "app-service-header"]
        }).register()
        defer { fixture.stop() }
        let endpoint = source == "managed-identity" ? "managed" : "entra"
        _ = try await fixture.keepAsking(atLeast: 6, issues: 2, endpoint: endpoint)
        #expect(fixture.issued(endpoint) >= 2)
        #expect(fixture.cloud.log.allSatisfy { $0["status"] as? Int == 200 && $0["auth"] as? String == "entra" }, "\(fixture.cloud.log)")
        if source != "managed-identity" {
            let auth = source == "client-secret" ? "secret" : "certificate"
            #expect(fixture.credentials.log.filter { $0["endpoint"] as? String == "entra" }.allSatisfy { $0["auth"] as? String == auth })
        }
        let before = fixture.issued(endpoint)
        try fixture.control("/_stub/revoke")
        #expect(try await fixture.post().status == 200)
        #expect(fixture.issued(endpoint) == before + 1)
        #expect(await fixture.server.waitForLog(containing: "cloud_credentials_dropped"))
        let shown = try fixture.ctl(["workspaces", "show", "cloud", "--json"])
        let upstream = try #require((try JSONSerialization.jsonObject(with: Data(shown.utf8)) as? [String: Any])?["upstream"] as? [String: Any])
        #expect(upstream["credential_source"] as? String == source && upstream["client_id"] as? String == Self.clientID)
        let keyLines = (try? String(contentsOfFile: fixture.directory.appendingPathComponent("client-key.pem").path, encoding: .utf8))?
            .split(separator: "\n").dropFirst().prefix(3).map(String.init) ?? []
        try Self.expectNoLeaks(fixture, extra: [Self.clientSecret] + keyLines)
    }

    /// A Bedrock API key goes as `Authorization: Bearer`, and is never shown or stored in the clear.
    @Test func aBedrockAPIKeyIsSentAsABearerToken() async throws {
        let fixture = try await Fixture(cloud: "bedrock", lifetime: 3600, upstream: { path in
            ["--region", "us-east-1", "--bedrock-api-key-file", path("bedrock-api-key")]
        }, environment: { _, _ in [:] }).register()
        defer { fixture.stop() }
        #expect(try await fixture.post().status == 200)
        let logged = try #require(await fixture.cloud.waitForLog { $0["auth"] as? String == "bedrock-api-key" })
        #expect(logged["status"] as? Int == 200)
        try Self.expectNoLeaks(fixture, extra: [Self.bedrockAPIKey])
    }

    /// A credential endpoint that fails: the device gets 503 `api_error` (never 401), and the
    /// log names the source and the endpoint's answer.
    @Test func aFailingCredentialEndpointIsA503ThatTheLogExplains() async throws {
        let fixture = try await Fixture(cloud: "bedrock", lifetime: 3600, upstream: { _ in ["--region", "us-east-1", "--aws-credentials", "container"] },
                                        environment: Self.awsEnvironment).register()
        defer { fixture.stop() }
        try fixture.control("/_stub/fail?endpoint=container&on=1")
        let reply = try await fixture.post()
        #expect(reply.status == 503)
        #expect((reply.json["error"] as? [String: Any])?["type"] as? String == "api_error")
        #expect(await fixture.server.waitForLog(containing: "cloud_credentials_unavailable"))
        #expect(fixture.server.log.contains("the container credentials endpoint answered HTTP 500"))
        #expect(fixture.cloud.log.isEmpty)
        #expect(!fixture.server.log.contains(#""status":401"#))
        // Once the endpoint answers again (after the failure is held a few seconds), so does Bedrock.
        try fixture.control("/_stub/fail?endpoint=container&on=0")
        let deadline = Date() + 15
        var status = 0
        while Date() < deadline, status != 200 {
            status = try await fixture.post().status
            #expect(status == 200 || status == 503)
            if status != 200 { try await Task.sleep(for: .milliseconds(250)) }
        }
        #expect(status == 200)
    }

    /// Nothing secret in the database, its WAL, attestd's log, /metrics or `workspaces show --json`.
    static func expectNoLeaks(_ fixture: Fixture, extra: [String]) throws {
        let secrets = fixture.issuedSecrets + extra
        #expect(!secrets.isEmpty)
        let show = try fixture.ctl(["workspaces", "show", "cloud", "--json"])
        let metrics = try ServerProcess.run("/usr/bin/curl", ["-s", fixture.server.adminBaseURL.absoluteString + "/metrics"]).1
        #expect(metrics.contains("attestd_"))
        for file in [fixture.db, fixture.db + "-wal"] {
            let bytes = (try? Data(contentsOf: URL(fileURLWithPath: file))) ?? Data()
            for secret in secrets { #expect(bytes.range(of: Data(secret.utf8)) == nil, "\(secret.prefix(8))… in \(file)") }
        }
        for secret in secrets {
            #expect(!fixture.server.log.contains(secret), "\(secret.prefix(8))… in the log")
            #expect(!show.contains(secret) && !metrics.contains(secret))
        }
    }
}

/// Microsoft Entra ID through the relay's credential cache, over real sockets to the credentials
/// stub: client credentials with a secret and with a certificate's signed assertion (the stub
/// checks its signature with the certificate's public key, `x5t#S256`, `aud`, `iss`/`sub`, `exp`),
/// managed identity (IMDS and App Service), a token that expires mid-test and is renewed, and a
/// refusal that drops it so one fresh fetch follows.
@Suite(.serialized) struct EntraCredentialTests {
    static let tenant = "contoso.onmicrosoft.com"
    static let clientID = "8f0e2a4c-1b3d-4e5f-9a7b-0c1d2e3f4a5b"
    static let secret = "entra~client~secret~0123456789abcdefghij"

    final class Stub {
        let directory: URL
        let stub: CloudUpstreamTests.CloudStub
        let client: UpstreamClient
        let certificatePEM: [UInt8]

        init(lifetime: Int) throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-entra-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let scratch = directory
            func path(_ name: String) -> String { scratch.appendingPathComponent(name).path }
            try Data(EntraCredentialTests.secret.utf8).write(to: URL(fileURLWithPath: path("secret")))
            try CloudUpstreamTests.Fixture.openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=relay",
                                                    "-keyout", path("key.pem"), "-out", path("cert.pem")])
            certificatePEM = Array(try Data(contentsOf: URL(fileURLWithPath: path("cert.pem"))) + Data(contentsOf: URL(fileURLWithPath: path("key.pem"))))
            stub = try CloudUpstreamTests.CloudStub(script: "credentials_stub", arguments: [
                "--lifetime", String(lifetime), "--tenant", EntraCredentialTests.tenant, "--client-id", EntraCredentialTests.clientID,
                "--client-secret-file", path("secret"), "--client-certificate-file", path("cert.pem"), "--identity-header", "app-service-header",
                "--issued", path("issued.json")], directory: scratch)
            client = try UpstreamClient(UpstreamConfiguration(baseURL: "http://127.0.0.1:\(stub.port)"))
        }

        var origin: String { "http://127.0.0.1:\(stub.port)" }

        func stop() {
            client.shutdown()
            stub.stop()
            try? FileManager.default.removeItem(at: directory)
        }

        /// One credential from `cache`, waited for.
        func credential(_ cache: CloudCredentials, _ source: CredentialSource) async -> Result<CloudCredential, CredentialFailure> {
            let client = self.client
            return await withCheckedContinuation { continuation in
                cache.credential(CloudCredentials.Identity(workspace: 1, sealed: [1], binding: []), source: source,
                                 start: { request, delegate in _ = client.start(request, delegate: delegate) }) { continuation.resume(returning: $0) }
            }
        }

        func granted(_ auth: String) -> Int {
            stub.log.filter { $0["endpoint"] as? String == "entra" && $0["auth"] as? String == auth && $0["status"] as? Int == 200 }.count
        }
    }

    static func token(_ result: Result<CloudCredential, CredentialFailure>) -> String? {
        if case .success(.bearer(let token)) = result { return token }
        return nil
    }

    @Test(arguments: ["secret", "certificate"])
    func clientCredentialsAreGrantedRenewedAndDroppedOnARefusal(auth: String) async throws {
        let stub = try Stub(lifetime: 3)
        defer { stub.stop() }
        let cache = CloudCredentials(environment: CredentialEnvironment(["AZURE_AUTHORITY_HOST": stub.origin]))
        let source: CredentialSource = auth == "secret"
            ? .entraClientSecret(tenant: Self.tenant, clientID: Self.clientID, secret: Self.secret, scope: "https://cognitiveservices.azure.com/.default")
            : .entraClientCertificate(tenant: Self.tenant, clientID: Self.clientID, certificate: try EntraClientCertificate(pem: stub.certificatePEM),
                                      scope: "https://cognitiveservices.azure.com/.default")
        let first = await stub.credential(cache, source)
        let firstToken = try #require(Self.token(first), "\(first)")
        #expect(stub.granted(auth) == 1)
        // Shared while fresh: the same token, not a grant per call (a renewal may begin on a slow machine).
        for _ in 0..<3 { #expect(Self.token(await stub.credential(cache, source)) == firstToken) }
        #expect(stub.granted(auth) <= 2)
        // Past half its life it is renewed in the background; every answer meanwhile is usable.
        let deadline = Date() + 8
        var tokens: Set<String> = [firstToken]
        while Date() < deadline, tokens.count < 3 {
            let token = try #require(Self.token(await stub.credential(cache, source)))
            tokens.insert(token)
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(tokens.count >= 3, "the token was not renewed as it neared its end")
        // A refusal drops it: exactly one fresh fetch follows, shared by the next callers.
        let current = try #require(Self.token(await stub.credential(cache, source)))
        let grants = stub.granted(auth)
        cache.drop(CloudCredentials.Identity(workspace: 1, sealed: [1], binding: []), used: .bearer(current))
        let fresh = try #require(Self.token(await stub.credential(cache, source)))
        #expect(fresh != current && stub.granted(auth) == grants + 1)
        #expect(Self.token(await stub.credential(cache, source)) == fresh && stub.granted(auth) == grants + 1)
    }

    @Test func aWrongSecretIsAFailureThatSaysWhy() async throws {
        let stub = try Stub(lifetime: 3600)
        defer { stub.stop() }
        let cache = CloudCredentials(environment: CredentialEnvironment(["AZURE_AUTHORITY_HOST": stub.origin]))
        let result = await stub.credential(cache, .entraClientSecret(tenant: Self.tenant, clientID: Self.clientID, secret: "wrong",
                                                                      scope: "https://cognitiveservices.azure.com/.default"))
        guard case .failure(let failure) = result else { Issue.record("a wrong secret got a token"); return }
        #expect(failure.description.contains("invalid_client") && failure.description.contains("HTTP 401"))
        #expect(!failure.description.contains("wrong"))
    }

    @Test(arguments: [false, true])
    func managedIdentityOnIMDSAndAppService(appService: Bool) async throws {
        let stub = try Stub(lifetime: 3600)
        defer { stub.stop() }
        let environment = appService ? ["IDENTITY_ENDPOINT": stub.origin + "/msi/token", "IDENTITY_HEADER": "app-service-header"]
            : ["AZURE_POD_IDENTITY_AUTHORITY_HOST": stub.origin]
        let cache = CloudCredentials(environment: CredentialEnvironment(environment))
        let result = await stub.credential(cache, .entraManagedIdentity(clientID: Self.clientID, scope: "https://cognitiveservices.azure.com/.default"))
        let token = try #require(Self.token(result), "\(result)")
        #expect(token.hasPrefix("eyJ0eXAi.managed-"))
        #expect(stub.stub.log.contains { $0["path"] as? String == (appService ? "/msi/token" : "/metadata/identity/oauth2/token") && $0["status"] as? Int == 200 })
    }
}

/// What a source's environment may name, checked before anything is sent.
@Suite struct CredentialEnvironmentTests {
    @Test func containerCredentialsGoOverPlainHTTPOnlyToTheAgentsAddresses() {
        for url in ["http://127.0.0.1:1234/creds", "http://169.254.170.2/v2/credentials/x", "http://169.254.170.23/v1/credentials",
                    "http://[fd00:ec2::23]/v1/credentials", "https://creds.example.com/x", "http://localhost/x"] {
            #expect(CredentialFetch.isAllowedContainerURI(url), "\(url)")
        }
        for url in ["http://10.0.0.5/creds", "http://169.254.170.2.evil.example/x", "ftp://127.0.0.1/x", "http://[::2]/x"] {
            #expect(!CredentialFetch.isAllowedContainerURI(url), "\(url)")
        }
    }

    /// Without the variables a source needs, the fetch fails at once, saying which is missing.
    @Test(arguments: [(CredentialSource.awsWebIdentity(region: "us-east-1"), "AWS_WEB_IDENTITY_TOKEN_FILE is not set"),
                      (CredentialSource.awsContainer, "AWS_CONTAINER_CREDENTIALS_FULL_URI nor AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")])
    func aMissingVariableIsNamed(source: CredentialSource, message: String) async {
        let fetch = CredentialFetch(http: CredentialHTTP(start: { _, _ in Issue.record("nothing may be sent") }), environment: CredentialEnvironment([:]))
        let result = await withCheckedContinuation { continuation in fetch.fetch(source) { continuation.resume(returning: $0) } }
        guard case .failure(let failure) = result else { Issue.record("fetched without its variables"); return }
        #expect(failure.description.contains(message), "\(failure)")
    }
}
