import AttestCrypto
import Foundation
import SQLiteStore
import Testing
import UpstreamStub
import TokenService

/// `AdminService.setUpstreamBedrock` and `setUpstreamVertex`: who may, what each refuses (with
/// a message that names the problem and never the secret), what is sealed and what is audited.
@Suite final class CloudUpstreamAdminTests {
    let directory: URL
    let store: SQLiteTokenStore
    let admin: AdminService
    let secrets: SecretBox

    static let secretKey = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    /// A real key: the service's check loads it as the relay will.
    static let privateKey = (try? StubCertificates.rsaPrivateKeyPEM()) ?? ""

    static func serviceAccount(_ changes: [String: Any?] = [:]) throws -> String {
        var object: [String: Any] = ["type": "service_account", "project_id": "my-project-123", "private_key_id": "0123456789abcdef0123456789abcdef0123ab12",
                                     "private_key": privateKey, "client_email": "relay@my-project-123.iam.gserviceaccount.com",
                                     "token_uri": "https://oauth2.googleapis.com/token"]
        for (name, value) in changes { object[name] = value ?? nil }
        return String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
    }

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("cloud-admin-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        store = try SQLiteTokenStore(path: directory.appendingPathComponent("a.sqlite").path)
        admin = AdminService(store: store)
        secrets = try SecretBox(key: secureRandomBytes(SecretBox.keyLength))
        _ = try admin.initialize(owner: "boss@example.com")
        try admin.addMember(actor: "boss@example.com", email: "o@example.com", role: .owner)
        try admin.addMember(actor: "boss@example.com", email: "a@example.com", role: .admin)
    }

    deinit { try? FileManager.default.removeItem(at: directory) }

    func bedrock(actor: String = "o@example.com", region: String = "us-east-1", accessKeyID: String = "AKIAIOSFODNN7EXAMPLE",
                 secretKey: String = secretKey, sessionToken: String? = nil, endpointURL: String? = nil,
                 models: [String] = ["claude-sonnet-4-5=anthropic.claude-sonnet-4-5-20250929-v1:0"]) throws {
        try admin.setUpstreamBedrock(actor: actor, workspace: "default", region: region, accessKeyID: accessKeyID, secretKey: secretKey,
                                     sessionToken: sessionToken, endpointURL: endpointURL, models: models, secrets: secrets)
    }

    func vertex(project: String = "my-project-123", region: String = "us-east5", account: String? = nil, endpointURL: String? = nil,
                tokenURL: String? = nil, models: [String] = ["claude-sonnet-4-5=claude-sonnet-4-5@20250929"]) throws {
        try admin.setUpstreamVertex(actor: "boss@example.com", workspace: "default", project: project, region: region,
                                    serviceAccountJSON: try account ?? Self.serviceAccount(), endpointURL: endpointURL, tokenURL: tokenURL,
                                    models: models, secrets: secrets)
    }

    /// The refusal's message; nothing was stored.
    func refusal(_ body: () throws -> Void) throws -> String {
        let before = try store.upstreamKey(workspaceID: 1)
        let error = try #require(throws: AdminError.self) { try body() }
        #expect(try store.upstreamKey(workspaceID: 1) == before, "a refusal changes nothing")
        #expect(!error.description.contains(Self.secretKey) && !error.description.contains("BEGIN PRIVATE KEY-----\nMII"))
        return error.description
    }

    @Test func bedrockIsSealedAsAnAWSAccessKeyAndAuditedWithoutIt() throws {
        try bedrock(sessionToken: "FwoGZXIvYXdzEJr//////////wEaDEXAMPLETOKEN\n", endpointURL: "HTTPS://Bedrock.Example.test:8443/",
                    models: ["claude-sonnet-4-5 = arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-v1:0",
                             "claude-haiku-4-5=anthropic.claude-haiku-4-5-20251001-v1:0"])
        let key = try #require(try admin.workspaceDetails("default").upstreamKey)
        #expect(key.kind == .bedrock && key.last4 == "MPLE" && key.setBy == "o@example.com")
        #expect(key.settings == CloudUpstreamSettings(region: "us-east-1", endpointURL: "https://bedrock.example.test:8443", models: [
            "claude-sonnet-4-5": "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-5-v1:0",
            "claude-haiku-4-5": "anthropic.claude-haiku-4-5-20251001-v1:0"], api: .messages))
        let opened = try secrets.open(key.sealed, associatedData: key.associatedData(workspaceID: 1))
        // Sealed with the settings: the workspace alone, or any other settings, do not open it.
        #expect(throws: (any Error).self) { try secrets.open(key.sealed, associatedData: SealedUpstreamKey.associatedData(workspaceID: 1)) }
        var moved = try #require(key.settings)
        moved.endpointURL = "https://attacker.example"
        #expect(throws: (any Error).self) {
            try secrets.open(key.sealed, associatedData: SealedUpstreamKey.associatedData(workspaceID: 1, kind: .bedrock, settings: moved))
        }
        let credentials = try JSONDecoder().decode(AWSAccessKey.self, from: Data(opened))
        #expect(credentials == AWSAccessKey(accessKeyID: "AKIAIOSFODNN7EXAMPLE", secretAccessKey: Self.secretKey,
                                            sessionToken: "FwoGZXIvYXdzEJr//////////wEaDEXAMPLETOKEN"))
        let event = try #require(try store.auditEvents(limit: 10).first)
        #expect(event.action == "workspace.upstream_set" && event.actor == "o@example.com")
        let detail = try #require(event.detail)
        #expect(detail.contains("bedrock") && detail.contains("us-east-1") && detail.contains("claude-haiku-4-5=anthropic.claude-haiku-4-5-20251001-v1:0"))
        #expect(!detail.contains(Self.secretKey) && !detail.contains("EXAMPLETOKEN") && !detail.contains("AKIAIOSFODNN7EXAMPLE"))
    }

    @Test func vertexSealsTheKeyFileAsGivenAndShowsTheAccount() throws {
        let account = try Self.serviceAccount()
        try vertex(account: account, endpointURL: "http://127.0.0.1:9443", tokenURL: "http://localhost:9444")
        let key = try #require(try admin.workspaceDetails("default").upstreamKey)
        #expect(key.kind == .vertex && key.last4 == "ab12" && key.setBy == "boss@example.com")
        #expect(key.settings == CloudUpstreamSettings(region: "us-east5", project: "my-project-123", endpointURL: "http://127.0.0.1:9443",
                                                      tokenURL: "http://localhost:9444", models: ["claude-sonnet-4-5": "claude-sonnet-4-5@20250929"],
                                                      clientEmail: "relay@my-project-123.iam.gserviceaccount.com"))
        #expect(try secrets.open(key.sealed, associatedData: key.associatedData(workspaceID: 1)) == Array(account.utf8))
        let detail = try #require(try store.auditEvents(limit: 10).first?.detail)
        #expect(detail.contains("vertex") && detail.contains("my-project-123") && detail.contains("relay@my-project-123.iam.gserviceaccount.com"))
        #expect(!detail.contains("PRIVATE KEY"))
        // Without a private_key_id, the account's last 4 characters.
        try vertex(account: try Self.serviceAccount(["private_key_id": nil]))
        #expect(try admin.workspaceDetails("default").upstreamKey?.last4 == ".com")
        // The Anthropic key takes the row back.
        try admin.setUpstreamKey(actor: "o@example.com", workspace: "default", key: "test-key-admin-0123456789-wxyz", secrets: secrets)
        let back = try #require(try admin.workspaceDetails("default").upstreamKey)
        #expect(back.kind == .anthropic && back.settings == nil && back.last4 == "wxyz")
    }

    @Test func onlyOwnersSetAnotherKind() throws {
        #expect(try refusal { try bedrock(actor: "a@example.com") }.contains("a@example.com is admin in default and may not set the upstream"))
        #expect(try refusal { try bedrock(actor: "stranger@example.com") }.contains("not a member"))
        try bedrock(actor: "boss@example.com")
        try bedrock(actor: "o@example.com")
    }

    @Test func endpointsAreHTTPSOriginsOrPlainHTTPToLoopback() throws {
        for url in ["https://bedrock.example.test", "https://bedrock.example.test:8443/", "http://127.0.0.1:8080", "http://127.9.9.9",
                    "http://localhost:1234", "http://[::1]:8080"] {
            try bedrock(endpointURL: url)
        }
        #expect(try store.upstreamKey(workspaceID: 1)?.settings?.endpointURL == "http://[::1]:8080")
        for url in ["http://bedrock.example.test", "http://10.0.0.1:8080", "http://128.0.0.1", "http://localhost.example.com"] {
            #expect(try refusal { try bedrock(endpointURL: url) }.contains("plain http:// is allowed only to a loopback address"), "\(url)")
        }
        for url in ["https://bedrock.example.test/v1", "https://bedrock.example.test?x=1", "https://user:pw@bedrock.example.test", "ftp://host",
                    "https://", "https://host:0", "https://host:70000", "bedrock.example.test", "https://bedrock.example.test#top"] {
            #expect(try refusal { try bedrock(endpointURL: url) }.contains("the endpoint URL must be https://host"), "\(url)")
        }
        #expect(try refusal { try vertex(tokenURL: "http://oauth.example.test") }.contains("the token URL must use https://"))
        // Blank is absent.
        try bedrock(endpointURL: "  ")
        #expect(try store.upstreamKey(workspaceID: 1)?.settings?.endpointURL == nil)
    }

    @Test func regionsProjectsAndCredentialsAreChecked() throws {
        for region in ["US-EAST-1", "a", "us_east_1", String(repeating: "a", count: 33)] {
            #expect(try refusal { try bedrock(region: region) }.contains("region"), "\(region)")
        }
        for project in ["My-Project", "short", "1project", "project-", String(repeating: "a", count: 64)] {
            #expect(try refusal { try vertex(project: project) }.contains("Google Cloud project ID"), "\(project)")
        }
        #expect(try refusal { try bedrock(accessKeyID: "akiaiosfodnn7example") }.contains("access key ID"))
        #expect(try refusal { try bedrock(accessKeyID: "AKIA123") }.contains("access key ID"))
        #expect(try refusal { try bedrock(secretKey: "\n") }.contains("the secret access key must be"))
        #expect(try refusal { try bedrock(secretKey: String(repeating: "k", count: 257)) }.contains("the secret access key must be"))
        #expect(try refusal { try bedrock(secretKey: "has space inside") }.contains("the secret access key must be"))
        #expect(try refusal { try bedrock(sessionToken: String(repeating: "t", count: 4097)) }.contains("the session token must be"))
        try bedrock(sessionToken: String(repeating: "t", count: 4096))
    }

    @Test func serviceAccountKeyFilesAreChecked() throws {
        let cases: [(String, String)] = [
            ("{not json", "not a JSON object"),
            (try Self.serviceAccount(["type": "authorized_user"]), "\"type\" must be \"service_account\""),
            (try Self.serviceAccount(["client_email": nil]), "no \"client_email\""),
            (try Self.serviceAccount(["private_key": "MIIEvQ..."]), "PEM private key"),
            (try Self.serviceAccount(["token_uri": "http://oauth2.googleapis.com/token"]), "\"token_uri\" must be an https:// URL"),
            (try Self.serviceAccount(["padding": String(repeating: "x", count: 16 << 10)]), "at most 16 KiB"),
        ]
        for (account, message) in cases {
            #expect(try refusal { try vertex(account: account) }.contains(message), "\(message)")
        }
    }

    @Test func modelsAreOneToSixtyFourMappingsEachAPIModelOnce() throws {
        #expect(try refusal { try bedrock(models: []) }.contains("map at least one model"))
        #expect(try refusal { try bedrock(models: ["claude-sonnet-4-5"]) }.contains("is not API_MODEL=CLOUD_MODEL"))
        #expect(try refusal { try bedrock(models: ["=anthropic.x"]) }.contains("API model"))
        #expect(try refusal { try bedrock(models: ["claude/x=anthropic.x"]) }.contains("API model"))
        #expect(try refusal { try bedrock(models: ["claude-x="]) }.contains("cloud model ID"))
        #expect(try refusal { try bedrock(models: ["claude-x=anthropic x"]) }.contains("cloud model ID"))
        #expect(try refusal { try bedrock(models: ["claude-x=" + String(repeating: "a", count: 257)]) }.contains("cloud model ID"))
        #expect(try refusal { try bedrock(models: ["claude-x=a", "claude-x=b"]) }.contains("model claude-x is mapped twice"))
        #expect(try refusal { try bedrock(models: (0...64).map { "m\($0)=c\($0)" }) }.contains("at most 64"))
        try bedrock(models: (1...64).map { "m\($0)=c\($0)" })
        #expect(try store.upstreamKey(workspaceID: 1)?.settings?.models.count == 64)
    }

    /// Every setting that says where credentials go is bound; the encoding is unambiguous.
    @Test func theBindingChangesWithEverySettingThatSaysWhereCredentialsGo() {
        let base = CloudUpstreamSettings(region: "us-east5", project: "my-project-123", endpointURL: "https://a.example", tokenURL: "https://t.example/token",
                                         models: ["m": "c", "n": "d"], clientEmail: "x@example.com")
        var variants: [CloudUpstreamSettings] = []
        for change in 0..<7 {
            var v = base
            switch change {
            case 0: v.region = "us-east4"
            case 1: v.project = "my-project-124"
            case 2: v.endpointURL = nil
            case 3: v.tokenURL = "https://t.example/token2"
            case 4: v.models["m"] = "c2"
            case 5: v.models = ["m=c": "", "n": "d"]
            default: v.clientEmail = "y@example.com"
            }
            variants.append(v)
        }
        let bindings = Set(([base] + variants).map { $0.binding(kind: .vertex) } + [base.binding(kind: .bedrock)])
        #expect(bindings.count == variants.count + 2)
        #expect(base.binding(kind: .vertex) == CloudUpstreamSettings(region: "us-east5", project: "my-project-123", endpointURL: "https://a.example",
                                                                      tokenURL: "https://t.example/token", models: ["n": "d", "m": "c"],
                                                                      clientEmail: "x@example.com").binding(kind: .vertex))
    }

    /// A cloud upstream sealed before settings were bound (the workspace alone) is refused by the
    /// relay until an owner binds it; a rotation re-seals it as it was, and one bound since with
    /// its settings.
    @Test func aLegacyRowIsBoundByAnOwnerAndRotationsKeepEachRowsBinding() throws {
        try bedrock(endpointURL: "https://bedrock.example.test")
        let current = try #require(try store.upstreamKey(workspaceID: 1))
        let credentials = try secrets.open(current.sealed, associatedData: current.associatedData(workspaceID: 1))
        let legacy = SealedUpstreamKey(sealed: try secrets.seal(credentials, associatedData: SealedUpstreamKey.associatedData(workspaceID: 1)),
                                       last4: current.last4, setAt: current.setAt, setBy: current.setBy, kind: .bedrock, settings: current.settings)
        try store.setUpstreamKey(workspaceID: 1, legacy)
        // A rotation re-seals it to the workspace alone, as it was: no settings are bound unseen.
        let next = try SecretBox(key: secureRandomBytes(SecretBox.keyLength))
        let keyring = SecretsKeyring(current: next, previous: secrets)
        let report = try admin.resealSecrets(actor: "boss@example.com", keyring: keyring)
        #expect(report.unopenable.isEmpty && report.resealed == [.upstream(workspaceID: 1)])
        let rotated = try #require(try store.upstreamKey(workspaceID: 1))
        #expect(try next.open(rotated.sealed, associatedData: SealedUpstreamKey.associatedData(workspaceID: 1)) == credentials)
        // An admin may not bind; an owner may, once.
        #expect(throws: AdminError.self) { _ = try admin.bindUpstreamSettings(actor: "a@example.com", workspace: "default", secrets: next, keyring: keyring) }
        let bound = try admin.bindUpstreamSettings(actor: "o@example.com", workspace: "default", secrets: next, keyring: keyring)
        let stored = try #require(try store.upstreamKey(workspaceID: 1))
        #expect(try next.open(stored.sealed, associatedData: stored.associatedData(workspaceID: 1)) == credentials)
        #expect(bound.settings == current.settings)
        #expect(throws: AdminError.self) { _ = try admin.bindUpstreamSettings(actor: "o@example.com", workspace: "default", secrets: next, keyring: keyring) }
        #expect(try store.auditEvents(limit: 1).first?.action == "workspace.upstream_settings_bound")
        // A rotation of a bound row keeps it bound.
        let third = try SecretBox(key: secureRandomBytes(SecretBox.keyLength))
        _ = try admin.resealSecrets(actor: "boss@example.com", keyring: SecretsKeyring(current: third, previous: next))
        let again = try #require(try store.upstreamKey(workspaceID: 1))
        #expect(try third.open(again.sealed, associatedData: again.associatedData(workspaceID: 1)) == credentials)
    }

    /// The deployment's pinned hosts, when set and for what is already set.
    @Test func pinnedHostsRefuseOtherHostsWhenSet() throws {
        #expect(throws: AdminError.self) { _ = try admin.setCloudEndpointPins(actor: "a@example.com", hosts: ["x.example"]) }
        for bad in ["", "*.com", "a b", "https://x.example", "x..example", "*.", "-"] {
            #expect(throws: AdminError.self, "\(bad)") { _ = try admin.setCloudEndpointPins(actor: "o@example.com", hosts: [bad]) }
        }
        try bedrock(endpointURL: "https://bedrock.example.test")
        let refused = try admin.setCloudEndpointPins(actor: "o@example.com", hosts: ["*.amazonaws.com", "127.0.0.1", "::1"])
        #expect(refused == ["workspace #1"])
        #expect(try admin.cloudEndpointPins().hosts == ["*.amazonaws.com", "127.0.0.1", "::1"])
        #expect(try refusal { try bedrock(endpointURL: "https://bedrock.example.test") }.contains("does not allow cloud credentials"))
        try bedrock()   // bedrock-runtime.us-east-1.amazonaws.com
        try bedrock(endpointURL: "http://127.0.0.1:8443")
        #expect(try refusal { try vertex() }.contains("us-east5-aiplatform.googleapis.com"))
        _ = try admin.setCloudEndpointPins(actor: "o@example.com", hosts: ["*.googleapis.com"])
        try vertex()
        #expect(try refusal { try vertex(account: try Self.serviceAccount(["token_uri": "https://tokens.example.org/token"])) }.contains("tokens.example.org"))
        _ = try admin.setCloudEndpointPins(actor: "o@example.com", hosts: [])
        try bedrock(endpointURL: "https://bedrock.example.test")
        #expect(CloudEndpointPins(["*.example.com"]).allows(host: "a.example.com") && !CloudEndpointPins(["*.example.com"]).allows(host: "example.com")
                && !CloudEndpointPins(["*.example.com"]).allows(host: "aexample.com"))
    }
}
