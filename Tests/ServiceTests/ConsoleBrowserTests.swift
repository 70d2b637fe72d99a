import Foundation
import Testing
import WebDriver

/// One operator's whole flow in a real headless Chromium (Debian's, through chromedriver), on the
/// shipped attestd with the stub upstream: sign in with a fresh link, set the upstream key, create
/// an integration (after its errors), copy the client ID, see a device's relayed requests on the
/// Usage tab as `attestctl usage --json` has them, change the policy and see it obeyed, revoke by
/// typing the name and see the device refused, sign out. Every page is photographed at 1280 and
/// 360 px wide under .build/console-screenshots/.
@Suite(.serialized) struct ConsoleBrowserTests {
    static let screenshots = ServerProcess.packageRoot.appendingPathComponent(".build/console-screenshots")

    /// Both widths; at 360 px nothing may stick out sideways (tables scroll in their own box).
    static func photograph(_ browser: Browser, _ name: String) async throws {
        try FileManager.default.createDirectory(at: screenshots, withIntermediateDirectories: true)
        for width in [1280, 360] {
            try await browser.resize(width: width, height: 900)
            try await browser.wait("a \(width)-px layout") { try await browser.run("return window.innerWidth") as? Int ?? 0 <= width }
            // The whole page, not only its first screen.
            let height = min(6000, max(900, try await browser.run("return document.documentElement.scrollHeight") as? Int ?? 900))
            try await browser.resize(width: width, height: height + 120)
            try await browser.screenshot().write(to: screenshots.appendingPathComponent("\(name)-\(width).png"))
            if width == 360 {
                let overflow = try await browser.run("return document.documentElement.scrollWidth - window.innerWidth") as? Int ?? 0
                #expect(overflow <= 0, "\(name) is \(overflow) px wider than a 360-px screen")
            }
        }
        try await browser.resize(width: 1280, height: 900)
    }

    static func clickButton(_ browser: Browser, _ text: String) async throws {
        try await browser.click(try await browser.find("button", text: text))
    }

    /// `body` on a fresh fixture and browser; the page is photographed as `failure` if it throws.
    static func withBrowser(_ body: (ConsoleFixture, Browser) async throws -> Void) async throws {
        let fixture = try ConsoleFixture()
        defer { fixture.stop() }
        let browser = try await Browser()
        do {
            try await body(fixture, browser)
        } catch {
            try? await Self.photograph(browser, "failure")
            await browser.quit()
            throw error
        }
        await browser.quit()
    }

    @Test func anOperatorsWholeFlow() async throws {
        try await Self.withBrowser(flow)
    }

    /// Workspace settings' Bedrock form in the browser: a refusal shown beside the form, then the
    /// upstream set and shown, the secret never back in the page.
    @Test func anOwnerSetsAmazonBedrockThroughTheSettingsForm() async throws {
        try await Self.withBrowser(bedrockFlow)
    }

    func bedrockFlow(_ fixture: ConsoleFixture, _ browser: Browser) async throws {
        let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
        try await browser.open(try fixture.signInLink())
        try await browser.wait("the sign-in button") { (try? await browser.find("#sign-in")) != nil }
        try await browser.click(try await browser.find("#sign-in"))
        try await browser.waitForPage("App integrations") { $0 == "/console/" }
        try await browser.open(fixture.adminBase + "/console/settings")
        try await browser.click(try await browser.find("summary", text: "Use Amazon Bedrock"))
        for (field, text) in [("#bedrock_region", "us-west-2"), ("#bedrock_access_key_id", "AKIAIOSFODNN7EXAMPLE"), ("#bedrock_secret_key", secret),
                              ("#bedrock_models", "claude-x=anthropic.claude-x-v1:0\nclaude-y=anthropic.claude-y-v1:0"),
                              ("#bedrock_endpoint_url", "http://bedrock.example.test")] {
            try await browser.type(try await browser.find(field), text)
        }
        try await Self.clickButton(browser, "Use Amazon Bedrock")
        try await browser.wait("the form's error") { try await browser.exists("#bedrock_error") }
        #expect(try await browser.text("#bedrock_error").contains("loopback"))
        #expect(try await browser.property(try await browser.find("#bedrock_region"), "value") as? String == "us-west-2")
        #expect(try await browser.property(try await browser.find("#bedrock_secret_key"), "value") as? String == "")
        try await browser.clear(try await browser.find("#bedrock_endpoint_url"))
        try await browser.type(try await browser.find("#bedrock_secret_key"), secret)
        try await Self.clickButton(browser, "Use Amazon Bedrock")
        try await browser.wait("the upstream's kind") { (try? await browser.text("#upstream-kind")) == "Amazon Bedrock" }
        #expect(try await browser.text("#upstream-key").contains("us-west-2"))
        #expect(try await browser.text("#upstream-models").contains("claude-y → anthropic.claude-y-v1:0"))
        #expect(try await browser.text("#key-last4") == "MPLE")
        #expect(!(try await browser.source()).contains(secret))
        try await Self.photograph(browser, "12-upstream-bedrock")
    }

    func flow(_ fixture: ConsoleFixture, _ browser: Browser) async throws {
        // 1. Sign in with a fresh link: its page has one button (a link preview spends nothing).
        try await browser.open(try fixture.signInLink())
        try await browser.wait("the sign-in button") { (try? await browser.find("#sign-in")) != nil }
        try await browser.click(try await browser.find("#sign-in"))
        try await browser.waitForPage("App integrations") { $0 == "/console/" }
        #expect(try await browser.text("h1") == "App integrations")
        #expect(try await browser.text("header .who").contains(ConsoleFixture.owner))
        try await Self.photograph(browser, "01-app-integrations-empty")

        // The README's tour: the upstream key in Workspace settings.
        try await browser.click(try await browser.find("header nav a", text: "Workspace settings"))
        try await browser.waitForPage("Workspace settings") { $0 == "/console/settings" }
        try await browser.type(try await browser.find("#upstream_key"), RelayTests.keyA)
        try await Self.clickButton(browser, "Set key")
        try await browser.wait("the key's last 4") { (try? await browser.text("#key-last4")) == String(RelayTests.keyA.suffix(4)) }
        #expect(!(try await browser.source()).contains(RelayTests.keyA))
        try await Self.photograph(browser, "02-workspace-settings")

        // 2. Create an integration: first the errors for a 9-character Team ID and 33 bundle IDs.
        try await browser.click(try await browser.find("header nav a", text: "App integrations"))
        try await browser.waitForPage("App integrations") { $0 == "/console/" }
        try await Self.clickButton(browser, "Create app integration")
        try await browser.waitForPage("Create app integration") { $0 == "/console/integrations/new" }
        #expect(try await browser.text("label[for=name]") == "Name")
        #expect(try await browser.text("label[for=team_id]") == "Apple Developer Team ID")
        #expect(try await browser.text("label[for=bundle_ids]") == "Bundle IDs")
        // From the keyboard: Tab goes from field to field in order.
        let nameField = try await browser.find("#name")
        let name = "Demo <script>window.__pwned = 1</script> & \"co\""
        try await browser.type(nameField, name)
        try await browser.type(nameField, "\u{E004}")
        #expect(try await browser.run("return document.activeElement.id") as? String == "team_id")
        try await browser.type(try await browser.find("#team_id"), "ABCDE1234")
        let tooMany = (1...33).map { "com.example.app\($0)" }.joined(separator: "\n")
        try await browser.type(try await browser.find("#bundle_ids"), tooMany)
        try await Self.clickButton(browser, "Create app integration")
        try await browser.wait("the form's errors") { try await browser.exists("#team_id-error") }
        #expect(try await browser.text("#team_id-error").contains("10 characters"))
        #expect(try await browser.text("#bundle_ids-error").contains("at most 32"))
        #expect(try await browser.property(try await browser.find("#name"), "value") as? String == name)   // the rest kept
        try await Self.photograph(browser, "03-create-errors")
        try await browser.clear(try await browser.find("#team_id"))
        try await browser.type(try await browser.find("#team_id"), "ABCDE12345")
        try await browser.clear(try await browser.find("#bundle_ids"))
        try await browser.type(try await browser.find("#bundle_ids"), "com.example.app\ncom.example.app.widget")
        try await Self.clickButton(browser, "Create app integration")
        try await browser.waitForPage("the new integration's Overview") { $0.hasPrefix("/console/integrations/clid_") }

        // The name is text, never markup.
        #expect(try await browser.text("h1").hasPrefix(name))
        #expect(try await browser.run("return window.__pwned === undefined") as? Bool == true)

        // 3. Copy the client ID from Overview.
        let clientID = try await browser.text("#client-id")
        #expect(clientID.hasPrefix("clid_"))
        #expect(try fixture.integrations().first?["client_id"] as? String == clientID)
        try await Self.clickButton(browser, "Copy")
        try await browser.wait("the copy's confirmation") { (try? await browser.text(".copied")) == "Copied" }
        #expect(try await browser.text("#overview").contains("com.example.app.widget"))
        try await Self.photograph(browser, "04-overview")
        let overviewURL = try await browser.url()
        // Before any device: the Devices tab says so in one sentence, with no headings left blank.
        try await browser.click(try await browser.find("nav.tabs a", text: "Devices"))
        try await browser.waitForPage("the empty Devices tab") { $0.hasSuffix("/devices") }
        let empty = try await browser.text("main")
        #expect(empty.contains("No device has registered yet.") && !empty.contains("By platform"), "\(empty)")
        // The list names the bundle IDs (a bare count read as one).
        try await browser.open(fixture.adminBase + "/console/")
        try await browser.waitForPage("App integrations") { $0 == "/console/" }
        let listed = try await browser.text("#integrations")
        #expect(listed.contains("com.example.app") && listed.contains("and 1 more"), "\(listed)")
        try await browser.open(overviewURL)
        try await browser.waitForPage("Overview") { $0.hasPrefix("/console/integrations/clid_") }

        // 4. A simulated device registers with it and relays Messages requests.
        let http = TestHTTP(baseURL: fixture.server.baseURL)
        let device = try ManualDevice(clientID: clientID)
        let token = try #require(try await http.registerFresh(device).json["access_token"] as? String)
        func relay(model: String = "claude-test") async throws -> Int {
            try await http.send("POST", "/v1/messages", body: Data(RelayTests.request(model: model).utf8), contentType: "application/json",
                                headers: ["authorization": "Bearer \(token)"]).status
        }
        for _ in 0..<3 { #expect(try await relay() == 200) }

        // 5. The Usage tab: its table is what `attestctl usage --json` says.
        try await browser.click(try await browser.find("nav.tabs a", text: "Usage"))
        try await browser.waitForPage("Usage") { $0.hasSuffix("/usage") }
        try await browser.wait("the three requests on the Usage tab") {
            try await browser.open(try await browser.url())
            guard try await browser.exists("#usage-by-day-model tbody tr") else { return false }
            return try await browser.text("#usage-by-day-model tbody td:nth-child(3)") == "3"
        }
        let cells = try await browser.findAll("#usage-by-day-model tbody td")
        var table: [String] = []
        for cell in cells { table.append(try await browser.text(cell)) }
        let lines = try fixture.ctl(["usage", "--client-id", clientID, "--by", "day,model", "--json"]).split(separator: "\n")
            .filter { !$0.hasPrefix(#"{"forecast""#) }
        #expect(lines.count == 1)
        let usage = try #require(try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any])
        let expected = [usage["day"], usage["model"], usage["requests"], usage["input_tokens"], usage["output_tokens"],
                        usage["cache_creation_input_tokens"], usage["cache_read_input_tokens"]].map { "\($0 ?? "")" }
        #expect(table == expected)
        // The bars are drawn (rendered with a height), not only present in the markup.
        for chart in ["chart-input", "chart-output", "chart-requests"] {
            let drawn = try await browser.run("var r = document.querySelector('svg#' + arguments[0] + ' rect'); return r ? r.getBoundingClientRect().height : 0",
                                              [chart]) as? Double ?? 0
            #expect(drawn > 1, "\(chart)")
        }
        try await Self.photograph(browser, "05-usage")
        // On a phone's width the charts scroll in their own box rather than shrink their labels
        // (720 units drawn in 330 px made 11-unit labels 5 px tall): at least 9 px.
        try await browser.resize(width: 360, height: 800)
        let labelPixels = try await browser.run("""
            return Math.min(...Array.from(document.querySelectorAll('svg.chart')).map(svg =>
                parseFloat(svg.querySelector('text').getAttribute('font-size')) * svg.getBoundingClientRect().width / svg.viewBox.baseVal.width));
            """) as? Double ?? 0
        #expect(labelPixels >= 9, "chart labels are \(labelPixels) px at 360 px")
        try await browser.resize(width: 1280, height: 900)

        // 6. Change the policy and see the next relayed request obey it.
        try await browser.click(try await browser.find("nav.tabs a", text: "Policy"))
        try await browser.waitForPage("Policy") { $0.hasSuffix("/policy") }
        try await browser.clear(try await browser.find("#models"))
        try await browser.type(try await browser.find("#models"), "claude-other")
        try await Self.clickButton(browser, "Save policy")
        try await browser.wait("the saved policy") { (try? await browser.text(".notice")).map { $0.contains("Policy saved") } ?? false }
        #expect(try await browser.property(try await browser.find("#models"), "value") as? String == "claude-other")
        try await Self.photograph(browser, "06-policy")
        #expect(try await relay() == 400)
        #expect(try await relay(model: "claude-other") == 200)

        // The Devices and Audit tabs show the device and what was done.
        try await browser.click(try await browser.find("nav.tabs a", text: "Devices"))
        try await browser.waitForPage("Devices") { $0.hasSuffix("/devices") }
        #expect(try await browser.findAll("#devices tbody tr").count == 1)
        try await Self.photograph(browser, "07-devices")
        try await browser.click(try await browser.find("nav.tabs a", text: "Audit"))
        try await browser.waitForPage("Audit") { $0.hasSuffix("/audit") }
        let audit = try await browser.text("#audit")
        #expect(audit.contains("integration.policy_updated") && audit.contains("integration.created") && audit.contains(ConsoleFixture.owner))
        try await Self.photograph(browser, "08-audit")
        // On a phone's width no token in a table breaks inside a word (`integrat` / `ion.crea` /
        // `ted`): each code cell is one line box; the table scrolls instead.
        try await browser.resize(width: 360, height: 800)
        let broken = try await browser.run("""
            return Array.from(document.querySelectorAll('td code')).filter(c => c.getClientRects().length !== 1 ||
                c.getBoundingClientRect().height > 2 * parseFloat(getComputedStyle(c).lineHeight || '16')).map(c => c.textContent);
            """) as? [String]
        #expect(broken == [], "tokens broken across lines at 360 px: \(broken ?? [])")
        #expect((try await browser.run("return document.querySelectorAll('td code').length") as? Int ?? 0) >= 3)
        try await browser.resize(width: 1280, height: 900)

        // 7. Revoke by typing the name; the device's next request gets 401.
        try await browser.open(overviewURL)
        try await browser.waitForPage("Overview") { $0.hasPrefix("/console/integrations/clid_") }
        try await Self.clickButton(browser, "Revoke")
        try await browser.waitForPage("the revocation's confirmation") { $0.hasSuffix("/revoke") }
        #expect(try await browser.text("main").contains("Revocation is permanent"))
        let submit = try await browser.find("#revoke-submit")
        #expect(try await browser.property(submit, "disabled") as? Bool == true)   // until the name is typed
        try await browser.type(try await browser.find("#confirm_name"), name)
        #expect(try await browser.property(submit, "disabled") as? Bool == false)
        try await Self.photograph(browser, "09-revoke-confirmation")
        try await browser.click(submit)
        try await browser.waitForPage("the revoked Overview") { !$0.hasSuffix("/revoke") }
        let overview = try await browser.text("#overview")
        #expect(overview.contains("Revoked") && overview.contains("by \(ConsoleFixture.owner)"))
        #expect(!(try await browser.exists("form[action$='/revoke'] button")))
        try await Self.photograph(browser, "10-revoked")
        #expect(try await relay() == 401)

        // 8. Sign out: the session ends (the console asks to sign in again).
        try await Self.clickButton(browser, "Sign out")
        try await browser.wait("the signed-out page") { (try? await browser.text("h1")) == "Signed out" }
        try await browser.open(fixture.adminBase + "/console/")
        try await browser.wait("the sign-in page") { (try? await browser.text("h1")) == "Sign in" }
        try await Self.photograph(browser, "11-signed-out")
    }
}
