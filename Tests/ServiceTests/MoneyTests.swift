import AppAttest
import Foundation
import Testing
import UpstreamStub

/// Spend in money on the shipped binaries: every ledger row's cost from the price table in force
/// when it was recorded, on JSON replies and streams, and budgets in dollars that refuse with the
/// token budgets' 429 (attestd relaying to the stub upstream, attestctl changing prices and budgets).
@Suite(.serialized) struct MoneyTests {
    typealias Fixture = RelayTests.Fixture

    /// USD per million tokens, restated from the Claude pricing page (the shipped table): one
    /// token at `$P / MTok` costs P micro-dollars.
    struct Rates {
        var input, output, write5m, write1h, read: Double
        static let sonnet46 = Rates(input: 3, output: 15, write5m: 3.75, write1h: 6, read: 0.30)
        static let sonnet45Long = Rates(input: 6, output: 22.50, write5m: 7.50, write1h: 12, read: 0.60)
    }

    /// What a request the stub answered costs at `rates`, plus $10 per 1,000 web searches.
    static func expectedCost(_ usage: StubUsage, _ rates: Rates, webSearches: Int = 0) -> Int {
        let fiveMinutes = usage.cacheCreationInputTokens - usage.cacheCreation1hInputTokens
        let tokens = Double(usage.inputTokens) * rates.input + Double(usage.outputTokens) * rates.output + Double(fiveMinutes) * rates.write5m
            + Double(usage.cacheCreation1hInputTokens) * rates.write1h + Double(usage.cacheReadInputTokens) * rates.read
        return Int(tokens.rounded(.toNearestOrAwayFromZero)) + webSearches * 10_000
    }

    /// The ledger's total cost and requests (`usage --json`), once it holds `requests` requests.
    static func waitForCost(_ fixture: Fixture, requests: Int, _ arguments: [String] = [],
                            sourceLocation: SourceLocation = #_sourceLocation) async throws -> Int {
        let lines = try await UsageTests.waitForRequests(fixture, requests, sourceLocation: sourceLocation)
        #expect(lines.allSatisfy { $0["cost_micro_usd"] is Int }, "every row has cost_micro_usd", sourceLocation: sourceLocation)
        return UsageTests.total(lines, "cost_micro_usd")
    }

    /// Micro-dollars as `--…-budget-usd` takes them.
    static func usdText(_ micro: Int) -> String {
        let fraction = String(micro % 1_000_000)
        return "\(micro / 1_000_000)." + String(repeating: "0", count: 6 - fraction.count) + fraction
    }

    static func body(model: String, stream: Bool, tools: Bool = false) -> String {
        let toolList = tools ? #","tools":[{"type":"web_search_20260209","name":"web_search","max_uses":2},{"type":"web_fetch_20260209","name":"web_fetch","max_uses":2}]"# : ""
        return #"{"model":"\#(model)","max_tokens":64,"stream":\#(stream)\#(toolList),"messages":[{"role":"user","content":"What does it cost?"}]}"#
    }

    static func cache(_ creation: Int, _ read: Int, oneHour: Int = 0, deltas: Int? = nil) -> StubBehavior {
        var behavior = StubBehavior()
        behavior.cacheCreationTokens = creation
        behavior.cacheReadTokens = read
        behavior.cacheCreation1hTokens = oneHour
        behavior.deltaCount = deltas
        return behavior
    }

    @Test func theCostOfEachKindOfTokenAndEachServerToolMatchesTheTableOnJSONAndStreams() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        // Input and output; 5-minute and 1-hour cache writes and cache reads; web search and web
        // fetch: each on a JSON reply and on a stream, and each request's cost checked on its own.
        let cases: [(label: String, stream: Bool, tools: Bool, behavior: StubBehavior?)] = [
            ("json", false, false, nil), ("stream", true, false, nil),
            ("json cache", false, false, Self.cache(400, 1000, oneHour: 100)), ("stream cache", true, false, Self.cache(400, 1000, oneHour: 100)),
            ("json tools", false, true, nil), ("stream tools", true, true, nil),
        ]
        var total = 0
        for (index, item) in cases.enumerated() {
            if let behavior = item.behavior { fixture.stub.enqueue(behavior) }
            let reply = try await fixture.post(token: fixture.tokenA, body: Self.body(model: "claude-sonnet-4-6", stream: item.stream, tools: item.tools))
            #expect(reply.status == 200, "\(item.label)")
            let usage = try #require(fixture.stub.requests.last?.usage, "\(item.label)")
            let expected = Self.expectedCost(usage, .sonnet46, webSearches: item.tools ? 1 : 0)
            total += expected
            let recorded = try await Self.waitForCost(fixture, requests: index + 1)
            #expect(recorded == total, "\(item.label): this request cost \(recorded - (total - expected)), the table says \(expected) (\(usage))")
        }
        // The cache cases wrote for an hour as well as for five minutes, and read: each priced apart.
        let lines = try UsageTests.usage(fixture, ["--by", "model"])
        #expect(UsageTests.total(lines, "cache_creation_1h_input_tokens") == 200)
        #expect((lines.first?["server_tool_use"] as? [String: Int]) == ["web_search_requests": 2, "web_fetch_requests": 2])
    }

    @Test func theLongContextTierAndTheOneHourCacheWriteArePricedApart() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        // Claude Sonnet 4.5 above 200K prompt tokens: every token at the long-context rates.
        fixture.stub.enqueue(Self.cache(0, 250_000, deltas: 4))
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.body(model: "claude-sonnet-4-5", stream: true)).status == 200)
        let long = try #require(fixture.stub.requests.last?.usage)
        #expect(long.inputTokens + long.cacheReadInputTokens > 200_000)
        let longCost = try await Self.waitForCost(fixture, requests: 1)
        #expect(longCost == Self.expectedCost(long, .sonnet45Long), "long context: \(long)")
        // The same prompt under 200K tokens is priced at the base rates.
        fixture.stub.enqueue(Self.cache(0, 150_000, deltas: 4))
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.body(model: "claude-sonnet-4-5", stream: false)).status == 200)
        let short = try #require(fixture.stub.requests.last?.usage)
        #expect(try await Self.waitForCost(fixture, requests: 2) - longCost == Self.expectedCost(short, .sonnet46))
        // 1,000 tokens written for an hour cost $6 / MTok, for 5 minutes $3.75.
        var before = try await Self.waitForCost(fixture, requests: 2)
        for (requests, oneHour) in [(3, 1000), (4, 0)] {
            fixture.stub.enqueue(Self.cache(1000, 0, oneHour: oneHour, deltas: 4))
            #expect(try await fixture.post(token: fixture.tokenA, body: Self.body(model: "claude-sonnet-4-6", stream: false)).status == 200)
            let usage = try #require(fixture.stub.requests.last?.usage)
            let after = try await Self.waitForCost(fixture, requests: requests)
            #expect(after - before == Self.expectedCost(usage, .sonnet46))
            #expect(after - before - (usage.inputTokens * 3 + 4 * 15) == (oneHour > 0 ? 6000 : 3750))
            before = after
        }
    }

    @Test func aPriceOverrideAppliesOnlyFromItsTimeOn() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.body(model: "claude-sonnet-4-6", stream: false)).status == 200)
        let first = try #require(fixture.stub.requests.last?.usage)
        let firstCost = try await Self.waitForCost(fixture, requests: 1)
        #expect(firstCost == Self.expectedCost(first, .sonnet46))
        // The workspace's contract: ten times the input and output price, from now on.
        _ = try UsageTests.ctl(fixture, ["prices", "set", "--actor", "owner@example.com", "--workspace", "default", "--model", "claude-sonnet-4-6",
                                         "--input", "30", "--output", "150"])
        let shown = try #require(try JSONSerialization.jsonObject(with: Data(try UsageTests.ctl(fixture, ["prices", "show", "--workspace", "default", "--json"]).utf8)) as? [String: Any])
        let model = try #require((shown["models"] as? [String: Any])?["claude-sonnet-4-6"] as? [String: Any])
        #expect(model["input"] as? Double == 30 && model["output"] as? Double == 150 && model["cache_read"] as? Double == 0.3)
        #expect(shown["effective_at"] is String)
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.body(model: "claude-sonnet-4-6", stream: true)).status == 200)
        let second = try #require(fixture.stub.requests.last?.usage)
        let total = try await Self.waitForCost(fixture, requests: 2)
        // The first request keeps its cost; the second is priced with the override.
        #expect(total == firstCost + Self.expectedCost(second, Rates(input: 30, output: 150, write5m: 3.75, write1h: 6, read: 0.30)))
        // Another workspace still pays the shipped prices.
        #expect(try await fixture.post(token: fixture.tokenB, body: Self.body(model: "claude-sonnet-4-6", stream: false)).status == 200)
        let third = try #require(fixture.stub.requests.last?.usage)
        _ = try await Self.waitForCost(fixture, requests: 3)
        #expect(UsageTests.total(try UsageTests.usage(fixture, ["--workspace", "second"]), "cost_micro_usd") == Self.expectedCost(third, .sonnet46))
        // Audited, and import takes back what show prints.
        #expect(try UsageTests.ctl(fixture, ["audit"]).contains("prices.set"))
        let file = fixture.directory.appendingPathComponent("prices.json")
        try Data(try UsageTests.ctl(fixture, ["prices", "show", "--json"]).utf8).write(to: file)
        _ = try UsageTests.ctl(fixture, ["prices", "import", "--actor", "owner@example.com", "--workspace", "default", file.path])
        #expect(try UsageTests.ctl(fixture, ["prices", "show", "--workspace", "default"]).contains("claude-sonnet-4-6  3.00   15.00"))
        // The month so far and its projection close `usage --json`.
        let forecast = try #require(try UsageTests.usageLines(fixture).last?["forecast"] as? [String: Any])
        #expect(forecast["cost_micro_usd"] as? Int == total + Self.expectedCost(third, .sonnet46))
        #expect((forecast["projected_cost_micro_usd"] as? Int ?? 0) >= total)
    }

    // MARK: Budgets

    static let profileHeaders = ["anthropic-beta": "user-profiles-2026-08-18"]

    static func send(_ fixture: Fixture, _ token: String, profile: String?) async throws -> HTTPResult {
        var headers = Self.profileHeaders
        if let profile { headers["anthropic-user-profile-id"] = profile }
        return try await fixture.post(token: token, body: Self.body(model: "claude-sonnet-4-6", stream: false), headers: headers)
    }

    /// Sends until a request is refused (each costs about 200 micro-dollars): the budget is spent.
    static func spendUntilRefused(_ fixture: Fixture, _ token: String, profile: String?, sourceLocation: SourceLocation = #_sourceLocation) async throws -> HTTPResult {
        let deadline = Date() + 15
        while true {
            let reply = try await send(fixture, token, profile: profile)
            if reply.status != 200 { return reply }
            guard Date() < deadline else {
                Issue.record("never refused", sourceLocation: sourceLocation)
                return reply
            }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// The token budgets' wire shape: 429 `rate_limit_error`, `retry-after` at the period's end.
    static func expectBudgetRefusal(_ reply: HTTPResult, renewsAt end: Date, _ label: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(reply.status == 429, "\(label): \(reply.status)", sourceLocation: sourceLocation)
        #expect(UsageTests.errorType(reply) == "rate_limit_error", "\(label)", sourceLocation: sourceLocation)
        let retry = Int(reply.header("retry-after") ?? "") ?? -1
        #expect(abs(Double(retry) - end.timeIntervalSinceNow) < 10, "\(label): retry-after \(retry)", sourceLocation: sourceLocation)
    }

    static var midnight: Date { Date(timeIntervalSince1970: ((Date().timeIntervalSince1970 / 86_400).rounded(.down) + 1) * 86_400) }
    static var nextMonth: Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let start = calendar.date(from: calendar.dateComponents([.year, .month], from: Date()))!
        return calendar.date(byAdding: .month, value: 1, to: start)!
    }

    @Test func aProfilesDailyBudgetRefusesThatProfileAndNoOther() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        try UsageTests.update(fixture, fixture.clientA, ["--profile-daily-budget-usd", "0.0005"])
        let refused = try await Self.spendUntilRefused(fixture, fixture.tokenA, profile: "uprof_spender")
        Self.expectBudgetRefusal(refused, renewsAt: Self.midnight, "the spender")
        #expect(UsageTests.errorMessage(refused).contains("this user profile has used its daily budget of $0.0005"))
        #expect(try await Self.send(fixture, fixture.tokenA, profile: "uprof_spender").status == 429, "still refused")
        #expect(try await Self.send(fixture, fixture.tokenA, profile: "uprof_other").status == 200, "another profile")
        #expect(try await Self.send(fixture, fixture.tokenA, profile: nil).status == 200, "no profile")
        // What it spent is in the ledger: at least the budget, at most one request over it.
        let lines = try await UsageTests.waitForRequests(fixture, 1)
        let refusals = lines.compactMap { $0["refused"] as? [String: Int] }.reduce(into: [String: Int]()) { $0.merge($1, uniquingKeysWith: +) }
        #expect(refusals["profile_daily_budget_usd_spent"] == 2)
    }

    @Test func theIntegrationsMonthlyBudgetRefusesAllItsProfiles() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        try UsageTests.update(fixture, fixture.clientA, ["--monthly-budget-usd", "0.001", "--profile-daily-budget-usd", "5"])
        let refused = try await Self.spendUntilRefused(fixture, fixture.tokenA, profile: "uprof_one")
        Self.expectBudgetRefusal(refused, renewsAt: Self.nextMonth, "the spender")
        #expect(UsageTests.errorMessage(refused).contains("this app has used its monthly budget of $0.001"))
        for profile in ["uprof_two", "uprof_three", nil] {
            Self.expectBudgetRefusal(try await Self.send(fixture, fixture.tokenA, profile: profile), renewsAt: Self.nextMonth, "\(profile ?? "no profile")")
        }
        // The other workspace's integration is not affected; removing the budget lifts it.
        #expect(try await Self.send(fixture, fixture.tokenB, profile: "uprof_one").status == 200)
        try UsageTests.update(fixture, fixture.clientA, ["--monthly-budget-usd", "0"])
        #expect(try await Self.send(fixture, fixture.tokenA, profile: "uprof_two").status == 200)
        // Token budgets keep working beside money.
        try UsageTests.update(fixture, fixture.clientA, ["--monthly-token-budget", "1"])
        #expect(try await Self.send(fixture, fixture.tokenA, profile: "uprof_two").status == 429)
    }

    @Test func theWorkspaceBudgetRefusesAllItsIntegrations() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        // A second integration in the same workspace, with a device of its own.
        let output = try UsageTests.ctl(fixture, ["integrations", "create", "--actor", "owner@example.com", "--workspace", "default", "--name", "Other",
                                                  "--team-id", "ABCDE12345", "--bundle-id", "com.example.other", "--json"])
        let other = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
        let device = try ManualDevice(clientID: other, appID: AppID(teamID: "ABCDE12345", bundleID: "com.example.other"))
        let otherToken = try #require(try await fixture.http.registerFresh(device).json["access_token"] as? String)
        _ = try UsageTests.ctl(fixture, ["workspaces", "set-budget", "--actor", "owner@example.com", "--workspace", "default", "--daily-budget-usd", "0.001"])
        #expect(try UsageTests.ctl(fixture, ["audit"]).contains("workspace.budget_updated"))
        let refused = try await Self.spendUntilRefused(fixture, fixture.tokenA, profile: nil)
        Self.expectBudgetRefusal(refused, renewsAt: Self.midnight, "the spending integration")
        #expect(UsageTests.errorMessage(refused).contains("workspace has used its daily budget"))
        Self.expectBudgetRefusal(try await Self.send(fixture, otherToken, profile: "uprof_x"), renewsAt: Self.midnight, "the other integration")
        #expect(try await Self.send(fixture, fixture.tokenB, profile: nil).status == 200, "another workspace")
    }
}

/// A budget in money on two attestd instances sharing one PostgreSQL database: the spend both
/// record adds up in one ledger, and the overshoot past the budget stays within the bound
/// docs/usage-and-policy.md states.
@Suite(.serialized) struct MoneyScaleOutTests {
    @Test func twoInstancesOvershootTheBudgetByNoMoreThanTheDocumentedBound() async throws {
        // Each request takes 100 ms upstream, so requests are in flight when the budget is reached.
        let stub = try UpstreamStubServer(UpstreamStubConfiguration(latency: .milliseconds(100)))
        defer { stub.stop() }
        let deployment = try ScaleOutTests.Deployment(instanceArguments: ["--upstream-url", stub.baseURL])
        defer { deployment.stop() }
        func ctl(_ arguments: [String]) throws -> String {
            let (status, output) = try ServerProcess.attestctl(["--db", deployment.url, "--secrets-key-file", deployment.keyFile] + arguments)
            try #require(status == 0, "attestctl \(arguments): \(output)")
            return output
        }
        try Data("pg-money-upstream-key\n".utf8).write(to: URL(fileURLWithPath: deployment.upstreamKeyFile))
        _ = try ctl(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", deployment.upstreamKeyFile])
        // Every request is the same, so it costs the same: its cost, then a budget of 40 of them.
        let http = deployment.http
        let workers = 8   // per instance
        var tokens: [String] = []
        for _ in 0..<(2 * workers) {
            tokens.append(try #require(try await http[0].registerFresh(try ManualDevice(clientID: deployment.clientID)).json["access_token"] as? String))
        }
        let body = Data(MoneyTests.body(model: "claude-sonnet-4-6", stream: false).utf8)
        let first = try await http[0].send("POST", "/v1/messages", body: body, contentType: "application/json", headers: ["authorization": "Bearer \(tokens[0])"])
        try #require(first.status == 200)
        let cost = MoneyTests.expectedCost(try #require(stub.requests.last?.usage), .sonnet46)
        try #require(cost > 0)
        let budget = 40 * cost
        _ = try ctl(["integrations", "update", deployment.clientID, "--actor", "owner@example.com", "--device-requests-per-minute", "0",
                     "--daily-budget-usd", MoneyTests.usdText(budget)])

        // Both instances, 8 clients each, sending until refused.
        let started = ContinuousClock.now
        struct Refusal: Sendable {
            let status: Int
            let type: String?
            let retryAfter: String?
        }
        let results = try await withThrowingTaskGroup(of: (instance: Int, admitted: [Duration], refusal: Refusal?).self) { group in
            for worker in 0..<(2 * workers) {
                let instance = worker % 2, token = tokens[worker], target = http[instance]
                group.addTask {
                    var admitted: [Duration] = []
                    while ContinuousClock.now - started < .seconds(30) {
                        let reply = try await target.send("POST", "/v1/messages", body: body, contentType: "application/json",
                                                          headers: ["authorization": "Bearer \(token)"])
                        if reply.status != 200 {
                            return (instance, admitted, Refusal(status: reply.status, type: UsageTests.errorType(reply), retryAfter: reply.header("retry-after")))
                        }
                        admitted.append(ContinuousClock.now - started)
                    }
                    return (instance, admitted, nil)
                }
            }
            var all: [(instance: Int, admitted: [Duration], refusal: Refusal?)] = []
            for try await result in group { all.append(result) }
            return all
        }
        for result in results {
            let refusal = try #require(result.refusal, "every client was refused in the end")
            #expect(refusal.status == 429 && refusal.type == "rate_limit_error")
            #expect(refusal.retryAfter != nil)
        }
        let admitted = 1 + results.reduce(0) { $0 + $1.admitted.count }
        // Both instances' spend in one ledger, once flushed.
        var spent = 0
        for _ in 0..<50 {
            let lines = try ctl(["usage", "--json", "--by", "integration"]).split(separator: "\n")
                .compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }.filter { $0["forecast"] == nil }
            if UsageTests.total(lines, "requests") >= admitted {
                spent = UsageTests.total(lines, "cost_micro_usd")
                break
            }
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(spent == admitted * cost, "every admitted request's cost is recorded")
        #expect(spent >= budget, "the budget was reached before anything was refused")
        // The bound: the requests in flight when the budget was reached (at most one per client)
        // plus what the other instance admitted within one flush interval and one database read
        // (1.5 s), each at most one request's cost.
        func mostWithin(_ window: Duration, _ times: [Duration]) -> Int {
            let sorted = times.sorted()
            var most = 0, start = 0
            for end in sorted.indices {
                while sorted[end] - sorted[start] > window { start += 1 }
                most = max(most, end - start + 1)
            }
            return most
        }
        let perInstance = (0..<2).map { instance in results.filter { $0.instance == instance }.flatMap(\.admitted) }
        let otherInstance = max(mostWithin(.milliseconds(1500), perInstance[0]), mostWithin(.milliseconds(1500), perInstance[1]))
        let bound = (2 * workers + otherInstance) * cost
        #expect(spent - budget <= bound, "overshoot \(spent - budget) µ$ (\((spent - budget) / cost) requests) within \(bound) µ$")
        print("money budget on 2 instances: budget \(budget) µ$, spent \(spent) µ$, overshoot \((spent - budget) / cost) requests, bound \(bound / cost)")
    }
}
