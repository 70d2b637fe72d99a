import Foundation
import Testing
import UpstreamStub

/// Issue 47's usage item: a cached request of the published client's, streamed (and as JSON)
/// through Bedrock's Messages API, its InvokeModel path and Vertex AI. The ledger holds what the
/// cloud billed: Bedrock's `amazon-bedrock-invocationMetrics` on InvokeModel's `message_stop`, the
/// stream's own usage (`message_start`, `message_delta`) on the Messages API and on Vertex. The
/// Anthropic stub reports cache counts for a body that carries a breakpoint, which the relay moved
/// from the top level onto the last block.
@Suite(.serialized) struct CloudCachedUsageTests {
    typealias Clouds = PublishedClientClouds
    typealias Wire = PublishedClientWire

    /// Input, cache writes, cache reads, output.
    struct Billed: Equatable, CustomStringConvertible {
        var input = 0, cacheCreation = 0, cacheRead = 0, output = 0
        static func + (a: Billed, b: Billed) -> Billed {
            Billed(input: a.input + b.input, cacheCreation: a.cacheCreation + b.cacheCreation, cacheRead: a.cacheRead + b.cacheRead,
                   output: a.output + b.output)
        }
        init(input: Int = 0, cacheCreation: Int = 0, cacheRead: Int = 0, output: Int = 0) {
            (self.input, self.cacheCreation, self.cacheRead, self.output) = (input, cacheCreation, cacheRead, output)
        }
        init(_ usage: StubUsage) {
            self.init(input: usage.inputTokens, cacheCreation: usage.cacheCreationInputTokens, cacheRead: usage.cacheReadInputTokens,
                      output: usage.outputTokens)
        }
        /// The API's `usage` object.
        init(usage: [String: Any]?) {
            self.init(input: usage?["input_tokens"] as? Int ?? -1, cacheCreation: usage?["cache_creation_input_tokens"] as? Int ?? -1,
                      cacheRead: usage?["cache_read_input_tokens"] as? Int ?? -1, output: usage?["output_tokens"] as? Int ?? -1)
        }
        /// Bedrock's invocation metrics.
        init(metrics: [String: Any]?) {
            self.init(input: metrics?["inputTokenCount"] as? Int ?? -1, cacheCreation: metrics?["cacheWriteInputTokenCount"] as? Int ?? -1,
                      cacheRead: metrics?["cacheReadInputTokenCount"] as? Int ?? -1, output: metrics?["outputTokenCount"] as? Int ?? -1)
        }
        /// The ledger's rows, summed.
        init(ledger rows: [[String: Any]]) {
            self.init(input: UsageTests.total(rows, "input_tokens"), cacheCreation: UsageTests.total(rows, "cache_creation_input_tokens"),
                      cacheRead: UsageTests.total(rows, "cache_read_input_tokens"), output: UsageTests.total(rows, "output_tokens"))
        }
        var description: String { "input \(input), cache writes \(cacheCreation), cache reads \(cacheRead), output \(output)" }
    }

    @Test(arguments: PublishedClientClouds.workspaces)
    func aCachedStreamIsRecordedAsTheCloudBilledIt(workspace: String) async throws {
        let fixture = try await Clouds.fixture()
        defer { fixture.stop() }
        let stub = Clouds.stub(fixture, workspace)
        let body = Wire.body(model: "claude-opus-4-7", messages: Wire.toolRound, tools: [Wire.weatherTool], thinking: true, effort: "high")

        // The stream, as the client sends it.
        let reply = try await fixture.post(workspace, body, headers: Clouds.clientHeaders())
        #expect(reply.status == 200, "\(reply.bodyText)")
        let events = Clouds.events(reply.bodyText)
        let start = events.first { $0.name == "message_start" }?.data["message"] as? [String: Any]
        let delta = events.last { $0.name == "message_delta" }?.data["usage"] as? [String: Any]
        var inStream = Billed(usage: start?["usage"] as? [String: Any])
        inStream.output = delta?["output_tokens"] as? Int ?? -1
        let billed: Billed
        if workspace == "aws" {
            // InvokeModelWithResponseStream: Bedrock bills by the metrics on its last chunk, which
            // the device's `message_stop` carries as they came.
            let record = try #require(await stub.waitForLog { $0["invocation_metrics"] != nil }, "\(stub.log)")
            billed = Billed(metrics: record["invocation_metrics"] as? [String: Any])
            let stop = events.last { $0.name == "message_stop" }?.data
            #expect(Billed(metrics: stop?["amazon-bedrock-invocationMetrics"] as? [String: Any]) == billed)
            #expect(Billed(usage: stop?["usage"] as? [String: Any]) == billed, "message_stop's usage")
        } else {
            // The Messages API's own stream, relayed unchanged by Bedrock's Messages API and by Vertex.
            billed = inStream
            #expect(events.last { $0.name == "message_stop" }?.data["amazon-bedrock-invocationMetrics"] == nil)
        }
        #expect(billed.cacheCreation > 0 && billed.cacheRead > 0 && billed.input > 0 && billed.output > 0, "a cached request: \(billed)")
        #expect(inStream == billed, "the stream's usage is what was billed")
        // The model behind the cloud reported the same.
        let upstream = try #require(fixture.anthropic.requests.last?.usage)
        #expect(Billed(upstream) == billed)

        let rows = try await UsageTests.waitForCloudRequests(fixture, workspace: workspace, 1)
        #expect(Billed(ledger: rows) == billed, "ledger \(Billed(ledger: rows)), billed \(billed)")
        #expect(UsageTests.total(rows, "incomplete") == 0 && UsageTests.total(rows, "requests") == 1)

        // The same request as JSON: its reply's usage (on InvokeModel, with Bedrock's token-count
        // headers, which say the same) is added to the row.
        let json = try await fixture.post(workspace, Wire.body(model: "claude-opus-4-7", messages: Wire.toolRound, tools: [Wire.weatherTool],
                                                               thinking: true, effort: "high", stream: false),
                                          headers: Clouds.clientHeaders())
        #expect(json.status == 200, "\(json.bodyText)")
        let jsonBilled = Billed(usage: json.json["usage"] as? [String: Any])
        #expect(jsonBilled.cacheCreation > 0 && jsonBilled.cacheRead > 0)
        #expect(Billed(try #require(fixture.anthropic.requests.last?.usage)) == jsonBilled)
        let both = try await UsageTests.waitForCloudRequests(fixture, workspace: workspace, 2)
        #expect(Billed(ledger: both) == billed + jsonBilled, "ledger \(Billed(ledger: both)), billed \(billed + jsonBilled)")
    }
}
