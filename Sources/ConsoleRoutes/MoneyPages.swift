import Foundation
import HTTPRouting
import TokenService

/// The Policy tab's budgets in money: four fields in US dollars, as `integrations update` takes them.
enum MoneyBudgetFields {
    static var names: [(name: String, label: String, hint: String, keyPath: WritableKeyPath<IntegrationPolicy, Int64>)] { [
        ("monthly_budget_usd", "Monthly budget (USD)", "US dollars the whole integration may spend per calendar month (UTC), at the workspace's prices; 0 for none.",
         \.monthlyBudgetMicroUSD),
        ("daily_budget_usd", "Daily budget (USD)", "US dollars the whole integration may spend per day (UTC); 0 for none.", \.dailyBudgetMicroUSD),
        ("profile_monthly_budget_usd", "User profile monthly budget (USD)", "US dollars each user profile may spend per calendar month (UTC); 0 for none.",
         \.profileMonthlyBudgetMicroUSD),
        ("profile_daily_budget_usd", "User profile daily budget (USD)", "US dollars each user profile may spend per day (UTC); 0 for none.",
         \.profileDailyBudgetMicroUSD),
    ] }

    /// The policy's budgets as the fields show them: `2000`, `1.5`, `0`.
    static func values(_ policy: IntegrationPolicy) -> [String] {
        names.map { amount(policy[keyPath: $0.keyPath]) }
    }

    /// Dollars without a `$` and without trailing zeros (`2000`, `1.5`, `0.0005`).
    static func amount(_ micro: Int64) -> String {
        let text = String(MoneyText.usd(micro).dropFirst())
        guard text.contains(".") else { return text }
        var trimmed = Substring(text)
        while trimmed.hasSuffix("0") { trimmed = trimmed.dropLast() }
        if trimmed.hasSuffix(".") { trimmed = trimmed.dropLast() }
        return String(trimmed)
    }

    static func render(_ values: [String], errors: [String: String], readOnly: [(String, String?)]) -> HTML {
        HTML.join(zip(names, values + Array(repeating: "", count: max(0, names.count - values.count))).map { field, value in
            ConsolePages.field(field.label, name: field.name, value: value, error: errors[field.name], hint: field.hint,
                               attributes: [("inputmode", "decimal")] + readOnly)
        })
    }

    static func apply(_ values: [String], to policy: inout IntegrationPolicy, errors: inout [String: String]) {
        for (field, value) in zip(names, values) {
            let text = value.trimmingCharacters(in: .whitespaces)
            guard let micro = MoneyText.microUSD(text.isEmpty ? "0" : text) else {
                errors[field.name] = "Use US dollars, such as 2000 or 1.50 (at most 6 decimals); 0 for none."
                continue
            }
            policy[keyPath: field.keyPath] = micro
        }
    }
}

/// The Usage tab's money: this month's spend, its forecast and each budget in money's use, and
/// the cost by day and model.
enum SpendSection {
    static func render(_ integration: Integration, _ admin: AdminService, groups: [UsageGroup], now: Date) throws -> HTML {
        let forecast = try admin.forecast(clientID: integration.clientID, at: now)
        let today = try admin.usage(clientID: integration.clientID, since: Date(timeIntervalSince1970: Double(UsageClock.day(now)) * 86_400))
            .reduce(Int64(0)) { Int64.saturatingSum($0, $1.counters.costMicroUSD) }
        let workspaceBudget = try admin.workspaceBudget(integration.workspaceName)
        let workspaceForecast = workspaceBudget.isOn ? try admin.forecast(workspace: integration.workspaceName, at: now) : nil
        var body = HTML.element("h2", [], "Spend this month")
        body += HTML.element("p", [("id", "spend")], HTML.text(MoneyText.usd(forecast.monthToDateMicroUSD)) + " spent this month, "
                             + HTML.text(MoneyText.usd(today)) + " today (UTC), at the prices in force when each request was recorded.")
        body += HTML.element("p", [("id", "forecast")], "Forecast: " + HTML.element("strong", [], HTML.text(MoneyText.usd(forecast.projectedMicroUSD)))
                             + " by the end of the month, if it goes on as it has so far.")
        var meters: [HTML] = []
        func meter(_ id: String, _ label: String, spent: Int64, budget: Int64) {
            guard budget > 0 else { return }
            let percent = min(999, Double(spent) * 100 / Double(budget))
            meters.append(HTML.element("li", [("id", id)],
                HTML.void("meter", [("min", "0"), ("max", String(budget)), ("value", String(min(spent, budget))), ("aria-label", label)])
                + " " + HTML.text(label) + ": " + HTML.text(MoneyText.usd(spent)) + " of " + HTML.text(MoneyText.usd(budget))
                + " (" + HTML.text(String(format: "%.1f", percent)) + "%)"))
        }
        let policy = integration.policy
        meter("budget-usd-monthly", "Monthly budget", spent: forecast.monthToDateMicroUSD, budget: policy.monthlyBudgetMicroUSD)
        meter("budget-usd-daily", "Daily budget", spent: today, budget: policy.dailyBudgetMicroUSD)
        if let workspaceForecast {
            meter("budget-usd-workspace-monthly", "Workspace monthly budget", spent: workspaceForecast.monthToDateMicroUSD,
                  budget: workspaceBudget.monthlyMicroUSD)
        }
        body += meters.isEmpty
            ? HTML.element("p", [("id", "budgets-usd")], "No budget in money is set for this integration; the Policy tab sets them.")
            : HTML.element("ul", [("id", "budgets-usd"), ("class", "meters")], HTML.join(meters))
        if policy.profileMonthlyBudgetMicroUSD > 0 || policy.profileDailyBudgetMicroUSD > 0 {
            body += HTML.element("p", [], "Each user profile may spend " + HTML.text(
                [policy.profileDailyBudgetMicroUSD > 0 ? MoneyText.usd(policy.profileDailyBudgetMicroUSD) + " a day" : nil,
                 policy.profileMonthlyBudgetMicroUSD > 0 ? MoneyText.usd(policy.profileMonthlyBudgetMicroUSD) + " a month" : nil]
                    .compactMap { $0 }.joined(separator: " and ")) + ".")
        }
        body += ConsolePages.table(caption: "Cost by day and model", id: "cost-by-day-model", headers: ["Day", "Model", "Requests", "Cost (USD)"],
                                   rows: groups.map { group in
                                       [HTML.text(group.day ?? ""), HTML.element("code", [], HTML.text(group.model ?? "")),
                                        HTML.text(group.counters.requests), HTML.text(MoneyText.usd(group.counters.costMicroUSD))]
                                   }, empty: "No usage in the last 30 days.")
        return HTML.element("section", [("class", "budget"), ("id", "money")], body)
    }
}

/// Workspace settings' budgets in money: over all the workspace's integrations, owners only.
enum WorkspaceBudgetSection {
    static func render(_ request: ConsoleRequest, _ admin: AdminService, errors: [String: String], typed: [String: String]) throws -> HTML {
        let workspace = request.session.workspace
        let budget = try admin.workspaceBudget(workspace.name)
        let forecast = try admin.forecast(workspace: workspace.name)
        var body = HTML.element("h2", [("id", "budget-heading")], "Budgets in money")
        body += HTML.element("p", [("id", "workspace-spend")], HTML.text(MoneyText.usd(forecast.monthToDateMicroUSD)) + " spent this month by all of "
                             + HTML.text(workspace.name) + "'s integrations; forecast "
                             + HTML.element("strong", [], HTML.text(MoneyText.usd(forecast.projectedMicroUSD))) + " by the end of the month.")
        if let error = errors["budget"] { body += ConsolePages.notice(error, kind: "error") }
        let readOnly: [(String, String?)] = request.isOwner ? [] : [("readonly", "")]
        var fields = ConsolePages.csrfField(request)
        for (name, label, micro) in [("monthly_budget_usd", "Workspace monthly budget (USD)", budget.monthlyMicroUSD),
                                     ("daily_budget_usd", "Workspace daily budget (USD)", budget.dailyMicroUSD)] {
            fields += ConsolePages.field(label, name: "workspace_" + name, value: typed["workspace_" + name] ?? MoneyBudgetFields.amount(micro),
                                         error: errors["workspace_" + name],
                                         hint: "Over all the workspace's integrations, per " + (name.hasPrefix("monthly") ? "calendar month" : "day")
                                             + " (UTC); a request over it is refused until it renews. 0 for none.",
                                         attributes: [("inputmode", "decimal")] + readOnly)
        }
        if request.isOwner {
            fields += HTML.element("div", [("class", "actions")], HTML.element("button", [("type", "submit")], "Save budgets"))
            body += HTML.element("form", [("method", "post"), ("action", "/console/settings/budget"), ("novalidate", "")], fields)
        } else {
            body += HTML.element("div", [("class", "readonly-form")], fields)
            body += HTML.element("p", [("class", "hint")], "Setting the workspace's budgets needs the owner or primary owner role.")
        }
        return HTML.element("section", [("aria-labelledby", "budget-heading"), ("id", "workspace-budget")], body)
    }

    static func update(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        var errors: [String: String] = [:]
        func value(_ name: String) -> Int64? {
            let text = (request.form["workspace_" + name] ?? "").trimmingCharacters(in: .whitespaces)
            guard let micro = MoneyText.microUSD(text.isEmpty ? "0" : text) else {
                errors["workspace_" + name] = "Use US dollars, such as 2000 or 1.50 (at most 6 decimals); 0 for none."
                return nil
            }
            return micro
        }
        let monthly = value("monthly_budget_usd"), daily = value("daily_budget_usd")
        if let monthly, let daily {
            do {
                _ = try admin.setWorkspaceBudget(actor: request.session.email, workspace: request.session.workspace.name,
                                                 monthlyMicroUSD: monthly, dailyMicroUSD: daily)
                return RouteOutcome(ConsoleRoutes.redirect("/console/settings?budget=1#workspace-budget"))
            } catch let error as AdminError where error.kind != .notFound {
                errors["budget"] = error.description
            }
        }
        return try SettingsPage.page(request, admin, notice: "", errors: errors, status: 422, typed: request.form)
    }
}
