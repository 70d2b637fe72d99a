import Foundation
import Testing

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
        try fixture.ctl(["integrations", "update", fixture.clients[workspace] ?? "", "--actor", "owner@example.com", "--betas", "allowed-beta-1"])
        let refused = try await fixture.post(workspace, #"{"model":"claude-test","max_tokens":5,"anthropic_beta":["secret-beta-2"],"messages":[{"role":"user","content":"Hi"}]}"#)
        #expect(refused.status == 400)
        #expect(((refused.json["error"] as? [String: Any])?["message"] as? String)?.contains("secret-beta-2") == true, "\(refused.json)")
        let malformed = try await fixture.post(workspace, #"{"model":"claude-test","max_tokens":5,"anthropic_beta":"allowed-beta-1","messages":[]}"#)
        #expect(malformed.status == 400)
        let header = try await fixture.post(workspace, #"{"model":"claude-test","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}"#,
                                            headers: ["anthropic-beta": "secret-beta-2"])
        #expect(header.status == 400)
        guard workspace != "default" else { return }
        let allowed = try await fixture.post(workspace, #"{"model":"claude-test","max_tokens":5,"anthropic_beta":["allowed-beta-1"],"messages":[{"role":"user","content":"Hi"}]}"#)
        #expect(allowed.status == 200, "\(String(decoding: allowed.body, as: UTF8.self))")
        let stub = workspace == "aws" ? fixture.bedrock : fixture.vertex
        let logged = try #require(await stub.waitForLog { $0["grant"] == nil })
        #expect(stub.log.filter { $0["grant"] == nil }.count == 1, "only the allowed request reached the cloud")
        if workspace == "aws" {
            #expect((logged["body"] as? [String: Any])?["anthropic_beta"] as? [String] == ["allowed-beta-1"])
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
