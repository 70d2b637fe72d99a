import Foundation
import HTTPRouting
import TokenService

/// The Policy tab's rules table: each rule's mode (enforce, or monitor: it watches and refuses
/// nothing), what it refused and would have refused over the last 7 and 30 days, and a button
/// switching its mode (a form of its own, CSRF-checked like every console POST, audited).
enum RuleModesSection {
    /// The rules shown: those the relay and the device exchange check today.
    static let rules: [PolicyRule] = [.models, .maxTokens, .deviceRequestsPerMinute, .monthlyTokenBudget, .serverTools, .maxServerToolUses, .betas,
                                      .profileRequestsPerMinute, .profileMonthlyTokenBudget, .monthlyBudgetUSD, .dailyBudgetUSD,
                                      .profileMonthlyBudgetUSD, .profileDailyBudgetUSD, .distribution, .minBundleVersion, .requireExtensions,
                                      .platforms, .riskLimit]

    static func render(_ request: ConsoleRequest, _ integration: Integration, _ admin: AdminService, now: Date = Date()) throws -> HTML {
        let today = PolicyRuleTally.day(now)
        let rows = try admin.ruleUsage(clientID: integration.clientID, since: Date(timeIntervalSince1970: TimeInterval(today - 29 * 86_400)))
        var last7: [PolicyRule: RuleCount] = [:], last30: [PolicyRule: RuleCount] = [:]
        for row in rows {
            last30[row.key.rule, default: RuleCount()] += row.count
            if row.key.day > today - 7 * 86_400 { last7[row.key.rule, default: RuleCount()] += row.count }
        }
        let editable = request.canManage && !integration.isRevoked
        let table: [[HTML]] = rules.map { rule in
            let mode = integration.policy.mode(rule)
            var cells: [HTML] = [HTML.element("code", [], HTML.text(rule.rawValue)),
                                 HTML.element("span", [("class", "mode \(mode.rawValue)")], HTML.text(mode == .monitor ? "Monitor" : "Enforce"))]
            for window in [last7, last30] {
                let count = window[rule] ?? RuleCount()
                cells.append(HTML.text(count.refused))
                cells.append(HTML.text(count.wouldRefuse))
            }
            if editable {
                let other: RuleMode = mode == .monitor ? .enforce : .monitor
                cells.append(HTML.element("form", [("method", "post"), ("action", IntegrationPages.base(integration) + "/rule-mode"), ("class", "inline")],
                    ConsolePages.csrfField(request)
                    + HTML.void("input", [("type", "hidden"), ("name", "rule"), ("value", rule.rawValue)])
                    + HTML.void("input", [("type", "hidden"), ("name", "mode"), ("value", other.rawValue)])
                    + HTML.element("button", [("type", "submit"), ("class", "link"), ("aria-label", "\(other == .monitor ? "Monitor" : "Enforce") \(rule.rawValue)")],
                                   HTML.text(other == .monitor ? "Monitor" : "Enforce"))))
            }
            return cells
        }
        let headers = ["Rule", "Mode", "Refused (7 days)", "Would refuse (7 days)", "Refused (30 days)", "Would refuse (30 days)"]
            + (editable ? ["Switch"] : [])
        return HTML.element("h2", [("id", "rules-heading")], "Watch before refusing")
            + HTML.element("p", [("class", "hint")],
                           "A rule in Monitor refuses nothing: the request or registration goes through as if the rule were absent, "
                           + "and is counted under Would refuse. Switch it to Enforce once its counts say whom it would refuse.")
            + ConsolePages.table(caption: "Each rule's mode and what it refused or would have refused", id: "rules", headers: headers, rows: table,
                                 empty: "")
    }

    /// POST …/rule-mode: `rule` and `mode` from the form.
    static func update(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integration = try request.integration(admin)
        try request.requireManager("change integrations")
        guard let rule = request.form["rule"].flatMap(PolicyRule.init(rawValue:)), let mode = request.form["mode"].flatMap(RuleMode.init(rawValue:)) else {
            throw AdminError("the form names no known rule and mode")
        }
        _ = try admin.setRuleModes(actor: request.session.email, clientID: integration.clientID, [rule: mode])
        return RouteOutcome(ConsoleRoutes.redirect(IntegrationPages.base(integration) + "/policy?mode=\(mode.rawValue)#rules"), clientID: integration.clientID)
    }
}
