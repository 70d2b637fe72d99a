import Foundation

/// The price table a workspace is charged by now: the shipped one, with its newest override laid over it.
public struct PricesInForce: Sendable {
    public let workspace: String?
    public let table: PriceTable
    /// The override's time and author; nil when the shipped table is in force.
    public let effectiveAt: Date?
    public let setBy: String?
}

/// One model's prices as an operator changes them (`prices set`), in USD per million tokens; nil keeps one.
public struct PriceChange: Sendable {
    public var input, output, cacheWrite5m, cacheWrite1h, cacheRead: Double?

    public init(input: Double? = nil, output: Double? = nil, cacheWrite5m: Double? = nil, cacheWrite1h: Double? = nil, cacheRead: Double? = nil) {
        self.input = input
        self.output = output
        self.cacheWrite5m = cacheWrite5m
        self.cacheWrite1h = cacheWrite1h
        self.cacheRead = cacheRead
    }

    public var isEmpty: Bool { [input, output, cacheWrite5m, cacheWrite1h, cacheRead].allSatisfy { $0 == nil } }
}

extension AdminService {
    // MARK: Prices

    /// The table in force for a workspace (by name), or the shipped one without a name.
    public func prices(workspace name: String?) throws -> PricesInForce {
        guard let name else { return PricesInForce(workspace: nil, table: .shipped, effectiveAt: nil, setBy: nil) }
        let workspace = try existingWorkspace(name)
        guard let newest = try store.priceTables(workspaceID: workspace.id).first else {
            return PricesInForce(workspace: name, table: .shipped, effectiveAt: nil, setBy: nil)
        }
        return PricesInForce(workspace: name, table: PriceTable.shipped.overlaid(with: newest.table), effectiveAt: newest.effectiveAt,
                             setBy: newest.setBy)
    }

    /// Changes one model's prices for a workspace, from now on (rows already recorded keep their
    /// cost). A model the table does not price needs all five. Owner or admin; audited.
    public func setPrice(actor: String, workspace name: String, model: String, _ change: PriceChange) throws -> PricesInForce {
        guard IntegrationPolicy.isValidModelID(model) else { throw AdminError("--model '\(model.prefix(60))' is not a model ID") }
        guard !change.isEmpty else { throw AdminError("nothing to change: give one or more of --input, --output, --cache-write-5m, --cache-write-1h, --cache-read") }
        let current = try prices(workspace: name)
        let old = current.table.models[model]
        guard old != nil || ![change.input, change.output, change.cacheWrite5m, change.cacheWrite1h, change.cacheRead].contains(where: { $0 == nil }) else {
            throw AdminError("\(model) has no price yet: give all of --input, --output, --cache-write-5m, --cache-write-1h and --cache-read")
        }
        func amount(_ value: Double?, _ flag: String, _ kept: Int64?) throws -> Int64 {
            guard let value else { return kept ?? 0 }
            guard value.isFinite, (0...PriceTable.maxUSD).contains(value) else { throw AdminError("--\(flag): expected USD per million tokens from 0 to 1000000") }
            return micro(value)
        }
        var price = ModelPrice(input: try amount(change.input, "input", old?.input), output: try amount(change.output, "output", old?.output),
                               cacheWrite5m: try amount(change.cacheWrite5m, "cache-write-5m", old?.cacheWrite5m),
                               cacheWrite1h: try amount(change.cacheWrite1h, "cache-write-1h", old?.cacheWrite1h),
                               cacheRead: try amount(change.cacheRead, "cache-read", old?.cacheRead),
                               longContext: old?.longContext, regionalUpliftPercent: old?.regionalUpliftPercent ?? 0)
        // A long-context tier stays where the operator changed only its base: it is the shipped
        // table's, and a contract that changes it is imported whole.
        if old == nil { price.longContext = nil }
        var table = current.table
        table.models[model] = price
        return try storePrices(actor: actor, workspace: name, table, action: "prices.set",
                               detail: "\(model): \(Self.describe(old)) -> \(Self.describe(price))")
    }

    /// Replaces a workspace's table, from now on, with one in `prices show --json`'s shape. Owner or admin; audited.
    public func importPrices(actor: String, workspace name: String, json text: String) throws -> PricesInForce {
        let table = try PriceTable.decode(text)
        guard !table.models.isEmpty else { throw AdminError("the prices JSON prices no model") }
        return try storePrices(actor: actor, workspace: name, table, action: "prices.imported",
                               detail: "\(table.models.count) models, \(table.serverTools.count) server tools")
    }

    private func storePrices(actor: String, workspace name: String, _ table: PriceTable, action: String, detail: String) throws -> PricesInForce {
        let workspace = try existingWorkspace(name)
        _ = try requireRole(actor, in: workspace, "change prices") { $0.managesIntegrations }
        // Strictly after the newest override, so the newest always wins even within one clock tick.
        var at = now()
        if let newest = try store.priceTables(workspaceID: workspace.id).first, newest.effectiveAt >= at {
            at = newest.effectiveAt.addingTimeInterval(0.001)
        }
        try store.addPriceTable(workspaceID: workspace.id, StoredPriceTable(effectiveAt: at, table: table, setBy: actor))
        try audit(actor: actor, action, detail: "workspace \(name): \(detail)")
        return try prices(workspace: name)
    }

    static func describe(_ price: ModelPrice?) -> String {
        guard let price else { return "none" }
        func usd(_ value: Int64) -> String { MoneyText.usd(value) }
        return "input \(usd(price.input)), output \(usd(price.output)), cache_write_5m \(usd(price.cacheWrite5m)), "
            + "cache_write_1h \(usd(price.cacheWrite1h)), cache_read \(usd(price.cacheRead)) per MTok"
    }

    // MARK: Workspace budgets

    public func workspaceBudget(_ name: String) throws -> MoneyBudget {
        try store.workspaceBudget(workspaceID: try existingWorkspace(name).id)
    }

    /// Sets a workspace's budgets in money (nil keeps one, 0 removes it). Owner only; audited.
    public func setWorkspaceBudget(actor: String, workspace name: String, monthlyMicroUSD: Int64?, dailyMicroUSD: Int64?) throws -> MoneyBudget {
        let workspace = try existingWorkspace(name)
        _ = try requireRole(actor, in: workspace, "set the workspace's budget") { $0 == .primaryOwner || $0 == .owner }
        guard monthlyMicroUSD != nil || dailyMicroUSD != nil else { throw AdminError("nothing to change: give --monthly-budget-usd and/or --daily-budget-usd") }
        let old = try store.workspaceBudget(workspaceID: workspace.id)
        var budget = old
        if let monthlyMicroUSD { budget.monthlyMicroUSD = monthlyMicroUSD }
        if let dailyMicroUSD { budget.dailyMicroUSD = dailyMicroUSD }
        guard budget.monthlyMicroUSD >= 0, budget.dailyMicroUSD >= 0 else { throw AdminError("a budget is 0 (none) or more") }
        guard try store.setWorkspaceBudget(workspaceID: workspace.id, budget) else { throw AdminError("no workspace named \(name)", kind: .notFound) }
        try audit(actor: actor, "workspace.budget_updated", detail: "workspace \(name): \(Self.describe(old)) -> \(Self.describe(budget))")
        return budget
    }

    static func describe(_ budget: MoneyBudget) -> String {
        func amount(_ value: Int64) -> String { value == 0 ? "none" : MoneyText.usd(value) }
        return "monthly_budget_usd \(amount(budget.monthlyMicroUSD)), daily_budget_usd \(amount(budget.dailyMicroUSD))"
    }

    /// The month's spend so far for a workspace and/or integration, and its projection to the month's end.
    public func forecast(workspace name: String? = nil, clientID: String? = nil, at time: Date? = nil) throws -> SpendForecast {
        let time = time ?? now()
        let rows = try usage(workspace: name, clientID: clientID, since: UsageClock.monthStart(of: time), until: nil)
        var spent: Int64 = 0
        for row in rows { spent.saturatingAdd(row.counters.costMicroUSD) }
        return SpendForecast(monthToDateMicroUSD: spent, at: time)
    }
}
