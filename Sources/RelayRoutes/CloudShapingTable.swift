import MessagesBody
import TokenService

/// What each cloud API takes of a Messages request, as data: for each top-level member, pass,
/// translate or refuse (`MemberRule`), and the betas it accepts. A request with anything else is
/// refused with a 400 that names it and the upstream, before anything is sent, so the device
/// never meets a cloud's opaque "Extra inputs are not permitted". docs/relay.md lists the table
/// with the public record behind each line.
enum CloudAPI: Sendable, Equatable {
    case bedrockInvoke
    case bedrockMessages
    case vertex
    /// The Anthropic-compatible kind's services: Microsoft Foundry, Claude Platform on AWS,
    /// bedrock-mantle and the Anthropic API itself (Bedrock's Messages API is `bedrockMessages`).
    case foundry
    case claudePlatformAWS
    case bedrockMantle
    case anthropicAPI

    init(kind: UpstreamKind, settings: CloudUpstreamSettings) {
        if kind == .compatible, let service = settings.compatible?.service {
            self = switch service {
            case .foundry: .foundry
            case .claudePlatformAWS: .claudePlatformAWS
            case .bedrock: .bedrockMessages
            case .bedrockMantle: .bedrockMantle
            case .anthropic: .anthropicAPI
            }
            return
        }
        self = kind == .vertex ? .vertex : (settings.api == .messages ? .bedrockMessages : .bedrockInvoke)
    }

    /// Anthropic's own stack behind another front door (Claude Platform on AWS, the API itself):
    /// every member and beta the API takes, the model named as mapped.
    var isAnthropicOperated: Bool { self == .claudePlatformAWS || self == .anthropicAPI }

    /// How operators and devices read it in an error.
    var name: String {
        switch self {
        case .bedrockInvoke: "Bedrock (InvokeModel)"
        case .bedrockMessages: "Bedrock (Messages API)"
        case .vertex: "Vertex AI"
        case .foundry: "Microsoft Foundry"
        case .claudePlatformAWS: "Claude Platform on AWS"
        case .bedrockMantle: "Bedrock (bedrock-mantle)"
        case .anthropicAPI: "the Anthropic API"
        }
    }

    /// The members the Messages API defines that every cloud takes as they are.
    static let common: Set<String> = ["messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p", "top_k",
                                      "tools", "tool_choice", "thinking", "context_management"]

    /// Whether the cloud model takes `output_config` (effort, and a structured output's format):
    /// reported for Opus and Sonnet 4.6, Opus 4.7 and later and the 5 family; Opus 4.5 takes
    /// `effort` only with its beta. Any other model answers it "Extra inputs are not permitted".
    static func takesOutputConfig(model: String, betas: [String]) -> Bool {
        let id = model.lowercased()
        let family = ["claude-opus-4-6", "claude-sonnet-4-6", "claude-opus-4-7", "claude-opus-4-8", "claude-opus-4-9",
                      "claude-opus-5", "claude-sonnet-5", "claude-haiku-5"]
        if family.contains(where: { id.contains($0) }) { return true }
        return id.contains("claude-opus-4-5") && betas.contains("effort-2025-11-24")
    }

    /// The member rules for a request to the cloud model `model` with `betas`.
    func rules(model: String, betas: [String]) -> @Sendable (String) -> MemberRule {
        let outputConfig = Self.takesOutputConfig(model: model, betas: betas)
        return { name in name == "output_config" ? (outputConfig ? .pass : .outputConfigHintOnly) : self.rule(name) }
    }

    /// The fate of top-level member `name` (`output_config` as for a model that does not take it).
    func rule(_ name: String) -> MemberRule {
        if Self.common.contains(name) { return .pass }
        // The model is sent as mapped (the relay adds it again); everything else as the API has it.
        if isAnthropicOperated { return name == "model" ? .remove : .pass }
        switch (self, name) {
        // Foundry and bedrock-mantle read the Messages API's own body: the mapped model (a
        // Foundry deployment's name) in `model`, `stream`, `metadata`. Foundry's server tools
        // (web search and fetch, code execution, MCP connectors, skills: litellm's
        // anthropic_beta_headers_config.json, block azure_ai) take their members as the API does.
        case (.foundry, "model"), (.bedrockMantle, "model"): return .remove
        case (.foundry, "metadata"), (.foundry, "mcp_servers"), (.foundry, "container"): return .pass
        case (.bedrockMantle, "metadata"): return .remove
        // Named in the URL (InvokeModel, rawPredict) or sent again by the relay: the mapped
        // model, this API's `anthropic_version`, the checked betas.
        case (.bedrockInvoke, "model"), (.vertex, "model"), (.bedrockMessages, "model"): return .remove
        case (_, "anthropic_version"), (_, "anthropic_beta"): return .remove
        // InvokeModel streams by its path; the others read `stream`.
        case (.bedrockInvoke, "stream"): return .remove
        case (_, "stream"): return .pass
        // Reported refused at the top level by InvokeModel and rawPredict: the same breakpoint
        // goes on the last cacheable block, where both take it.
        case (_, "cache_control"): return .moveCacheControl
        // `effort` is a hint a model may not take; `format` changes the answer and is refused.
        case (_, "output_config"): return .outputConfigHintOnly
        // `metadata.user_id` is for the API's abuse checks: rawPredict takes it, Bedrock does not.
        case (.vertex, "metadata"): return .pass
        case (_, "metadata"): return .remove
        // The API's own service tiers and geography mean nothing to a cloud's billing.
        case (_, "service_tier"), (_, "inference_geo"): return .remove
        // Server features of the Anthropic API (and `fallbacks`, refused before this) and
        // anything unknown.
        default: return .refuse
        }
    }

    /// Betas each cloud is documented or reported to accept.
    /// Betas each cloud is documented or reported to accept (docs/relay.md names the source of each).
    static let bedrockBetas: Set<String> = [
        "computer-use-2024-10-22", "computer-use-2025-01-24", "computer-use-2025-11-24", "token-efficient-tools-2025-02-19",
        "interleaved-thinking-2025-05-14", "output-128k-2025-02-19", "dev-full-thinking-2025-05-14", "context-1m-2025-08-07",
        "context-management-2025-06-27", "effort-2025-11-24", "tool-search-tool-2025-10-19", "tool-examples-2025-10-29",
        "fine-grained-tool-streaming-2025-05-14", "compact-2026-01-12", "dangerous-tool-use-2026-09-03",
        "thinking-binding-controls-2026-08-01", "thinking-display-updates-2026-08-18", "mid-conversation-output-config-2026-07-01",
        "mid-conversation-tool-changes-2026-07-01",
    ]
    static let vertexBetas: Set<String> = [
        "computer-use-2025-01-24", "computer-use-2025-11-24", "context-1m-2025-08-07", "context-management-2025-06-27",
        "interleaved-thinking-2025-05-14", "tool-search-tool-2025-10-19", "web-search-2025-03-05", "compact-2026-01-12",
        "compact-2026-09-04", "dangerous-tool-use-2026-09-03", "per-turn-control-2026-07-01", "thinking-binding-controls-2026-08-01",
        "thinking-display-updates-2026-08-18",
    ]
    /// Microsoft Foundry's: the non-null entries of litellm's anthropic_beta_headers_config.json,
    /// block `azure_ai` (what its maintainers found Foundry to take).
    static let foundryBetas: Set<String> = [
        "advanced-tool-use-2025-11-20", "code-execution-2025-08-25", "computer-use-2025-01-24", "computer-use-2025-11-24",
        "context-1m-2025-08-07", "context-management-2025-06-27", "dangerous-tool-use-2026-09-03", "effort-2025-11-24",
        "files-api-2025-04-14", "interleaved-thinking-2025-05-14", "mcp-client-2025-11-20", "mcp-client-2025-04-04",
        "per-turn-control-2026-07-01", "prompt-caching-scope-2026-01-05", "skills-2025-10-02", "structured-outputs-2025-11-13",
        "thinking-display-updates-2026-08-18", "web-fetch-2025-09-10", "web-search-2025-03-05",
    ]
    /// bedrock-mantle's: the same file's block `bedrock_mantle`.
    static let mantleBetas: Set<String> = [
        "claude-code-20250219", "compact-2026-01-12", "computer-use-2025-01-24", "computer-use-2025-11-24", "context-1m-2025-08-07",
        "context-management-2025-06-27", "dangerous-tool-use-2026-09-03", "effort-2025-11-24", "fine-grained-tool-streaming-2025-05-14",
        "interleaved-thinking-2025-05-14", "output-128k-2025-02-19", "per-turn-control-2026-07-01", "structured-outputs-2025-11-13",
        "thinking-binding-controls-2026-08-01", "thinking-display-updates-2026-08-18", "token-efficient-tools-2025-02-19",
        "tool-examples-2025-10-29", "tool-search-tool-2025-10-19", "web-search-2025-03-05",
    ]
    /// Betas the relay itself acts on and no cloud knows: consumed here, never sent (the user
    /// profile is read for the limits and the ledger).
    static let consumedBetas: Set<String> = ["user-profiles-2026-08-18"]

    /// The first of `betas` this API does not take (beyond what the owner allowed), if any.
    func refusedBeta(_ betas: [String], extra: [String]?) -> String? {
        // Anthropic's own stack takes the API's betas as the API does (and answers any it does not).
        if isAnthropicOperated { return nil }
        let accepted = switch self {
        case .vertex: Self.vertexBetas
        case .foundry: Self.foundryBetas
        case .bedrockMantle: Self.mantleBetas
        default: Self.bedrockBetas
        }
        return betas.first { !accepted.contains($0) && !Self.consumedBetas.contains($0) && !(extra ?? []).contains($0) }
    }

    /// The betas sent to the cloud: the request's, less what the relay consumes.
    static func sent(_ betas: [String]) -> [String] {
        var seen = Set<String>()
        return betas.filter { !consumedBetas.contains($0) && seen.insert($0).inserted }
    }
}
