import AttestCrypto
import Foundation
import SQLiteStore
import Testing
import UpstreamStub
import TokenService

/// `attestctl workspaces set-upstream-bedrock|set-upstream-vertex` and `show --json`, run as the
/// built binary: what is shown is the kind, region or project, models and last 4 characters; the
/// credentials are in neither the output, the audit trail nor the database's files in clear.
extension AdminCommandTests {
    static let awsSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    static let awsSessionToken = "FwoGZXIvYXdzEJr//////////wEaDSessionTokenNotReal0123456789"
    /// A real key (the service loads it as the relay will), and a line of it to look for.
    static let privateKeyPEM = (try? StubCertificates.rsaPrivateKeyPEM()) ?? ""
    static let privateKeyBody = String(privateKeyPEM.split(separator: "\n").dropFirst(2).first ?? "missing")

    func serviceAccountFile() throws -> String {
        let object: [String: Any] = ["type": "service_account", "project_id": "my-project-123", "private_key_id": "0123456789abcdef0123cd34",
                                     "private_key": Self.privateKeyPEM,
                                     "client_email": "relay@my-project-123.iam.gserviceaccount.com", "token_uri": "https://oauth2.googleapis.com/token"]
        let path = dir.appendingPathComponent("service-account.json").path
        try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]).write(to: URL(fileURLWithPath: path))
        return path
    }

    func secretFile(_ text: String, name: String) throws -> String {
        let path = dir.appendingPathComponent(name).path
        try Data((text + "\n").utf8).write(to: URL(fileURLWithPath: path))
        return path
    }

    func upstream() throws -> [String: Any] {
        let shown = try json(try run(["workspaces", "show", "default", "--json"]))
        return try #require(shown["upstream"] as? [String: Any])
    }

    /// The database's files (and the WAL beside it) as bytes.
    func databaseBytes() -> Data {
        var files = Data()
        for suffix in ["", "-wal", "-shm"] { files.append((try? Data(contentsOf: URL(fileURLWithPath: db + suffix))) ?? Data()) }
        return files
    }

    func bedrockArguments(actor: String = "owner@example.com", secretKeyFile: String, extra: [String] = []) -> [String] {
        ["workspaces", "set-upstream-bedrock", "--actor", actor, "--workspace", "default", "--region", "us-east-1",
         "--access-key-id", "AKIAIOSFODNN7EXAMPLE", "--secret-key-file", secretKeyFile,
         "--model", "claude-sonnet-4-5=arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-v1:0",
         "--model", "claude-haiku-4-5=anthropic.claude-haiku-4-5-20251001-v1:0"] + extra
    }

    @Test func cloudUpstreamsAreSetShownAndNeverStoredOrPrintedInClear() throws {
        try organisation()
        let secretKeyFile = try secretFile(Self.awsSecret, name: "aws-secret")
        let sessionFile = try secretFile(Self.awsSessionToken, name: "aws-session")

        // Admins may not; a missing file is named by its flag; plain http to a remote host is refused.
        let refused = try run(bedrockArguments(actor: "admin@example.com", secretKeyFile: secretKeyFile))
        #expect(refused.status == 2 && refused.stderr.contains("may not set the upstream"))
        let missing = try run(bedrockArguments(secretKeyFile: dir.appendingPathComponent("absent").path))
        #expect(missing.status == 2 && missing.stderr.contains("--secret-key-file: cannot read"))
        let http = try run(bedrockArguments(secretKeyFile: secretKeyFile, extra: ["--endpoint-url", "http://bedrock.example.test"]))
        #expect(http.status == 2 && http.stderr.contains("plain http:// is allowed only to a loopback address"))
        let unset = try upstream()
        #expect(unset["kind"] as? String == "anthropic" && unset["key_last4"] is NSNull && unset["set_at"] is NSNull)

        let set = try ok(bedrockArguments(secretKeyFile: secretKeyFile, extra: ["--session-token-file", sessionFile,
                                                                                 "--endpoint-url", "http://127.0.0.1:8443"]))
        #expect(set.stdout.contains("bedrock") && set.stdout.contains("MPLE"))
        let bedrock = try upstream()
        #expect(bedrock["kind"] as? String == "bedrock" && bedrock["region"] as? String == "us-east-1" && bedrock["project"] is NSNull)
        #expect(bedrock["endpoint_url"] as? String == "http://127.0.0.1:8443" && bedrock["key_last4"] as? String == "MPLE")
        #expect(bedrock["set_by"] as? String == "owner@example.com" && (bedrock["set_at"] as? String).flatMap(ISO8601DateFormatter().date) != nil)
        #expect(bedrock["models"] as? [String: String] == [
            "claude-sonnet-4-5": "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-v1:0",
            "claude-haiku-4-5": "anthropic.claude-haiku-4-5-20251001-v1:0"])
        let text = try ok(["workspaces", "show", "default"]).stdout
        #expect(text.contains("kind: bedrock") && text.contains("region: us-east-1") && text.contains("key_last4: MPLE")
                && text.contains("claude-haiku-4-5=anthropic.claude-haiku-4-5-20251001-v1:0"))
        // The sealed credentials open with this workspace's binding, to the AWS key as given.
        let stored = try #require(try store().upstreamKey(workspaceID: 1))
        let secrets = try SecretsKeyFile.load(dir.appendingPathComponent("attestd.key").path)
        let opened = try secrets.open(stored.sealed, associatedData: stored.associatedData(workspaceID: 1))
        #expect(try JSONDecoder().decode(AWSAccessKey.self, from: Data(opened))
                == AWSAccessKey(accessKeyID: "AKIAIOSFODNN7EXAMPLE", secretAccessKey: Self.awsSecret, sessionToken: Self.awsSessionToken))

        let vertex = try ok(["workspaces", "set-upstream-vertex", "--actor", "owner@example.com", "--workspace", "default", "--project", "my-project-123",
                             "--region", "us-east5", "--service-account-file", try serviceAccountFile(), "--token-url", "https://oauth.example.test:9444",
                             "--model", "claude-sonnet-4-5=claude-sonnet-4-5@20250929"])
        #expect(vertex.stdout.contains("vertex") && vertex.stdout.contains("cd34"))
        let shown = try upstream()
        #expect(shown["kind"] as? String == "vertex" && shown["project"] as? String == "my-project-123" && shown["region"] as? String == "us-east5")
        #expect(shown["client_email"] as? String == "relay@my-project-123.iam.gserviceaccount.com" && shown["key_last4"] as? String == "cd34")
        #expect(shown["token_url"] as? String == "https://oauth.example.test:9444" && shown["endpoint_url"] is NSNull)
        #expect(shown["models"] as? [String: String] == ["claude-sonnet-4-5": "claude-sonnet-4-5@20250929"])

        // No credential anywhere: every output, the audit trail, the database and its WAL.
        let audit = try ok(["audit", "--json"]).stdout
        #expect(audit.components(separatedBy: "workspace.upstream_set").count == 3)
        let outputs = [set.stdout, vertex.stdout, text, audit, try ok(["workspaces", "show", "default", "--json"]).stdout].joined()
        for secret in [Self.awsSecret, Self.awsSessionToken, Self.privateKeyBody, "PRIVATE KEY"] {
            #expect(!outputs.contains(secret), "\(secret) printed")
            #expect(databaseBytes().range(of: Data(secret.utf8)) == nil, "\(secret) in the database's files")
        }

        // set-upstream-key switches back: kind anthropic, no settings.
        try ok(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", try writeKeyFile(Self.madeUpKey)])
        let back = try upstream()
        #expect(back["kind"] as? String == "anthropic" && back["region"] is NSNull && back["models"] is NSNull && back["key_last4"] as? String == "wxyz")
        #expect(try store().upstreamKey(workspaceID: 1)?.settings == nil)
    }

    @Test func cloudUpstreamCommandsRefuseBadInputBeforeWriting() throws {
        try organisation()
        let before = try snapshot()
        let secretKeyFile = try secretFile(Self.awsSecret, name: "aws-secret")
        let cases: [([String], String)] = [
            (bedrockArguments(secretKeyFile: secretKeyFile, extra: ["--region", "x"]), "--region given 2 times"),
            (Array(bedrockArguments(secretKeyFile: secretKeyFile).prefix(12)), "map at least one model"),
            (bedrockArguments(secretKeyFile: secretKeyFile, extra: ["--model", "claude-haiku-4-5=other"]), "claude-haiku-4-5 is mapped twice"),
            (["workspaces", "set-upstream-vertex", "--actor", "owner@example.com", "--workspace", "default", "--project", "my-project-123",
              "--region", "us-east5", "--model", "a=b"], "give one of --service-account-file and --metadata-server"),
            (["workspaces", "set-upstream-vertex", "--actor", "owner@example.com", "--workspace", "default", "--project", "my-project-123",
              "--region", "us-east5", "--metadata-server", "--service-account-file", try serviceAccountFile(), "--model", "a=b"],
             "give one of --service-account-file and --metadata-server"),
            (bedrockArguments(secretKeyFile: secretKeyFile, extra: ["--aws-credentials", "instance"]), "give exactly one of"),
            (Array(bedrockArguments(secretKeyFile: secretKeyFile).prefix(8)) + ["--aws-credentials", "laptop", "--model", "a=b"],
             "--aws-credentials must be web-identity, container or instance"),
            (Array(bedrockArguments(secretKeyFile: secretKeyFile).prefix(8)) + ["--aws-credentials", "instance", "--assume-role", "role/x", "--model", "a=b"],
             "--assume-role must be a role's ARN"),
            (Array(bedrockArguments(secretKeyFile: secretKeyFile).prefix(8)) + ["--bedrock-api-key-file", secretKeyFile, "--assume-role",
                                                                               "arn:aws:iam::123456789012:role/x", "--model", "a=b"],
             "--assume-role needs AWS credentials to sign with"),
            (["workspaces", "set-upstream-vertex", "--actor", "owner@example.com", "--workspace", "default", "--project", "Bad_Project",
              "--region", "us-east5", "--service-account-file", try serviceAccountFile(), "--model", "a=b"], "Google Cloud project ID"),
        ]
        for (arguments, message) in cases {
            let result = try run(arguments)
            #expect(result.status == 2 && result.stderr.contains(message), "\(message): \(result.stderr)")
        }
        #expect(try snapshot() == before)
        #expect(try store().upstreamKey(workspaceID: 1) == nil)
    }
}
