import Foundation
import Testing

/// `/v1/messages/count_tokens` through each cloud: Bedrock's CountTokens (for both of its APIs)
/// and Vertex's count-tokens endpoint, answered in the API's shape, with the strict stubs checking
/// what they received.
@Suite(.serialized) struct CloudCountTokensTests {
    typealias Fixture = CloudUpstreamTests.Fixture

    static let body = #"{"model":"claude-test","system":"Be brief.","messages":[{"role":"user","content":"Hello"}],"cache_control":{"type":"ephemeral"}}"#

    @Test(arguments: ["aws", "gcp"])
    func countTokensIsAnsweredInTheAPIsShape(workspace: String) async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        let reply = try await fixture.post(workspace, Self.body, path: "/v1/messages/count_tokens")
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
        let count = try #require(reply.json["input_tokens"] as? Int)
        #expect(count > 0 && reply.json.count == 1)
        let stub = workspace == "aws" ? fixture.bedrock : fixture.vertex
        let logged = try #require(await stub.waitForLog { ($0["path"] as? String)?.contains("count-tokens") == true })
        #expect(logged["verified"] as? Bool == true)
        // Counting spends nothing: no tokens are recorded against the workspace's budget.
        let usage = try await UsageTests.waitForCloudRequests(fixture, workspace: workspace, 1)
        #expect(UsageTests.total(usage, "output_tokens") == 0)
    }

    @Test func bedrocksMessagesAPICountsThroughCountTokensToo() async throws {
        let fixture = try await Fixture().register()
        defer { fixture.stop() }
        try fixture.ctl(["workspaces", "set-upstream-bedrock", "--actor", "owner@example.com", "--workspace", "aws", "--region", "us-east-1",
                         "--access-key-id", CloudUpstreamTests.accessKeyID,
                         "--secret-key-file", fixture.directory.appendingPathComponent("aws-secret").path,
                         "--session-token-file", fixture.directory.appendingPathComponent("aws-session").path,
                         "--endpoint-url", fixture.bedrock.origin, "--model", "claude-test=claude-test"])
        let reply = try await fixture.post("aws", Self.body, path: "/v1/messages/count_tokens")
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
        #expect((reply.json["input_tokens"] as? Int ?? 0) > 0)
        let json = try await fixture.post("aws", CloudUpstreamTests.request())
        #expect(json.status == 200, "\(String(decoding: json.body, as: UTF8.self))")
        #expect(await fixture.bedrock.waitForLog { ($0["path"] as? String) == "/anthropic/v1/messages" } != nil)
    }
}
