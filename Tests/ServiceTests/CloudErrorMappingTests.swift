import Foundation
import Testing
import UpstreamStub

/// Issue 47's errors item: every error a cloud answers, through each kind of cloud upstream, as
/// the device gets it (status, `error.type`, and for an overflow the word the published client's
/// `ErrorMapper` looks for), JSON and streamed. A refusal of this service's credentials is 503
/// `api_error`: never 401 or `authentication_error`, which make the published client throw its
/// App Attest token away and attest again.
@Suite(.serialized) struct CloudErrorMappingTests {
    typealias Clouds = PublishedClientClouds
    typealias Wire = PublishedClientWire

    struct Expected: CustomStringConvertible {
        let model: String
        let status: Int
        let type: String
        var retryAfter: String? = nil
        /// The message is `CloudErrorAnswer.credentialsRefused`.
        var credentials = false
        /// A context overflow: the message says "context", as the client's `ErrorMapper` needs.
        var overflow = false
        var description: String { "\(model) → \(status) \(type)" }
    }

    static let credentialsRefused = "the upstream refused this service's credentials"

    /// What each kind of upstream must answer for each scripted failure of the stubs (the cloud's
    /// own, then the API's behind it).
    static func expected(_ workspace: String) -> [Expected] {
        let api = [
            Expected(model: "claude-too-long", status: 400, type: "invalid_request_error", overflow: true),
            Expected(model: "claude-api-400", status: 400, type: "invalid_request_error"),
            Expected(model: "claude-api-401", status: 503, type: "api_error", credentials: true),
            Expected(model: "claude-api-429", status: 429, type: "rate_limit_error", retryAfter: "7"),
            Expected(model: "claude-api-500", status: 500, type: "api_error"),
        ]
        let bedrock = [
            Expected(model: "claude-throttled", status: 429, type: "rate_limit_error", retryAfter: "7"),
            Expected(model: "claude-unavailable", status: 503, type: "overloaded_error"),
            Expected(model: "claude-not-ready", status: 529, type: "overloaded_error"),
            Expected(model: "claude-denied", status: 503, type: "api_error", credentials: true),
        ]
        switch workspace {
        // InvokeModel answers the model's errors as Bedrock's exceptions: an overloaded model is
        // ServiceUnavailableException (503).
        case "aws": return bedrock + api + [Expected(model: "claude-api-529", status: 503, type: "overloaded_error")]
        // The Messages API route answers the model's own errors as the API sends them.
        case "awsm": return bedrock + api + [Expected(model: "claude-api-529", status: 529, type: "overloaded_error")]
        default: return [
            Expected(model: "claude-throttled", status: 429, type: "rate_limit_error"),
            Expected(model: "claude-denied", status: 503, type: "api_error", credentials: true),
        ] + api + [Expected(model: "claude-api-529", status: 529, type: "overloaded_error")]
        }
    }

    /// The cloud's own words (account, principal, project, host) that must never reach a device.
    static let cloudWords = ["arn:aws", "123456789012", "assumed-role", CloudUpstreamTests.project, "aiplatform.googleapis.com",
                             "Input is too long for requested model", "ValidationException", "RESOURCE_EXHAUSTED"]

    @Test(arguments: PublishedClientClouds.workspaces)
    func everyMappedErrorReachesTheDeviceAsTheAPIWouldAnswer(workspace: String) async throws {
        let fixture = try await Clouds.fixture()
        defer { fixture.stop() }
        for expected in Self.expected(workspace) {
            for stream in [true, false] {
                let label = "\(workspace) \(expected), stream \(stream)"
                let body = Wire.body(model: expected.model, messages: [Wire.question], stream: stream)
                let reply = try await fixture.post(workspace, body, headers: Clouds.clientHeaders())
                Self.expectError(reply, expected, label: label)
            }
        }
    }

    static func expectError(_ reply: HTTPResult, _ expected: Expected, label: String) {
        let error = reply.json["error"] as? [String: Any]
        let type = error?["type"] as? String
        let message = error?["message"] as? String ?? ""
        #expect(reply.status == expected.status && type == expected.type, "\(label): got \(reply.status) \(reply.bodyText)")
        #expect(reply.json["type"] as? String == "error" && !message.isEmpty, "\(label): the API's error shape: \(reply.bodyText)")
        #expect(reply.header("content-type")?.hasPrefix("application/json") == true, "\(label)")
        // What makes the published client attest again, never.
        #expect(reply.status != 401 && type != "authentication_error", "\(label)")
        if expected.credentials { #expect(message == Self.credentialsRefused, "\(label): \(message)") }
        // `ErrorMapper`: `.invalidRequest where error.message.lowercased().contains("context")` → contextSizeExceeded.
        if expected.overflow { #expect(message.lowercased().contains("context") && message.contains("prompt is too long"), "\(label): \(message)") }
        if let retryAfter = expected.retryAfter { #expect(reply.header("retry-after") == retryAfter, "\(label)") }
        for word in cloudWords { #expect(!reply.bodyText.contains(word), "\(label): \(word) in \(reply.bodyText)") }
    }

    /// Errors once the stream has begun: an event-stream exception on InvokeModel, the API's own
    /// `error` event on every kind; the device's stream ends with an `error` event of the type.
    @Test(arguments: PublishedClientClouds.workspaces)
    func anErrorMidStreamEndsTheStreamWithTheAPIsErrorEvent(workspace: String) async throws {
        let fixture = try await Clouds.fixture()
        defer { fixture.stop() }
        var cases = [("claude-stream-error", "overloaded_error")]
        if workspace == "aws" { cases.append(("claude-exception", "rate_limit_error")) }
        for (model, type) in cases {
            let reply = try await fixture.post(workspace, Wire.body(model: model, messages: [Wire.question]), headers: Clouds.clientHeaders())
            #expect(reply.status == 200, "\(model): \(reply.bodyText)")
            let events = Clouds.events(reply.bodyText)
            #expect(events.first?.name == "message_start", "\(model): \(events.map(\.name))")
            #expect(events.last?.name == "error" && (events.last?.data["error"] as? [String: Any])?["type"] as? String == type,
                    "\(workspace) \(model): \(reply.bodyText)")
            #expect(!events.contains { $0.name == "message_stop" })
        }
        // Both recorded: errors mid-stream are the stream's status (200), the ledger has them.
        let rows = try await UsageTests.waitForCloudRequests(fixture, workspace: workspace, cases.count)
        #expect(UsageTests.total(rows, "requests") == cases.count)
    }

    /// This service's own credentials refused: Bedrock with a secret that signs wrong
    /// (InvalidSignatureException) on InvokeModel, an access key Bedrock does not know
    /// (UnrecognizedClientException) on the Messages API, a Vertex service account whose key the
    /// token endpoint refuses. The device gets 503 `api_error`, the operator the cause.
    @Test func aRefusalOfThisServicesCredentialsNeverMakesTheClientAttestAgain() async throws {
        let fixture = try await Clouds.fixture()
        defer { fixture.stop() }
        let directory = fixture.directory
        try Data("another/SECRET+key000000000000000000000000\n".utf8).write(to: directory.appendingPathComponent("aws-wrong-secret"))
        try CloudUpstreamTests.Fixture.openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out",
                                                directory.appendingPathComponent("sa-wrong.pem").path])
        let account = try #require(try JSONSerialization.jsonObject(with: Data(fixture.serviceAccount.utf8)) as? [String: Any])
        var wrong = account
        wrong["private_key"] = try String(contentsOf: directory.appendingPathComponent("sa-wrong.pem"), encoding: .utf8)
        try JSONSerialization.data(withJSONObject: wrong).write(to: directory.appendingPathComponent("sa-wrong.json"))
        let models = [("claude-haiku-4-5", "global.anthropic.claude-haiku-4-5-20251001-v1:0")]
        try await Clouds.addWorkspace(fixture, "aws-badsig", upstream: Clouds.bedrockArguments(fixture, workspace: "aws-badsig", api: "invoke",
                                                                                            secretFile: "aws-wrong-secret", models: models))
        try await Clouds.addWorkspace(fixture, "awsm-badkey", upstream: Clouds.bedrockArguments(fixture, workspace: "awsm-badkey", api: "messages",
                                                                                             accessKeyID: "AKIAUNKNOWNKEY000001", models: models))
        try await Clouds.addWorkspace(fixture, "gcp-badkey", upstream: Clouds.vertexArguments(fixture, workspace: "gcp-badkey", serviceAccount: "sa-wrong.json",
                                                                                           models: [("claude-haiku-4-5", "claude-haiku-4-5@20251001")]))
        let workspaces = ["aws-badsig": "InvalidSignatureException", "awsm-badkey": "UnrecognizedClientException", "gcp-badkey": "no credential from service-account: the token endpoint answered HTTP 400"]
        for (workspace, _) in workspaces.sorted(by: { $0.key < $1.key }) {
            for stream in [true, false] {
                let reply = try await fixture.post(workspace, Wire.body(model: "claude-haiku-4-5", messages: [Wire.question], stream: stream),
                                                   headers: Clouds.clientHeaders())
                Self.expectError(reply, Expected(model: "claude-haiku-4-5", status: 503, type: "api_error", credentials: true),
                                 label: "\(workspace), stream \(stream)")
            }
        }
        // The stubs refused them themselves: nothing reached the model.
        let refused = fixture.bedrock.log.filter { $0["status"] as? Int == 403 && $0["verified"] as? Bool == false }
        #expect(refused.count == 4, "\(fixture.bedrock.log)")
        #expect(fixture.vertex.log.contains { $0["grant"] as? Bool == true && $0["status"] as? Int == 400 })
        #expect(fixture.anthropic.requests.isEmpty)
        // The operator's log names each workspace and the cloud's cause (written once the device has its answer).
        func refusals() -> [[String: Any]] {
            fixture.server.log.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
                .filter { $0["event"] as? String == "upstream_credentials_refused" }
        }
        let deadline = Date() + 10
        while refusals().count < 6, Date() < deadline { try await Task.sleep(for: .milliseconds(50)) }
        let refusals = refusals()
        #expect(refusals.count == 6, "\(refusals)")
        for (workspace, cause) in workspaces {
            #expect(refusals.contains { $0["workspace"] as? String == workspace && ($0["cause"] as? String)?.contains(cause) == true },
                    "\(workspace): \(refusals)")
        }
    }
}
