import Foundation
import MessagesBody
import Testing
import TokenService
@testable import RelayRoutes

/// Each cloud API's table: what passes, what is translated (a top-level `cache_control` becomes
/// the breakpoint on the last cacheable block), what is taken out, and what is refused by name.
@Suite struct CloudShapingTests {
    /// What the published client 0.2.3 sends: a top-level `cache_control` on every request,
    /// adaptive thinking, `output_config.effort`, tools, and a stream.
    static let publishedClientBody = #"""
    {"model":"claude-opus-4-7","max_tokens":16000,"system":"Be brief.","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"…","signature":"c2ln"},{"type":"text","text":"Hello"}]},{"role":"user","content":[{"type":"text","text":"What is the weather?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]}],"tools":[{"name":"weather","description":"d","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto"},"thinking":{"type":"adaptive"},"cache_control":{"type":"ephemeral"},"output_config":{"effort":"high"},"stream":true}
    """#

    static func shape(_ body: String, _ api: CloudAPI, model: String = "anthropic.claude-haiku-4-5-20251001-v1:0", adding: [(String, String)] = []) throws -> (object: [String: Any]?, refused: String?) {
        switch try CloudRequestBody.shape(Array(body.utf8), rule: api.rules(model: model, betas: []), adding: adding) {
        case .shaped(let bytes): return (try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any], nil)
        case .refused(let member): return (nil, member)
        }
    }

    @Test(arguments: [CloudAPI.bedrockInvoke, .bedrockMessages, .vertex])
    func thePublishedClientsBodyIsShapedForEachCloud(api: CloudAPI) throws {
        let shaped = try Self.shape(Self.publishedClientBody, api)
        let object = try #require(shaped.object, "refused \(shaped.refused ?? "")")
        #expect(object["cache_control"] == nil, "no top-level cache_control reaches a cloud")
        let messages = try #require(object["messages"] as? [[String: Any]])
        let last = try #require(messages.last?["content"] as? [[String: Any]])
        // The breakpoint is on the last cacheable block (the image), as the API puts it.
        #expect((last.last?["cache_control"] as? [String: Any])?["type"] as? String == "ephemeral")
        #expect(last.first?["cache_control"] == nil)
        #expect(object["model"] == nil && object["thinking"] != nil && object["tools"] != nil)
        #expect(object["output_config"] == nil, "effort is a hint a model that does not take output_config goes without")
        let newest = try #require(try Self.shape(Self.publishedClientBody, api, model: "global.anthropic.claude-opus-4-7").object)
        #expect(newest["output_config"] != nil, "the newest models take it")
        #expect((object["stream"] != nil) == (api != .bedrockInvoke))
    }

    @Test func aStringContentBecomesOneTextBlockWithTheBreakpointAndThinkingIsSkipped() throws {
        let string = try #require(try Self.shape(#"{"messages":[{"role":"user","content":"a \"b\""}],"cache_control":{"type":"ephemeral","ttl":"1h"}}"#, .vertex).object)
        let blocks = try #require((string["messages"] as? [[String: Any]])?.first?["content"] as? [[String: Any]])
        #expect(blocks.count == 1 && blocks[0]["text"] as? String == #"a "b""# && (blocks[0]["cache_control"] as? [String: Any])?["ttl"] as? String == "1h")
        let thinkingLast = try #require(try Self.shape(#"{"messages":[{"role":"assistant","content":[{"type":"text","text":"x"},{"type":"redacted_thinking","data":"d"}]}],"cache_control":{"type":"ephemeral"}}"#, .bedrockInvoke).object)
        let content = try #require((thinkingLast["messages"] as? [[String: Any]])?.first?["content"] as? [[String: Any]])
        #expect(content[0]["cache_control"] != nil && content[1]["cache_control"] == nil)
        // An empty block gets the breakpoint without a stray comma.
        let empty = try Self.shape(#"{"messages":[{"role":"user","content":[{ }]}],"cache_control":{"type":"ephemeral"}}"#, .vertex)
        #expect(empty.object != nil)
    }

    @Test func aBreakpointIsNotAddedWhereOneIsOrWhenFourAreThere() throws {
        let own = #"{"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral","ttl":"5m"}}]}],"cache_control":{"type":"ephemeral","ttl":"1h"}}"#
        let kept = try #require(try Self.shape(own, .vertex).object)
        let block = try #require(((kept["messages"] as? [[String: Any]])?.first?["content"] as? [[String: Any]])?.first)
        #expect((block["cache_control"] as? [String: Any])?["ttl"] as? String == "5m")
        let blocks = (0..<4).map { #"{"type":"text","text":"\#($0)","cache_control":{"type":"ephemeral"}}"# }.joined(separator: ",")
        let full = #"{"system":[],"messages":[{"role":"user","content":[\#(blocks),{"type":"text","text":"last"}]}],"cache_control":{"type":"ephemeral"}}"#
        let shaped = try #require(try Self.shape(full, .bedrockInvoke).object)
        let content = try #require((shaped["messages"] as? [[String: Any]])?.first?["content"] as? [[String: Any]])
        #expect(content.last?["cache_control"] == nil, "a fifth breakpoint would be refused by the API")
    }

    @Test func whatAFormatOrAnUnknownMemberAsksIsRefusedByName() throws {
        for api in [CloudAPI.bedrockInvoke, .vertex] {
            #expect(try Self.shape(#"{"messages":[],"output_config":{"effort":"low","format":{"type":"json_schema","schema":{}}}}"#, api).refused
                    == "output_config.format")
            #expect(try Self.shape(#"{"messages":[],"output_config":{"effort":"low","format":null}}"#, api).object?["output_config"] == nil)
        }
        #expect(try Self.shape(#"{"messages":[],"output_config":{"format":{"type":"json_schema","schema":{}}}}"#, .bedrockMessages,
                               model: "claude-sonnet-4-6@20260101").object?["output_config"] != nil)
        #expect(CloudAPI.takesOutputConfig(model: "anthropic.claude-opus-4-5-20251101-v1:0", betas: ["effort-2025-11-24"]))
        #expect(!CloudAPI.takesOutputConfig(model: "anthropic.claude-opus-4-5-20251101-v1:0", betas: []))
        for member in ["container", "mcp_servers", "fallbacks", "made_up_member"] {
            #expect(try Self.shape(#"{"messages":[],"\#(member)":{}}"#, .vertex).refused == member)
        }
        let metadata = try Self.shape(#"{"messages":[],"metadata":{"user_id":"u"},"service_tier":"auto"}"#, .bedrockInvoke).object
        #expect(metadata?["metadata"] == nil && metadata?["service_tier"] == nil)
    }

    @Test func betasAreCheckedAgainstEachCloudsTableAndTheProfileBetaIsConsumed() {
        #expect(CloudAPI.vertex.refusedBeta(["context-1m-2025-08-07", "user-profiles-2026-08-18"], extra: nil) == nil)
        #expect(CloudAPI.vertex.refusedBeta(["made-up-2030-01-01"], extra: nil) == "made-up-2030-01-01")
        #expect(CloudAPI.vertex.refusedBeta(["made-up-2030-01-01"], extra: ["made-up-2030-01-01"]) == nil)
        #expect(CloudAPI.bedrockMessages.refusedBeta(["dev-full-thinking-2025-05-14"], extra: nil) == nil)
        #expect(CloudAPI.sent(["a", "user-profiles-2026-08-18", "a", "b"]) == ["a", "b"])
    }

    @Test func vertexLocationsGetTheSDKsHosts() {
        func origin(_ region: String) -> String? { CloudUpstreamSettings(region: region, project: "p", models: [:]).origin(kind: .vertex) }
        #expect(origin("global") == "https://aiplatform.googleapis.com")
        #expect(origin("us") == "https://aiplatform.us.rep.googleapis.com")
        #expect(origin("eu") == "https://aiplatform.eu.rep.googleapis.com")
        #expect(origin("us-east5") == "https://us-east5-aiplatform.googleapis.com")
        #expect((try? Validate.cloudProject("123456789012")) == "123456789012")
    }
}
