import AttestWire
import CommandLineSupport
import Foundation
import TokenService

/// The Anthropic-compatible upstreams (`set-upstream-foundry`, `set-upstream-claude-platform-aws`)
/// and a workspace's list of upstreams (`--upstream LABEL [--priority N]` on every
/// `set-upstream-…`, `upstreams`, `remove-upstream`).
extension AdminCommands {
    static let foundryOptions: Set<String> = ["actor", "workspace", "resource", "base-url", "api-key-file", "endpoint-url", "model", "cloud-beta"]
    static let claudePlatformAWSOptions: Set<String> = ["actor", "workspace", "region", "anthropic-workspace-id", "api-key-file", "endpoint-url",
                                                        "model", "cloud-beta"]

    /// `set-upstream-foundry --actor EMAIL --workspace NAME (--resource NAME | --base-url URL)
    /// (--api-key-file FILE | Entra ID credentials) --model API_MODEL=DEPLOYMENT…`.
    static func setUpstreamFoundry(_ argv: [String]) throws {
        let arguments = try parse(argv, options: foundryOptions.union(entraCredentialOptions), flags: entraCredentialFlags)
        let actor = try Validate.email(try arguments.required("actor"))
        let workspace = try arguments.required("workspace")
        let entra = try entraCredentials(arguments)
        guard arguments.has(option: "api-key-file") != (entra != nil) else {
            throw UsageError("give exactly one of --api-key-file FILE and Microsoft Entra ID credentials (--tenant-id ID --client-id ID "
                             + "--client-secret-file FILE | --client-certificate-file PEM, or --managed-identity)")
        }
        let apiKey = arguments.has(option: "api-key-file") ? try readSecretFile(arguments, "api-key-file") : nil
        let (service, _) = try open(arguments)
        try service.setUpstreamFoundry(actor: actor, workspace: workspace, resource: try arguments.value("resource"), baseURL: try arguments.value("base-url"),
                                       apiKey: apiKey, entra: entra, endpointURL: try arguments.value("endpoint-url"), models: arguments.all("model"),
                                       extraBetas: arguments.all("cloud-beta"), secrets: try secretBox(arguments))
        try printUpstreamSet(service, workspace)
    }

    /// `set-upstream-claude-platform-aws --actor EMAIL --workspace NAME --region REGION
    /// --anthropic-workspace-id ID (--api-key-file FILE | AWS credentials) --model API_MODEL=MODEL…`.
    static func setUpstreamClaudePlatformAWS(_ argv: [String]) throws {
        let arguments = try parse(argv, options: claudePlatformAWSOptions.union(awsCredentialOptions))
        let actor = try Validate.email(try arguments.required("actor"))
        let workspace = try arguments.required("workspace")
        let region = try arguments.required("region"), anthropicWorkspace = try arguments.required("anthropic-workspace-id")
        var apiKey: String?, aws: AWSCredentialInput?, role: String?
        if arguments.has(option: "api-key-file") {
            guard !awsCredentialOptions.contains(where: { arguments.has(option: $0) }) else {
                throw UsageError("give either --api-key-file FILE or AWS credentials, not both")
            }
            apiKey = try readSecretFile(arguments, "api-key-file")
        } else if awsCredentialOptions.contains(where: { arguments.has(option: $0) }) {
            (aws, role) = try awsCredentials(arguments, allowsBedrockAPIKey: false)
        } else {
            throw UsageError("give --api-key-file FILE, or AWS credentials: --access-key-id ID --secret-key-file FILE [--session-token-file FILE], "
                             + "or --aws-credentials web-identity|container|instance")
        }
        let (service, _) = try open(arguments)
        try service.setUpstreamClaudePlatformAWS(actor: actor, workspace: workspace, region: region, anthropicWorkspaceID: anthropicWorkspace, apiKey: apiKey,
                                                 aws: aws, assumeRole: role, endpointURL: try arguments.value("endpoint-url"),
                                                 models: arguments.all("model"), extraBetas: arguments.all("cloud-beta"), secrets: try secretBox(arguments))
        try printUpstreamSet(service, workspace)
    }

    /// `set-upstream-bedrock --api mantle`: bedrock-mantle (`https://bedrock-mantle.REGION.api.aws/anthropic/v1/messages`),
    /// SigV4 for `bedrock-mantle` or a Bedrock API key as a bearer token.
    static func setUpstreamBedrockMantle(_ arguments: Arguments) throws {
        let actor = try Validate.email(try arguments.required("actor"))
        let workspace = try arguments.required("workspace")
        let (credentials, assumeRole) = try awsCredentials(arguments)
        let (service, _) = try open(arguments)
        try service.setUpstreamBedrockCompatible(actor: actor, workspace: workspace, service: .bedrockMantle, region: try arguments.required("region"),
                                                 aws: credentials, assumeRole: assumeRole, endpointURL: try arguments.value("endpoint-url"),
                                                 models: arguments.all("model"), extraBetas: arguments.all("cloud-beta"), secrets: try secretBox(arguments))
        try printUpstreamSet(service, workspace)
    }

    /// Runs a `set-upstream-…` command with its `--upstream LABEL [--priority N]` taken out: the
    /// upstream it sets is that one of the workspace's list (`UpstreamPlacement`).
    static func placed(_ argv: [String], _ body: ([String]) throws -> Void) throws {
        var rest: [String] = [], label: String?, priority: String?
        var i = 0
        while i < argv.count {
            let argument = argv[i]
            let name = argument.hasPrefix("--") ? String(argument.dropFirst(2).prefix { $0 != "=" }) : ""
            if name == "upstream" || name == "priority" {
                let value: String
                if let equals = argument.firstIndex(of: "=") {
                    value = String(argument[argument.index(after: equals)...])
                } else {
                    i += 1
                    guard i < argv.count else { throw UsageError("--\(name) needs a value") }
                    value = argv[i]
                }
                if name == "upstream" { label = value } else { priority = value }
            } else {
                rest.append(argument)
            }
            i += 1
        }
        guard label != nil || priority == nil else { throw UsageError("--priority goes with --upstream LABEL") }
        guard let label else { return try body(rest) }
        let placement = UpstreamPlacement(label: try Validate.upstreamLabel(label), priority: try priority.map(Validate.upstreamPriority))
        try UpstreamPlacement.$current.withValue(placement) { try body(rest) }
    }

    /// `upstreams NAME [--json]`, `upstreams NAME add|remove|order …`.
    static func upstreams(_ argv: [String]) throws {
        guard argv.count >= 2, ["add", "remove", "order"].contains(argv[1]) else { return try listUpstreams(argv) }
        let name = argv[0], rest = Array(argv.dropFirst(2))
        switch argv[1] {
        case "add":
            // `add --kind KIND --upstream LABEL …`: the kind's set-upstream command on this workspace.
            guard let kindIndex = rest.firstIndex(where: { $0 == "--kind" }), kindIndex + 1 < rest.count else {
                throw UsageError("upstreams NAME add --kind key|bedrock|vertex|foundry|claude-platform-aws --upstream LABEL [--priority N] "
                                 + "--actor EMAIL, then the options of that kind's set-upstream command")
            }
            let kind = rest[kindIndex + 1]
            var options = rest
            options.removeSubrange(kindIndex...(kindIndex + 1))
            guard options.contains(where: { $0 == "--upstream" || $0.hasPrefix("--upstream=") }) else { throw UsageError("add needs --upstream LABEL") }
            let command: ([String]) throws -> Void
            switch kind {
            case "key": command = setUpstreamKey
            case "bedrock": command = setUpstreamBedrock
            case "vertex": command = setUpstreamVertex
            case "foundry": command = setUpstreamFoundry
            case "claude-platform-aws": command = setUpstreamClaudePlatformAWS
            default: throw UsageError("--kind must be key, bedrock, vertex, foundry or claude-platform-aws")
            }
            try placed(options + ["--workspace", name], command)
        case "remove":
            try removeUpstream(rest + ["--workspace", name])
        default:
            let arguments = try parse(rest, options: ["actor", "upstream"])
            let actor = try Validate.email(try arguments.required("actor"))
            let labels = arguments.all("upstream")
            guard !labels.isEmpty else { throw UsageError("order --actor EMAIL --upstream LABEL [--upstream LABEL]…: every upstream, in the order to try them") }
            let (service, _) = try open(arguments)
            try service.orderUpstreams(actor: actor, workspace: name, labels: labels)
            print("upstreams of \(name), in the order they are tried: " + labels.joined(separator: ", "))
        }
    }

    /// `remove-upstream --actor EMAIL --workspace NAME --upstream LABEL`.
    static func removeUpstream(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "workspace", "upstream"])
        let actor = try Validate.email(try arguments.required("actor"))
        let workspace = try arguments.required("workspace"), label = try arguments.required("upstream")
        let (service, _) = try open(arguments)
        try service.removeUpstream(actor: actor, workspace: workspace, label: label)
        print("removed upstream \(label) of \(workspace)")
    }

    /// `upstreams NAME [--json]`: the list in the order it is tried, each upstream's kind, where
    /// it goes, its models and what may be shown of its credentials, and its state as stored
    /// (`sealed`; the cool-downs are each attestd's own: `attestd_upstream_state` and the console).
    static func listUpstreams(_ argv: [String]) throws {
        let arguments = try parse(argv, options: [], flags: ["json"], positional: 1)
        let (service, _) = try open(arguments)
        let (workspace, list) = try service.upstreams(workspace: arguments.positional[0])
        let pins = try service.cloudEndpointPins()
        let rows: [[String: Any]] = list.map { upstream in
            var record = upstreamRecord(upstream.key)
            record["label"] = upstream.label
            record["priority"] = upstream.priority
            record["state"] = storedState(upstream, pins: pins)
            return record
        }
        if arguments.has("json") {
            printJSON(["workspace": workspace.name, "upstreams": rows])
            return
        }
        guard !list.isEmpty else {
            print("workspace \(workspace.name): no upstreams (attestd uses --upstream-key-file, if given)")
            return
        }
        print("workspace \(workspace.name): \(list.count) upstream(s), in the order they are tried")
        for upstream in list {
            let settings = upstream.key.settings.map { AdminService.describe(upstream.key.kind, $0) } ?? "anthropic (the Anthropic API, attestd's --upstream-url)"
            print("\(upstream.priority)  \(upstream.label)  \(storedState(upstream, pins: pins))  \(settings); credentials ending in \(upstream.key.last4)")
        }
    }

    /// What the database says of an upstream: `sealed` (ready to be opened), or why an attestd
    /// would refuse it (its settings, or a host the deployment does not allow).
    static func storedState(_ upstream: WorkspaceUpstream, pins: CloudEndpointPins) -> String {
        guard let settings = upstream.key.settings else { return "sealed" }
        do {
            try Validate.storedCloudSettings(settings, kind: upstream.key.kind, pins: pins)
            return "sealed"
        } catch {
            return "refused: \(error)"
        }
    }
}
