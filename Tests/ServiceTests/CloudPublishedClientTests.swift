import Foundation
import Testing
import UpstreamStub

/// Issue 47: what the published client 0.2.3 (`ClaudeForFoundationModels`) sends, through each
/// kind of cloud upstream, against the strict stubs of Bedrock and Vertex AI. Every body is the
/// JSON the client's `RequestBuilder` puts on the wire (keys sorted, as its `JSONEncoder` writes
/// them; `stream: true`; a top-level `cache_control`; adaptive thinking and `output_config` for
/// the models that take them; images; tools; server tools), with the user profile header and its
/// beta. Each gets the API's answer, or a 400 naming what the cloud cannot take, with nothing sent.
@Suite(.serialized) struct CloudPublishedClientTests {
    typealias Fixture = CloudUpstreamTests.Fixture
    typealias Clouds = PublishedClientClouds
    typealias Wire = PublishedClientWire

    /// One request the client makes, and what the cloud must receive of it.
    struct Case: Sendable {
        let name: String
        let model: String
        let body: @Sendable (Bool) -> String
        /// What the cloud's body holds beyond the common checks: `output_config`'s members, thinking, tools.
        var effort: String? = nil
        var format = false
        var thinking = false
        var tools = 1
        var serverTools = 0
    }

    static let cases: [Case] = [
        Case(name: "a photo, adaptive thinking, effort and a tool", model: "claude-opus-4-7",
             body: { Wire.body(model: "claude-opus-4-7", messages: [Wire.photoMessage], tools: [Wire.weatherTool], thinking: true, effort: "high", stream: $0) },
             effort: "high", thinking: true),
        Case(name: "a tool round: thinking replayed, tool_use, tool_result", model: "claude-opus-4-7",
             body: { Wire.body(model: "claude-opus-4-7", messages: Wire.toolRound, tools: [Wire.weatherTool], thinking: true, effort: "medium", stream: $0) },
             effort: "medium", thinking: true),
        Case(name: "structured output (output_config.format) with effort", model: "claude-opus-4-7",
             body: { Wire.body(model: "claude-opus-4-7", messages: [Wire.question], thinking: true, effort: "high", format: true, stream: $0) },
             effort: "high", format: true, thinking: true, tools: 0),
        Case(name: "server tools (web search, web fetch, code execution)", model: "claude-opus-4-7",
             body: { Wire.body(model: "claude-opus-4-7", messages: [Wire.question], tools: [Wire.weatherTool] + Wire.serverTools,
                               thinking: true, effort: "high", stream: $0) },
             effort: "high", thinking: true, tools: 4, serverTools: 2),
        Case(name: "Haiku 4.5: a photo, a tool, temperature (no thinking, no effort)", model: "claude-haiku-4-5",
             body: { Wire.body(model: "claude-haiku-4-5", messages: [Wire.photoMessage], tools: [Wire.weatherTool], temperature: "0.7", stream: $0) }),
    ]

    @Test(arguments: PublishedClientClouds.workspaces)
    func theClientsBodiesGetTheAPIsAnswerThroughEachCloud(workspace: String) async throws {
        let fixture = try await Clouds.fixture()
        defer { fixture.stop() }
        let stub = Clouds.stub(fixture, workspace)
        var answered = 0
        for item in Self.cases {
            for stream in [true, false] {
                let label = "\(workspace), \(item.name), stream \(stream)"
                let before = Clouds.requests(stub).count
                let reply = try await fixture.post(workspace, item.body(stream), headers: Clouds.clientHeaders())
                #expect(reply.status == 200, "\(label): \(reply.status) \(reply.bodyText)")
                guard reply.status == 200 else { continue }
                answered += 1
                // The API's answer, as the API sends it.
                if stream {
                    #expect(reply.header("content-type")?.hasPrefix("text/event-stream") == true, "\(label)")
                    let events = Clouds.events(reply.bodyText)
                    #expect(events.first?.name == "message_start" && events.last?.name == "message_stop", "\(label): \(events.map(\.name))")
                    let text = events.filter { $0.name == "content_block_delta" }
                        .compactMap { ($0.data["delta"] as? [String: Any])?["text"] as? String }.joined()
                    #expect(text == StubReply.text(deltaCount: 5), "\(label)")
                } else {
                    #expect(reply.json["type"] as? String == "message", "\(label): \(reply.bodyText)")
                    let content = reply.json["content"] as? [[String: Any]]
                    #expect(content?.first?["text"] as? String == StubReply.text(deltaCount: 5), "\(label)")
                }
                // What the cloud verified and received.
                let record = try #require(await Clouds.record(stub, at: before), "\(label): the stub logged nothing")
                #expect(record["verified"] as? Bool == true && record["status"] as? Int == 200, "\(label): \(record)")
                let body = try #require(record["body"] as? [String: Any], "\(label)")
                Self.expectShaped(body, record: record, workspace: workspace, item: item, stream: stream, label: label)
            }
        }
        // The device's user profile carried every request to the ledger; the server tools the
        // upstream reported were counted.
        let rows = try await UsageTests.waitForCloudRequests(fixture, workspace: workspace, answered)
        let byProfile = try fixture.ctl(["usage", "--json", "--workspace", workspace, "--by", "profile"]).split(separator: "\n")
            .compactMap { try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }.filter { $0["forecast"] == nil }
        #expect(byProfile.count == 1 && byProfile.first?["user_profile"] as? String == Clouds.profile, "\(byProfile)")
        #expect(byProfile.first?["requests"] as? Int == answered)
        let tools = rows.compactMap { $0["server_tool_use"] as? [String: Int] }.reduce(into: [String: Int]()) { $0.merge($1, uniquingKeysWith: +) }
        #expect(tools == ["web_search_requests": 2, "web_fetch_requests": 2], "\(rows)")
    }

    /// The body the cloud received: the client's, shaped by the relay's table.
    static func expectShaped(_ body: [String: Any], record: [String: Any], workspace: String, item: Case, stream: Bool, label: String) {
        // No top-level breakpoint; the client's one is on the last block of the last message, and nowhere else.
        #expect(body["cache_control"] == nil, "\(label)")
        let messages = body["messages"] as? [[String: Any]] ?? []
        let blocks = messages.flatMap { $0["content"] as? [[String: Any]] ?? [] }
        #expect(blocks.last?["cache_control"] as? [String: String] == ["type": "ephemeral"], "\(label): \(blocks.last ?? [:])")
        #expect(blocks.dropLast().allSatisfy { $0["cache_control"] == nil }, "\(label)")
        // Images arrive byte for byte.
        for block in blocks where block["type"] as? String == "image" {
            #expect((block["source"] as? [String: Any])?["data"] as? String == PublishedClientWire.imageBase64, "\(label)")
        }
        // The user profile is the relay's: neither its header nor its beta reaches a cloud.
        let headerNames = record["header_names"] as? [String] ?? []
        #expect(headerNames.contains("authorization") && headerNames.contains("content-type"), "\(label): the stub logs header names: \(record)")
        #expect(!headerNames.contains("anthropic-user-profile-id") && !headerNames.contains("anthropic-beta"), "\(label): \(headerNames)")
        #expect(record["beta_header"] as? [String] == [], "\(label)")
        #expect(body["anthropic_beta"] == nil, "\(label)")
        #expect(body["metadata"] == nil && body["service_tier"] == nil)
        // Each cloud's own members.
        switch workspace {
        case "aws":
            #expect(body["anthropic_version"] as? String == "bedrock-2023-05-31" && body["model"] == nil && body["stream"] == nil, "\(label)")
            #expect(record["stream"] as? Bool == stream)
        case "awsm":
            #expect(body["anthropic_version"] == nil && body["stream"] as? Bool == stream, "\(label)")
            #expect(body["model"] as? String == PublishedClientClouds.bedrockModels.first { $0.0 == item.model }?.1, "\(label)")
        default:
            #expect(body["anthropic_version"] as? String == "vertex-2023-10-16" && body["model"] == nil && body["stream"] as? Bool == stream, "\(label)")
        }
        // What the model takes passes as the client wrote it.
        if item.effort != nil || item.format {
            let sent = body["output_config"] as? [String: Any]
            #expect(sent?["effort"] as? String == item.effort, "\(label): \(sent ?? [:])")
            let format = sent?["format"] as? [String: Any]
            #expect((format?["type"] as? String) == (item.format ? "json_schema" : nil), "\(label)")
            if item.format { #expect((format?["schema"] as? [String: Any])?["required"] as? [String] == ["city", "temperature_c"]) }
        } else {
            #expect(body["output_config"] == nil, "\(label)")
        }
        #expect((body["thinking"] as? [String: String]) == (item.thinking ? ["type": "adaptive", "display": "summarized"] : nil), "\(label)")
        let tools = body["tools"] as? [[String: Any]] ?? []
        #expect(tools.count == item.tools, "\(label)")
        #expect(tools.filter { ($0["type"] as? String)?.hasPrefix("web_") == true }.count == item.serverTools, "\(label)")
        #expect(body["max_tokens"] as? Int == 16000 && body["system"] as? String == PublishedClientWire.system, "\(label)")
    }

    /// Structured output is a contract: to a model that does not take `output_config` (Haiku 4.5
    /// on either cloud), the client's format is refused by name, with the upstream, and nothing
    /// is sent; the same request without it goes through.
    @Test(arguments: PublishedClientClouds.workspaces)
    func aFormatForAModelThatCannotTakeItIsRefusedByNameAndNothingIsSent(workspace: String) async throws {
        let fixture = try await Clouds.fixture()
        defer { fixture.stop() }
        let stub = Clouds.stub(fixture, workspace)
        for stream in [true, false] {
            let before = (cloud: Clouds.requests(stub).count, api: fixture.anthropic.requests.count)
            let body = Wire.body(model: "claude-haiku-4-5", messages: [Wire.photoMessage], tools: [Wire.weatherTool], format: true, stream: stream)
            let reply = try await fixture.post(workspace, body, headers: Clouds.clientHeaders())
            #expect(reply.status == 400, "\(reply.bodyText)")
            #expect(reply.json["type"] as? String == "error")
            let error = reply.json["error"] as? [String: Any]
            #expect(error?["type"] as? String == "invalid_request_error")
            let message = error?["message"] as? String ?? ""
            #expect(message.contains("output_config.format") && message.contains(Clouds.upstreamName(workspace)), "\(message)")
            // The next request goes through: by the time its record is there, one request reached the cloud.
            let plain = Wire.body(model: "claude-haiku-4-5", messages: [Wire.photoMessage], tools: [Wire.weatherTool], stream: stream)
            let next = try await fixture.post(workspace, plain, headers: Clouds.clientHeaders())
            #expect(next.status == 200, "\(next.bodyText)")
            let record = await Clouds.record(stub, at: before.cloud)
            #expect((record?["body"] as? [String: Any])?["output_config"] == nil)
            #expect(Clouds.requests(stub).count == before.cloud + 1, "the refused request reached the cloud")
            #expect(fixture.anthropic.requests.count == before.api + 1)
        }
    }
}

/// What the published client 0.2.3 puts on the wire, written out: its `RequestBuilder` (a system
/// string, user text and image blocks, replayed assistant blocks, tool results, client tools with
/// `input_schema`, server tools sorted by name, `thinking` adaptive with its display summarized
/// for the models that think, `output_config` with `effort` and `format`, a top-level
/// `cache_control`, `max_tokens` 16000, `stream: true`) encoded with sorted keys.
enum PublishedClientWire {
    static let system = "You are a concise travel assistant."

    /// A photo as `ClaudeImage` sends it: JPEG, base64, `/` escaped as Foundation's encoder writes it.
    static let imageBase64: String = {
        var bytes: [UInt8] = [0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46]
        var state: UInt32 = 0x2545_f491
        for _ in 0..<1500 {
            state ^= state << 13; state ^= state >> 17; state ^= state << 5
            bytes.append(UInt8(truncatingIfNeeded: state))
        }
        bytes += [0xff, 0xd9]
        return Data(bytes).base64EncodedString()
    }()
    static var imageJSON: String { imageBase64.replacingOccurrences(of: "/", with: #"\/"#) }

    static let question = #"{"content":[{"text":"What should I pack for Lisbon in May?","type":"text"}],"role":"user"}"#
    static var photoMessage: String {
        #"{"content":[{"text":"Where was this photo taken?","type":"text"},{"source":{"data":"\#(imageJSON)","media_type":"image\/jpeg","type":"base64"},"type":"image"}],"role":"user"}"#
    }
    /// A turn that called the app's tool, replayed with its signed thinking, then the tool's result.
    static let toolRound = [
        #"{"content":[{"text":"Is it warm in Paris right now?","type":"text"}],"role":"user"}"#,
        #"{"content":[{"signature":"EqQBCkYIBxgCKkDq3bP7\/sig+AbC==","thinking":"The user wants the current weather; I will call the tool.","type":"thinking"},"#
            + #"{"id":"toolu_01Xg7","input":{"city":"Paris"},"name":"get_weather","type":"tool_use"}],"role":"assistant"}"#,
        #"{"content":[{"content":"18 °C and sunny","tool_use_id":"toolu_01Xg7","type":"tool_result"}],"role":"user"}"#,
    ]
    static let weatherTool = #"{"description":"Looks up the current weather in a city.","input_schema":{"additionalProperties":false,"#
        + #""properties":{"city":{"description":"The city's name.","type":"string"}},"required":["city"],"type":"object"},"name":"get_weather"}"#
    /// `ClaudeServerTool`'s definitions, sorted by name as the client sorts them.
    static let serverTools = [
        #"{"name":"code_execution","type":"code_execution_20260120"}"#,
        #"{"max_uses":2,"name":"web_fetch","type":"web_fetch_20260209"}"#,
        #"{"allowed_domains":["meteo.example"],"max_uses":3,"name":"web_search","type":"web_search_20260209"}"#,
    ]
    static let schema = #"{"additionalProperties":false,"properties":{"city":{"type":"string"},"temperature_c":{"type":"number"}},"#
        + #""required":["city","temperature_c"],"type":"object"}"#

    static func body(model: String, messages: [String], tools: [String] = [], thinking: Bool = false, effort: String? = nil,
                     format: Bool = false, temperature: String? = nil, stream: Bool = true) -> String {
        var fields: [(String, String)] = [
            ("cache_control", #"{"type":"ephemeral"}"#), ("max_tokens", "16000"), ("messages", "[" + messages.joined(separator: ",") + "]"),
            ("model", "\"\(model)\""), ("stream", String(stream)), ("system", "\"\(system)\""),
        ]
        var outputConfig: [String] = []
        if let effort { outputConfig.append(#""effort":"\#(effort)""#) }
        if format { outputConfig.append(#""format":{"schema":\#(schema),"type":"json_schema"}"#) }
        if !outputConfig.isEmpty { fields.append(("output_config", "{" + outputConfig.joined(separator: ",") + "}")) }
        if let temperature { fields.append(("temperature", temperature)) }
        if thinking { fields.append(("thinking", #"{"display":"summarized","type":"adaptive"}"#)) }
        if !tools.isEmpty { fields.append(("tools", "[" + tools.joined(separator: ",") + "]")) }
        return "{" + fields.sorted { $0.0 < $1.0 }.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
    }
}

/// The cloud workspaces these tests use, on `CloudUpstreamTests.Fixture`: `aws` on Bedrock's
/// InvokeModel, `awsm` on Bedrock's Messages API (added here), `gcp` on Vertex AI, each mapping
/// one model that takes `output_config` (Opus 4.7), one that does not (Haiku 4.5), and the
/// stubs' scripted failures.
enum PublishedClientClouds {
    static let workspaces = ["aws", "awsm", "gcp"]
    static let profile = "uprof_cloud_client_1"

    /// Errors the Anthropic stub behind both clouds answers (its `stub-` model names).
    static let apiModels = [("claude-api-400", "stub-error-400"), ("claude-api-401", "stub-error-401"), ("claude-api-429", "stub-error-429"),
                            ("claude-api-500", "stub-error-500"), ("claude-api-529", "stub-error-529"),
                            ("claude-stream-error", "stub-stream-error")]
    static let bedrockModels = [("claude-opus-4-7", "global.anthropic.claude-opus-4-7"),
                                ("claude-haiku-4-5", "global.anthropic.claude-haiku-4-5-20251001-v1:0"),
                                ("claude-throttled", "anthropic.throttle-v1:0"), ("claude-unavailable", "anthropic.unavailable-v1:0"),
                                ("claude-not-ready", "anthropic.not-ready-v1:0"), ("claude-denied", "anthropic.denied-v1:0"),
                                ("claude-too-long", "anthropic.claude-too-long-v1:0"), ("claude-exception", "midstream-exception")] + apiModels
    static let vertexModels = [("claude-opus-4-7", "claude-opus-4-7@20260416"), ("claude-haiku-4-5", "claude-haiku-4-5@20251001"),
                               ("claude-throttled", "throttle@2026"), ("claude-denied", "denied@2026"),
                               ("claude-too-long", "claude-too-long@2026")] + apiModels

    static func modelArguments(_ models: [(String, String)]) -> [String] { models.flatMap { ["--model", "\($0.0)=\($0.1)"] } }

    /// `set-upstream-bedrock` for `workspace` against the fixture's stub (`--api`, credentials as given).
    static func bedrockArguments(_ fixture: CloudUpstreamTests.Fixture, workspace: String, api: String,
                                 accessKeyID: String = CloudUpstreamTests.accessKeyID, secretFile: String = "aws-secret",
                                 models: [(String, String)] = bedrockModels) -> [String] {
        ["workspaces", "set-upstream-bedrock", "--actor", "owner@example.com", "--workspace", workspace, "--region", "us-east-1", "--api", api,
         "--access-key-id", accessKeyID, "--secret-key-file", fixture.directory.appendingPathComponent(secretFile).path,
         "--session-token-file", fixture.directory.appendingPathComponent("aws-session").path, "--endpoint-url", fixture.bedrock.origin]
            + modelArguments(models)
    }

    static func vertexArguments(_ fixture: CloudUpstreamTests.Fixture, workspace: String, serviceAccount: String = "sa.json",
                                models: [(String, String)] = vertexModels) -> [String] {
        ["workspaces", "set-upstream-vertex", "--actor", "owner@example.com", "--workspace", workspace, "--project", CloudUpstreamTests.project,
         "--region", "us-east5", "--service-account-file", fixture.directory.appendingPathComponent(serviceAccount).path,
         "--endpoint-url", fixture.vertex.origin, "--token-url", fixture.vertex.origin + "/token"] + modelArguments(models)
    }

    /// The fixture with its devices registered, `aws` and `gcp` mapped as above and `awsm` added.
    static func fixture() async throws -> CloudUpstreamTests.Fixture {
        let fixture = try await CloudUpstreamTests.Fixture().register()
        do {
            try fixture.ctl(bedrockArguments(fixture, workspace: "aws", api: "invoke"))
            try fixture.ctl(vertexArguments(fixture, workspace: "gcp"))
            try await addWorkspace(fixture, "awsm", upstream: bedrockArguments(fixture, workspace: "awsm", api: "messages"))
        } catch {
            fixture.stop()
            throw error
        }
        return fixture
    }

    /// A workspace with `upstream` (attestctl's arguments), an integration, and a registered device.
    static func addWorkspace(_ fixture: CloudUpstreamTests.Fixture, _ name: String, upstream: [String]) async throws {
        try fixture.ctl(["workspaces", "create", "--actor", "owner@example.com", "--name", name])
        try fixture.ctl(upstream)
        let output = try fixture.ctl(["integrations", "create", "--actor", "owner@example.com", "--workspace", name, "--name", "App",
                                      "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
        let client = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
        fixture.clients[name] = client
        let registered = try await TestHTTP(baseURL: fixture.server.baseURL).registerFresh(try ManualDevice(clientID: client))
        fixture.tokens[name] = try #require(registered.json["access_token"] as? String, "\(registered.status) \(registered.bodyText)")
    }

    static func stub(_ fixture: CloudUpstreamTests.Fixture, _ workspace: String) -> CloudUpstreamTests.CloudStub {
        workspace.hasPrefix("gcp") ? fixture.vertex : fixture.bedrock
    }

    /// How the relay names the upstream in a refusal.
    static func upstreamName(_ workspace: String) -> String {
        ["aws": "Bedrock (InvokeModel)", "awsm": "Bedrock (Messages API)", "gcp": "Vertex AI"][workspace] ?? workspace
    }

    /// The headers the client sends with `.appAttest` and a user profile (the relay adds the token).
    static func clientHeaders(profile: String? = profile) -> [String: String] {
        PublishedClientTests.clientHeaders(profile: profile, betas: [])
    }

    /// The stub's Messages requests (not its token grants), in the order it answered them.
    static func requests(_ stub: CloudUpstreamTests.CloudStub) -> [[String: Any]] {
        stub.log.filter { $0["grant"] == nil && $0["control"] == nil }
    }

    /// The stub's `index`th Messages request, once it has logged it (it logs after answering).
    static func record(_ stub: CloudUpstreamTests.CloudStub, at index: Int) async -> [String: Any]? {
        _ = await stub.waitForLog { _ in requests(stub).count > index }
        let all = requests(stub)
        return all.count > index ? all[index] : nil
    }

    /// A stream's events: name and JSON data.
    static func events(_ text: String) -> [(name: String, data: [String: Any])] {
        text.components(separatedBy: "\n\n").compactMap { block in
            var name: String?
            var data = ""
            for line in block.split(separator: "\n") {
                if line.hasPrefix("event: ") { name = String(line.dropFirst(7)) }
                if line.hasPrefix("data: ") { data += line.dropFirst(6) }
            }
            guard let name, let object = try? JSONSerialization.jsonObject(with: Data(data.utf8)) as? [String: Any] else { return nil }
            return (name, object)
        }
    }
}
