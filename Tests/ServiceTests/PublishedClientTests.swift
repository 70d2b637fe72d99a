import Foundation
import Testing
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// The published client 0.2.3's requests through the shipped attestd to the stub upstream: its
/// headers, its beta joining, its `fallbacks` forms and its `pause_turn` follow-up arrive intact;
/// every policy refusal happens before the upstream sees anything; usage lands on the model that
/// served, the user profile and the server tools.
@Suite(.serialized) struct PublishedClientTests {
    typealias Fixture = RelayTests.Fixture

    static let userAgent = "ClaudeForFoundationModels/0.2.3 (com.example.app/1.4; Swift/6.3; iOS/27.0.1)"
    static let fallbackBeta = "server-side-fallback-2026-06-01"
    static let defaultFallbackBeta = "server-side-fallback-2026-07-01"
    static let profileBeta = "user-profiles-2026-08-18"

    /// The headers the client sends with `.appAttest`, a user profile and a fallbacks list: the
    /// app's own beta first, then the request's, then the profile's, joined with a bare comma.
    static func clientHeaders(profile: String? = "uprof_test_1", betas: [String] = ["feature-1", fallbackBeta]) -> [String: String] {
        var headers = ["anthropic-version": "2023-06-01", "user-agent": userAgent]
        var all = betas
        if let profile {
            headers["anthropic-user-profile-id"] = profile
            all.append(profileBeta)
        }
        if !all.isEmpty { headers["anthropic-beta"] = all.joined(separator: ",") }
        return headers
    }

    /// A body as the client encodes it (sorted keys, always streaming), with `fallbacks` and tools.
    static func body(model: String, fallbacks: String? = #"[{"model":"claude-haiku-4-5"}]"#, stream: Bool = true,
                     tools: String? = #"[{"max_uses":3,"name":"web_search","type":"web_search_20260209"}]"#,
                     messages: String = #"[{"content":"Hello","role":"user"}]"#) -> String {
        var fields = [#""cache_control":{"type":"ephemeral"}"#]
        if let fallbacks { fields.append(#""fallbacks":\#(fallbacks)"#) }
        fields += [#""max_tokens":16000"#, #""messages":\#(messages)"#, #""model":"\#(model)""#, #""stream":\#(stream)"#]
        if let tools { fields.append(#""tools":\#(tools)"#) }
        return "{" + fields.joined(separator: ",") + "}"
    }

    /// The follow-up after `pause_turn`: the first request plus the assistant's content so far,
    /// with blocks the relay must pass as they are (and one of a type nobody knows yet).
    static let pausedTurnMessages = #"[{"content":"Hello","role":"user"},{"content":[{"type":"fallback","from":{"model":"stub-fallback"},"#
        + #""to":{"model":"claude-haiku-4-5"},"trigger":{"type":"refusal","category":"cyber"}},"#
        + #"{"type":"thinking","thinking":"Let me search.","signature":"EqQBCkYIBxgCKkA\u002b/sig=="},"#
        + #"{"type":"server_tool_use","id":"srvtoolu_01","name":"web_search","input":{"query":"weather \"Paris\""}},"#
        + #"{"type":"web_search_tool_result","tool_use_id":"srvtoolu_01","content":[{"type":"web_search_result","url":"https://example.com","#
        + #""title":"Météo","encrypted_content":"AbC+/=","page_age":null}]},"#
        + #"{"type":"future_block_2027","payload":{"nested":[1,2.5e3,true,null]}}],"role":"assistant"}]"#

    static func usageLines(_ fixture: Fixture, by: String) throws -> [[String: Any]] {
        try UsageTests.usage(fixture, ["--client-id", fixture.clientA, "--by", by])
    }

    /// Waits for the ledger's flush (every second) until the rows hold `requests` requests and `refused` refusals.
    static func waitForLedger(_ fixture: Fixture, by: String, requests: Int, refused: Int = 0) async throws -> [[String: Any]] {
        let deadline = Date() + 10
        while true {
            let lines = try usageLines(fixture, by: by)
            let refusals = lines.reduce(0) { $0 + (($1["refused"] as? [String: Int])?.values.reduce(0, +) ?? 0) }
            if UsageTests.total(lines, "requests") >= requests && refusals >= refused { return lines }
            guard Date() < deadline else {
                Issue.record("the ledger never held \(requests) requests and \(refused) refusals: \(lines)")
                return lines
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    @Test func theClientsRequestsArriveIntactAndBillTheServingModelTheProfileAndTheServerTools() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        // A streamed request with a fallbacks list, a profile and a web search tool; the requested model declines.
        let streamed = Self.body(model: "stub-fallback")
        let reply = try await fixture.post(token: fixture.tokenA, body: streamed, headers: Self.clientHeaders())
        #expect(reply.status == 200)
        #expect(reply.bodyText.contains(#""type":"fallback""#) && reply.bodyText.contains("event: message_stop"))
        let record = try #require(fixture.stub.requests.last)
        #expect(record.body.map { String(decoding: $0, as: UTF8.self) } == streamed, "the body byte for byte")
        #expect(record.header("anthropic-beta") == "feature-1,\(Self.fallbackBeta),\(Self.profileBeta)")
        #expect(record.header("anthropic-user-profile-id") == "uprof_test_1")
        #expect(record.header("user-agent") == Self.userAgent)
        #expect(record.header("anthropic-version") == "2023-06-01")
        #expect(record.header("authorization") == nil && record.header("x-api-key") == RelayTests.keyA)

        // The same as JSON, with `fallbacks: "default"` and its beta.
        let json = Self.body(model: "stub-fallback", fallbacks: #""default""#, stream: false)
        let jsonReply = try await fixture.post(token: fixture.tokenA, body: json,
                                               headers: Self.clientHeaders(betas: ["feature-1", Self.defaultFallbackBeta]))
        #expect(jsonReply.status == 200)
        let content = try #require(jsonReply.json["content"] as? [[String: Any]])
        #expect((content.first?["to"] as? [String: Any])?["model"] as? String == "claude-haiku-4-5")

        // The pause_turn follow-up: every block, known or not, reaches the upstream as the app wrote it.
        let followUp = Self.body(model: "claude-opus-4-8", fallbacks: nil, messages: Self.pausedTurnMessages)
        let followUpReply = try await fixture.post(token: fixture.tokenA, body: followUp,
                                                   headers: Self.clientHeaders(profile: "uprof_other-2", betas: ["feature-1", Self.fallbackBeta]))
        #expect(followUpReply.status == 200)
        #expect(fixture.stub.requests.last?.body.map { String(decoding: $0, as: UTF8.self) } == followUp)
        // Without a profile: no profile header reaches the upstream.
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.body(model: "claude-opus-4-8", fallbacks: nil, tools: nil),
                                       headers: Self.clientHeaders(profile: nil, betas: [])).status == 200)
        #expect(fixture.stub.requests.last?.header("anthropic-user-profile-id") == nil)

        // The ledger: the fallback's model served both fallback requests, the profile carries them,
        // and each web search the upstream reported is counted, from the stream and the JSON reply.
        let lines = try await Self.waitForLedger(fixture, by: "model,profile", requests: 4)
        func line(_ model: String, _ profile: String?) -> [String: Any]? {
            lines.first { $0["model"] as? String == model && ($0["user_profile"] as? String) == profile }
        }
        let served = try #require(line("claude-haiku-4-5", "uprof_test_1"), "\(lines)")
        #expect(served["requests"] as? Int == 2)
        #expect((served["server_tool_use"] as? [String: Int])?["web_search_requests"] == 2)
        let stubOutput = fixture.stub.requests.prefix(2).reduce(0) { $0 + ($1.usage?.outputTokens ?? 0) }
        #expect(served["output_tokens"] as? Int == stubOutput)
        #expect(line("claude-opus-4-8", "uprof_other-2")?["requests"] as? Int == 1)
        let unprofiled = try #require(lines.first { $0["model"] as? String == "claude-opus-4-8" && $0["user_profile"] is NSNull }, "\(lines)")
        #expect(unprofiled["requests"] as? Int == 1)
        #expect(!lines.contains { $0["model"] as? String == "stub-fallback" }, "the declining model served nothing: \(lines)")
    }

    @Test func everyPolicyRefusalHappensBeforeTheUpstreamAndMintsNoModelName() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        try UsageTests.update(fixture, fixture.clientA, [
            "--models", "stub-fallback,claude-haiku-4-5", "--server-tools", "web_fetch", "--max-server-tool-uses", "2",
            "--betas", "feature-1,\(Self.fallbackBeta),\(Self.defaultFallbackBeta),\(Self.profileBeta)"])
        let shown = try JSONSerialization.jsonObject(with: Data(try UsageTests.ctl(fixture, ["integrations", "show", fixture.clientA, "--json"]).utf8))
        let policy = try #require((shown as? [String: Any])?["policy"] as? [String: Any])
        #expect(policy["server_tools"] as? [String] == ["web_fetch"] && policy["max_server_tool_uses"] as? Int == 2)
        #expect(policy["betas"] as? [String] == ["feature-1", Self.fallbackBeta, Self.defaultFallbackBeta, Self.profileBeta])
        #expect(policy["profile_requests_per_minute"] as? Int == 0 && policy["profile_monthly_token_budget"] as? Int == 0)

        let fetch = #"[{"name":"web_fetch","type":"web_fetch_20260209","max_uses":2}]"#
        let refused: [(String, [String: String], String)] = [
            (Self.body(model: "stub-fallback", fallbacks: #"[{"model":"claude-opus-4-8"}]"#, tools: fetch), Self.clientHeaders(), "claude-opus-4-8"),
            (Self.body(model: "stub-fallback", fallbacks: #""default""#, tools: fetch),
             Self.clientHeaders(betas: [Self.defaultFallbackBeta]), #""default""#),
            (Self.body(model: "stub-fallback", tools: #"[{"name":"web_search","type":"web_search_20260209","max_uses":1}]"#),
             Self.clientHeaders(), "web_search_20260209"),
            (Self.body(model: "stub-fallback", tools: #"[{"name":"web_fetch","type":"web_fetch_20260209"}]"#), Self.clientHeaders(), "must set max_uses"),
            (Self.body(model: "stub-fallback", tools: #"[{"name":"web_fetch","type":"web_fetch_20260209","max_uses":5}]"#), Self.clientHeaders(),
             "max_uses 5"),
            (Self.body(model: "stub-fallback", tools: fetch), Self.clientHeaders(betas: ["files-api-2025-04-14"]), "files-api-2025-04-14"),
            (Self.body(model: "claude-random-\(UUID().uuidString.prefix(8).lowercased())", tools: fetch), Self.clientHeaders(), "claude-random-"),
            // Bad input, refused whatever the policy.
            (Self.body(model: "stub-fallback", tools: fetch), Self.clientHeaders(profile: "user_42"), "anthropic-user-profile-id"),
            (Self.body(model: "stub-fallback", tools: fetch), Self.clientHeaders(profile: "uprof_" + String(repeating: "x", count: 130)),
             "anthropic-user-profile-id"),
            (Self.body(model: "stub-fallback", fallbacks: #"{"model":"claude-haiku-4-5"}"#, tools: fetch), Self.clientHeaders(), "fallbacks"),
            (Self.body(model: "stub-fallback", fallbacks: "7", tools: fetch), Self.clientHeaders(), "fallbacks"),
            (Self.body(model: "stub-fallback", fallbacks: "[" + Array(repeating: #"{"model":"claude-haiku-4-5"}"#, count: 50).joined(separator: ",") + "]",
                       tools: fetch), Self.clientHeaders(), "at most 3"),
            (Self.body(model: "stub-fallback", tools: #"{"type":"web_fetch_20260209"}"#), Self.clientHeaders(), "tools: must be an array"),
            (Self.body(model: "stub-fallback", tools: #"[{"name":"web_fetch","type":"web_fetch_20260209","max_uses":"2"}]"#), Self.clientHeaders(),
             "max_uses"),
        ]
        let before = fixture.stub.requests.count
        for (body, headers, named) in refused {
            let reply = try await fixture.post(token: fixture.tokenA, body: body, headers: headers)
            #expect(reply.status == 400, "\(named): \(reply.bodyText)")
            #expect(reply.json["type"] as? String == "error" && UsageTests.errorType(reply) == "invalid_request_error", "\(reply.bodyText)")
            #expect(UsageTests.errorMessage(reply).contains(named), "\(named) in \(UsageTests.errorMessage(reply))")
        }
        #expect(fixture.stub.requests.count == before, "nothing reached the upstream")
        // What the policy allows goes through, and is billed to the model that served.
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.body(model: "stub-fallback", tools: fetch), headers: Self.clientHeaders()).status == 200)
        #expect(fixture.stub.requests.count == before + 1)

        let lines = try await Self.waitForLedger(fixture, by: "model", requests: 1, refused: refused.count)
        let models = Set(lines.compactMap { $0["model"] as? String })
        #expect(models.isSubset(of: ["stub-fallback", "claude-haiku-4-5", "refused"]), "no model name minted by a refused request: \(models)")
        let refusals = lines.compactMap { $0["refused"] as? [String: Int] }.reduce(into: [String: Int]()) { $0.merge($1, uniquingKeysWith: +) }
        #expect(refusals["malformed_request"] == 7 && refusals["fallback_not_allowed"] == 2, "\(refusals)")
        #expect(refusals["server_tool_not_allowed"] == 1 && refusals["server_tool_uses_over_limit"] == 2 && refusals["beta_not_allowed"] == 1)
        #expect(refusals["model_not_allowed"] == 1)
        #expect(lines.first { $0["model"] as? String == "claude-haiku-4-5" }?["requests"] as? Int == 1)
    }

    @Test func anUpstreamRedirectIsA502AndNeverFollowed() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        for status in [301, 307, 308] {
            let reply = try await fixture.post(token: fixture.tokenB, body: RelayTests.request(model: "stub-redirect-\(status)"))
            #expect(reply.status == 502, "\(status)")
            #expect(reply.header("location") == nil)
            #expect(UsageTests.errorType(reply) == "api_error" && UsageTests.errorMessage(reply).contains("redirect"))
        }
        #expect(fixture.stub.requests.count == 3, "each request went upstream once: nothing followed a Location")
        #expect(await fixture.server.waitForLog(containing: "a redirect, which is never followed"))
    }

    @Test func aProfileOverItsLimitIsRefusedWhileOtherProfilesGoOn() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        try UsageTests.update(fixture, fixture.clientA, ["--profile-requests-per-minute", "2", "--device-requests-per-minute", "0"])
        // Early in a minute, so the window holds everything below.
        let intoMinute = Date().timeIntervalSince1970.truncatingRemainder(dividingBy: 60)
        if intoMinute > 45 { try await Task.sleep(for: .milliseconds(Int((60.5 - intoMinute) * 1000))) }
        let body = Self.body(model: "claude-opus-4-8", fallbacks: nil, tools: nil)
        for _ in 0..<2 { #expect(try await fixture.post(token: fixture.tokenA, body: body, headers: Self.clientHeaders(profile: "uprof_a", betas: [])).status == 200) }
        let before = fixture.stub.requests.count
        let over = try await fixture.post(token: fixture.tokenA, body: body, headers: Self.clientHeaders(profile: "uprof_a", betas: []))
        #expect(over.status == 429 && UsageTests.errorType(over) == "rate_limit_error")
        #expect(Int(over.header("retry-after") ?? "") ?? 0 >= 1)
        #expect(fixture.stub.requests.count == before)
        #expect(try await fixture.post(token: fixture.tokenA, body: body, headers: Self.clientHeaders(profile: "uprof_b", betas: [])).status == 200)
        #expect(try await fixture.post(token: fixture.tokenA, body: body, headers: Self.clientHeaders(profile: nil, betas: [])).status == 200)
    }
}

extension HTTPResult {
    var bodyText: String { String(decoding: body, as: UTF8.self) }
}
