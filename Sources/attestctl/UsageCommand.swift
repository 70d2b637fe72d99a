import AttestWire
import CommandLineSupport
import Foundation
import TokenService

/// `attestctl usage`: the usage ledger, grouped, as a table or one JSON object per line.
enum UsageCommand {
    static let options: Set<String> = ["workspace", "client-id", "since", "until", "by"]

    static func run(_ arguments: Arguments) throws {
        var groupings = Set<UsageGrouping>()
        if let by = try arguments.value("by"), by.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) == ["upstream"] {
            return try byUpstream(arguments)
        }
        if let by = try arguments.value("by"), by.split(separator: ",").contains(where: { $0.trimmingCharacters(in: .whitespaces) == "rule" }) {
            guard by.trimmingCharacters(in: .whitespaces) == "rule" else { throw UsageError("--by rule is given alone") }
            return try runByRule(arguments)
        }
        if let by = try arguments.value("by") {
            for part in by.split(separator: ",") {
                guard let grouping = UsageGrouping(rawValue: part.trimmingCharacters(in: .whitespaces)) else {
                    throw UsageError("--by \(by): use hour, day, model, integration or profile, or upstream or rule alone")
                }
                groupings.insert(grouping)
            }
        }
        let since = try arguments.value("since").map { try date($0, "since") }
        let until = try arguments.value("until").map { try date($0, "until") }
        let (service, _) = try AdminCommands.open(arguments)
        let rows = try service.usage(workspace: try arguments.value("workspace"), clientID: try arguments.value("client-id"),
                                     since: since, until: until)
        let groups = UsageReport.group(rows, by: groupings)
        let forecast = try service.forecast(workspace: try arguments.value("workspace"), clientID: try arguments.value("client-id"))
        if arguments.has("json") {
            for group in groups { print(JSONText.object(fields(group))) }
            print(JSONText.object(forecastFields(forecast)))
        } else {
            printTable(groups)
            print("this month (\(monthText(forecast.month))): \(MoneyText.usd(forecast.monthToDateMicroUSD)) so far, "
                  + "\(MoneyText.usd(forecast.projectedMicroUSD)) projected to its end")
        }
    }

    /// `--by upstream`: requests and tokens per workspace and upstream label (the upstream of the
    /// workspace's list that served; `default` for its own), and how many came after a failover.
    static func byUpstream(_ arguments: Arguments) throws {
        let since = try arguments.value("since").map { try date($0, "since") }
        let until = try arguments.value("until").map { try date($0, "until") }
        let (service, _) = try AdminCommands.open(arguments)
        let rows = try service.usageByUpstream(workspace: try arguments.value("workspace"), clientID: try arguments.value("client-id"),
                                               since: since, until: until)
        func counts(_ c: UpstreamUsageCounters) -> [(String, Any)] {
            [("requests", c.requests), ("input_tokens", c.inputTokens), ("output_tokens", c.outputTokens),
             ("cache_creation_input_tokens", c.cacheCreationInputTokens), ("cache_read_input_tokens", c.cacheReadInputTokens), ("failovers", c.failovers),
             ("cost_micro_usd", c.costMicroUSD)]
        }
        if arguments.has("json") {
            for row in rows { print(JSONText.object([("workspace", row.workspace), ("upstream", row.key.upstream)] + counts(row.counters))) }
            return
        }
        guard !rows.isEmpty else {
            print("no usage recorded")
            return
        }
        let header = ["WORKSPACE", "UPSTREAM", "REQUESTS", "COST_USD", "INPUT", "OUTPUT", "CACHE_WRITE", "CACHE_READ", "FAILOVERS"]
        let lines = rows.map { row in
            let c = row.counters
            return [row.workspace, row.key.upstream, String(c.requests), String(MoneyText.usd(c.costMicroUSD).dropFirst()), String(c.inputTokens),
                    String(c.outputTokens), String(c.cacheCreationInputTokens), String(c.cacheReadInputTokens), String(c.failovers)]
        }
        let widths = header.indices.map { column in ([header] + lines).map { $0[column].count }.max()! }
        for line in [header] + lines {
            print(line.enumerated().map { $0.element.padding(toLength: widths[$0.offset], withPad: " ", startingAt: 0) }
                .joined(separator: "  ").trimmingCharacters(in: .whitespaces))
        }
    }

    /// `--by rule`: each rule's refusals (enforced) and would-be refusals (monitored) per integration and day.
    static func runByRule(_ arguments: Arguments) throws {
        let since = try arguments.value("since").map { try date($0, "since") }
        let until = try arguments.value("until").map { try date($0, "until") }
        let (service, _) = try AdminCommands.open(arguments)
        let rows = try service.ruleUsage(workspace: try arguments.value("workspace"), clientID: try arguments.value("client-id"),
                                         since: since, until: until)
        if arguments.has("json") {
            for row in rows { print(JSONText.object(ruleFields(row))) }
            return
        }
        guard !rows.isEmpty else { return print("no rule refused or would have refused anything") }
        let lines = [["DAY", "CLIENT_ID", "RULE", "MODE", "REFUSED", "WOULD_REFUSE"]]
            + rows.map { [UsageClock.dayText($0.key.day), $0.key.clientID, $0.key.rule.rawValue, $0.mode.rawValue,
                          String($0.count.refused), String($0.count.wouldRefuse)] }
        let widths = lines[0].indices.map { column in lines.map { $0[column].count }.max()! }
        for line in lines {
            print(line.enumerated().map { $0.element.padding(toLength: widths[$0.offset], withPad: " ", startingAt: 0) }
                .joined(separator: "  ").trimmingCharacters(in: .whitespaces))
        }
    }

    /// The `--by rule --json` line: the fields, then which integration.
    static func ruleFields(_ row: RuleUsageRow) -> [(String, Any)] {
        [("rule", row.key.rule.rawValue), ("mode", row.mode.rawValue), ("refused", row.count.refused), ("would_refuse", row.count.wouldRefuse),
         ("day", UsageClock.dayText(row.key.day)), ("client_id", row.key.clientID), ("workspace", row.workspace)]
    }

    /// 2026-12-01 (midnight UTC) or an ISO 8601 time.
    static func date(_ text: String, _ option: String) throws -> Date {
        if text.utf8.count == 10, let day = parseISO8601(text + "T00:00:00Z") { return day }
        if let time = parseISO8601(text) { return time }
        throw UsageError("--\(option) \(text): use 2026-12-01 or 2026-12-01T13:00:00Z")
    }

    /// `2026-12-01T13:00:00Z`.
    static func hourText(_ hour: Int64) -> String { AdminCommands.iso8601(Date(timeIntervalSince1970: TimeInterval(hour))) }

    /// The JSON line: the group's fields (those a grouping folds away are left out), then the counts.
    static func fields(_ group: UsageGroup) -> [(String, Any)] {
        var fields: [(String, Any)] = []
        if let workspace = group.workspace { fields.append(("workspace", workspace)) }
        if let clientID = group.clientID { fields.append(("client_id", clientID)) }
        if let model = group.model { fields.append(("model", model)) }
        if let hour = group.hour { fields.append(("hour", hourText(hour))) }
        if let day = group.day { fields.append(("day", day)) }
        if let profile = group.profile { fields.append(("user_profile", profile.isEmpty ? NSNull() : profile)) }
        let c = group.counters
        fields += [("requests", c.requests), ("cost_micro_usd", c.costMicroUSD), ("input_tokens", c.inputTokens), ("output_tokens", c.outputTokens),
                   ("cache_creation_input_tokens", c.cacheCreationInputTokens),
                   ("cache_creation_1h_input_tokens", c.cacheCreation1hInputTokens), ("cache_read_input_tokens", c.cacheReadInputTokens),
                   ("server_tool_use", c.serverToolUse.sorted { $0.key < $1.key }.map { ($0.key, $0.value as Any) }),
                   ("errors", c.errors.sorted { $0.key < $1.key }.map { (String($0.key), $0.value as Any) }),
                   ("incomplete", c.incomplete), ("abandoned", c.abandoned),
                   ("refused", c.refusals.sorted { $0.key < $1.key }.map { ($0.key, $0.value as Any) })]
        return fields
    }

    /// The last `--json` line: the month's spend so far (whatever --since/--until say) and its
    /// projection to the month's end, for the same workspace or integration.
    static func forecastFields(_ forecast: SpendForecast) -> [(String, Any)] {
        [("forecast", [("month", monthText(forecast.month) as Any), ("cost_micro_usd", forecast.monthToDateMicroUSD as Any),
                       ("projected_cost_micro_usd", forecast.projectedMicroUSD as Any)]),
         ("cost_micro_usd", forecast.monthToDateMicroUSD)]
    }

    /// `2026-12` for 202612.
    static func monthText(_ month: Int64) -> String { "\(month / 100)-" + (month % 100 < 10 ? "0" : "") + "\(month % 100)" }

    static func printTable(_ groups: [UsageGroup]) {
        guard !groups.isEmpty else {
            print("no usage recorded")
            return
        }
        let keys: [(String, (UsageGroup) -> String?)] = [
            ("WORKSPACE", { $0.workspace }), ("CLIENT_ID", { $0.clientID }), ("MODEL", { $0.model }),
            ("HOUR", { $0.hour.map(hourText) }), ("DAY", { $0.day }), ("USER_PROFILE", { $0.profile.map { $0.isEmpty ? "(none)" : $0 } }),
        ].filter { _, get in groups.contains { get($0) != nil } }
        func counts(_ c: UsageCounters) -> [String] {
            [String(c.requests), String(MoneyText.usd(c.costMicroUSD).dropFirst()), String(c.inputTokens), String(c.outputTokens), String(c.cacheCreationInputTokens), String(c.cacheReadInputTokens),
             c.serverToolUse.isEmpty ? "-" : c.serverToolUse.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ","),
             c.errors.isEmpty ? "-" : c.errors.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ","),
             String(c.incomplete), String(c.abandoned),
             c.refusals.isEmpty ? "-" : c.refusals.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: ",")]
        }
        let header = keys.map(\.0) + ["REQUESTS", "COST_USD", "INPUT", "OUTPUT", "CACHE_WRITE", "CACHE_READ", "SERVER_TOOLS", "ERRORS", "INCOMPLETE", "ABANDONED", "REFUSED"]
        var lines = groups.map { group in keys.map { $0.1(group) ?? "-" } + counts(group.counters) }
        lines.append(keys.enumerated().map { $0.offset == 0 ? "TOTAL" : "" } + counts(UsageReport.total(groups)))
        let widths = header.indices.map { column in ([header] + lines).map { $0[column].count }.max()! }
        for line in [header] + lines {
            print(line.enumerated().map { $0.element.padding(toLength: widths[$0.offset], withPad: " ", startingAt: 0) }
                .joined(separator: "  ").trimmingCharacters(in: .whitespaces))
        }
    }
}
