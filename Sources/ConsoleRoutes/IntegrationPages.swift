import AppAttest
import AttestWire
import Foundation
import HTTPRouting
import TokenService

/// App integrations: the list, the create form, and an integration's tabs (Overview, Policy,
/// Usage, Devices, Audit) with its revocation.
enum IntegrationPages {
    enum Tab: String, CaseIterable {
        case overview = "Overview", policy = "Policy", usage = "Usage", devices = "Devices", audit = "Audit"
        var path: String { self == .overview ? "" : "/" + rawValue.lowercased() }
    }

    static func base(_ integration: Integration) -> String { "/console/integrations/" + integration.clientID }

    static func status(_ integration: Integration) -> HTML {
        integration.isRevoked ? HTML.element("span", [("class", "status revoked")], "Revoked")
                              : HTML.element("span", [("class", "status active")], "Active")
    }

    /// An integration's page: its name, status and tabs around `content`.
    static func tabbed(_ request: ConsoleRequest, _ integration: Integration, _ tab: Tab, notice: HTML = "", _ content: HTML) -> RouteOutcome {
        let tabs = HTML.element("nav", [("class", "tabs"), ("aria-label", "Integration")], HTML.join(Tab.allCases.map { item in
            HTML.element("a", [("href", base(integration) + item.path), ("aria-current", item == tab ? "page" : nil)], HTML.text(item.rawValue))
        }))
        let heading = HTML.element("p", [("class", "crumbs")], HTML.element("a", [("href", "/console/")], "App integrations"))
            + HTML.element("h1", [], HTML.text(integration.name) + " " + status(integration))
        let page = ConsolePages.layout(title: "\(integration.name) · \(tab.rawValue)", request: request, nav: .integrations,
                                       heading + tabs + notice + HTML.element("section", [("aria-label", tab.rawValue)], content))
        return RouteOutcome(ConsoleRoutes.finish(page, status: 200), clientID: integration.clientID)
    }

    // MARK: The list

    /// The first bundle ID, and how many more: a bare count read as an ID.
    static func bundleIDs(_ ids: [String]) -> HTML {
        guard let first = ids.first else { return "—" }
        let more = ids.count - 1
        return HTML.element("code", [], HTML.text(first)) + (more > 0 ? HTML.text(" and \(more) more") : "")
    }

    static func list(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integrations = try admin.integrations(workspace: request.session.workspace.name)
        let rows: [[HTML]] = integrations.map { integration in
            [HTML.element("a", [("href", base(integration))], HTML.text(integration.name)),
             HTML.element("code", [], HTML.text(integration.clientID)),
             bundleIDs(integration.bundleIDs), status(integration), ConsoleTime.html(integration.createdAt)]
        }
        var content = HTML.element("h1", [], "App integrations")
            + HTML.element("p", [], "Each app integration lets the genuine installs of your apps (checked with Apple's App Attest) call the Messages API with short-lived tokens instead of an API key.")
        if request.canManage {
            content += HTML.element("form", [("method", "get"), ("action", "/console/integrations/new"), ("class", "actions")],
                                    HTML.element("button", [("type", "submit"), ("class", "primary")], "Create app integration"))
        }
        content += ConsolePages.table(caption: "App integrations in \(request.session.workspace.name)", id: "integrations",
                                      headers: ["Name", "Client ID", "Bundle IDs", "Status", "Created"], rows: rows,
                                      empty: "No app integrations yet." + (request.canManage ? " Create one to let an app sign in." : ""))
        return RouteOutcome(ConsoleRoutes.finish(ConsolePages.layout(title: "App integrations", request: request, nav: .integrations, content), status: 200))
    }

    // MARK: Creating

    struct CreateValues {
        var name = "", teamID = "", bundleIDs = "", development = true, production = true
    }

    static func createForm(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        try request.requireManager("create integrations")
        return createPage(request, CreateValues(), errors: [:], status: 200)
    }

    static func createPage(_ request: ConsoleRequest, _ values: CreateValues, errors: [String: String], status: Int) -> RouteOutcome {
        var form = ConsolePages.csrfField(request)
        form += ConsolePages.field("Name", name: "name", value: values.name, error: errors["name"],
                                   hint: "What your team calls the app; shown only here.", attributes: [("required", ""), ("maxlength", "100")])
        form += ConsolePages.field("Apple Developer Team ID", name: "team_id", value: values.teamID, error: errors["team_id"],
                                   hint: "10 characters, A–Z and 0–9, from the Membership page of your Apple Developer account.",
                                   attributes: [("required", ""), ("autocomplete", "off"), ("spellcheck", "false")])
        form += ConsolePages.field("Bundle IDs", name: "bundle_ids", value: values.bundleIDs, error: errors["bundle_ids"],
                                   hint: "One per line, up to 32, such as com.example.app.", attributes: [("required", ""), ("spellcheck", "false")],
                                   multiline: true)
        form += HTML.element("fieldset", [("aria-describedby", errors["environments"] == nil ? nil : "environments-error")],
                             HTML.element("legend", [], "Environments")
                             + ConsolePages.checkbox("Production (App Store, TestFlight)", name: "env_production", checked: values.production)
                             + ConsolePages.checkbox("Development (builds from Xcode)", name: "env_development", checked: values.development)
                             + (errors["environments"].map { HTML.element("p", [("class", "field-error"), ("id", "environments-error")], HTML.text($0)) } ?? ""))
        form += HTML.element("div", [("class", "actions")],
                             HTML.element("button", [("type", "submit"), ("class", "primary")], "Create app integration")
                             + HTML.element("a", [("href", "/console/")], "Cancel"))
        var content = HTML.element("p", [("class", "crumbs")], HTML.element("a", [("href", "/console/")], "App integrations"))
            + HTML.element("h1", [], "Create app integration")
        if !errors.isEmpty { content += ConsolePages.notice("Nothing was created: correct the fields marked below.", kind: "error") }
        content += HTML.element("form", [("method", "post"), ("action", "/console/integrations"), ("novalidate", "")], form)
        return RouteOutcome(ConsoleRoutes.finish(ConsolePages.layout(title: "Create app integration", request: request, nav: .integrations, content),
                                                 status: status), reason: errors.isEmpty ? nil : "console_invalid_form")
    }

    static func create(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        try request.requireManager("create integrations")
        let form = request.form
        let values = CreateValues(name: form["name"] ?? "", teamID: (form["team_id"] ?? "").trimmingCharacters(in: .whitespaces),
                                  bundleIDs: form["bundle_ids"] ?? "", development: form["env_development"] != nil,
                                  production: form["env_production"] != nil)
        var errors: [String: String] = [:]
        func check(_ field: String, _ body: () throws -> Void) {
            do { try body() } catch { errors[field] = String(describing: error) }
        }
        let bundleIDs = values.bundleIDs.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        check("name") { _ = try Validate.name(values.name, what: "The name") }
        check("team_id") {
            guard values.teamID.utf8.count == 10 else {
                throw AdminError("The Team ID must be 10 characters, A–Z and 0–9; this one has \(values.teamID.count).")
            }
            _ = try Validate.teamID(values.teamID)
        }
        check("bundle_ids") { _ = try Validate.bundleIDs(bundleIDs) }
        var environments = Set<AttestationEnvironment>()
        if values.production { environments.insert(.production) }
        if values.development { environments.insert(.development) }
        if environments.isEmpty { errors["environments"] = "Allow at least one environment." }
        guard errors.isEmpty else { return createPage(request, values, errors: errors, status: 422) }
        let integration = try admin.createIntegration(actor: request.session.email, workspace: request.session.workspace.name, name: values.name,
                                                      teamID: values.teamID, bundleIDs: bundleIDs, environments: environments)
        return RouteOutcome(ConsoleRoutes.redirect(base(integration) + "?created=1"), clientID: integration.clientID)
    }

    // MARK: Overview

    static func overview(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integration = try request.integration(admin)
        let (created, revoked) = try admin.history(integration.clientID)
        let counts = try admin.counts(integration.clientID)
        let clientID = HTML.element("code", [("id", "client-id")], HTML.text(integration.clientID))
            + HTML.element("button", [("type", "button"), ("class", "copy"), ("data-copy", integration.clientID), ("aria-describedby", "client-id"),
                                      ("hidden", "")], "Copy")
            + HTML.element("span", [("class", "copied"), ("role", "status"), ("aria-live", "polite")], "")
        var facts: [(String, HTML)] = [
            ("Client ID", clientID),
            ("Apple Developer Team ID", HTML.element("code", [("id", "team-id")], HTML.text(integration.teamID))),
            ("Bundle IDs", HTML.element("ul", [("id", "bundle-ids")], HTML.join(integration.bundleIDs.map { HTML.element("li", [], HTML.element("code", [], HTML.text($0))) }))),
            ("Environments", HTML.text(integration.environments.map { $0.rawValue.capitalized }.sorted().joined(separator: ", "))),
            ("Status", status(integration)),
            ("Created", ConsoleTime.html(integration.createdAt) + (created?.actor.map { " by " + HTML.text($0) } ?? "")),
        ]
        if let revokedAt = integration.revokedAt {
            facts.append(("Revoked", ConsoleTime.html(revokedAt) + (revoked?.actor.map { " by " + HTML.text($0) } ?? "")))
        }
        facts += [("Devices", HTML.text(counts.devices)), ("Live tokens", HTML.text(counts.liveTokens))]
        var content = ConsolePages.facts(facts, id: "overview")
        if integration.isRevoked {
            content += HTML.element("p", [("class", "revoked-note")],
                                    "This integration is revoked. Revocation is permanent: its tokens no longer work and its devices cannot get new ones.")
        } else if request.canManage {
            content += HTML.element("form", [("method", "get"), ("action", base(integration) + "/revoke"), ("class", "actions danger-zone")],
                                    HTML.element("button", [("type", "submit"), ("class", "danger")], "Revoke"))
        }
        let query = request.query
        let notice: HTML = query["created"] != nil ? ConsolePages.notice("App integration created. Copy its Client ID into your app.")
            : query["revoked"] != nil ? ConsolePages.notice("App integration revoked.") : ""
        return tabbed(request, integration, .overview, notice: notice, content)
    }

    // MARK: Policy

    static func policy(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integration = try request.integration(admin)
        let notice = request.query["saved"] != nil ? ConsolePages.notice("Policy saved. Every instance applies it to the next request.")
            : request.query["mode"] != nil ? ConsolePages.notice("Rule mode saved. Every instance applies it to the next request.") : ""
        return policyPage(request, integration, PolicyValues(integration), errors: [:], status: 200, notice: notice,
                          rules: try RuleModesSection.render(request, integration, admin))
    }

    /// The form's fields as text, so a refused form comes back as typed.
    struct PolicyValues {
        var models: String, maxTokens: String, deviceRequestsPerMinute: String, monthlyTokenBudget: String
        var serverTools: String, maxServerToolUses: String, betas: String, profileRequestsPerMinute: String, profileMonthlyTokenBudget: String
        var distribution: [AttestationEnvironment: Set<Distribution>]
        var minBundleVersion: String, requireExtensions: Bool, platforms: Set<DevicePlatform>, riskLimit: String
        /// The budgets in money, in USD as typed (`MoneyBudgetFields.names` order).
        var moneyBudgets: [String] = []

        init(_ integration: Integration) {
            let p = integration.policy, d = integration.devicePolicy
            models = p.models?.joined(separator: ", ") ?? "*"
            maxTokens = String(p.maxTokens)
            deviceRequestsPerMinute = String(p.deviceRequestsPerMinute)
            monthlyTokenBudget = String(p.monthlyTokenBudget)
            serverTools = p.serverTools.map { $0.isEmpty ? "none" : $0.sorted().joined(separator: ", ") } ?? "*"
            maxServerToolUses = String(p.maxServerToolUses)
            betas = p.betas?.joined(separator: ", ") ?? "*"
            profileRequestsPerMinute = String(p.profileRequestsPerMinute)
            profileMonthlyTokenBudget = String(p.profileMonthlyTokenBudget)
            distribution = d.distribution
            minBundleVersion = d.minBundleVersion?.description ?? ""
            requireExtensions = d.requireExtensions
            platforms = d.platforms
            riskLimit = String(d.riskLimit)
            moneyBudgets = MoneyBudgetFields.values(p)
        }

        init(form: [String: String]) {
            models = form["models"] ?? ""
            maxTokens = form["max_tokens"] ?? ""
            deviceRequestsPerMinute = form["device_requests_per_minute"] ?? ""
            monthlyTokenBudget = form["monthly_token_budget"] ?? ""
            serverTools = form["server_tools"] ?? ""
            maxServerToolUses = form["max_server_tool_uses"] ?? ""
            betas = form["betas"] ?? ""
            profileRequestsPerMinute = form["profile_requests_per_minute"] ?? ""
            profileMonthlyTokenBudget = form["profile_monthly_token_budget"] ?? ""
            var distribution: [AttestationEnvironment: Set<Distribution>] = [:]
            for environment in AttestationEnvironment.allCases {
                distribution[environment] = Set(Distribution.admissible.filter { form[PolicyValues.distributionField(environment, $0)] != nil })
            }
            self.distribution = distribution
            minBundleVersion = form["min_bundle_version"] ?? ""
            requireExtensions = form["require_extensions"] != nil
            platforms = Set(DevicePlatform.allCases.filter { form["platform_\($0.rawValue)"] != nil })
            riskLimit = form["risk_limit"] ?? ""
            moneyBudgets = MoneyBudgetFields.names.map { form[$0.name] ?? "" }
        }

        static func distributionField(_ environment: AttestationEnvironment, _ distribution: Distribution) -> String {
            "distribution_\(environment.rawValue)_\(distribution.rawValue)"
        }
    }

    static func policyPage(_ request: ConsoleRequest, _ integration: Integration, _ v: PolicyValues, errors: [String: String], status: Int,
                           notice: HTML = "", rules: HTML = "") -> RouteOutcome {
        let editable = request.canManage && !integration.isRevoked
        let readOnly: [(String, String?)] = editable ? [] : [("readonly", "")]
        func number(_ label: String, _ name: String, _ value: String, hint: String) -> HTML {
            ConsolePages.field(label, name: name, value: value, type: "number", error: errors[name], hint: hint,
                               attributes: [("min", "0"), ("inputmode", "numeric")] + readOnly)
        }
        var spend = HTML.element("legend", [], "Messages API limits")
        spend += ConsolePages.field("Models", name: "models", value: v.models, error: errors["models"],
                                    hint: "The model IDs the app may call, separated by commas; * for any.", attributes: readOnly)
        spend += number("Largest max_tokens", "max_tokens", v.maxTokens, hint: "A ceiling on each request's max_tokens; 0 for none.")
        spend += number("Device requests per minute", "device_requests_per_minute", v.deviceRequestsPerMinute,
                        hint: "Relayed requests each install may make per minute; 0 for no limit.")
        spend += number("Monthly token budget", "monthly_token_budget", v.monthlyTokenBudget,
                        hint: "Input and output tokens for the whole integration per calendar month (UTC); 0 for none.")
        spend += ConsolePages.field("Server tools", name: "server_tools", value: v.serverTools, error: errors["server_tools"],
                                    hint: "Which of web_search, web_fetch and code_execution a request may carry, separated by commas; * for any, none for none.",
                                    attributes: readOnly)
        spend += number("Largest max_uses per server tool", "max_server_tool_uses", v.maxServerToolUses,
                        hint: "Each server tool must set max_uses of at most this; 0 for no cap.")
        spend += ConsolePages.field("Betas", name: "betas", value: v.betas, error: errors["betas"],
                                    hint: "The anthropic-beta values a request may name, separated by commas; * for any.", attributes: readOnly)
        spend += number("User profile requests per minute", "profile_requests_per_minute", v.profileRequestsPerMinute,
                        hint: "Relayed requests each user profile (anthropic-user-profile-id) may make per minute; 0 for no limit.")
        spend += number("User profile monthly token budget", "profile_monthly_token_budget", v.profileMonthlyTokenBudget,
                        hint: "Tokens each user profile may use per calendar month (UTC); 0 for none.")
        spend += MoneyBudgetFields.render(v.moneyBudgets, errors: errors, readOnly: readOnly)
        var devices = HTML.element("legend", [], "Which builds may sign in (iOS 27 and macOS 27)")
        for environment in AttestationEnvironment.allCases.reversed() {
            let boxes = HTML.join(Distribution.admissible.map { distribution in
                ConsolePages.checkbox(distribution.rawValue, name: PolicyValues.distributionField(environment, distribution),
                                      checked: v.distribution[environment]?.contains(distribution) == true, disabled: !editable)
            })
            devices += HTML.element("fieldset", [("class", "inline")],
                                    HTML.element("legend", [], HTML.text("\(environment.rawValue.capitalized) builds from")) + boxes)
        }
        if let error = errors["distribution"] { devices += HTML.element("p", [("class", "field-error"), ("id", "distribution-error")], HTML.text(error)) }
        devices += ConsolePages.field("Minimum bundle version", name: "min_bundle_version", value: v.minBundleVersion, error: errors["min_bundle_version"],
                                      hint: "Dotted numbers such as 2.1.0; empty for none.", attributes: readOnly)
        devices += ConsolePages.checkbox("Require the iOS 27 / macOS 27 extensions", name: "require_extensions", checked: v.requireExtensions,
                                         disabled: !editable)
        devices += HTML.element("fieldset", [("class", "inline")], HTML.element("legend", [], "Platforms")
            + HTML.join(DevicePlatform.allCases.map {
                ConsolePages.checkbox($0 == .ios ? "iOS" : "macOS", name: "platform_\($0.rawValue)", checked: v.platforms.contains($0), disabled: !editable)
            }))
        if let error = errors["platforms"] { devices += HTML.element("p", [("class", "field-error"), ("id", "platforms-error")], HTML.text(error)) }
        devices += number("Risk limit", "risk_limit", v.riskLimit,
                          hint: "Refuse a device at its next refresh when Apple's risk metric (keys attested on the device lately) is above this; 0 for none.")
        var form = ConsolePages.csrfField(request) + HTML.element("fieldset", [], spend) + HTML.element("fieldset", [], devices)
        if editable {
            form += HTML.element("div", [("class", "actions")], HTML.element("button", [("type", "submit"), ("class", "primary")], "Save policy"))
        }
        var content: HTML = ""
        if !errors.isEmpty { content += ConsolePages.notice("Nothing was saved: correct the fields marked below.", kind: "error") }
        if !request.canManage { content += ConsolePages.notice("You can read this policy; changing it needs the admin, owner or primary owner role.") }
        content += editable ? HTML.element("form", [("method", "post"), ("action", base(integration) + "/policy"), ("novalidate", "")], form)
                            : HTML.element("div", [("class", "readonly-form")], form)
        content += rules
        var outcome = tabbed(request, integration, .policy, notice: notice, content)
        outcome.status = status
        outcome.response?.status = status
        return outcome
    }

    static func updatePolicy(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integration = try request.integration(admin)
        try request.requireManager("change integrations")
        let v = PolicyValues(form: request.form)
        var errors: [String: String] = [:]
        func count(_ text: String, _ field: String) -> Int {
            guard let value = Int(text.trimmingCharacters(in: .whitespaces)), value >= 0 else {
                errors[field] = "Use a whole number, 0 or more."
                return 0
            }
            return value
        }
        var policy = integration.policy
        let models = v.models.split(whereSeparator: { $0 == "," || $0.isNewline || $0 == " " }).map(String.init)
        policy.models = models.isEmpty || models == ["*"] ? nil : models
        policy.maxTokens = count(v.maxTokens, "max_tokens")
        policy.deviceRequestsPerMinute = count(v.deviceRequestsPerMinute, "device_requests_per_minute")
        policy.monthlyTokenBudget = count(v.monthlyTokenBudget, "monthly_token_budget")
        policy.maxServerToolUses = count(v.maxServerToolUses, "max_server_tool_uses")
        policy.profileRequestsPerMinute = count(v.profileRequestsPerMinute, "profile_requests_per_minute")
        policy.profileMonthlyTokenBudget = count(v.profileMonthlyTokenBudget, "profile_monthly_token_budget")
        MoneyBudgetFields.apply(v.moneyBudgets, to: &policy, errors: &errors)
        do { policy.serverTools = try Validate.serverTools(v.serverTools.isEmpty ? "*" : v.serverTools) } catch {
            errors["server_tools"] = String(describing: error)
        }
        do { policy.betas = try Validate.betas(v.betas.isEmpty ? "*" : v.betas) } catch { errors["betas"] = String(describing: error) }
        do { policy = try Validate.policy(policy) } catch { errors["models"] = errors["models"] ?? String(describing: error) }
        var device = integration.devicePolicy
        device.distribution = v.distribution
        device.requireExtensions = v.requireExtensions
        device.platforms = v.platforms
        device.riskLimit = count(v.riskLimit, "risk_limit")
        let version = v.minBundleVersion.trimmingCharacters(in: .whitespaces)
        if version.isEmpty { device.minBundleVersion = nil } else {
            do { device.minBundleVersion = try Validate.bundleVersion(version) } catch { errors["min_bundle_version"] = String(describing: error) }
        }
        if v.platforms.isEmpty { errors["platforms"] = "Admit at least one platform." }
        do { device = try Validate.devicePolicy(device) } catch {
            if errors["platforms"] == nil { errors["distribution"] = String(describing: error) }
        }
        guard errors.isEmpty else { return policyPage(request, integration, v, errors: errors, status: 422) }
        if policy != integration.policy { _ = try admin.updatePolicy(actor: request.session.email, clientID: integration.clientID) { $0 = policy } }
        if device != integration.devicePolicy {
            _ = try admin.updateDevicePolicy(actor: request.session.email, clientID: integration.clientID) { $0 = device }
        }
        return RouteOutcome(ConsoleRoutes.redirect(base(integration) + "/policy?saved=1"), clientID: integration.clientID)
    }

    // MARK: Devices

    static func devices(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integration = try request.integration(admin)
        let limit = 200
        let devices = try admin.devices(integration.clientID, limit: limit)
        let counts = try admin.deviceCounts(integration.clientID)
        let total = counts.byPlatform.values.reduce(0, +)
        func summary(_ counts: [String: Int]) -> HTML {
            counts.isEmpty ? "none yet" : HTML.text(counts.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", "))
        }
        // Before the first registration there is nothing to break down: the table's own sentence says so.
        var content: HTML = total == 0 ? "" : ConsolePages.facts([("Registered devices", HTML.text(total)), ("By platform", summary(counts.byPlatform)),
                                                                   ("By distribution", summary(counts.byCategory)),
                                                                   ("By Apple risk metric", summary(counts.byRisk))])
        let rows: [[HTML]] = devices.map { device in
            let key = base64URL(device.keyID)
            return [HTML.element("code", [("title", key)], HTML.text(String(key.prefix(12)) + "…")),
                    HTML.text(device.platform?.rawValue ?? "unknown"), HTML.text(device.distribution?.rawValue ?? "none"),
                    HTML.text(device.environment.rawValue), HTML.text(device.bundleVersion ?? "—"), HTML.text(device.osVersion ?? "—"),
                    ConsoleTime.html(device.registeredAt), ConsoleTime.html(device.lastRefreshAt),
                    HTML.text(device.risk?.metric.map(String.init) ?? "—")]
        }
        content += ConsolePages.table(caption: total > limit ? "The newest \(limit) of \(total) devices" : "Devices, newest first", id: "devices",
                                      headers: ["Key ID", "Platform", "Distribution", "Environment", "Bundle version", "OS version", "Registered",
                                                "Last refresh", "Risk metric"],
                                      rows: rows, empty: "No device has registered yet.")
        return tabbed(request, integration, .devices, content)
    }

    // MARK: Audit

    static func audit(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integration = try request.integration(admin)
        let perPage = 50
        // Pages by key: `before` is the last row the previous page showed.
        let before = request.query["before"].flatMap { Int64($0) }.map { max(0, $0) }
        var events = try admin.auditPage(integration.clientID, beforeID: before, perPage: perPage + 1)
        let older = events.count > perPage
        events = Array(events.prefix(perPage))
        let rows: [[HTML]] = events.map { event in
            [ConsoleTime.html(event.at), HTML.text(event.actor ?? "device"), HTML.element("code", [], HTML.text(event.action)),
             HTML.text(event.reason ?? ""), HTML.text(event.count), HTML.text(event.detail ?? "")]
        }
        var content = ConsolePages.table(caption: "Audit events, newest first", id: "audit",
                                         headers: ["Time", "Actor", "Action", "Reason", "Count", "Detail"], rows: rows,
                                         empty: before == nil ? "No audit events." : "No older audit events.")
        content += HTML.element("p", [("class", "hint")],
                                "A device refusal row counts every refusal of its action, client ID and reason in that minute.")
        var links: HTML = ""
        if before != nil { links += HTML.element("a", [("href", base(integration) + "/audit"), ("rel", "first")], "Newest") }
        if older, let last = events.last?.id {
            links += HTML.element("a", [("href", base(integration) + "/audit?before=\(last)"), ("rel", "next")], "Older")
        }
        content += HTML.element("nav", [("class", "pages"), ("aria-label", "Audit pages")], links)
        return tabbed(request, integration, .audit, content)
    }

    // MARK: Revoking

    static func revokeConfirmation(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integration = try request.integration(admin)
        try request.requireManager("revoke integrations")
        return revokePage(request, integration, typed: "", error: nil, status: 200)
    }

    static func revokePage(_ request: ConsoleRequest, _ integration: Integration, typed: String, error: String?, status: Int) -> RouteOutcome {
        var content = HTML.element("p", [("class", "crumbs")],
                                   HTML.element("a", [("href", "/console/")], "App integrations") + " / "
                                   + HTML.element("a", [("href", base(integration))], HTML.text(integration.name)))
            + HTML.element("h1", [], "Revoke " + HTML.text(integration.name) + "?")
        if integration.isRevoked {
            content += ConsolePages.notice("This integration is already revoked. Revocation is permanent.")
        } else {
            content += HTML.element("div", [("class", "warning"), ("role", "note")],
                HTML.element("p", [], HTML.element("strong", [], "Revocation is permanent.")
                             + " Every token of this integration stops working at once, its devices can never get new ones, and it cannot be undone.")
                + HTML.element("p", [], "Apps that use its client ID stop reaching the Messages API until they ship with a new integration's client ID."))
            let form = ConsolePages.csrfField(request)
                + ConsolePages.field("Type the integration's name to confirm", name: "confirm_name", value: typed, error: error,
                                     hint: "Type: \(integration.name)",
                                     attributes: [("required", ""), ("autocomplete", "off"), ("spellcheck", "false"), ("data-confirm-name", integration.name)])
                + HTML.element("div", [("class", "actions")],
                               HTML.element("button", [("type", "submit"), ("class", "danger"), ("id", "revoke-submit")], "Revoke")
                               + HTML.element("a", [("href", base(integration))], "Cancel"))
            content += HTML.element("form", [("method", "post"), ("action", base(integration) + "/revoke"), ("novalidate", "")], form)
        }
        let page = ConsolePages.layout(title: "Revoke \(integration.name)", request: request, nav: .integrations, content)
        return RouteOutcome(ConsoleRoutes.finish(page, status: status), clientID: integration.clientID, reason: error == nil ? nil : "console_invalid_form")
    }

    static func revoke(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integration = try request.integration(admin)
        try request.requireManager("revoke integrations")
        let typed = request.form["confirm_name"] ?? ""
        guard typed == integration.name else {
            return revokePage(request, integration, typed: typed,
                              error: typed.isEmpty ? "Type the integration's name to confirm." : "That is not this integration's name: nothing was revoked.",
                              status: 422)
        }
        guard !integration.isRevoked else { return RouteOutcome(ConsoleRoutes.redirect(base(integration)), clientID: integration.clientID) }
        try admin.revokeIntegration(actor: request.session.email, clientID: integration.clientID)
        return RouteOutcome(ConsoleRoutes.redirect(base(integration) + "?revoked=1"), clientID: integration.clientID)
    }
}
