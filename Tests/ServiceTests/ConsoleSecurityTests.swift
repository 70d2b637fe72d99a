import Foundation
import RawHTTP
import SQLiteStore
import Testing
import TokenService

/// The console's defences, byte for byte on the shipped attestd: sign-in links used once and
/// only in time, CSRF tokens and Origin on every form, the roles enforced by the server whatever
/// a page shows, and the headers every page carries.
@Suite(.serialized) struct ConsoleSecurityTests {
    @Test func aSignInLinkSignsInOnceAndAReusedExpiredOrTamperedOneGetsAPageAndNoSession() throws {
        let fixture = try ConsoleFixture()
        defer { fixture.stop() }
        let link = try fixture.signInLink()
        #expect(link.hasPrefix(fixture.adminBase + "/console/sign-in?token="))
        let path = String(link.dropFirst(fixture.adminBase.count))

        // The link's page spends nothing (a chat app's preview fetches it): one button signs in.
        let page = try fixture.request("GET", path)
        #expect(page.status == 200 && page.text.contains(#"id="sign-in""#) && ConsoleFixture.sessionCookie(page) == nil)
        #expect(try fixture.request("GET", path).status == 200, "fetching the page twice spends nothing")
        // The button's POST must come from the console's own page.
        let token = String(path.split(separator: "=").last!)
        let foreign = try fixture.request("POST", "/console/sign-in", headers: [("Origin", "https://evil.example")], form: [("token", token)])
        #expect(foreign.status == 403 && ConsoleFixture.sessionCookie(foreign) == nil)
        let first = try fixture.redeem(path)
        #expect(first.status == 200)
        let cookie = try #require(ConsoleFixture.sessionCookie(first))
        let setCookie = first.headers["set-cookie"] ?? ""
        #expect(setCookie.contains("HttpOnly") && setCookie.contains("SameSite=Strict") && setCookie.contains("Path=/console/"))
        #expect(!setCookie.contains("Secure"))   // plain HTTP, no trusted proxy
        #expect(try fixture.request("GET", "/console/", headers: [("Cookie", "attestd_console=\(cookie)")]).status == 200)

        let reused = try fixture.redeem(path)
        #expect(reused.status == 403 && reused.text.contains("already been used") && ConsoleFixture.sessionCookie(reused) == nil)
        // A member who is signed in already finds the way back from the refusal.
        #expect(reused.text.contains(#"href="/console/""#))

        // One character changed.
        var tampered = Array(path)
        tampered[tampered.count - 1] = tampered.last == "A" ? "B" : "A"
        let bad = try fixture.redeem(String(tampered))
        #expect(bad.status == 403 && bad.text.contains("not valid") && ConsoleFixture.sessionCookie(bad) == nil)
        #expect(try fixture.request("GET", "/console/sign-in").status == 403)

        // A link made eleven minutes ago (by the service itself, on the same database) has expired.
        let store = try SQLiteTokenStore(path: fixture.db)
        let past = AdminService(store: store, now: { Date() - 11 * 60 })
        let old = try past.createSignInLink(for: ConsoleFixture.owner)
        let expired = try fixture.redeem("/console/sign-in?token=\(old)")
        #expect(expired.status == 403 && expired.text.contains("expired") && ConsoleFixture.sessionCookie(expired) == nil)

        // Only members get links.
        #expect(throws: (any Error).self) { try fixture.signInLink("stranger@example.com") }
        // The database holds hashes only: neither the link's token nor the cookie is in it.
        let bytes = try Data(contentsOf: URL(fileURLWithPath: fixture.db)) + ((try? Data(contentsOf: URL(fileURLWithPath: fixture.db + "-wal"))) ?? Data())
        #expect(bytes.range(of: Data(token.utf8)) == nil && bytes.range(of: Data(cookie.utf8)) == nil)
    }

    @Test func formsWithoutTheCSRFTokenOrFromAnotherOriginChangeNothing() throws {
        let fixture = try ConsoleFixture()
        defer { fixture.stop() }
        let cookie = try fixture.signIn()
        let fields = [("name", "Made by an attacker"), ("team_id", "ABCDE12345"), ("bundle_ids", "com.example.evil"), ("env_production", "on")]
        let headers = [("Cookie", "attestd_console=\(cookie)"), ("Origin", fixture.origin)]

        let noToken = try fixture.request("POST", "/console/integrations", headers: headers, form: fields)
        #expect(noToken.status == 403)
        let wrongToken = try fixture.post("/console/integrations", cookie: cookie, fields, csrf: String(repeating: "A", count: 43))
        #expect(wrongToken.status == 403)
        // Another session's token is not this one's.
        let otherCookie = try fixture.signIn()
        #expect(try fixture.post("/console/integrations", cookie: cookie, fields, csrf: try fixture.csrf(otherCookie)).status == 403)
        let crossSite = try fixture.post("/console/integrations", cookie: cookie, fields, origin: "http://evil.example")
        #expect(crossSite.status == 403 && crossSite.text.contains("Origin"))
        let noOrigin = try fixture.request("POST", "/console/integrations", headers: [("Cookie", "attestd_console=\(cookie)")],
                                           form: [("csrf", try fixture.csrf(cookie))] + fields)
        #expect(noOrigin.status == 403)
        #expect(try fixture.integrations().isEmpty)

        // The same form, done right, creates it: the refusals above were about the checks alone.
        let created = try fixture.post("/console/integrations", cookie: cookie, fields)
        #expect(created.status == 303 && created.headers["location"]?.hasPrefix("/console/integrations/clid_") == true)
        #expect(try fixture.integrations().count == 1)
        // Signing out ends the session on the server: the old cookie opens nothing.
        #expect(try fixture.post("/console/sign-out", cookie: cookie, []).status == 200)
        #expect(try fixture.request("GET", "/console/", headers: [("Cookie", "attestd_console=\(cookie)")]).status == 401)
    }

    @Test func aReadOnlyMemberSeesNoControlsAndTheServerRefusesTheirActions() throws {
        let fixture = try ConsoleFixture()
        defer { fixture.stop() }
        let clientID = try fixture.createIntegration(name: "Shipping app")
        try fixture.ctl(["members", "add", "--actor", ConsoleFixture.owner, "--email", "dev@example.com", "--role", "developer"])
        let cookie = try fixture.signIn("dev@example.com")
        let headers = [("Cookie", "attestd_console=\(cookie)")]

        let list = try fixture.request("GET", "/console/", headers: headers)
        #expect(list.status == 200 && list.text.contains("Shipping app") && !list.text.contains("Create app integration"))
        let overview = try fixture.request("GET", "/console/integrations/\(clientID)", headers: headers)
        #expect(overview.status == 200 && overview.text.contains(clientID) && !overview.text.contains(">Revoke<"))
        let policy = try fixture.request("GET", "/console/integrations/\(clientID)/policy", headers: headers)
        #expect(policy.status == 200 && !policy.text.contains("Save policy") && !policy.text.contains("<form method=\"post\" action=\"/console/integrations/"))

        // Direct requests, with a valid session, CSRF token and Origin: refused all the same.
        let csrf = try fixture.csrf(cookie)
        let revoke = try fixture.post("/console/integrations/\(clientID)/revoke", cookie: cookie, [("confirm_name", "Shipping app")], csrf: csrf)
        #expect(revoke.status == 403)
        #expect(try fixture.post("/console/integrations/\(clientID)/policy", cookie: cookie, [("models", "x"), ("max_tokens", "1"),
            ("device_requests_per_minute", "1"), ("monthly_token_budget", "1"), ("risk_limit", "0"), ("platform_ios", "on"),
            ("distribution_production_app-store", "on"), ("distribution_development_development", "on")], csrf: csrf).status == 403)
        #expect(try fixture.post("/console/integrations", cookie: cookie, [("name", "X"), ("team_id", "ABCDE12345"), ("bundle_ids", "a.b")],
                                 csrf: csrf).status == 403)
        #expect(try fixture.request("GET", "/console/integrations/new", headers: headers).status == 403)
        #expect(try fixture.post("/console/settings/upstream-key", cookie: cookie, [("upstream_key", "sk-not-allowed-123")], csrf: csrf).status == 403)
        let record = try #require(try fixture.integrations().first)
        #expect(record["revoked_at"] is NSNull)
        #expect((record["policy"] as? [String: Any])?["max_tokens"] as? Int == 0)

        // Removing the member ends their session at once.
        try fixture.ctl(["members", "remove", "--actor", ConsoleFixture.owner, "--email", "dev@example.com"])
        #expect(try fixture.request("GET", "/console/", headers: headers).status == 401)
    }

    @Test func membersAreManagedInWorkspaceSettingsAsAttestctlAllows() throws {
        let fixture = try ConsoleFixture()
        defer { fixture.stop() }
        let owner = try fixture.signIn()
        #expect(try fixture.post("/console/settings/members", cookie: owner, [("email", "Admin@Example.com"), ("role", "admin")]).status == 303)
        let members = try fixture.ctl(["members", "list", "--json"])
        #expect(members.contains(#""email":"admin@example.com""#) && members.contains(#""role":"admin""#))
        // An admin adds developers and users only, and removes only those.
        let admin = try fixture.signIn("admin@example.com")
        #expect(try fixture.post("/console/settings/members", cookie: admin, [("email", "boss@example.com"), ("role", "owner")]).status == 403)
        #expect(try fixture.post("/console/settings/members", cookie: admin, [("email", "dev@example.com"), ("role", "developer")]).status == 303)
        let invalid = try fixture.post("/console/settings/members", cookie: admin, [("email", "not an address"), ("role", "user")])
        #expect(invalid.status == 422 && invalid.text.contains("not an email address"))
        #expect(try fixture.post("/console/settings/members/remove", cookie: admin, [("email", ConsoleFixture.owner)]).status == 403)
        let dev = try fixture.signIn("dev@example.com")
        #expect(try fixture.post("/console/settings/members/remove", cookie: admin, [("email", "dev@example.com")]).status == 303)
        #expect(try fixture.request("GET", "/console/", headers: [("Cookie", "attestd_console=\(dev)")]).status == 401)
        #expect(!(try fixture.ctl(["members", "list"])).contains("dev@example.com"))
        let audit = try fixture.ctl(["audit", "--limit", "20"])
        #expect(audit.contains("member.added") && audit.contains("member.removed"))
    }

    @Test func everyConsoleResponseCarriesItsHeadersAndTheConsoleIsNotOnThePublicListener() throws {
        let fixture = try ConsoleFixture()
        defer { fixture.stop() }
        let cookie = try fixture.signIn()
        for path in ["/console/", "/console/settings", "/console/integrations/new", "/console/no-such-page", "/console/static/console.js"] {
            let response = try fixture.request("GET", path, headers: [("Cookie", "attestd_console=\(cookie)")])
            let policy = response.headers["content-security-policy"] ?? ""
            #expect(policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'") && !policy.contains("unsafe-inline"), "\(path)")
            #expect(response.headers["x-content-type-options"] == "nosniff" && response.headers["referrer-policy"] == "same-origin", "\(path)")
        }
        let page = try fixture.request("GET", "/console/", headers: [("Cookie", "attestd_console=\(cookie)")]).text
        // No inline script and nothing from another origin.
        #expect(!page.contains("<script>") && !page.contains("http://") && !page.contains("https://"))
        #expect(page.contains(#"<script src="/console/static/console.js" defer></script>"#))
        #expect(try fixture.request("GET", "/console/").status == 401)

        let publicListener = try RawConnection(port: fixture.server.port, timeout: 5)
        defer { publicListener.disconnect() }
        _ = publicListener.sendAll("GET /console/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        #expect(publicListener.readFramedResponse()?.status == 404)
    }

    @Test func behindATrustedTLSProxyTheCookieIsSecureAndTheOriginIsHTTPS() throws {
        let fixture = try ConsoleFixture(extraArguments: ["--trusted-proxy", "127.0.0.1/32"])
        defer { fixture.stop() }
        let link = try fixture.signInLink()
        let tls = [("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "console.example.com")]
        let viaTLS = try fixture.redeem(String(link.dropFirst(fixture.adminBase.count)), headers: tls, origin: "https://console.example.com")
        // Over TLS the cookie is __Host-: Secure, Path=/, bound to this host.
        let setCookie = viaTLS.headers["set-cookie"] ?? ""
        #expect(setCookie.hasPrefix("__Host-attestd_console=") && setCookie.contains("; Secure") && setCookie.contains("Path=/;"))
        let cookie = try #require(ConsoleFixture.sessionCookie(viaTLS))
        // Over TLS only the __Host- cookie is read: one without the prefix (planted by a sibling host) is not a session.
        #expect(try fixture.request("GET", "/console/", headers: tls + [("Cookie", "attestd_console=\(cookie)")]).status == 401)
        let page = try fixture.request("GET", "/console/", headers: tls + [("Cookie", "__Host-attestd_console=\(cookie)")])
        #expect(page.status == 200)
        let csrf = try #require(page.text.range(of: #"name="csrf" value=""#).map { String(page.text[$0.upperBound...].prefix { $0 != "\"" }) })
        let fields = [("name", "Via proxy"), ("team_id", "ABCDE12345"), ("bundle_ids", "com.example.proxy"), ("env_production", "on")]
        let proxied = [("Cookie", "__Host-attestd_console=\(cookie)")] + tls
        // The browser's origin is the proxy's https one, not the listener's.
        #expect(try fixture.request("POST", "/console/integrations", headers: proxied + [("Origin", fixture.origin)],
                                    form: [("csrf", csrf)] + fields).status == 403)
        #expect(try fixture.request("POST", "/console/integrations", headers: proxied + [("Origin", "https://console.example.com")],
                                    form: [("csrf", csrf)] + fields).status == 303)
    }
}
