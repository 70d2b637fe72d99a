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
    /// `usage.server_tool_use`, by counter name.
    public var serverToolUse: [String: Int64] = [:]

    public init(inputTokens: Int64 = 0, outputTokens: Int64 = 0, cacheCreationInputTokens: Int64 = 0, cacheReadInputTokens: Int64 = 0,
                serverToolUse: [String: Int64] = [:]) {
        self.inputTokens = inputTokens
        self.outputTokens = outputTokens
        self.cacheCreationInputTokens = cacheCreationInputTokens
        self.cacheReadInputTokens = cacheReadInputTokens
        self.serverToolUse = serverToolUse
    }
}
