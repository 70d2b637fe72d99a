import Foundation
import RawHTTP
import Testing
import UpstreamStub

/// Workspace settings' upstream forms on the shipped attestd: an owner sets Amazon Bedrock and
/// Google Vertex AI through them (errors shown beside the form, secrets never put back in a page)
/// and sees the kind, region or project, models and who set it; anyone else is refused.
@Suite(.serialized) struct ConsoleUpstreamTests {
    static let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    /// A real key (the service loads it as the relay will), and a line of it to look for.
    static let privateKeyPEM = (try? StubCertificates.rsaPrivateKeyPEM()) ?? ""
    static let privateKeyBody = String(privateKeyPEM.split(separator: "\n").dropFirst(2).first ?? "missing")

    static func bedrockForm(endpoint: String = "", models: String) -> [(String, String)] {
        [("bedrock_region", "eu-west-1"), ("bedrock_access_key_id", "AKIAIOSFODNN7EXAMPLE"), ("bedrock_secret_key", secret),
         ("bedrock_session_token", ""), ("bedrock_endpoint_url", endpoint), ("bedrock_models", models)]
    }

    static func upstream(_ fixture: ConsoleFixture) throws -> [String: Any] {
        let shown = try JSONSerialization.jsonObject(with: Data(try fixture.ctl(["workspaces", "show", "default", "--json"]).utf8)) as? [String: Any]
        return try #require(shown?["upstream"] as? [String: Any])
    }

    @Test func anOwnerSetsBedrockThenVertexInWorkspaceSettingsAndOthersAreRefused() throws {
        let fixture = try ConsoleFixture()
        defer { fixture.stop() }
        let owner = try fixture.signIn()
        let headers = [("Cookie", "attestd_console=\(owner)")]
        let empty = try fixture.request("GET", "/console/settings", headers: headers)
        #expect(empty.status == 200 && empty.text.contains("action=\"/console/settings/upstream-bedrock\"")
                && empty.text.contains("action=\"/console/settings/upstream-vertex\""))

        // Refused by the service: the page again, 422, the error beside the form, what was typed
        // kept but the secret gone.
        let models = "claude-sonnet-4-5=anthropic.claude-sonnet-4-5-20250929-v1:0\r\n\r\nclaude-haiku-4-5 = anthropic.claude-haiku-4-5-20251001-v1:0\r\n"
        let bad = try fixture.post("/console/settings/upstream-bedrock", cookie: owner,
                                   Self.bedrockForm(endpoint: "http://bedrock.example.test", models: models), csrf: try fixture.csrf(owner, on: "/console/settings"))
        #expect(bad.status == 422 && bad.text.contains("id=\"bedrock_error\"") && bad.text.contains("plain http:// is allowed only to a loopback address"))
        #expect(bad.text.contains("value=\"eu-west-1\"") && !bad.text.contains(Self.secret))
        #expect(try Self.upstream(fixture)["kind"] as? String == "anthropic")
        let noModels = try fixture.post("/console/settings/upstream-bedrock", cookie: owner, Self.bedrockForm(models: "\r\n"))
        #expect(noModels.status == 422 && noModels.text.contains("map at least one model"))

        let set = try fixture.post("/console/settings/upstream-bedrock", cookie: owner, Self.bedrockForm(endpoint: "http://127.0.0.1:9", models: models))
        #expect(set.status == 303 && set.headers["location"] == "/console/settings?upstream=bedrock")
        let page = try fixture.request("GET", "/console/settings?upstream=bedrock", headers: headers)
        #expect(page.status == 200 && page.text.contains("Upstream set to Amazon Bedrock"))
        #expect(page.text.contains("<span id=\"upstream-kind\">Amazon Bedrock</span>") && page.text.contains("<code>eu-west-1</code>"))
        #expect(page.text.contains("<code>claude-haiku-4-5</code> → <code>anthropic.claude-haiku-4-5-20251001-v1:0</code>"))
        #expect(page.text.contains("<code id=\"key-last4\">MPLE</code>") && page.text.contains("by \(ConsoleFixture.owner)"))
        // Where the credentials come from is shown, never the credentials.
        #expect(page.text.contains("<code id=\"credential-source\">static</code>"))
        #expect(!page.text.contains(Self.secret))
        let shown = try Self.upstream(fixture)
        #expect(shown["kind"] as? String == "bedrock" && shown["region"] as? String == "eu-west-1" && shown["endpoint_url"] as? String == "http://127.0.0.1:9")
        #expect((shown["models"] as? [String: String])?.count == 2)

        // Vertex, with its key file pasted into the textarea.
        let account: [String: Any] = ["type": "service_account", "private_key_id": "feedfacecafe9f0e",
                                      "private_key": Self.privateKeyPEM,
                                      "client_email": "console@my-project-123.iam.gserviceaccount.com", "token_uri": "https://oauth2.googleapis.com/token"]
        let json = String(decoding: try JSONSerialization.data(withJSONObject: account, options: [.prettyPrinted]), as: UTF8.self)
        let vertex = try fixture.post("/console/settings/upstream-vertex", cookie: owner, [
            ("vertex_project", "my-project-123"), ("vertex_region", "global"), ("vertex_service_account", json), ("vertex_endpoint_url", ""),
            ("vertex_token_url", ""), ("vertex_models", "claude-sonnet-4-5=claude-sonnet-4-5@20250929")])
        #expect(vertex.status == 303)
        let vertexPage = try fixture.request("GET", "/console/settings", headers: headers)
        #expect(vertexPage.text.contains("Google Vertex AI") && vertexPage.text.contains("<code>my-project-123</code>")
                && vertexPage.text.contains("console@my-project-123.iam.gserviceaccount.com") && vertexPage.text.contains(">9f0e</code>"))
        #expect(!vertexPage.text.contains(Self.privateKeyBody) && !vertexPage.text.contains(Self.secret))
        #expect(try Self.upstream(fixture)["project"] as? String == "my-project-123")

        // An admin sees the upstream but no form, and the server refuses the post all the same.
        try fixture.ctl(["members", "add", "--actor", ConsoleFixture.owner, "--email", "admin@example.com", "--role", "admin"])
        let admin = try fixture.signIn("admin@example.com")
        let adminPage = try fixture.request("GET", "/console/settings", headers: [("Cookie", "attestd_console=\(admin)")])
        #expect(adminPage.text.contains("Google Vertex AI") && !adminPage.text.contains("action=\"/console/settings/upstream-bedrock\""))
        let refused = try fixture.post("/console/settings/upstream-bedrock", cookie: admin, Self.bedrockForm(models: models),
                                       csrf: try fixture.csrf(admin, on: "/console/settings"))
        #expect(refused.status == 403)
        #expect(try Self.upstream(fixture)["kind"] as? String == "vertex")
        // Nowhere in the database's files in clear.
        let bytes = try Data(contentsOf: URL(fileURLWithPath: fixture.db)) + ((try? Data(contentsOf: URL(fileURLWithPath: fixture.db + "-wal"))) ?? Data())
        #expect(bytes.range(of: Data(Self.secret.utf8)) == nil && bytes.range(of: Data(Self.privateKeyBody.utf8)) == nil)
    }
}
