import Foundation
import Testing
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// The usage ledger and the per-integration policy on the shipped binaries: attestd relaying to
/// the stub upstream, attestctl reading and changing what the database holds.
@Suite(.serialized) struct UsageTests {
    typealias Fixture = RelayTests.Fixture

    static func ctl(_ fixture: Fixture, _ arguments: [String]) throws -> String {
        let (status, output) = try ServerProcess.attestctl(arguments + ["--db", fixture.db])
        guard status == 0 else { throw HTTPTestError("attestctl \(arguments.joined(separator: " ")) exited \(status): \(output)") }
        return output
    }

    /// `attestctl usage --json …`, one object per line: the ledger's rows, without the last line's forecast.
    static func usage(_ fixture: Fixture, _ arguments: [String] = []) throws -> [[String: Any]] {
        try usageLines(fixture, arguments).filter { $0["forecast"] == nil }
    }

    /// Every line of `attestctl usage --json …`, the forecast's included.
    static func usageLines(_ fixture: Fixture, _ arguments: [String] = []) throws -> [[String: Any]] {
        try ctl(fixture, ["usage", "--json"] + arguments).split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
    }

    static func total(_ lines: [[String: Any]], _ field: String) -> Int {
        lines.reduce(0) { $0 + ($1[field] as? Int ?? 0) }
    }

    /// Waits (the ledger flushes every second) until attestctl sees `requests` relayed requests;
    /// a timeout is a failure of the test, not a silent return.
    static func waitForRequests(_ fixture: Fixture, _ requests: Int, timeout: TimeInterval = 6,
                                sourceLocation: SourceLocation = #_sourceLocation) async throws -> [[String: Any]] {
        let deadline = Date() + timeout
        while true {
            let lines = try usage(fixture)
            if total(lines, "requests") >= requests { return lines }
            guard Date() <= deadline else {
                Issue.record("the ledger never held \(requests) requests within \(timeout) s: \(total(lines, "requests"))", sourceLocation: sourceLocation)
                return lines
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    static func update(_ fixture: Fixture, _ clientID: String, _ options: [String]) throws {
        _ = try ctl(fixture, ["integrations", "update", clientID, "--actor", "owner@example.com"] + options)
    }

    static func errorType(_ reply: HTTPResult) -> String? { (reply.json["error"] as? [String: Any])?["type"] as? String }
    static func errorMessage(_ reply: HTTPResult) -> String { (reply.json["error"] as? [String: Any])?["message"] as? String ?? "" }

    @Test func usageFromJSONAndStreamedRepliesIsRecordedExactlyAndAddsUpInEveryGrouping() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let bodies = [
            RelayTests.request(model: "claude-a"),
            RelayTests.request(model: "stub-deltas-9", stream: true),
            RelayTests.request(model: "stub-cache-100-250"),
            RelayTests.request(model: "stub-cache-40-7", stream: true, maxTokens: 500),
            RelayTests.request(model: "claude-a", stream: true),
            RelayTests.request(model: "stub-error-529"),
            RelayTests.request(model: "stub-error-429"),
        ]
        for body in bodies { _ = try await fixture.post(token: fixture.tokenA, body: body) }
        _ = try await fixture.post(token: fixture.tokenB, body: RelayTests.request(model: "claude-b", stream: true))
        let records = fixture.stub.requests
        #expect(records.count == 8)
        let lines = try await Self.waitForRequests(fixture, 8)
        // Exactly the stub's numbers, per model.
        for record in records where record.status == 200 {
            let model = try #require(record.model)
            let line = try #require(lines.first { $0["model"] as? String == model }, "\(model) in \(lines)")
            let sameModel = records.filter { $0.model == model && $0.status == 200 }
            #expect(line["input_tokens"] as? Int == sameModel.reduce(0) { $0 + ($1.usage?.inputTokens ?? 0) }, "\(model)")
            #expect(line["output_tokens"] as? Int == sameModel.reduce(0) { $0 + ($1.usage?.outputTokens ?? 0) }, "\(model)")
            #expect(line["cache_creation_input_tokens"] as? Int == sameModel.reduce(0) { $0 + ($1.usage?.cacheCreationInputTokens ?? 0) })
            #expect(line["cache_read_input_tokens"] as? Int == sameModel.reduce(0) { $0 + ($1.usage?.cacheReadInputTokens ?? 0) })
            #expect(line["incomplete"] as? Int == 0)
        }
        let stubInput = records.reduce(0) { $0 + ($1.status == 200 ? $1.usage?.inputTokens ?? 0 : 0) }
        let stubOutput = records.reduce(0) { $0 + ($1.status == 200 ? $1.usage?.outputTokens ?? 0 : 0) }
        #expect(Self.total(lines, "input_tokens") == stubInput && stubInput > 0)
        #expect(Self.total(lines, "output_tokens") == stubOutput && stubOutput > 0)
        // Errors by upstream status; every relayed request counted.
        let errors = lines.compactMap { $0["errors"] as? [String: Int] }.reduce(into: [String: Int]()) { $0.merge($1, uniquingKeysWith: +) }
        #expect(errors == ["429": 1, "529": 1])
        #expect(Self.total(lines, "requests") == 8)
        // The detail lines carry workspace, integration, model and hour.
        let first = try #require(lines.first)
        #expect(Set(first.keys).isSuperset(of: ["workspace", "client_id", "model", "hour", "requests", "input_tokens", "output_tokens",
                                                  "cache_creation_input_tokens", "cache_read_input_tokens", "errors", "incomplete"]))
        // Every grouping folds away the other fields and keeps the totals.
        for (by, kept, folded) in [("hour", "hour", "model"), ("day", "day", "client_id"), ("model", "model", "hour"),
                                   ("integration", "client_id", "model")] {
            let grouped = try Self.usage(fixture, ["--by", by])
            #expect(grouped.allSatisfy { $0[kept] != nil && $0[folded] == nil }, "--by \(by)")
            for field in ["requests", "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"] {
                #expect(Self.total(grouped, field) == Self.total(lines, field), "--by \(by) \(field)")
            }
        }
        #expect(try Self.usage(fixture, ["--by", "integration"]).count == 2)
        #expect(Self.total(try Self.usage(fixture, ["--client-id", fixture.clientB]), "requests") == 1)
        #expect(Self.total(try Self.usage(fixture, ["--workspace", "second"]), "requests") == 1)
        // Dates: the current hour is in today; nothing is in a range that ended yesterday.
        #expect(Self.total(try Self.usage(fixture, ["--since", String(ISO8601DateFormatter().string(from: Date()).prefix(10))]), "requests") == 8)
        #expect(try Self.usage(fixture, ["--until", "2020-01-01"]).isEmpty)
        // The readable table ends with the same totals.
        let table = try Self.ctl(fixture, ["usage", "--by", "model"])
        let totalRow = try #require(table.split(separator: "\n").last { $0.hasPrefix("TOTAL") }).split(separator: " ", omittingEmptySubsequences: true)
        #expect(totalRow.first == "TOTAL" && totalRow.dropFirst().first.map(String.init) == "8")
        // And the metrics.
        let metrics = String(decoding: try await TestHTTP(baseURL: fixture.server.adminBaseURL).send("GET", "/metrics").body, as: UTF8.self)
        #expect(metrics.contains(#"attestd_upstream_tokens_total{kind="output"} \#(stubOutput)"#))
        #expect(metrics.contains(#"attestd_upstream_requests_total{status="529"} 1"#))
        #expect(metrics.contains("attestd_upstream_latency_seconds_count 8") && metrics.contains("attestd_upstream_ttfb_seconds_bucket"))
        #expect(!metrics.contains(fixture.clientA), "no client IDs as labels")
    }

    @Test func aStreamCutMidwayIsRecordedWithWhatWasSeenAndFlagged() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        // Cut by the upstream after message_start and one delta.
        let cut = try await fixture.post(token: fixture.tokenA, body: RelayTests.request(model: "stub-drop-mid-stream", stream: true))
        #expect(cut.status == 200)
        // Cut by the client: it hangs up during a slow stream.
        let stream = try RawStream(port: fixture.server.port, path: "/v1/messages", token: fixture.tokenA,
                                   body: RelayTests.request(model: "stub-slow-stream-30", stream: true))
        _ = try stream.read(until: "content_block_delta", timeout: 10)
        stream.close()
        let lines = try await Self.waitForRequests(fixture, 2)
        let records = fixture.stub.requests
        for model in ["stub-drop-mid-stream", "stub-slow-stream-30"] {
            let line = try #require(lines.first { $0["model"] as? String == model }, "\(model)")
            let record = try #require(records.first { $0.model == model })
            #expect(line["requests"] as? Int == 1)
            #expect(line["incomplete"] as? Int == 1, "\(model) flagged")
            #expect(line["input_tokens"] as? Int == record.usage?.inputTokens, "\(model): message_start's input was seen")
            #expect((line["output_tokens"] as? Int ?? 0) >= 1)
        }
    }

    /// A client that hangs up while its non-streamed reply is being generated: the upstream
    /// generates and bills it all the same, so the relay reads it to its end and records its real
    /// usage, flagged abandoned. A stream whose client leaves is cancelled upstream, as before.
    @Test func anAbandonedReplyIsReadToItsEndAndRecordedWithItsRealUsage() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let reply = try RawStream(port: fixture.server.port, path: "/v1/messages", token: fixture.tokenA,
                                  body: RelayTests.request(model: "stub-latency-1000"))
        let stream = try RawStream(port: fixture.server.port, path: "/v1/messages", token: fixture.tokenA,
                                   body: RelayTests.request(model: "stub-latency-1001", stream: true))
        // Both reached the upstream, which is still working on them.
        #expect(await fixture.stub.waitUntil(timeout: .seconds(10)) { $0.requests.count == 2 })
        reply.close()
        stream.close()
        let lines = try await Self.waitForRequests(fixture, 2, timeout: 15)
        let records = fixture.stub.requests
        let json = try #require(records.first { $0.model == "stub-latency-1000" })
        let line = try #require(lines.first { $0["model"] as? String == "stub-latency-1000" })
        // The stub marks a record complete after its last write: wait for the mark.
        #expect(await fixture.stub.waitUntil(timeout: .seconds(10)) { stub in
            stub.requests.contains { $0.model == "stub-latency-1000" && $0.outcome == .completed }
        }, "the relay kept reading the reply its client left")
        #expect(line["abandoned"] as? Int == 1)
        #expect(line["incomplete"] as? Int == 0)
        #expect(line["input_tokens"] as? Int == json.usage?.inputTokens && (json.usage?.inputTokens ?? 0) > 0)
        #expect(line["output_tokens"] as? Int == json.usage?.outputTokens && (json.usage?.outputTokens ?? 0) > 0)
        #expect(line["errors"] as? [String: Int] == [:])
        // The stream: cancelled upstream while it waited, recorded as cut short with what was seen.
        let streamed = try #require(records.first { $0.model == "stub-latency-1001" })
        #expect(await fixture.stub.waitUntil(timeout: .seconds(10)) { stub in
            stub.requests.first { $0.model == "stub-latency-1001" }?.outcome == .clientClosed
        }, "\(streamed.outcome)")
        // Cancelled before the upstream answered, its model never served: the row is `unknown`
        // (a device leaving at once must not mint model names), not the name it sent.
        #expect(!lines.contains { $0["model"] as? String == "stub-latency-1001" })
        let streamLine = try #require(lines.first { $0["model"] as? String == "unknown" })
        #expect(streamLine["incomplete"] as? Int == 1)
        #expect(streamLine["abandoned"] as? Int == 0)
    }

    /// A stream the upstream cuts after five deltas, before its closing message_delta, counts at
    /// least those five output tokens (message_start said 1).
    @Test func aStreamCutBeforeItsEndCountsTheDeltasItCarried() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let cut = try await fixture.post(token: fixture.tokenA, body: RelayTests.request(model: "stub-drop-after-5+deltas-20", stream: true, maxTokens: 100))
        #expect(cut.status == 200)
        #expect(String(decoding: cut.body, as: UTF8.self).components(separatedBy: "event: content_block_delta").count - 1 == 5)
        let line = try #require(try await Self.waitForRequests(fixture, 1).first)
        #expect(line["incomplete"] as? Int == 1)
        #expect(line["output_tokens"] as? Int == 5)
    }

    /// Cache writes and reads count against the monthly budget like other input.
    @Test func cacheTokensCountAgainstTheMonthlyBudget() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        try Self.update(fixture, fixture.clientA, ["--monthly-token-budget", "1000", "--device-requests-per-minute", "0"])
        // Little plain input and output, 3,000 tokens written to the cache.
        #expect(try await fixture.post(token: fixture.tokenA, body: RelayTests.request(model: "stub-cache-3000-0")).status == 200)
        let record = try #require(fixture.stub.requests.last?.usage)
        #expect(record.inputTokens + record.outputTokens < 1000 && record.cacheCreationInputTokens == 3000)
        _ = try await Self.waitForRequests(fixture, 1)
        try await Task.sleep(for: .milliseconds(300))
        let refused = try await fixture.post(token: fixture.tokenA, body: RelayTests.request())
        #expect(refused.status == 429 && Self.errorMessage(refused).contains("monthly budget"))
    }

    @Test func eachPolicyRefusalHasItsStatusTypeMessageAndRetryAfter() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        try Self.update(fixture, fixture.clientA, ["--models", "claude-ok,claude-also", "--max-tokens", "100"])
        let details = try Self.ctl(fixture, ["integrations", "show", fixture.clientA, "--json"])
        #expect(details.contains(#""models":["claude-ok","claude-also"]"#) && details.contains(#""max_tokens":100"#))

        let model = try await fixture.post(token: fixture.tokenA, body: RelayTests.request(model: "claude-expensive"))
        #expect(model.status == 400 && Self.errorType(model) == "invalid_request_error")
        #expect(Self.errorMessage(model).contains("claude-expensive"), "the message names the model")
        #expect(model.header("request-id")?.hasPrefix("req_") == true)

        let tokens = try await fixture.post(token: fixture.tokenA, body: RelayTests.request(model: "claude-ok", maxTokens: 101))
        #expect(tokens.status == 400 && Self.errorType(tokens) == "invalid_request_error")
        #expect(Self.errorMessage(tokens).contains("max_tokens") && Self.errorMessage(tokens).contains("100"))
        // Two max_tokens: ours and the upstream's reading could differ, so it is refused.
        let twice = try await fixture.post(token: fixture.tokenA, body: #"{"model":"claude-ok","max_tokens":10,"max_tokens":100000,"messages":[]}"#)
        #expect(twice.status == 400 && Self.errorMessage(twice).contains("more than once"))
        #expect(try await fixture.post(token: fixture.tokenA, body: RelayTests.request(model: "claude-ok", maxTokens: 100)).status == 200)

        try Self.update(fixture, fixture.clientA, ["--models", "*", "--max-tokens", "0", "--device-requests-per-minute", "2"])
        #expect(try await fixture.post(token: fixture.tokenA, body: RelayTests.request(model: "claude-expensive", maxTokens: 5000)).status == 200)
        let limited = try await fixture.post(token: fixture.tokenA, body: RelayTests.request())
        #expect(limited.status == 429 && Self.errorType(limited) == "rate_limit_error")
        #expect(Self.errorMessage(limited).contains("2 requests a minute"))
        let retry = try #require(limited.header("retry-after").flatMap(Int.init))
        #expect((1...120).contains(retry))
        // The other device of the same integration is not limited by this one.
        let other = try ManualDevice(clientID: fixture.clientA)
        let otherToken = try #require(try await fixture.http.registerFresh(other).json["access_token"] as? String)
        #expect(try await fixture.post(token: otherToken, body: RelayTests.request()).status == 200)

        try Self.update(fixture, fixture.clientA, ["--device-requests-per-minute", "0", "--monthly-token-budget", "1"])
        let spent = try await fixture.post(token: fixture.tokenA, body: RelayTests.request())
        #expect(spent.status == 429 && Self.errorType(spent) == "rate_limit_error")
        #expect(Self.errorMessage(spent).contains("monthly budget"))
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let monthStart = calendar.date(from: calendar.dateComponents([.year, .month], from: Date()))!
        let nextMonth = calendar.date(byAdding: .month, value: 1, to: monthStart)!.timeIntervalSinceNow
        let renews = try #require(spent.header("retry-after").flatMap(Double.init))
        #expect(abs(renews - nextMonth) < 10, "retry-after is the start of next month")
        // count_tokens spends nothing, so the budget does not stop it.
        #expect(try await fixture.post("/v1/messages/count_tokens", token: fixture.tokenA, body: RelayTests.request()).status == 200)

        // Refusals never reached the upstream and are counted apart, by reason.
        let refused = try await Self.waitForRequests(fixture, 4).compactMap { $0["refused"] as? [String: Int] }
            .reduce(into: [String: Int]()) { $0.merge($1, uniquingKeysWith: +) }
        #expect(refused == ["model_not_allowed": 1, "max_tokens_over_limit": 1, "unreadable_body": 1, "device_rate_limited": 1,
                            "monthly_budget_spent": 1])
        #expect(fixture.stub.requests.count == 4)
        // The changes are in the audit trail.
        #expect(try Self.ctl(fixture, ["audit", "--client-id", fixture.clientA]).contains("integration.policy_updated"))
    }

    @Test func anUpdateAppliesOnTheNextRequestOfEveryInstanceAndLimitsAreShared() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let second = try ServerProcess(db: fixture.db, extraArguments: ["--upstream-url", fixture.stub.baseURL, "--upstream-key-file", fixture.keyFileB])
        defer { second.stop() }
        let secondHTTP = TestHTTP(baseURL: second.baseURL)
        func post(_ http: TestHTTP, _ body: String) async throws -> Int {
            try await http.send("POST", "/v1/messages", body: Data(body.utf8), contentType: "application/json",
                                headers: ["authorization": "Bearer \(fixture.tokenA)"]).status
        }
        #expect(try await post(fixture.http, RelayTests.request(maxTokens: 500)) == 200)
        #expect(try await post(secondHTTP, RelayTests.request(maxTokens: 500)) == 200)
        try Self.update(fixture, fixture.clientA, ["--max-tokens", "100"])
        #expect(try await post(fixture.http, RelayTests.request(maxTokens: 500)) == 400)
        #expect(try await post(secondHTTP, RelayTests.request(maxTokens: 500)) == 400)
        try Self.update(fixture, fixture.clientA, ["--max-tokens", "0"])
        #expect(try await post(secondHTTP, RelayTests.request(maxTokens: 500)) == 200)
        // The per-device limit is global: a fresh device's requests on the first instance count on
        // the second once flushed (every second).
        try Self.update(fixture, fixture.clientA, ["--device-requests-per-minute", "2"])
        let device = try ManualDevice(clientID: fixture.clientA)
        let token = try #require(try await fixture.http.registerFresh(device).json["access_token"] as? String)
        for _ in 0..<2 { #expect(try await fixture.post(token: token, body: RelayTests.request()).status == 200) }
        // 3 of device A before, 2 of the new one: wait until the first instance has flushed them.
        #expect(Self.total(try await Self.waitForRequests(fixture, 5), "requests") == 5)
        let limited = try await secondHTTP.send("POST", "/v1/messages", body: Data(RelayTests.request().utf8), contentType: "application/json",
                                                headers: ["authorization": "Bearer \(token)"])
        #expect(limited.status == 429 && limited.header("retry-after") != nil)
    }

    /// 50 requests at a time against a budget: each wave is admitted while the recorded spend is
    /// under the budget, so the overshoot is at most what one wave spends.
    @Test func theMonthlyBudgetHoldsUnderFiftyConcurrentRequests() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let body = RelayTests.request(model: "claude-budget")
        #expect(try await fixture.post(token: fixture.tokenB, body: body).status == 200)
        let probe = try #require(fixture.stub.requests.last?.usage)
        let perRequest = probe.inputTokens + probe.outputTokens
        let budget = 75 * perRequest
        try Self.update(fixture, fixture.clientA, ["--monthly-token-budget", String(budget), "--device-requests-per-minute", "0"])
        let http = fixture.http, token = fixture.tokenA
        var refusedWaves = 0
        var statuses: [Int] = []
        for _ in 0..<6 where refusedWaves == 0 {
            let wave = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<50 {
                    group.addTask {
                        try await http.send("POST", "/v1/messages", body: Data(body.utf8), contentType: "application/json",
                                            headers: ["authorization": "Bearer \(token)"]).status
                    }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            statuses += wave
            if wave.allSatisfy({ $0 == 429 }) { refusedWaves += 1 }
            try await Task.sleep(for: .milliseconds(1300))   // the spend is flushed and read back
        }
        #expect(refusedWaves == 1, "the budget stopped a wave: \(statuses)")
        let lines = try Self.usage(fixture, ["--client-id", fixture.clientA])
        let spent = Self.total(lines, "input_tokens") + Self.total(lines, "output_tokens")
        #expect(spent >= budget, "the budget was reached: \(spent) of \(budget)")
        #expect(spent <= budget + 50 * perRequest, "overshoot bounded by one wave in flight: \(spent) of \(budget)")
        #expect(statuses.filter { $0 == 200 }.count * perRequest == spent)
    }

    /// Usage is flushed every second: a kill -9 loses at most the requests of the last interval
    /// or so (the bound allows a flush that a loaded machine runs two seconds late: what this
    /// catches is a ledger that does not flush on its own at all, or loses committed counts).
    @Test func aKillNineLosesAtMostOneFlushInterval() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        try Self.update(fixture, fixture.clientA, ["--device-requests-per-minute", "0"])
        var completed: [Date] = []
        let end = Date() + 6
        while Date() < end {
            if try await fixture.post(token: fixture.tokenA, body: RelayTests.request()).status == 200 { completed.append(Date()) }
        }
        let killedAt = Date()
        fixture.server.kill9()
        let recorded = Self.total(try Self.usage(fixture), "requests")
        let olderThanAnInterval = completed.filter { $0 < killedAt - 3 }.count
        #expect(recorded <= completed.count)
        #expect(recorded >= olderThanAnInterval, "recorded \(recorded) of \(completed.count); \(olderThanAnInterval) ended over 3 s before the kill")
        #expect(completed.count - recorded <= completed.count - olderThanAnInterval)
    }
}
