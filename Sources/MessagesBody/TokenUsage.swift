// What the ledger records of a reply, defined beside the readers that take it from a JSON reply
// or an SSE stream (`UsageObject`, `StreamUsageReader`); TokenService re-exports it.

/// Token counts from the upstream's own `usage`.
public struct TokenUsage: Sendable, Equatable {
    /// The most one reply may count of any kind: 2^40, far past any model's context, far below
    /// where sums of many replies could overflow. A count an upstream sends above it is taken as
    /// this (and the ledger's sums saturate), so no number from an upstream can trap the process.
    public static let maxCount: Int64 = 1 << 40

    /// A count as an upstream sent it, within 0...`maxCount`.
    public static func bounded(_ count: Int) -> Int64 { Int64(Swift.min(Swift.max(0, count), Int(maxCount))) }

    public var inputTokens: Int64 = 0
    public var outputTokens: Int64 = 0
    public var cacheCreationInputTokens: Int64 = 0
    public var cacheReadInputTokens: Int64 = 0
    /// The part of `cacheCreationInputTokens` written for an hour (`usage.cache_creation.
    /// ephemeral_1h_input_tokens`), priced at 2× input where a 5-minute write is 1.25×; the rest
    /// were written for 5 minutes. 0 where the upstream does not split them (InvokeModel).
    public var cacheCreation1hInputTokens: Int64 = 0
    /// `usage.server_tool_use`, by counter name.
    public var serverToolUse: [String: Int64] = [:]

    public init(inputTokens: Int64 = 0, outputTokens: Int64 = 0, cacheCreationInputTokens: Int64 = 0, cacheReadInputTokens: Int64 = 0,
                cacheCreation1hInputTokens: Int64 = 0, serverToolUse: [String: Int64] = [:]) {
        self.inputTokens = inputTokens
        self.outputTokens = outputTokens
        self.cacheCreationInputTokens = cacheCreationInputTokens
        self.cacheReadInputTokens = cacheReadInputTokens
        self.cacheCreation1hInputTokens = cacheCreation1hInputTokens
        self.serverToolUse = serverToolUse
    }
}

/// Counts an upstream reported, each only where it said one, laid over what was read before: a
/// stream's running totals (`message_delta`, Bedrock's `message_stop`), and the counts a cloud
/// bills by (Bedrock's `amazon-bedrock-invocationMetrics` on a stream's last event, its
/// `x-amzn-bedrock-*-token-count` headers on a JSON reply). Bedrock's input count, like the API's
/// `input_tokens`, leaves out the tokens read from or written to the cache.
public struct ReportedCounts: Sendable, Equatable {
    public var inputTokens: Int64?
    public var outputTokens: Int64?
    public var cacheCreationInputTokens: Int64?
    public var cacheReadInputTokens: Int64?

    public init(inputTokens: Int64? = nil, outputTokens: Int64? = nil, cacheCreationInputTokens: Int64? = nil, cacheReadInputTokens: Int64? = nil) {
        self.inputTokens = inputTokens
        self.outputTokens = outputTokens
        self.cacheCreationInputTokens = cacheCreationInputTokens
        self.cacheReadInputTokens = cacheReadInputTokens
    }

    public var isEmpty: Bool { inputTokens == nil && outputTokens == nil && cacheCreationInputTokens == nil && cacheReadInputTokens == nil }

    /// `usage` with each reported count in place of its own.
    public func laid(over usage: TokenUsage) -> TokenUsage {
        var usage = usage
        if let inputTokens { usage.inputTokens = inputTokens }
        if let outputTokens { usage.outputTokens = outputTokens }
        if let cacheCreationInputTokens { usage.cacheCreationInputTokens = cacheCreationInputTokens }
        if let cacheReadInputTokens { usage.cacheReadInputTokens = cacheReadInputTokens }
        return usage
    }

    /// These counts, and `other`'s where these have none.
    public func laid(over other: ReportedCounts) -> ReportedCounts {
        ReportedCounts(inputTokens: inputTokens ?? other.inputTokens, outputTokens: outputTokens ?? other.outputTokens,
                       cacheCreationInputTokens: cacheCreationInputTokens ?? other.cacheCreationInputTokens,
                       cacheReadInputTokens: cacheReadInputTokens ?? other.cacheReadInputTokens)
    }

    /// The counts InvokeModel reports in its reply's headers (names compared without case):
    /// `x-amzn-bedrock-input-token-count`, `-output-token-count`, `-cache-read-input-token-count`
    /// and `-cache-write-input-token-count`. A value that is not a decimal count is no count.
    public init(bedrockHeaders headers: [(name: String, value: String)]) {
        self.init()
        for (name, value) in headers {
            let lower = name.lowercased()
            guard lower.hasPrefix("x-amzn-bedrock-"), lower.hasSuffix("-token-count"), let count = Self.decimalCount(value) else { continue }
            switch lower {
            case "x-amzn-bedrock-input-token-count": inputTokens = count
            case "x-amzn-bedrock-output-token-count": outputTokens = count
            case "x-amzn-bedrock-cache-read-input-token-count": cacheReadInputTokens = count
            case "x-amzn-bedrock-cache-write-input-token-count": cacheCreationInputTokens = count
            default: break
            }
        }
    }

    /// Digits, with blanks around them, as a count bounded like any other (`TokenUsage.bounded`).
    static func decimalCount(_ text: String) -> Int64? {
        var value: Int64 = 0
        var digits = 0
        var trailing = false
        for byte in text.utf8 {
            if byte == 0x20 || byte == 0x09 {
                if digits > 0 { trailing = true }
                continue
            }
            guard !trailing, byte >= 0x30, byte <= 0x39 else { return nil }
            digits += 1
            value = value > TokenUsage.maxCount ? value : value * 10 + Int64(byte - 0x30)
        }
        return digits > 0 ? min(value, TokenUsage.maxCount) : nil
    }
}
