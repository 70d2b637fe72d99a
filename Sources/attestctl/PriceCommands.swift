import CommandLineSupport
import Foundation
import TokenService

/// `attestctl prices show|set|import` and `workspaces set-budget`: what relayed requests cost, and
/// how much a workspace may spend.
enum PriceCommands {
    static func show(_ argv: [String]) throws {
        let arguments = try AdminCommands.parse(argv, options: ["workspace"], flags: ["json"])
        let (service, _) = try AdminCommands.open(arguments)
        let prices = try service.prices(workspace: try arguments.value("workspace"))
        if arguments.has("json") {
            print(json(prices))
            return
        }
        print("prices for \(prices.workspace.map { "workspace \($0)" } ?? "every workspace without an override") in USD per million tokens: "
              + (prices.effectiveAt.map { "the workspace's override since \(AdminCommands.iso8601($0)) by \(prices.setBy ?? "?")" }
                 ?? "the shipped table of \(PriceTable.shippedDate), from \(PriceTable.shippedSource)"))
        let header = ["MODEL", "INPUT", "OUTPUT", "CACHE_WRITE_5M", "CACHE_WRITE_1H", "CACHE_READ", "LONG_CONTEXT", "REGIONAL_UPLIFT"]
        func usd(_ value: Int64) -> String { String(MoneyText.usd(value).dropFirst()) }
        let lines = prices.table.models.sorted { $0.key < $1.key }.map { name, price in
            [name, usd(price.input), usd(price.output), usd(price.cacheWrite5m), usd(price.cacheWrite1h), usd(price.cacheRead),
             price.longContext.map { "above \($0.aboveInputTokens): \(usd($0.input))/\(usd($0.output))" } ?? "-",
             price.regionalUpliftPercent == 0 ? "-" : "\(price.regionalUpliftPercent)%"]
        }
        let widths = header.indices.map { column in ([header] + lines).map { $0[column].count }.max()! }
        for line in [header] + lines {
            print(line.enumerated().map { $0.element.padding(toLength: widths[$0.offset], withPad: " ", startingAt: 0) }
                .joined(separator: "  ").trimmingCharacters(in: .whitespaces))
        }
        print("server tools, USD per use: " + prices.table.serverTools.sorted { $0.key < $1.key }.map { "\($0.key) \(usd($0.value))" }
            .joined(separator: ", "))
    }

    /// The JSON `show --json` prints and `import` reads: the table, where it comes from, and since when.
    static func json(_ prices: PricesInForce) -> String {
        var document = prices.table.json
        document.workspace = prices.workspace
        document.source = prices.effectiveAt == nil ? PriceTable.shippedSource : "override by \(prices.setBy ?? "?")"
        document.dated = PriceTable.shippedDate
        document.effective_at = prices.effectiveAt.map(AdminCommands.iso8601)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(document)) ?? Data("{}".utf8), as: UTF8.self)
    }

    static func set(_ argv: [String]) throws {
        let fields = ["input", "output", "cache-write-5m", "cache-write-1h", "cache-read"]
        let arguments = try AdminCommands.parse(argv, options: Set(["actor", "workspace", "model"] + fields), flags: ["json"])
        let actor = try Validate.email(try arguments.required("actor"))
        func price(_ name: String) throws -> Double? {
            guard let text = try arguments.value(name) else { return nil }
            guard let micro = MoneyText.microUSD(text.trimmingCharacters(in: .whitespaces)) else {
                throw UsageError("--\(name) \(text.prefix(40)): expected USD per million tokens, such as 3 or 0.30")
            }
            return Double(micro) / 1_000_000
        }
        let change = PriceChange(input: try price("input"), output: try price("output"), cacheWrite5m: try price("cache-write-5m"),
                                 cacheWrite1h: try price("cache-write-1h"), cacheRead: try price("cache-read"))
        let (service, _) = try AdminCommands.open(arguments)
        let prices = try service.setPrice(actor: actor, workspace: try arguments.required("workspace"), model: try arguments.required("model"), change)
        if arguments.has("json") { return print(json(prices)) }
        print("prices of \(try arguments.required("model")) in \(try arguments.required("workspace")) changed from "
              + "\(prices.effectiveAt.map(AdminCommands.iso8601) ?? "now") on; requests recorded before keep their cost")
    }

    /// The most an imported file may hold.
    static let maxImportBytes = 1 << 20

    static func importFile(_ argv: [String]) throws {
        let arguments = try AdminCommands.parse(argv, options: ["actor", "workspace"], flags: ["json"], positional: 1)
        let actor = try Validate.email(try arguments.required("actor"))
        let path = arguments.positional[0]
        guard let handle = FileHandle(forReadingAtPath: path) else { throw UsageError("cannot read \(path)") }
        defer { try? handle.close() }
        let data = (try? handle.read(upToCount: maxImportBytes + 1)) ?? nil ?? Data()
        guard data.count <= maxImportBytes else { throw UsageError("\(path) is larger than \(maxImportBytes) bytes") }
        let (service, _) = try AdminCommands.open(arguments)
        let workspace = try arguments.required("workspace")
        let prices = try service.importPrices(actor: actor, workspace: workspace, json: String(decoding: data, as: UTF8.self))
        if arguments.has("json") { return print(json(prices)) }
        print("imported \(prices.table.models.count) model prices into \(workspace), in force from "
              + "\(prices.effectiveAt.map(AdminCommands.iso8601) ?? "now") on; requests recorded before keep their cost")
    }

    static func setBudget(_ argv: [String]) throws {
        let arguments = try AdminCommands.parse(argv, options: ["actor", "workspace", "monthly-budget-usd", "daily-budget-usd"], flags: ["json"])
        let actor = try Validate.email(try arguments.required("actor"))
        let workspace = try arguments.required("workspace")
        let monthly = try AdminCommands.usd(arguments, "monthly-budget-usd")
        let daily = try AdminCommands.usd(arguments, "daily-budget-usd")
        let (service, _) = try AdminCommands.open(arguments)
        let budget = try service.setWorkspaceBudget(actor: actor, workspace: workspace, monthlyMicroUSD: monthly, dailyMicroUSD: daily)
        if arguments.has("json") {
            return printJSON(["workspace": workspace, "monthly_budget_micro_usd": budget.monthlyMicroUSD, "daily_budget_micro_usd": budget.dailyMicroUSD])
        }
        print("workspace \(workspace): monthly budget \(budget.monthlyMicroUSD == 0 ? "none" : MoneyText.usd(budget.monthlyMicroUSD)), "
              + "daily budget \(budget.dailyMicroUSD == 0 ? "none" : MoneyText.usd(budget.dailyMicroUSD))")
    }
}
