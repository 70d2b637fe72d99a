import Foundation
import HTTPRouting
import TokenService

/// The Usage tab: the last 30 days (UTC) from the usage ledger, as server-rendered SVG charts,
/// each followed by a table of the same numbers (the chart's text equivalent).
enum UsagePage {
    static let days = 30

    static func render(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let integration = try request.integration(admin)
        let now = Date()
        let today = (now.timeIntervalSince1970 / 86_400).rounded(.down) * 86_400
        let first = Date(timeIntervalSince1970: today - Double(days - 1) * 86_400)
        let dayNames = (0..<days).map { UsageClock.dayText(Int64(first.timeIntervalSince1970) + Int64($0) * 86_400) }
        let rows = try admin.usage(clientID: integration.clientID, since: first)
        // The same grouping as `attestctl usage --client-id … --by day,model`.
        let groups = foldModels(UsageReport.group(rows, by: [.day, .model]), keep: topModels)
        // The charts draw the top models by tokens and `other`, whatever the ledger holds.
        let models = Array(Set(groups.compactMap(\.model))).sorted { ($0 == "other" ? 1 : 0, $0) < ($1 == "other" ? 1 : 0, $1) }

        func series(_ value: (UsageCounters) -> Int64) -> [(name: String, values: [Int64])] {
            models.map { model in
                (model, dayNames.map { day in groups.filter { $0.day == day && $0.model == model }.reduce(0) { $0 + value($1.counters) } })
            }
        }
        var content = HTML.element("p", [], "The last 30 days, " + HTML.text(dayNames.first!) + " to " + HTML.text(dayNames.last!)
                                   + " (UTC, +00:00), as recorded by the usage ledger (written every few seconds).")
        content += budget(integration, try admin.usage(clientID: integration.clientID, since: monthStart(now)), now: now)
        content += try SpendSection.render(integration, admin, groups: groups, now: now)

        // Tokens per day by model.
        let tokenRows: [[HTML]] = groups.map { group in
            let c = group.counters
            return [HTML.text(group.day ?? ""), HTML.element("code", [], HTML.text(group.model ?? "")), HTML.text(c.requests), HTML.text(c.inputTokens),
                    HTML.text(c.outputTokens), HTML.text(c.cacheCreationInputTokens), HTML.text(c.cacheReadInputTokens)]
        }
        let tokenTable = ConsolePages.table(caption: "Usage by day and model", id: "usage-by-day-model",
                                            headers: ["Day", "Model", "Requests", "Input tokens", "Output tokens", "Cache write tokens", "Cache read tokens"],
                                            rows: tokenRows, empty: "No usage in the last 30 days.")
        content += section("Input tokens per day, by model", UsageChart.stackedBars(id: "chart-input", title: "Input tokens per day, by model",
                                                                                    labels: dayNames, series: series(\.inputTokens)))
        content += section("Output tokens per day, by model", UsageChart.stackedBars(id: "chart-output", title: "Output tokens per day, by model",
                                                                                     labels: dayNames, series: series(\.outputTokens)) + tokenTable)

        // Requests per day.
        let requestsPerDay = dayNames.map { day in groups.filter { $0.day == day }.reduce(Int64(0)) { $0 + $1.counters.requests } }
        let requestRows: [[HTML]] = zip(dayNames, requestsPerDay).filter { $0.1 > 0 || hasRefusals(groups, $0.0) }.map { day, count in
            let refused = groups.filter { $0.day == day }.reduce(Int64(0)) { Int64.saturatingSum($0, $1.counters.refusals.values.reduce(0, Int64.saturatingSum)) }
            let errors = groups.filter { $0.day == day }.reduce(Int64(0)) { Int64.saturatingSum($0, $1.counters.errors.values.reduce(0, Int64.saturatingSum)) }
            return [HTML.text(day), HTML.text(count), HTML.text(errors), HTML.text(refused)]
        }
        content += section("Requests per day", UsageChart.stackedBars(id: "chart-requests", title: "Requests per day", labels: dayNames,
                                                                      series: [("requests", requestsPerDay)])
                           + ConsolePages.table(caption: "Requests per day", id: "requests-by-day", headers: ["Day", "Requests", "Errors", "Refused"],
                                                rows: requestRows, empty: "No requests in the last 30 days."))

        // Top user profiles by tokens.
        let profiles = UsageReport.group(rows, by: [.profile]).filter { !($0.profile ?? "").isEmpty }
            .sorted { (tokens($0.counters), $1.profile ?? "") > (tokens($1.counters), $0.profile ?? "") }.prefix(topProfiles)
        content += section("Top user profiles by tokens", UsageChart.bars(id: "chart-profiles", title: "Top user profiles by tokens, last 30 days",
                                                                          labels: profiles.map { $0.profile ?? "" }, values: profiles.map { tokens($0.counters) })
                           + ConsolePages.table(caption: "Top user profiles by tokens, last 30 days", id: "usage-by-profile",
                                                headers: ["User profile", "Requests", "Tokens", "Server tool uses", "Refused"],
                                                rows: profiles.map { group in
                                                    let c = group.counters
                                                    return [HTML.element("code", [], HTML.text(group.profile ?? "")), HTML.text(c.requests),
                                                            HTML.text(tokens(c)), HTML.text(c.serverToolUse.values.reduce(0, Int64.saturatingSum)),
                                                            HTML.text(c.refusals.values.reduce(0, Int64.saturatingSum))]
                                                }, empty: "No request named a user profile in the last 30 days."))

        // Server tools, by the upstream's own counters.
        var serverTools: [String: Int64] = [:]
        for group in groups { serverTools.merge(group.counters.serverToolUse, uniquingKeysWith: Int64.saturatingSum) }
        let toolCounts = serverTools.sorted { $0.key < $1.key }
        content += section("Server tool uses", UsageChart.bars(id: "chart-server-tools", title: "Server tool uses, last 30 days",
                                                               labels: toolCounts.map(\.key), values: toolCounts.map(\.value))
                           + ConsolePages.table(caption: "Server tool uses, last 30 days", id: "server-tool-uses", headers: ["Counter", "Uses"],
                                                rows: toolCounts.map { [HTML.element("code", [], HTML.text($0.key)), HTML.text($0.value)] },
                                                empty: "No server tool was used in the last 30 days."))

        // Refusals by reason.
        var refusals: [String: Int64] = [:]
        for group in groups { refusals.merge(group.counters.refusals, uniquingKeysWith: Int64.saturatingSum) }
        let reasons = refusals.sorted { $0.key < $1.key }
        content += section("Refusals by reason", UsageChart.bars(id: "chart-refusals", title: "Refusals by reason, last 30 days",
                                                                 labels: reasons.map(\.key), values: reasons.map(\.value))
                           + ConsolePages.table(caption: "Refusals by reason, last 30 days", id: "refusals-by-reason", headers: ["Reason", "Refused"],
                                                rows: reasons.map { [HTML.element("code", [], HTML.text($0.key)), HTML.text($0.value)] },
                                                empty: "No request was refused in the last 30 days."))
        return IntegrationPages.tabbed(request, integration, .usage, content)
    }

    static let topModels = 10
    static let topProfiles = 10

    /// Every token the relay counts against a budget.
    static func tokens(_ c: UsageCounters) -> Int64 { c.totalTokens }

    /// The `keep` models with the most tokens stay by name; the rest are added up as `other`.
    static func foldModels(_ groups: [UsageGroup], keep: Int) -> [UsageGroup] {
        var totals: [String: Int64] = [:]
        for group in groups { totals[group.model ?? "", default: 0] += tokens(group.counters) + group.counters.requests }
        guard totals.count > keep else { return groups }
        let kept = Set(totals.sorted { ($0.value, $1.key) > ($1.value, $0.key) }.prefix(keep).map(\.key))
        var folded: [UsageGroup] = []
        var index: [String: Int] = [:]
        for var group in groups {
            if !kept.contains(group.model ?? "") { group.model = "other" }
            let key = (group.day ?? "") + "\u{1f}" + (group.model ?? "")
            if let at = index[key] { folded[at].counters += group.counters } else {
                index[key] = folded.count
                folded.append(group)
            }
        }
        return folded
    }

    static func hasRefusals(_ groups: [UsageGroup], _ day: String) -> Bool {
        groups.contains { $0.day == day && !$0.counters.refusals.isEmpty }
    }

    static func section(_ title: String, _ body: HTML) -> HTML {
        HTML.element("section", [("class", "chart")], HTML.element("h2", [], HTML.text(title)) + body)
    }

    static func monthStart(_ now: Date) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar.date(from: calendar.dateComponents([.year, .month], from: now))!
    }

    /// This month's budget: input and output tokens (cache writes and reads count as input), as the relay counts them.
    static func budget(_ integration: Integration, _ rows: [UsageRow], now: Date) -> HTML {
        let used = rows.reduce(Int64(0)) { total, row in
            let c = row.counters
            return Int64.saturatingSum(total, c.totalTokens)
        }
        let budget = Int64(integration.policy.monthlyTokenBudget)
        let month = ConsoleTime.html(monthStart(now))
        var body = HTML.element("h2", [], "Budget used this month")
        if budget > 0 {
            let percent = min(100, Double(used) * 100 / Double(budget))
            body += HTML.void("meter", [("id", "budget-meter"), ("min", "0"), ("max", String(budget)), ("value", String(min(used, budget))),
                                        ("aria-label", "Budget used this month")])
            body += HTML.element("p", [("id", "budget")], HTML.text(grouped(used)) + " of " + HTML.text(grouped(budget)) + " tokens ("
                                 + HTML.text(String(format: "%.1f", percent)) + "%) since " + month + ".")
        } else {
            body += HTML.element("p", [("id", "budget")], HTML.text(grouped(used)) + " tokens since " + month + "; this integration has no monthly budget.")
        }
        return HTML.element("section", [("class", "budget")], body)
    }
}

/// Bar charts as inline SVG, drawn on the server: no charting library, no script. Colours come
/// from presentation attributes (inline styles would need 'unsafe-inline').
enum UsageChart {
    static let palette = ["#3559c7", "#d9822b", "#2e8b57", "#b23a48", "#7a4fb5", "#4a8fa8", "#8a6d3b", "#5b6770"]
    static let width = 720.0, height = 240.0, left = 64.0, bottom = 36.0, top = 12.0

    /// One bar per label, stacked by series; a legend names the series.
    static func stackedBars(id: String, title: String, labels: [String], series: [(name: String, values: [Int64])]) -> HTML {
        let totals = labels.indices.map { i in series.reduce(Int64(0)) { $0 + $1.values[i] } }
        let maximum = niceMaximum(totals.max() ?? 0)
        let plotWidth = width - left - 8, plotHeight = height - bottom - top
        let slot = plotWidth / Double(max(1, labels.count))
        var marks = axes(maximum: maximum, plotHeight: plotHeight)
        for (i, label) in labels.enumerated() {
            var y = top + plotHeight
            for (s, line) in series.enumerated() where line.values[i] > 0 {
                let h = plotHeight * Double(line.values[i]) / Double(maximum)
                y -= h
                marks += HTML.element("rect", [("x", format(left + Double(i) * slot + slot * 0.15)), ("y", format(y)), ("width", format(slot * 0.7)),
                                               ("height", format(max(h, 0.5))), ("fill", palette[s % palette.count])],
                                      HTML.element("title", [], HTML.text("\(label) \(line.name): \(grouped(line.values[i]))")))
            }
            // Every fifth day is named on the axis (the table names them all).
            if i % 5 == 0 || i == labels.count - 1 {
                marks += HTML.element("text", [("x", format(left + Double(i) * slot + slot / 2)), ("y", format(height - bottom + 16)),
                                               ("text-anchor", "middle"), ("font-size", "11"), ("fill", "#444")], HTML.text(String(label.suffix(5))))
            }
        }
        let legend = series.isEmpty ? HTML.element("p", [("class", "legend")], "No data in these 30 days.")
            : HTML.element("ul", [("class", "legend")], HTML.join(series.enumerated().map { s, line in
                HTML.element("li", [], HTML(raw: "<svg width=\"12\" height=\"12\" aria-hidden=\"true\"><rect width=\"12\" height=\"12\" fill=\"\(palette[s % palette.count])\"/></svg> ")
                             + HTML.text(line.name))
            }))
        return svg(id: id, title: title, marks) + legend
    }

    /// One bar per label.
    static func bars(id: String, title: String, labels: [String], values: [Int64]) -> HTML {
        guard !labels.isEmpty else { return svg(id: id, title: title, axes(maximum: niceMaximum(0), plotHeight: height - bottom - top)) }
        let maximum = niceMaximum(values.max() ?? 0)
        let plotWidth = width - left - 8, plotHeight = height - bottom - top
        let slot = plotWidth / Double(labels.count)
        var marks = axes(maximum: maximum, plotHeight: plotHeight)
        for (i, label) in labels.enumerated() {
            let h = plotHeight * Double(values[i]) / Double(maximum)
            marks += HTML.element("rect", [("x", format(left + Double(i) * slot + slot * 0.2)), ("y", format(top + plotHeight - h)),
                                           ("width", format(slot * 0.6)), ("height", format(max(h, 0.5))), ("fill", palette[3])],
                                  HTML.element("title", [], HTML.text("\(label): \(grouped(values[i]))")))
            marks += HTML.element("text", [("x", format(left + Double(i) * slot + slot / 2)), ("y", format(height - bottom + 16)),
                                           ("text-anchor", "middle"), ("font-size", "11"), ("fill", "#444")], HTML.text(label))
        }
        return svg(id: id, title: title, marks)
    }

    /// The axis top: the data's maximum rounded up to four equal steps of 1, 2 or 5 times a power of
    /// ten, so every label is a distinct round number (integer division read 3 requests as 3/2/1/0/0).
    static func niceMaximum(_ maximum: Int64) -> Int64 {
        let needed = max(1, (maximum + 3) / 4)
        var magnitude: Int64 = 1
        while true {
            for factor: Int64 in [1, 2, 5] where factor * magnitude >= needed { return factor * magnitude * 4 }
            magnitude *= 10
        }
    }

    static func axes(maximum: Int64, plotHeight: Double) -> HTML {
        var marks: HTML = ""
        for step in 0...4 {
            let value = maximum * Int64(step) / 4
            let y = top + plotHeight - plotHeight * Double(step) / 4
            marks += HTML.svgLeaf("line", [("x1", format(left)), ("x2", format(width - 8)), ("y1", format(y)), ("y2", format(y)),
                                        ("stroke", step == 0 ? "#888" : "#ddd"), ("stroke-width", "1")])
            marks += HTML.element("text", [("x", format(left - 6)), ("y", format(y + 4)), ("text-anchor", "end"), ("font-size", "11"), ("fill", "#444")],
                                  HTML.text(compact(value)))
        }
        return marks
    }

    static func svg(id: String, title: String, _ marks: HTML) -> HTML {
        HTML.element("div", [("class", "chart-scroll")], HTML.element("svg", [("id", id), ("class", "chart"), ("viewBox", "0 0 \(Int(width)) \(Int(height))"), ("role", "img"),
                             ("aria-labelledby", "\(id)-title"), ("xmlns", "http://www.w3.org/2000/svg"), ("preserveAspectRatio", "xMinYMin meet")],
                     HTML.element("title", [("id", "\(id)-title")], HTML.text(title + " (the table below has the numbers)")) + marks))
    }

    static func format(_ value: Double) -> String { String(format: "%.1f", value) }

    /// 1.2k, 3.4M: axis labels stay short.
    static func compact(_ value: Int64) -> String {
        switch value {
        case ..<1000: String(value)
        case ..<1_000_000: String(format: "%.1fk", Double(value) / 1000)
        default: String(format: "%.1fM", Double(value) / 1_000_000)
        }
    }
}
