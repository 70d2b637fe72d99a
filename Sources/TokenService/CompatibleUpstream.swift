import AttestCrypto
import CloudUpstreams
import Foundation

/// The services that take the Messages API as the Anthropic API defines it, each at its own base
/// URL with its own auth: one upstream kind (`UpstreamKind.compatible`) serves them all, with the
/// shaping table of the service (what it refuses; `CloudAPI` in the relay).
public enum CompatibleService: String, Sendable, Codable, CaseIterable {
    /// The Anthropic API itself (through this kind: a labelled upstream at any base URL).
    case anthropic
    /// Microsoft Foundry: `https://{resource}.services.ai.azure.com/anthropic/v1/messages`, the
    /// model being the deployment's name.
    case foundry
    /// Claude Platform on AWS: `https://aws-external-anthropic.{region}.api.aws/v1/messages`, with
    /// the `anthropic-workspace-id` header; SigV4 for `aws-external-anthropic`, or an API key.
    case claudePlatformAWS = "claude-platform-aws"
    /// Amazon Bedrock's Messages API (`/anthropic/v1/messages`), SigV4 for `bedrock`.
    case bedrock
    /// bedrock-mantle's Messages API (`https://bedrock-mantle.{region}.api.aws/anthropic/v1/messages`),
    /// SigV4 for `bedrock-mantle`.
    case bedrockMantle = "bedrock-mantle"

    /// How operators and devices read it in an error.
    public var name: String {
        switch self {
        case .anthropic: "the Anthropic API"
        case .foundry: "Microsoft Foundry"
        case .claudePlatformAWS: "Claude Platform on AWS"
        case .bedrock: "Bedrock (Messages API)"
        case .bedrockMantle: "Bedrock (bedrock-mantle)"
        }
    }

    /// The SigV4 service name its AWS credentials sign for (nil: not an AWS service).
    public var signingService: String? {
        switch self {
        case .claudePlatformAWS: "aws-external-anthropic"
        case .bedrock: "bedrock"
        case .bedrockMantle: "bedrock-mantle"
        case .anthropic, .foundry: nil
        }
    }
}

/// How an Anthropic-compatible upstream's requests carry its credentials.
public enum CompatibleAuth: String, Sendable, Codable, CaseIterable {
    /// An API key in `x-api-key` (the Anthropic API, Foundry's key, Claude Platform on AWS's key).
    case apiKey = "x-api-key"
    /// An API key as `Authorization: Bearer` (a Bedrock API key).
    case bearer
    /// AWS SigV4 for `CompatibleSettings.signingService` with AWS credentials.
    case sigv4
    /// Microsoft Entra ID: a bearer token from the client-credentials grant (a secret or a
    /// certificate), from the renewing credential source the settings name.
    case entra
    /// Microsoft Entra ID through a managed identity (IMDS or App Service's IDENTITY_ENDPOINT).
    case managedIdentity = "managed-identity"
}

/// What an Anthropic-compatible upstream needs besides its credentials, stored in the clear with
/// the rest of `CloudUpstreamSettings` and bound to the sealed credentials (`binding`).
public struct CompatibleSettings: Sendable, Equatable, Codable {
    public var service: CompatibleService
    /// The API's base URL, the path prefix before `/v1/messages` included
    /// (`https://r.services.ai.azure.com/anthropic`); `--endpoint-url` replaces its origin only.
    public var baseURL: String
    public var auth: CompatibleAuth
    /// SigV4's service name (with `auth` sigv4).
    public var signingService: String?
    /// Headers sent with every request (`anthropic-workspace-id`), names in lowercase.
    public var headers: [String: String]

    public init(service: CompatibleService, baseURL: String, auth: CompatibleAuth, signingService: String? = nil, headers: [String: String] = [:]) {
        self.service = service
        self.baseURL = baseURL
        self.auth = auth
        self.signingService = signingService
        self.headers = headers
    }

    enum CodingKeys: String, CodingKey {
        case service, auth, headers
        case baseURL = "base_url"
        case signingService = "signing_service"
    }

    /// `scheme://host[:port]` of a base URL.
    public static func origin(ofBaseURL url: String) -> String {
        guard let schemeEnd = url.range(of: "://") else { return url }
        let rest = url[schemeEnd.upperBound...]
        let authority = rest.prefix { $0 != "/" }
        return String(url[..<schemeEnd.upperBound]) + authority
    }

    /// The base URL's path (`/anthropic`), without a trailing '/': what comes before `/v1/messages`.
    public var basePath: String {
        var path = String(baseURL.dropFirst(Self.origin(ofBaseURL: baseURL).count))
        while path.hasSuffix("/") { path.removeLast() }
        return path
    }

    /// Each service's own base URL.
    public static func defaultBaseURL(_ service: CompatibleService, region: String, resource: String? = nil) -> String {
        switch service {
        case .anthropic: "https://api.anthropic.com"
        case .foundry: "https://\(resource ?? "-").services.ai.azure.com/anthropic"
        case .claudePlatformAWS: "https://aws-external-anthropic.\(region).api.aws"
        case .bedrock: "https://bedrock-runtime.\(region).amazonaws.com/anthropic"
        case .bedrockMantle: "https://bedrock-mantle.\(region).api.aws/anthropic"
        }
    }
}

/// One upstream of a workspace's ordered list: its label (`default` for the workspace's own
/// upstream, the one set without `--upstream`), its priority (lowest tried first) and its row.
public struct WorkspaceUpstream: Sendable, Equatable {
    /// The label of the workspace's own upstream (`workspace_upstream_keys`).
    public static let defaultLabel = "default"
    public let label: String
    public let priority: Int
    public let key: SealedUpstreamKey

    public init(label: String, priority: Int, key: SealedUpstreamKey) {
        self.label = label
        self.priority = priority
        self.key = key
    }

    public var isDefault: Bool { label == Self.defaultLabel }

    /// Tried in this order: priority, then label.
    public static func ordered(_ upstreams: [WorkspaceUpstream]) -> [WorkspaceUpstream] {
        upstreams.sorted { ($0.priority, $0.label) < ($1.priority, $1.label) }
    }
}

/// Where `setUpstream` puts what it sets: a labelled upstream of the workspace's list, at a
/// priority. A task-local, so that every `set-upstream-…` command (those of the credential
/// sources included) takes `--upstream LABEL [--priority N]` without each signature growing.
public struct UpstreamPlacement: Sendable, Equatable {
    public let label: String
    public let priority: Int?

    public init(label: String, priority: Int?) {
        self.label = label
        self.priority = priority
    }

    @TaskLocal public static var current: UpstreamPlacement?
}

extension AdminService {
    // MARK: Anthropic-compatible upstreams

    /// Sends the workspace's requests to Microsoft Foundry: `--resource NAME` (its own host) or
    /// `--base-url URL`, the models mapped to deployment names; the API key sent as `x-api-key`,
    /// or a Microsoft Entra ID token (`entra`: client credentials or a managed identity, as a
    /// bearer token). Owners and the primary owner only; audited without the credentials.
    public func setUpstreamFoundry(actor: String, workspace name: String, resource: String?, baseURL: String?, apiKey: String? = nil,
                                   entra: EntraCredentialInput? = nil, endpointURL: String? = nil, models: [String], extraBetas: [String] = [],
                                   secrets: SecretBox) throws {
        let base: String
        switch (Validate.given(resource), Validate.given(baseURL)) {
        case (let resource?, nil): base = CompatibleSettings.defaultBaseURL(.foundry, region: "", resource: try Validate.foundryResource(resource))
        case (nil, let url?): base = try Validate.cloudURL(url, what: "the base URL", path: true)
        default: throw AdminError("give either --resource NAME or --base-url URL")
        }
        var settings = CloudUpstreamSettings(region: "global", endpointURL: try Validate.given(endpointURL).map { try Validate.cloudURL($0, what: "the endpoint URL") },
                                             models: try Validate.modelMappings(models), extraBetas: try Validate.cloudBetas(extraBetas),
                                             compatible: CompatibleSettings(service: .foundry, baseURL: base, auth: .apiKey))
        switch (apiKey, entra) {
        case (let key?, nil):
            let key = try Validate.cloudSecret(key, what: "the API key", limit: 512)
            try setCompatible(actor: actor, workspace: name, settings: settings, sealed: Array(key.utf8), last4: String(key.suffix(4)),
                              credentials: "API key ending in \(key.suffix(4))", secrets: secrets)
        case (nil, let entra?):
            let choice = try Validate.entraCredentials(entra)
            settings = choice.applied(to: settings)
            settings.compatible?.auth = entra.isManagedIdentity ? .managedIdentity : .entra
            try setCompatible(actor: actor, workspace: name, settings: settings, sealed: choice.sealed, last4: choice.last4,
                              credentials: choice.description, secrets: secrets)
        default:
            throw AdminError("give either --api-key-file FILE or Microsoft Entra ID credentials (--tenant-id, --client-id and a secret or certificate, or --managed-identity)")
        }
    }

    /// Sends the workspace's requests to Claude Platform on AWS in `region`, to the Anthropic
    /// workspace `anthropicWorkspaceID` (its `anthropic-workspace-id` header), with an API key
    /// (`x-api-key`) or AWS credentials (SigV4 for `aws-external-anthropic`). Owners and the
    /// primary owner only; audited without the credentials.
    public func setUpstreamClaudePlatformAWS(actor: String, workspace name: String, region: String, anthropicWorkspaceID: String,
                                             apiKey: String? = nil, aws: AWSCredentialInput? = nil, assumeRole: String? = nil,
                                             endpointURL: String? = nil, models: [String], extraBetas: [String] = [], secrets: SecretBox) throws {
        let region = try Validate.cloudRegion(region)
        let workspaceID = try Validate.anthropicWorkspaceID(anthropicWorkspaceID)
        let service = CompatibleService.claudePlatformAWS
        var settings = CloudUpstreamSettings(region: region, endpointURL: try Validate.given(endpointURL).map { try Validate.cloudURL($0, what: "the endpoint URL") },
                                             models: try Validate.modelMappings(models), extraBetas: try Validate.cloudBetas(extraBetas),
                                             compatible: CompatibleSettings(service: service, baseURL: CompatibleSettings.defaultBaseURL(service, region: region),
                                                                            auth: .apiKey, headers: ["anthropic-workspace-id": workspaceID]))
        switch (apiKey, aws) {
        case (let key?, nil):
            guard Validate.given(assumeRole) == nil else { throw AdminError("--assume-role needs AWS credentials to sign with; an API key is not one") }
            let key = try Validate.cloudSecret(key, what: "the API key", limit: 512)
            try setCompatible(actor: actor, workspace: name, settings: settings, sealed: Array(key.utf8), last4: String(key.suffix(4)),
                              credentials: "API key ending in \(key.suffix(4))", secrets: secrets)
        case (nil, let aws?):
            let choice = try Validate.awsCredentials(aws, assumeRole: assumeRole, allowsBedrockAPIKey: false)
            settings = choice.applied(to: settings)
            settings.compatible?.auth = .sigv4
            settings.compatible?.signingService = service.signingService
            try setCompatible(actor: actor, workspace: name, settings: settings, sealed: choice.sealed, last4: choice.last4,
                              credentials: choice.description, secrets: secrets)
        default:
            throw AdminError("give either --api-key-file FILE or AWS credentials (--access-key-id ID --secret-key-file FILE, or --aws-credentials)")
        }
    }

    /// Sends the workspace's requests to Bedrock's Messages API or bedrock-mantle through the
    /// Anthropic-compatible kind: SigV4 for `bedrock` or `bedrock-mantle`, or a Bedrock API key
    /// as a bearer token.
    public func setUpstreamBedrockCompatible(actor: String, workspace name: String, service: CompatibleService, region: String, aws: AWSCredentialInput,
                                             assumeRole: String? = nil, endpointURL: String? = nil, models: [String], extraBetas: [String] = [],
                                             secrets: SecretBox) throws {
        guard service == .bedrock || service == .bedrockMantle else { throw AdminError("not a Bedrock service: \(service.rawValue)") }
        let region = try Validate.cloudRegion(region)
        let choice = try Validate.awsCredentials(aws, assumeRole: assumeRole)
        var settings = CloudUpstreamSettings(region: region, endpointURL: try Validate.given(endpointURL).map { try Validate.cloudURL($0, what: "the endpoint URL") },
                                             models: try Validate.modelMappings(models), extraBetas: try Validate.cloudBetas(extraBetas),
                                             compatible: CompatibleSettings(service: service, baseURL: CompatibleSettings.defaultBaseURL(service, region: region),
                                                                            auth: .sigv4, signingService: service.signingService))
        settings = choice.applied(to: settings)
        if choice.source == .bedrockAPIKey {
            settings.compatible?.auth = .bearer
            settings.compatible?.signingService = nil
        }
        try setCompatible(actor: actor, workspace: name, settings: settings, sealed: choice.sealed, last4: choice.last4, credentials: choice.description,
                          secrets: secrets)
    }

    /// Sends the workspace's requests to the Anthropic API at `baseURL` (a gateway, another
    /// region's endpoint) through the Anthropic-compatible kind: the key as `x-api-key`, the models
    /// mapped (a labelled upstream of a list needs a map to know what it serves).
    public func setUpstreamAnthropicCompatible(actor: String, workspace name: String, baseURL: String, apiKey: String, models: [String],
                                               secrets: SecretBox) throws {
        let key = try Validate.upstreamKey(apiKey)
        let settings = CloudUpstreamSettings(region: "global", models: try Validate.modelMappings(models),
                                             compatible: CompatibleSettings(service: .anthropic, baseURL: try Validate.cloudURL(baseURL, what: "the base URL", path: true),
                                                                            auth: .apiKey))
        try setCompatible(actor: actor, workspace: name, settings: settings, sealed: Array(key.utf8), last4: String(key.suffix(4)),
                          credentials: "key ending in \(key.suffix(4))", secrets: secrets)
    }

    private func setCompatible(actor: String, workspace name: String, settings: CloudUpstreamSettings, sealed: [UInt8], last4: String,
                               credentials: String, secrets: SecretBox) throws {
        try Validate.storedCompatible(settings.compatible)
        try Validate.pinned(settings, kind: .compatible, pins: CloudEndpointPins(try store.cloudEndpointPins()))
        try setUpstream(actor: actor, workspace: name, what: "set the upstream", kind: .compatible, settings: settings, credentials: sealed,
                        last4: last4, secrets: secrets, action: "workspace.upstream_set", detail: Self.describe(.compatible, settings) + "; " + credentials)
    }

    // MARK: The workspace's list of upstreams

    /// The workspace's upstreams in the order they are tried: its own (`default`) and its labelled ones.
    public func upstreams(workspace name: String) throws -> (workspace: Workspace, upstreams: [WorkspaceUpstream]) {
        let workspace = try existingWorkspace(name)
        return (workspace, WorkspaceUpstream.ordered(try store.workspaceUpstreams(workspaceID: workspace.id)))
    }

    /// Removes one upstream of the workspace's list (`default`: its own). Owners and the primary
    /// owner only; audited.
    public func removeUpstream(actor: String, workspace name: String, label: String) throws {
        let label = try Validate.upstreamLabel(label)
        let workspace = try existingWorkspace(name)
        _ = try requireRole(actor, in: workspace, "remove an upstream") { $0 == .primaryOwner || $0 == .owner }
        guard try store.removeWorkspaceUpstream(workspaceID: workspace.id, label: label) else {
            throw AdminError("workspace \(workspace.name) has no upstream labelled \(label) (attestctl workspaces upstreams \(workspace.name) lists them)")
        }
        try audit(actor: actor, "workspace.upstream_removed", detail: "\(workspace.name): upstream \(label)")
    }

    /// Puts the workspace's upstreams in this order (priorities 10, 20, …); every label of the
    /// list once. Owners and the primary owner only; audited.
    public func orderUpstreams(actor: String, workspace name: String, labels: [String]) throws {
        let labels = try labels.map(Validate.upstreamLabel)
        let workspace = try existingWorkspace(name)
        _ = try requireRole(actor, in: workspace, "order the upstreams") { $0 == .primaryOwner || $0 == .owner }
        let present = Set(try store.workspaceUpstreams(workspaceID: workspace.id).map(\.label))
        guard Set(labels) == present, labels.count == present.count else {
            throw AdminError("name every upstream of \(workspace.name) once, in the order to try them: " + present.sorted().joined(separator: " "))
        }
        let priorities = labels.enumerated().map { ($0.element, ($0.offset + 1) * 10) }
        guard try store.setWorkspaceUpstreamPriorities(workspaceID: workspace.id, priorities) else {
            throw AdminError("workspace \(workspace.name)'s upstreams changed meanwhile: look at them again")
        }
        try audit(actor: actor, "workspace.upstreams_ordered", detail: "\(workspace.name): " + labels.joined(separator: ", "))
    }
}

extension Validate {
    /// An upstream's label: 1 to 32 lowercase letters, digits and '-', a letter first.
    public static func upstreamLabel(_ text: String) throws -> String {
        let label = text.trimmingCharacters(in: .whitespaces)
        guard matches(label, 1...32, { isLowerOrDigit($0) || $0 == 0x2d }), let first = label.utf8.first, (0x61...0x7a).contains(first) else {
            throw AdminError("upstream label '\(label.prefix(40))' must be 1 to 32 lowercase letters, digits and '-', starting with a letter, such as anthropic or bedrock-east")
        }
        return label
    }

    /// A priority: 0 to 1,000,000 (lowest tried first).
    public static func upstreamPriority(_ text: String) throws -> Int {
        guard let value = Int(text.trimmingCharacters(in: .whitespaces)), (0...1_000_000).contains(value) else {
            throw AdminError("--priority must be a whole number from 0 to 1000000 (the lowest is tried first)")
        }
        return value
    }

    /// A Foundry resource's name: 2 to 64 lowercase letters, digits and '-', no '-' first or last.
    public static func foundryResource(_ text: String) throws -> String {
        let name = text.trimmingCharacters(in: .whitespaces).lowercased()
        guard matches(name, 2...64, { isLowerOrDigit($0) || $0 == 0x2d }), name.first != "-", name.last != "-" else {
            throw AdminError("--resource '\(name.prefix(70))' must be a Foundry resource's name: 2 to 64 letters, digits and '-' (the NAME of NAME.services.ai.azure.com)")
        }
        return name
    }

    /// An Anthropic workspace ID (`wrkspc_…`): 1 to 128 letters, digits, '_' and '-'.
    public static func anthropicWorkspaceID(_ text: String) throws -> String {
        let id = text.trimmingCharacters(in: .whitespaces)
        guard matches(id, 1...128, { isAlphanumeric($0) || $0 == 0x5f || $0 == 0x2d }) else {
            throw AdminError("--anthropic-workspace-id must be the workspace's ID as Claude Platform on AWS shows it (such as wrkspc_01AbC…): letters, digits, '_' and '-'")
        }
        return id
    }

    /// An Anthropic-compatible upstream's settings as read back: the rules they met when set.
    static func storedCompatible(_ compatible: CompatibleSettings?) throws {
        guard let compatible else { throw AdminError("an Anthropic-compatible upstream has no service settings") }
        guard try cloudURL(compatible.baseURL, what: "the base URL", path: true) == compatible.baseURL else {
            throw AdminError("the base URL is not in its stored form")
        }
        if compatible.auth == .sigv4 {
            guard let service = compatible.signingService, matches(service, 1...64, { isLowerOrDigit($0) || $0 == 0x2d }) else {
                throw AdminError("a SigV4 upstream needs its signing service's name")
            }
        }
        guard compatible.headers.count <= 8 else { throw AdminError("at most 8 static headers") }
        for (name, value) in compatible.headers {
            guard matches(name, 1...64, { isLowerOrDigit($0) || $0 == 0x2d }), !reservedHeaders.contains(name),
                  matches(value, 1...256, { $0 > 0x20 && $0 < 0x7f }) else {
                throw AdminError("static header \(name.prefix(64)) is not one this service sends")
            }
        }
    }

    /// Headers the relay writes itself: never a static header's.
    static let reservedHeaders: Set<String> = ["host", "authorization", "x-api-key", "content-type", "content-length", "accept", "anthropic-version",
                                               "anthropic-beta", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256", "connection",
                                               "transfer-encoding"]
}

extension EntraCredentialInput {
    /// A managed identity rather than an application's own credentials.
    var isManagedIdentity: Bool {
        if case .managedIdentity = self { return true }
        return false
    }
}
