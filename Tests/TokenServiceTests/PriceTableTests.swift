import Foundation
import Testing
import MessagesBody
@testable import TokenService

/// The price table's arithmetic, independently restated: at `$P / MTok`, one token costs P
/// micro-dollars, so a reply's cost in micro-dollars is Σ tokens × USD-per-MTok.
@Suite struct PriceTableTests {
    static func usage(input: Int64 = 0, output: Int64 = 0, write: Int64 = 0, write1h: Int64 = 0, read: Int64 = 0,
                      tools: [String: Int64] = [:]) -> TokenUsage {
        TokenUsage(inputTokens: input, outputTokens: output, cacheCreationInputTokens: write, cacheReadInputTokens: read,
                   cacheCreation1hInputTokens: write1h, serverToolUse: tools)
    }

    @Test func eachKindOfTokenIsPricedAtItsOwnRate() {
        let table = PriceTable.shipped
        // Claude Sonnet 4.6: $3 in, $15 out, $3.75 5-minute writes, $6 1-hour writes, $0.30 reads.
        let model = "claude-sonnet-4-6"
        #expect(table.cost(model: model, usage: Self.usage(input: 1000)) == 3000)
        #expect(table.cost(model: model, usage: Self.usage(output: 1000)) == 15_000)
        #expect(table.cost(model: model, usage: Self.usage(write: 1000)) == 3750)
        #expect(table.cost(model: model, usage: Self.usage(write: 1000, write1h: 1000)) == 6000)
        #expect(table.cost(model: model, usage: Self.usage(write: 1000, write1h: 400)) == 600 * 3750 / 1000 + 400 * 6)
        #expect(table.cost(model: model, usage: Self.usage(read: 1000)) == 300)
        // Rounded to the nearest micro-dollar: 3 reads at $0.30 are 0.9 µ$.
        #expect(table.cost(model: model, usage: Self.usage(read: 3)) == 1)
        // Opus 4.5 and Haiku 4.5 at theirs; a dated ID, Vertex's `@` and Bedrock's prefixes find their model.
        #expect(table.cost(model: "claude-opus-4-5-20251101", usage: Self.usage(input: 100, output: 100)) == 100 * 5 + 100 * 25)
        #expect(table.cost(model: "claude-haiku-4-5@20251001", usage: Self.usage(input: 100, output: 100)) == 100 * 1 + 100 * 5)
        #expect(table.cost(model: "global.anthropic.claude-sonnet-4-5-20250929-v1:0", usage: Self.usage(input: 10)) == 30)
        // `claude-opus-4` is not taken for `claude-opus-4-5`, nor a longer unknown name for a known one's prefix.
        #expect(table.cost(model: "claude-opus-4", usage: Self.usage(input: 1)) == 15)
        #expect(table.cost(model: "claude-opus-45", usage: Self.usage(input: 1)) == 0)
    }

    @Test func eachServerToolIsPricedPerUse() {
        let table = PriceTable.shipped
        // Web search: $10 per 1,000 searches; web fetch and code execution: their tokens only.
        #expect(table.cost(model: "claude-sonnet-4-6", usage: Self.usage(tools: ["web_search_requests": 3])) == 30_000)
        #expect(table.cost(model: "claude-sonnet-4-6", usage: Self.usage(tools: ["web_fetch_requests": 3, "code_execution_requests": 2])) == 0)
        // Even for a model the table does not price.
        #expect(table.cost(model: "unknown-model", usage: Self.usage(input: 1000, tools: ["web_search_requests": 1])) == 10_000)
    }

    @Test func theLongContextTierPricesEveryTokenOfALongPrompt() {
        let table = PriceTable.shipped
        // Sonnet 4.5: up to 200K prompt tokens at $3 / $15; above, $6 / $22.50 on every token.
        let short = Self.usage(input: 100_000, output: 1000, read: 100_000)
        #expect(table.cost(model: "claude-sonnet-4-5", usage: short) == 100_000 * 3 + 1000 * 15 + 100_000 * 3 / 10)
        let long = Self.usage(input: 100_000, output: 1000, read: 100_001)
        #expect(table.cost(model: "claude-sonnet-4-5", usage: long) == 100_000 * 6 + 1000 * 45 / 2 + (100_001 * 6 + 5) / 10)
        // Sonnet 4.6 has no such tier.
        #expect(table.cost(model: "claude-sonnet-4-6", usage: long) == 100_000 * 3 + 1000 * 15 + (100_001 * 3 + 5) / 10)
    }

    @Test func aRegionalEndpointAddsItsUpliftToTheTokens() {
        let table = PriceTable.shipped
        let usage = Self.usage(input: 1000, tools: ["web_search_requests": 1])
        #expect(table.cost(model: "claude-sonnet-4-5", usage: usage, regional: false) == 3000 + 10_000)
        #expect(table.cost(model: "claude-sonnet-4-5", usage: usage, regional: true) == 3300 + 10_000)
        // Models before Sonnet 4.5 have no regional uplift.
        #expect(table.cost(model: "claude-sonnet-4", usage: usage, regional: true) == 3000 + 10_000)
    }

    @Test func hugeCountsSaturateInsteadOfTrapping() {
        let usage = Self.usage(input: .max, output: .max, write: .max, read: .max, tools: ["web_search_requests": .max])
        #expect(PriceTable.shipped.cost(model: "claude-opus-4-1", usage: usage, regional: true) == .max)
    }

    @Test func theJSONShapeRoundTripsAndRejectsWhatIsNoPrice() throws {
        let table = PriceTable.shipped
        #expect(try PriceTable.decode(table.encoded()) == table)
        #expect(throws: AdminError.self) { try PriceTable.decode(#"{"models":{"m":{"input":true,"output":1,"cache_write_5m":1,"cache_write_1h":1,"cache_read":1}}}"#) }
        #expect(throws: AdminError.self) { try PriceTable.decode(#"{"models":{"m":{"input":-1,"output":1,"cache_write_5m":1,"cache_write_1h":1,"cache_read":1}}}"#) }
        #expect(throws: AdminError.self) { try PriceTable.decode(#"{"models":{"m":{"input":1,"output":1}}}"#) }
        #expect(throws: AdminError.self) { try PriceTable.decode(#"{"models":{"bad model":{"input":1,"output":1,"cache_write_5m":1,"cache_write_1h":1,"cache_read":1}}}"#) }
        let custom = try PriceTable.decode(#"{"models":{"m":{"input":1.5,"output":2,"cache_write_5m":3,"cache_write_1h":4,"cache_read":0.000001}},"server_tools":{"web_search_requests":0.02}}"#)
        #expect(custom.models["m"] == ModelPrice(input: 1_500_000, output: 2_000_000, cacheWrite5m: 3_000_000, cacheWrite1h: 4_000_000, cacheRead: 1))
        #expect(custom.serverTools == ["web_search_requests": 20_000])
    }

    @Test func moneyIsWrittenAndReadAsOperatorsDo() {
        #expect(MoneyText.microUSD("2000") == 2_000_000_000)
        #expect(MoneyText.microUSD("1.5") == 1_500_000)
        #expect(MoneyText.microUSD("0.000001") == 1)
        #expect(MoneyText.microUSD("0") == 0)
        for bad in ["", "-1", "1.", ".5", "1.0000001", "1e3", "1,5", "abc", "10000000000"] { #expect(MoneyText.microUSD(bad) == nil, "\(bad)") }
        #expect(MoneyText.usd(2_000_000_000) == "$2000.00")
        #expect(MoneyText.usd(1_234_567) == "$1.234567")
        #expect(MoneyText.usd(10_000) == "$0.01")
    }

    @Test func theForecastProjectsTheMonthsSpendToItsEnd() throws {
        // 2026-12-11 00:00 UTC: 10 of December's 31 days have passed.
        let time = Date(timeIntervalSince1970: 1_796_083_200 + 10 * 86_400)
        #expect(UsageClock.monthStart(of: time) == Date(timeIntervalSince1970: 1_796_083_200))
        let forecast = SpendForecast(monthToDateMicroUSD: 10_000_000, at: time)
        #expect(forecast.month == 202612)
        #expect(forecast.projectedMicroUSD == 31_000_000)
        // Budgets renew at midnight and on the 1st.
        #expect(BudgetPeriod.daily.secondsToRenewal(from: time.addingTimeInterval(3600)) == 82_800)
        #expect(BudgetPeriod.monthly.secondsToRenewal(from: time) == 21 * 86_400)
    }

    /// The reader takes the 1-hour writes from `usage.cache_creation`, on JSON replies and streams.
    @Test func theOneHourCacheWritesAreReadFromJSONAndStreams() {
        let json = #"{"model":"claude-sonnet-4-6","usage":{"input_tokens":5,"cache_creation_input_tokens":30,"cache_read_input_tokens":7,"output_tokens":9,"cache_creation":{"ephemeral_5m_input_tokens":10,"ephemeral_1h_input_tokens":20}}}"#
        let usage = UsageObject.ofReply(Array(json.utf8))
        #expect(usage?.cacheCreationInputTokens == 30 && usage?.cacheCreation1hInputTokens == 20)
        var reader = StreamUsageReader()
        let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":5,"
            + "\"cache_creation_input_tokens\":30,\"cache_creation\":{\"ephemeral_5m_input_tokens\":26,\"ephemeral_1h_input_tokens\":4},\"output_tokens\":1}}}\n\n"
            + "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\n"
        Array(stream.utf8).withUnsafeBytes { _ = reader.feed($0) }
        #expect(reader.usage.cacheCreationInputTokens == 30 && reader.usage.cacheCreation1hInputTokens == 4 && reader.usage.outputTokens == 3)
    }
}
