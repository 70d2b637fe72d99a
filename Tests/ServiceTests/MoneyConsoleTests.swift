import Foundation
import Testing
import TokenService
import WebDriver

/// Money in the console, in a real headless Chromium on the shipped attestd: budgets in dollars set
/// on the Policy tab and obeyed as `attestctl` reads them, the spend, the forecast and the cost by
/// day and model on the Usage tab as `attestctl usage --json` has them, and the workspace's budgets
/// in Workspace settings. Photographed at 1280 and 360 px (nothing wider than a phone's screen).
@Suite(.serialized) struct MoneyConsoleTests {
    @Test func budgetsAndSpendInDollarsOnThePolicyAndUsageTabsAndTheWorkspacesSettings() async throws {
        try await ConsoleBrowserTests.withBrowser(flow)
    }

    func flow(_ fixture: ConsoleFixture, _ browser: Browser) async throws {
        // An integration whose device relays three requests to a priced model.
        let keyFile = fixture.directory.appendingPathComponent("a.key").path
        try Data("\(RelayTests.keyA)\n".utf8).write(to: URL(fileURLWithPath: keyFile))
        try fixture.ctl(["workspaces", "set-upstream-key", "--actor", ConsoleFixture.owner, "--workspace", "default", "--key-file", keyFile])
        let clientID = try fixture.createIntegration()
        let http = TestHTTP(baseURL: fixture.server.baseURL)
        let token = try #require(try await http.registerFresh(try ManualDevice(clientID: clientID)).json["access_token"] as? String)
        for _ in 0..<3 {
            let reply = try await http.send("POST", "/v1/messages", body: Data(RelayTests.request(model: "claude-sonnet-4-6").utf8),
                                            contentType: "application/json", headers: ["authorization": "Bearer \(token)"])
            #expect(reply.status == 200)
        }

        try await browser.open(try fixture.signInLink())
        try await browser.wait("the sign-in button") { (try? await browser.find("#sign-in")) != nil }
        try await browser.click(try await browser.find("#sign-in"))
        try await browser.waitForPage("App integrations") { $0 == "/console/" }

        // 1. The Policy tab: "$2,000 a month for this app, $1 a day per user"; a wrong amount first.
        let base = fixture.adminBase + "/console/integrations/" + clientID
        try await browser.open(base + "/policy")
        try await browser.waitForPage("Policy") { $0.hasSuffix("/policy") }
        #expect(try await browser.text("label[for=monthly_budget_usd]") == "Monthly budget (USD)")
        let monthly = try await browser.find("#monthly_budget_usd")
        try await browser.clear(monthly)
        try await browser.type(monthly, "2,000")
        try await ConsoleBrowserTests.clickButton(browser, "Save policy")
        try await browser.wait("the amount's error") { try await browser.exists("#monthly_budget_usd-error") }
        #expect(try await browser.text("#monthly_budget_usd-error").contains("US dollars"))
        #expect(try await browser.property(try await browser.find("#monthly_budget_usd"), "value") as? String == "2,000")
        try await browser.clear(try await browser.find("#monthly_budget_usd"))
        try await browser.type(try await browser.find("#monthly_budget_usd"), "2000")
        try await browser.clear(try await browser.find("#profile_daily_budget_usd"))
        try await browser.type(try await browser.find("#profile_daily_budget_usd"), "1")
        try await ConsoleBrowserTests.clickButton(browser, "Save policy")
        try await browser.wait("the saved notice") { (try? await browser.text("main").contains("Policy saved")) == true }
        let shown = try #require(try JSONSerialization.jsonObject(with: Data(try fixture.ctl(["integrations", "show", clientID, "--json"]).utf8)) as? [String: Any])
        let policy = try #require(shown["policy"] as? [String: Any])
        #expect(policy["monthly_budget_micro_usd"] as? Int == 2_000_000_000 && policy["profile_daily_budget_micro_usd"] as? Int == 1_000_000)
        #expect(policy["daily_budget_micro_usd"] as? Int == 0)
        #expect(try await browser.property(try await browser.find("#monthly_budget_usd"), "value") as? String == "2000")
        try await ConsoleBrowserTests.photograph(browser, "13-policy-budgets-usd")

        // 2. The Usage tab: the cost by day and model, the spend and the forecast, the budget's meter.
        try await browser.open(base + "/usage")
        try await browser.waitForPage("Usage") { $0.hasSuffix("/usage") }
        try await browser.wait("the three requests' cost") {
            try await browser.open(try await browser.url())
            guard try await browser.exists("#cost-by-day-model tbody tr") else { return false }
            return try await browser.text("#cost-by-day-model tbody td:nth-child(3)") == "3"
        }
        let lines = try fixture.ctl(["usage", "--client-id", clientID, "--by", "day,model", "--json"]).split(separator: "\n")
            .compactMap { try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
        let row = try #require(lines.first { $0["forecast"] == nil })
        let cost = try #require(row["cost_micro_usd"] as? Int)
        #expect(cost > 0)
        var cells: [String] = []
        for cell in try await browser.findAll("#cost-by-day-model tbody td") { cells.append(try await browser.text(cell)) }
        #expect(cells == ["\(row["day"] ?? "")", "claude-sonnet-4-6", "3", MoneyText.usd(Int64(cost))])
        let forecast = try #require(lines.last?["forecast"] as? [String: Any])
        #expect(forecast["cost_micro_usd"] as? Int == cost)
        #expect(try await browser.text("#spend").hasPrefix(MoneyText.usd(Int64(cost)) + " spent this month"))
        let forecastText = try await browser.text("#forecast")
        #expect(forecastText.hasPrefix("Forecast: $") && forecastText.contains("by the end of the month"), "\(forecastText)")
        #expect(try await browser.text("#budget-usd-monthly").contains("of $2000.00"))
        #expect(try await browser.text("#money").contains("Each user profile may spend $1.00 a day."))
        try await ConsoleBrowserTests.photograph(browser, "14-usage-money")

        // 3. Workspace settings: the workspace's budgets, over all its integrations.
        try await browser.open(fixture.adminBase + "/console/settings")
        try await browser.waitForPage("Workspace settings") { $0 == "/console/settings" }
        #expect(try await browser.text("#workspace-spend").hasPrefix(MoneyText.usd(Int64(cost)) + " spent this month"))
        try await browser.clear(try await browser.find("#workspace_daily_budget_usd"))
        try await browser.type(try await browser.find("#workspace_daily_budget_usd"), "300")
        try await ConsoleBrowserTests.clickButton(browser, "Save budgets")
        try await browser.wait("the budgets' notice") { (try? await browser.text("main").contains("Budgets saved")) == true }
        #expect(try await browser.property(try await browser.find("#workspace_daily_budget_usd"), "value") as? String == "300")
        #expect(try fixture.ctl(["audit"]).contains("workspace.budget_updated"))
        try await ConsoleBrowserTests.photograph(browser, "15-workspace-budgets-usd")
    }
}
