// What the policy reads from a Messages request, defined beside the scan that reads it
// (`MessagesRequestBody`); TokenService re-exports these types, whose policy judges them.

/// A request's `fallbacks`, as far as the policy reads it.
public enum FallbacksInput: Sendable, Equatable {
    case none
    /// `"default"`: the API picks the fallback.
    case serverDefault
    /// `[{"model": …}, …]`, the models in order.
    case models([String])
}

/// A tool of the request that is not a client tool: a server tool, billed beyond its tokens.
public struct ServerToolInput: Sendable, Equatable {
    /// Its versioned `type` (`web_search_20260209`).
    public var type: String
    public var maxUses: Int?

    public init(type: String, maxUses: Int? = nil) {
        self.type = type
        self.maxUses = maxUses
    }
}

/// What the policy reads from a Messages request (a bounded scan of the body, and its headers).
public struct PolicyInput: Sendable {
    /// The top-level `model` string, as sent (nil when absent).
    public var model: String?
    /// The top-level `max_tokens` (nil when absent).
    public var maxTokens: Int?
    /// Why the body could not be read, when it could not.
    public var problem: String?
    /// What is wrong with a governed field (refused whatever the policy).
    public var malformed: String?
    public var fallbacks: FallbacksInput
    public var serverTools: [ServerToolInput]
    /// The `anthropic-beta` header values as sent; `betas` splits them, only when a policy asks
    /// (Foundation's trimming cost 5% of a relayed request's CPU when done for every request).
    public var betaHeaderValues: [String]
    /// The betas named in the body's `anthropic_beta` array (Bedrock's way of naming them).
    public var bodyBetas: [String] = []
    /// Every `anthropic-beta` value, split at commas, spaces and tabs trimmed, empty ones dropped,
    /// then every beta of the body's `anthropic_beta`: the policy checks them all.
    public var betas: [String] {
        var names: [String] = []
        for value in betaHeaderValues {
            for part in value.utf8.split(separator: UInt8(ascii: ",")) {
                let trimmed = part.drop { $0 == 0x20 || $0 == 0x09 }.reversed().drop { $0 == 0x20 || $0 == 0x09 }.reversed()
                if !trimmed.isEmpty { names.append(String(decoding: trimmed, as: UTF8.self)) }
            }
        }
        names.append(contentsOf: bodyBetas)
        return names
    }
    /// The `anthropic-user-profile-id`, when sent (valid: a bad one is in `malformed`).
    public var profile: String?
    /// The request spends tokens (`/v1/messages`; `count_tokens` does not), so the budget applies.
    public var spendsTokens: Bool

    public init(model: String? = nil, maxTokens: Int? = nil, problem: String? = nil, malformed: String? = nil, fallbacks: FallbacksInput = .none,
                serverTools: [ServerToolInput] = [], betaHeaderValues: [String] = [], profile: String? = nil, spendsTokens: Bool = true) {
        self.model = model
        self.maxTokens = maxTokens
        self.problem = problem
        self.malformed = malformed
        self.fallbacks = fallbacks
        self.serverTools = serverTools
        self.betaHeaderValues = betaHeaderValues
        self.profile = profile
        self.spendsTokens = spendsTokens
    }
}
