import Foundation
import Synchronization

// Money: what a relayed request cost, from a price table, so budgets can be set in dollars.
// Every amount is an integer: prices in micro-dollars per million tokens (`$3 / MTok` is
// 3,000,000), costs in micro-dollars. A token count times a price fits Int64 for any real
// reply (2^40 tokens × $1,000,000 / MTok would not, so every product saturates instead).

/// One model's prices, in micro-dollars per million tokens.
public struct ModelPrice: Sendable, Equatable {
    public var input: Int64
    public var output: Int64
    public var cacheWrite5m: Int64
    public var cacheWrite1h: Int64
    public var cacheRead: Int64
    /// The long-context tier: when a request's prompt (input, cache writes and cache reads) is
    /// above `aboveInputTokens`, every token of it, output included, is priced at these.
    public var longContext: LongContextPrice?
    /// What a cloud's regional endpoint charges above its global one, in percent (10 on Bedrock
    /// and Vertex AI for the models from Claude Sonnet 4.5 on); 0 where there is none.
    public var regionalUpliftPercent: Int64

    public init(input: Int64, output: Int64, cacheWrite5m: Int64, cacheWrite1h: Int64, cacheRead: Int64, longContext: LongContextPrice? = nil,
                regionalUpliftPercent: Int64 = 0) {
        self.input = input
        self.output = output
        self.cacheWrite5m = cacheWrite5m
        self.cacheWrite1h = cacheWrite1h
        self.cacheRead = cacheRead
        self.longContext = longContext
        self.regionalUpliftPercent = regionalUpliftPercent
    }

    /// The API's multipliers on the input price: 5-minute writes 1.25×, 1-hour writes 2×, reads 0.1×.
    public static func standard(input usdPerMTok: Double, output: Double, cacheRead: Double? = nil, uplift: Int64 = 0) -> ModelPrice {
        let i = micro(usdPerMTok)
        return ModelPrice(input: i, output: micro(output), cacheWrite5m: i * 5 / 4, cacheWrite1h: i * 2, cacheRead: cacheRead.map(micro) ?? i / 10,
                          regionalUpliftPercent: uplift)
    }

    func with(longContext: LongContextPrice) -> ModelPrice {
        var price = self
        price.longContext = longContext
        return price
    }
}

/// A model's long-context tier.
public struct LongContextPrice: Sendable, Equatable {
    public var aboveInputTokens: Int64
    public var input: Int64
    public var output: Int64
    public var cacheWrite5m: Int64
    public var cacheWrite1h: Int64
    public var cacheRead: Int64

    public init(aboveInputTokens: Int64, input: Int64, output: Int64, cacheWrite5m: Int64, cacheWrite1h: Int64, cacheRead: Int64) {
        self.aboveInputTokens = aboveInputTokens
        self.input = input
        self.output = output
        self.cacheWrite5m = cacheWrite5m
        self.cacheWrite1h = cacheWrite1h
        self.cacheRead = cacheRead
    }
}

/// USD (a decimal as operators write it) to micro-dollars, rounded to the nearest.
func micro(_ usd: Double) -> Int64 { Int64((usd * 1_000_000).rounded()) }

/// A complete price table: per model, and per server-tool use.
public struct PriceTable: Sendable, Equatable {
    /// Where the shipped table's figures come from, and the day they were read.
    public static let shippedSource = "https://platform.claude.com/docs/en/about-claude/pricing"
    public static let shippedDate = "2026-12-06"

    public var models: [String: ModelPrice]
    /// Micro-dollars per use, by the name of the `usage.server_tool_use` counter (`web_search_requests`).
    public var serverTools: [String: Int64]

    public init(models: [String: ModelPrice], serverTools: [String: Int64]) {
        self.models = models
        self.serverTools = serverTools
    }

    /// The project's table: the Claude pricing page's per-model prices on `shippedDate`.
    public static let shipped: PriceTable = {
        let fromSonnet45: Int64 = 10
        var models: [String: ModelPrice] = [
            "claude-fable-5-2": .standard(input: 8, output: 40, cacheRead: 0.20, uplift: fromSonnet45),
            "claude-mythos-5-2": .standard(input: 8, output: 40, cacheRead: 0.20, uplift: fromSonnet45),
            "claude-fable-5-1": .standard(input: 10, output: 50, cacheRead: 0.25, uplift: fromSonnet45),
            "claude-mythos-5-1": .standard(input: 10, output: 50, cacheRead: 0.25, uplift: fromSonnet45),
            "claude-fable-5": .standard(input: 10, output: 50, cacheRead: 1, uplift: fromSonnet45),
            "claude-mythos-5": .standard(input: 10, output: 50, cacheRead: 1, uplift: fromSonnet45),
            "claude-opus-5-5": .standard(input: 4, output: 20, cacheRead: 0.20, uplift: fromSonnet45),
            "claude-opus-5": .standard(input: 5, output: 25, uplift: fromSonnet45),
            "claude-opus-4-8": .standard(input: 5, output: 25, uplift: fromSonnet45),
            "claude-opus-4-7": .standard(input: 5, output: 25, uplift: fromSonnet45),
            "claude-opus-4-6": .standard(input: 5, output: 25, uplift: fromSonnet45),
            "claude-opus-4-5": .standard(input: 5, output: 25, uplift: fromSonnet45),
            "claude-opus-4-1": .standard(input: 15, output: 75),
            "claude-opus-4": .standard(input: 15, output: 75),
            "claude-3-opus": .standard(input: 15, output: 75),
            "claude-sonnet-5-5": .standard(input: 2, output: 10, cacheRead: 0.10, uplift: fromSonnet45),
            "claude-sonnet-5": .standard(input: 2, output: 10, uplift: fromSonnet45),
            "claude-sonnet-4-6": .standard(input: 3, output: 15, uplift: fromSonnet45),
            "claude-sonnet-4-5": .standard(input: 3, output: 15, uplift: fromSonnet45),
            "claude-sonnet-4": .standard(input: 3, output: 15),
            "claude-3-7-sonnet": .standard(input: 3, output: 15),
            "claude-haiku-5-5": .standard(input: 0.10, output: 0.50, uplift: fromSonnet45),
            "claude-haiku-4-5": .standard(input: 1, output: 5, uplift: fromSonnet45),
            "claude-3-5-haiku": .standard(input: 0.80, output: 4),
            "claude-3-haiku": ModelPrice(input: micro(0.25), output: micro(1.25), cacheWrite5m: micro(0.30), cacheWrite1h: micro(0.50),
                                         cacheRead: micro(0.03)),
        ]
        // Sonnet 4 and 4.5 with the 1M context window: above 200K prompt tokens, $6 / $22.50.
        let sonnetLong = LongContextPrice(aboveInputTokens: 200_000, input: micro(6), output: micro(22.50), cacheWrite5m: micro(7.50),
                                          cacheWrite1h: micro(12), cacheRead: micro(0.60))
        for name in ["claude-sonnet-4-5", "claude-sonnet-4"] { models[name] = models[name]?.with(longContext: sonnetLong) }
        // Haiku 5.5: a prompt above 100K tokens pays 5× on every token of the request.
        models["claude-haiku-5-5"] = models["claude-haiku-5-5"]?.with(longContext: LongContextPrice(
            aboveInputTokens: 100_000, input: micro(0.50), output: micro(2.50), cacheWrite5m: micro(0.625), cacheWrite1h: micro(1), cacheRead: micro(0.05)))
        // Web search: $10 per 1,000 searches. Web fetch: its tokens only. Code execution is billed
        // by container-hour, which no reply reports: 0 per use here, an operator may price it.
        return PriceTable(models: models, serverTools: ["web_search_requests": 10_000, "web_fetch_requests": 0, "code_execution_requests": 0])
    }()

    /// The model's prices: its own ID, else the longest table name it starts with followed by
    /// `-` or `@` (`claude-sonnet-4-5-20250929`, `claude-sonnet-4-5@20250929`); Bedrock's
    /// `anthropic.`/`global.anthropic.` prefixes are ignored. Nil: the table has no price for it.
    public func price(for model: String) -> ModelPrice? {
        if let price = models[model] { return price }
        var name = Substring(model)
        if let range = name.range(of: "anthropic.") { name = name[range.upperBound...] }
        if let price = models[String(name)] { return price }
        var best: (length: Int, price: ModelPrice)?
        for (key, price) in models where name.hasPrefix(key) && key.count > (best?.length ?? 0) {
            let next = name.dropFirst(key.count).first
            if next == "-" || next == "@" || next == ":" { best = (key.count, price) }
        }
        return best?.price
    }

    /// What one reply cost, in micro-dollars: each kind of token at its price (the long-context
    /// tier's when the prompt is above its threshold), each server-tool use at its, and the
    /// regional uplift on the tokens when `regional`. Rounded to the nearest micro-dollar; every
    /// step saturates. A model the table does not price costs its server tools only.
    public func cost(model: String, usage: TokenUsage, regional: Bool = false) -> Int64 {
        var tools: Int64 = 0
        for (name, count) in usage.serverToolUse where count > 0 {
            if let each = serverTools[name] { tools.saturatingAdd(Self.product(count, each)) }
        }
        guard let price = price(for: model) else { return tools }
        let prompt = Int64.saturatingSum(Int64.saturatingSum(usage.inputTokens, usage.cacheCreationInputTokens), usage.cacheReadInputTokens)
        let oneHour = min(max(0, usage.cacheCreation1hInputTokens), usage.cacheCreationInputTokens)
        let fiveMinutes = usage.cacheCreationInputTokens - oneHour
        let rates: (input: Int64, output: Int64, w5: Int64, w1: Int64, read: Int64) =
            if let long = price.longContext, prompt > long.aboveInputTokens {
                (long.input, long.output, long.cacheWrite5m, long.cacheWrite1h, long.cacheRead)
            } else {
                (price.input, price.output, price.cacheWrite5m, price.cacheWrite1h, price.cacheRead)
            }
        var numerator: Int64 = 0
        for (tokens, rate) in [(usage.inputTokens, rates.input), (usage.outputTokens, rates.output), (fiveMinutes, rates.w5), (oneHour, rates.w1),
                               (usage.cacheReadInputTokens, rates.read)] {
            numerator.saturatingAdd(Self.product(tokens, rate))
        }
        if regional && price.regionalUpliftPercent > 0 {
            let scaled = Self.product(numerator, 100 + price.regionalUpliftPercent)
            numerator = scaled == .max ? .max : scaled / 100
        }
        let tokens = numerator == .max ? .max : (numerator + 500_000) / 1_000_000
        return Int64.saturatingSum(tokens, tools)
    }

    /// `a × b`, or `Int64.max` past it (both are never negative here).
    static func product(_ a: Int64, _ b: Int64) -> Int64 {
        let (value, overflow) = max(0, a).multipliedReportingOverflow(by: max(0, b))
        return overflow ? .max : value
    }

    /// The shipped table with an override's models and server tools laid over it.
    public func overlaid(with override: PriceTable) -> PriceTable {
        PriceTable(models: models.merging(override.models) { $1 }, serverTools: serverTools.merging(override.serverTools) { $1 })
    }
}

// MARK: The JSON operators read and write

/// `attestctl prices show --json`'s shape, in USD: what `prices import` reads back (other
/// top-level members, such as `source`, are ignored). Decoded strictly: a price is a number.
public struct PriceTableJSON: Codable, Sendable {
    public struct Model: Codable, Sendable {
        var input, output, cache_write_5m, cache_write_1h, cache_read: Double
        var regional_uplift_percent: Int?
        var long_context: LongContext?
    }
    public struct LongContext: Codable, Sendable {
        var above_input_tokens: Int
        var input, output, cache_write_5m, cache_write_1h, cache_read: Double
    }
    public var workspace: String?
    public var source: String?
    public var dated: String?
    public var effective_at: String?
    public var models: [String: Model]
    public var server_tools: [String: Double]?
}

extension PriceTable {
    /// The most models one table may hold (an import is read whole).
    public static let maxModels = 1_000
    /// The highest price accepted, in USD (per million tokens, or per use).
    public static let maxUSD: Double = 1_000_000

    public var json: PriceTableJSON {
        func usd(_ value: Int64) -> Double { Double(value) / 1_000_000 }
        let models = self.models.mapValues { price in
            PriceTableJSON.Model(input: usd(price.input), output: usd(price.output), cache_write_5m: usd(price.cacheWrite5m),
                                 cache_write_1h: usd(price.cacheWrite1h), cache_read: usd(price.cacheRead),
                                 regional_uplift_percent: Int(price.regionalUpliftPercent),
                                 long_context: price.longContext.map { long in
                                     PriceTableJSON.LongContext(above_input_tokens: Int(long.aboveInputTokens), input: usd(long.input),
                                                                output: usd(long.output), cache_write_5m: usd(long.cacheWrite5m),
                                                                cache_write_1h: usd(long.cacheWrite1h), cache_read: usd(long.cacheRead))
                                 })
        }
        return PriceTableJSON(models: models, server_tools: serverTools.mapValues(usd))
    }

    /// The table a JSON document describes: every price a number from 0 to `maxUSD`, every
    /// model all five prices, each name a model ID or a usage counter's.
    public init(json: PriceTableJSON) throws {
        guard json.models.count <= Self.maxModels else { throw AdminError("the prices JSON has more than \(Self.maxModels) models") }
        func amount(_ value: Double, _ what: String) throws -> Int64 {
            guard value.isFinite, (0...Self.maxUSD).contains(value) else { throw AdminError("\(what): expected a price in USD from 0 to \(Int(Self.maxUSD))") }
            return micro(value)
        }
        var models: [String: ModelPrice] = [:]
        for (name, entry) in json.models {
            guard IntegrationPolicy.isValidModelID(name) else { throw AdminError("\"\(name.prefix(64))\" is not a model ID") }
            var price = ModelPrice(input: try amount(entry.input, "models.\(name).input"), output: try amount(entry.output, "models.\(name).output"),
                                   cacheWrite5m: try amount(entry.cache_write_5m, "models.\(name).cache_write_5m"),
                                   cacheWrite1h: try amount(entry.cache_write_1h, "models.\(name).cache_write_1h"),
                                   cacheRead: try amount(entry.cache_read, "models.\(name).cache_read"))
            if let percent = entry.regional_uplift_percent {
                guard (0...1000).contains(percent) else { throw AdminError("models.\(name).regional_uplift_percent: expected 0 to 1000") }
                price.regionalUpliftPercent = Int64(percent)
            }
            if let long = entry.long_context {
                guard long.above_input_tokens > 0 else { throw AdminError("models.\(name).long_context.above_input_tokens: expected above 0") }
                let at = "models.\(name).long_context."
                price.longContext = LongContextPrice(aboveInputTokens: Int64(long.above_input_tokens), input: try amount(long.input, at + "input"),
                                                     output: try amount(long.output, at + "output"),
                                                     cacheWrite5m: try amount(long.cache_write_5m, at + "cache_write_5m"),
                                                     cacheWrite1h: try amount(long.cache_write_1h, at + "cache_write_1h"),
                                                     cacheRead: try amount(long.cache_read, at + "cache_read"))
            }
            models[name] = price
        }
        var tools: [String: Int64] = [:]
        for (name, value) in json.server_tools ?? [:] {
            guard tools.count < 64, (1...64).contains(name.utf8.count),
                  name.utf8.allSatisfy({ (0x61...0x7a).contains($0) || (0x30...0x39).contains($0) || $0 == 0x5f }) else {
                throw AdminError("server_tools: \"\(name.prefix(64))\" is not a usage counter name (snake_case, at most 64 of them)")
            }
            tools[name] = try amount(value, "server_tools.\(name)")
        }
        self.init(models: models, serverTools: tools)
    }

    /// The stored form of an override (the `prices` column): the JSON above, keys sorted.
    public func encoded() -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return String(decoding: (try? encoder.encode(json)) ?? Data("{}".utf8), as: UTF8.self)
    }

    /// A table from its JSON text (a stored override, or a file an operator imports).
    public static func decode(_ text: String) throws -> PriceTable {
        let json: PriceTableJSON
        do { json = try JSONDecoder().decode(PriceTableJSON.self, from: Data(text.utf8)) } catch {
            throw AdminError("the prices JSON is not in the shape `attestctl prices show --json` prints: \(error)")
        }
        return try PriceTable(json: json)
    }
}

/// A workspace's override as stored: the whole table it priced with from `effectiveAt` on.
public struct StoredPriceTable: Sendable, Equatable {
    public let effectiveAt: Date
    public let table: PriceTable
    public let setBy: String

    public init(effectiveAt: Date, table: PriceTable, setBy: String) {
        self.effectiveAt = effectiveAt
        self.table = table
        self.setBy = setBy
    }
}

/// A workspace's budgets in money, in micro-dollars (0: none).
public struct MoneyBudget: Sendable, Equatable {
    public var monthlyMicroUSD: Int64
    public var dailyMicroUSD: Int64

    public init(monthlyMicroUSD: Int64 = 0, dailyMicroUSD: Int64 = 0) {
        self.monthlyMicroUSD = monthlyMicroUSD
        self.dailyMicroUSD = dailyMicroUSD
    }

    public var isOn: Bool { monthlyMicroUSD > 0 || dailyMicroUSD > 0 }
}

/// Price overrides and workspace budgets.
public protocol PriceStore: AnyObject, Sendable {
    /// The workspace's overrides, newest first.
    func priceTables(workspaceID: Int64) throws -> [StoredPriceTable]
    func addPriceTable(workspaceID: Int64, _ table: StoredPriceTable) throws
    /// Replaces the workspace's budgets; false when there is no such workspace.
    func setWorkspaceBudget(workspaceID: Int64, _ budget: MoneyBudget) throws -> Bool
    func workspaceBudget(workspaceID: Int64) throws -> MoneyBudget
}

/// The tables in force, per workspace, for the relay: the shipped one, or the workspace's newest
/// override. The token check reads the override's time with the grant (`TokenGrant.pricesAt`),
/// so a change is seen by the next request of every instance, and loaded once per instance.
public final class PriceBook: Sendable {
    let store: (any PriceStore)?
    private let cache = Mutex<[Int64: (at: Double, table: PriceTable)]>([:])

    public init(store: (any PriceStore)?) { self.store = store }

    /// The table for a workspace whose newest override is dated `pricesAt` (nil: none).
    public func table(workspaceID: Int64, pricesAt: Double?) -> PriceTable {
        guard let pricesAt, let store else { return .shipped }
        if let cached = cache.withLock({ $0[workspaceID] }), cached.at == pricesAt { return cached.table }
        guard let newest = try? store.priceTables(workspaceID: workspaceID).first else { return .shipped }
        let table = PriceTable.shipped.overlaid(with: newest.table)
        cache.withLock { $0[workspaceID] = (newest.effectiveAt.timeIntervalSince1970, table) }
        return table
    }
}
