// No imports beyond the C library's memchr: the relay fuzzer (`make fuzz-relay`) compiles this
// target's files alone.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The upstream's own `usage` object, as the ledger records it, and the model that served.
public enum UsageObject {
    static let fields = JSONMemberScan.Names("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                                             "server_tool_use", "cache_creation")
    /// `usage.cache_creation`: the cache writes by lifetime.
    static let cacheCreation = JSONMemberScan.Names("ephemeral_1h_input_tokens")
    static let usage = JSONMemberScan.Names("usage")
    static let reply = JSONMemberScan.Names("usage", "model", "content")
    static let block = JSONMemberScan.Names("type", "to")
    static let model = JSONMemberScan.Names("model")
    /// Server-tool counters kept from one reply (the API reports a handful).
    static let serverToolCountersPerReply = 16

    /// The counts in the object at `bytes[range]`; absent or null fields count 0.
    static func read(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> TokenUsage? {
        guard let found = try? JSONMemberScan.members(of: fields, in: bytes, within: range) else { return nil }
        func count(_ slot: Int) -> Int64 { found[slot].flatMap { JSONMemberScan.integer(bytes, $0) }.map(TokenUsage.bounded) ?? 0 }
        var usage = TokenUsage(inputTokens: count(0), outputTokens: count(1), cacheCreationInputTokens: count(2), cacheReadInputTokens: count(3))
        if let tools = found[4] { usage.serverToolUse = serverToolUse(bytes, tools) }
        if let split = found[5], let oneHour = oneHourWrites(bytes, split) { usage.cacheCreation1hInputTokens = oneHour }
        return usage
    }

    /// `cache_creation.ephemeral_1h_input_tokens` of the object at `bytes[range]`, when it has one.
    static func oneHourWrites(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Int64? {
        guard let found = try? JSONMemberScan.members(of: cacheCreation, in: bytes, within: range), let value = found[0] else { return nil }
        return JSONMemberScan.integer(bytes, value).map(TokenUsage.bounded)
    }

    /// Every counter of `usage.server_tool_use` under its own name (a snake-case name of 1 to 64
    /// bytes, a count); an empty name is no counter.
    static func serverToolUse(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> [String: Int64] {
        var counters: [String: Int64] = [:]
        for (name, value) in JSONMemberScan.allMembers(in: bytes, within: range, limit: serverToolCountersPerReply) ?? []
        where (1...64).contains(name.utf8.count) && name.utf8.allSatisfy({ (0x61...0x7a).contains($0) || (0x30...0x39).contains($0) || $0 == 0x5f }) {
            if let count = JSONMemberScan.integer(bytes, value), count > 0 { counters[name] = TokenUsage.bounded(count) }
        }
        return counters
    }

    /// The top-level `usage` of a whole JSON reply.
    public static func ofReply(_ body: [UInt8]) -> TokenUsage? { servedReply(body).usage }

    /// A whole JSON reply's usage and the model that served: the last `fallback` block's
    /// `to.model`, else the reply's own `model`.
    public static func servedReply(_ body: [UInt8]) -> (usage: TokenUsage?, model: String?) {
        body.withUnsafeBytes { bytes in
            guard let found = try? JSONMemberScan.members(of: reply, in: bytes) else { return (nil, nil) }
            let usage = found[0].flatMap { read(bytes, $0) }
            var model = found[1].flatMap { JSONMemberScan.plainString(bytes, $0) }
            // Content is scanned block by block only when a fallback block can be in it.
            if let content = found[2], mentionsFallback(bytes, content),
               let blocks = try? JSONMemberScan.elements(in: bytes, content, limit: 100_000) {
                for block in blocks { if let to = fallbackTarget(bytes, block) { model = to } }
            }
            return (usage, model)
        }
    }

    /// `to.model` of a `fallback` content block at `bytes[range]`; nil for any other block.
    static func fallbackTarget(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> String? {
        guard let found = try? JSONMemberScan.members(of: block, in: bytes, within: range), let type = found[0],
              JSONMemberScan.plainString(bytes, type) == "fallback", let to = found[1],
              let inner = try? JSONMemberScan.members(of: model, in: bytes, within: to), let target = inner[0] else { return nil }
        return JSONMemberScan.plainString(bytes, target)
    }

    static let fallbackWord = Array(#""fallback""#.utf8)

    static func mentionsFallback(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Bool {
        guard range.count >= fallbackWord.count, let base = bytes.baseAddress else { return false }
        // memchr finds each `"f` candidate; the word is compared from there.
        var from = range.lowerBound
        let last = range.upperBound - fallbackWord.count
        while from <= last, let hit = memchr(base + from, 0x22, last - from + 1) {
            let at = base.distance(to: UnsafeRawPointer(hit))
            if bytes[at + 1] == fallbackWord[1], bytes[(at + 1)..<(at + fallbackWord.count)].elementsEqual(fallbackWord[1...]) { return true }
            from = at + 1
        }
        return false
    }

    /// The last `"usage": {…}` in the tail of a reply too large to hold (the API puts `usage` last).
    public static func ofTail(_ tail: [UInt8]) -> TokenUsage? {
        let marker = Array(#""usage""#.utf8)
        guard tail.count > marker.count else { return nil }
        var start = tail.count - marker.count
        while start >= 0 {
            if tail[start] == marker[0], tail[start..<(start + marker.count)].elementsEqual(marker) {
                var index = start + marker.count
                while index < tail.count, tail[index] == 0x20 || tail[index] == 0x0a || tail[index] == 0x0d || tail[index] == 0x09 || tail[index] == 0x3a { index += 1 }
                guard index < tail.count, tail[index] == 0x7b else { return nil }
                return tail.withUnsafeBytes { bytes in
                    var scanner = JSONMemberScan.Scanner(bytes: bytes.bindMemory(to: UInt8.self))
                    scanner.index = index
                    guard (try? scanner.skipValue()) != nil else { return nil }
                    return read(bytes, index..<scanner.index)
                }
            }
            start -= 1
        }
        return nil
    }
}

/// Reads usage from a Messages SSE stream as its bytes pass through, never holding the stream
/// back. `message_start.message.usage` gives the first counts; each `message_delta`'s usage is
/// the reply's running total on every kind of upstream (input, cache and output: a server-tool
/// turn grows `input_tokens` there too), so every count it carries replaces the one before.
/// Bedrock puts the cache counts on `message_stop`'s usage instead, beside
/// `amazon-bedrock-invocationMetrics`, whose counts are what Bedrock bills and so, where present,
/// the reply's. Only the data of those events is kept (bounded); text deltas are skipped as they
/// go by.
public struct StreamUsageReader: Sendable {
    public static let maxEventBytes = 1 << 20
    static let eventMembers = JSONMemberScan.Names("type", "message", "usage", "content_block", "amazon-bedrock-invocationMetrics")
    static let startMessage = JSONMemberScan.Names("usage", "model")
    /// Bedrock's invocation metrics: input (without the cache's), output, cache reads and writes.
    static let invocationMetrics = JSONMemberScan.Names("inputTokenCount", "outputTokenCount", "cacheReadInputTokenCount",
                                                        "cacheWriteInputTokenCount")

    /// The reply's usage as far as it was read: the running totals, under the counts Bedrock bills by.
    public var usage: TokenUsage { billed.laid(over: running) }
    /// The last counts of each kind the events carried.
    private var running = TokenUsage()
    /// `amazon-bedrock-invocationMetrics`, once seen.
    private var billed = ReportedCounts()
    /// The model that served: `message_start`'s, then the `to.model` of each `fallback` block.
    public private(set) var servingModel: String?
    public private(set) var sawStart = false
    /// `message_stop` arrived: the stream is complete.
    public private(set) var sawStop = false
    /// `content_block_delta` events seen: each carries at least one output token, so a stream cut
    /// before its closing `message_delta` is charged at least this many.
    public private(set) var deltaEvents: Int64 = 0

    private var line: [UInt8] = []
    /// The current line is data of an event we don't need: skip to its end without keeping it.
    private var skippingLine = false
    private var lineStarted = false
    private var event: [UInt8]?
    private var data: [UInt8] = []

    public init() {}

    private static let wanted: [[UInt8]] = ["message_start", "message_delta", "message_stop", "content_block_start"].map { Array($0.utf8) }

    /// Reads `chunk`; returns the offset just past the last event it completed (its blank line),
    /// or nil when it completed none: the relay forwards whole events only.
    @discardableResult
    public mutating func feed(_ chunk: UnsafeRawBufferPointer) -> Int? {
        var offset = 0
        var boundary: Int?
        while offset < chunk.count {
            let rest = UnsafeRawBufferPointer(rebasing: chunk[offset...])
            let newline = rest.firstIndex(of: 0x0a)
            let segment = UnsafeRawBufferPointer(rebasing: rest[..<(newline ?? rest.count)])
            if !lineStarted, let first = segment.first {
                lineStarted = true
                // A data line of an event named otherwise (content_block_delta, ping) is not kept;
                // `event:` lines and the blank line that ends the event always are.
                skippingLine = first == UInt8(ascii: "d") && (event.map { name in !Self.wanted.contains { $0 == name } } ?? false)
            }
            if !skippingLine && line.count + segment.count <= Self.maxEventBytes { line.append(contentsOf: segment) }
            guard let newline else { return boundary }
            let endedEvent = endLine()
            offset += newline + 1
            if endedEvent { boundary = offset }
        }
        return boundary
    }

    /// Ends the current line; true when it was the blank line that ends an event.
    private mutating func endLine() -> Bool {
        defer {
            line.removeAll(keepingCapacity: true)
            lineStarted = false
        }
        if skippingLine {
            skippingLine = false
            return false
        }
        if line.last == 0x0d { line.removeLast() }
        if line.isEmpty {
            dispatch()
            return true
        }
        if line.starts(with: "event:".utf8) {
            event = Array(line.dropFirst(6).drop { $0 == 0x20 })
        } else if line.starts(with: "data:".utf8) {
            var value = line.dropFirst(5)
            if value.first == 0x20 { value = value.dropFirst() }
            if !data.isEmpty { data.append(0x0a) }
            if data.count + value.count <= Self.maxEventBytes { data.append(contentsOf: value) }
        }
        return false
    }

    /// A blank line ends an event: read the usage of the ones that carry it.
    private mutating func dispatch() {
        defer {
            event = nil
            data.removeAll(keepingCapacity: true)
        }
        if let event, event.elementsEqual("content_block_delta".utf8) { deltaEvents += 1 }
        guard !data.isEmpty else { return }
        data.withUnsafeBytes { bytes in
            guard let found = try? JSONMemberScan.members(of: Self.eventMembers, in: bytes),
                  let typeRange = found[0], let type = JSONMemberScan.plainString(bytes, typeRange) else { return }
            switch type {
            case "message_start":
                guard let message = found[1], let inner = try? JSONMemberScan.members(of: Self.startMessage, in: bytes, within: message) else { return }
                if let model = inner[1].flatMap({ JSONMemberScan.plainString(bytes, $0) }) { servingModel = model }
                guard let usageRange = inner[0], let start = UsageObject.read(bytes, usageRange) else { return }
                running = start
                sawStart = true
            case "content_block_start":
                if let block = found[3], let to = UsageObject.fallbackTarget(bytes, block) { servingModel = to }
            case "message_delta":
                // Running totals: the last one seen is the reply's.
                if let usageRange = found[2] { takeRunningTotals(bytes, usageRange) }
            case "message_stop":
                sawStop = true
                // Bedrock's: the cache counts in its usage, then what it bills, which has the last word.
                if let usageRange = found[2] { takeRunningTotals(bytes, usageRange) }
                if let metrics = found[4] { billed = Self.invocationCounts(bytes, metrics).laid(over: billed) }
            case "content_block_delta" where event == nil:
                deltaEvents += 1  // a data-only delta (a named one was counted by its name above)
            default:
                break
            }
        }
    }

    /// The counts a usage object carries (integers only: an absent or null one changes nothing),
    /// each the reply's total so far; its server-tool counters likewise.
    private mutating func takeRunningTotals(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) {
        guard let fields = try? JSONMemberScan.members(of: UsageObject.fields, in: bytes, within: range) else { return }
        func count(_ slot: Int) -> Int64? { fields[slot].flatMap { JSONMemberScan.integer(bytes, $0) }.map(TokenUsage.bounded) }
        running = ReportedCounts(inputTokens: count(0), outputTokens: count(1), cacheCreationInputTokens: count(2), cacheReadInputTokens: count(3))
            .laid(over: running)
        if let tools = fields[4] { running.serverToolUse = UsageObject.serverToolUse(bytes, tools) }
        if let split = fields[5], let oneHour = UsageObject.oneHourWrites(bytes, split) { running.cacheCreation1hInputTokens = oneHour }
    }

    /// `amazon-bedrock-invocationMetrics`' counts (`inputTokenCount` leaves the cache's out, as
    /// `input_tokens` does; `cacheWriteInputTokenCount` is `cache_creation_input_tokens`).
    static func invocationCounts(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> ReportedCounts {
        guard let fields = try? JSONMemberScan.members(of: invocationMetrics, in: bytes, within: range) else { return ReportedCounts() }
        func count(_ slot: Int) -> Int64? { fields[slot].flatMap { JSONMemberScan.integer(bytes, $0) }.map(TokenUsage.bounded) }
        return ReportedCounts(inputTokens: count(0), outputTokens: count(1), cacheCreationInputTokens: count(3), cacheReadInputTokens: count(2))
    }
}
