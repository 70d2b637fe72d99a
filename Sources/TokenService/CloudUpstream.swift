import CloudUpstreams
import Foundation

/// Where a workspace's Messages requests go. The Anthropic API is the default; a workspace that
/// buys Claude through its cloud sets Amazon Bedrock or Google Vertex AI instead.
public enum UpstreamKind: String, Sendable, Codable, CaseIterable {
    case anthropic, bedrock, vertex
    /// An Anthropic-compatible Messages API (`CompatibleService`): Microsoft Foundry, Claude
    /// Platform on AWS, Bedrock's Messages API or bedrock-mantle, or the Anthropic API itself,
    /// each by its base URL, auth mode, static headers and model map.
    case compatible
}

/// Which of Bedrock's APIs a workspace's requests use.
public enum BedrockAPI: String, Sendable, Codable, CaseIterable {
    /// `POST /anthropic/v1/messages`: the Messages API itself, for the newest models and
    /// inference profiles (the default).
    case messages
    /// `InvokeModel` and `InvokeModelWithResponseStream`: what Anthropic now calls legacy, kept
    /// for ARN-versioned models.
    case invoke
}

/// What a cloud upstream needs besides its credentials, stored in the clear (shown by
/// `attestctl workspaces show` and the console). The credentials are sealed apart.
public struct CloudUpstreamSettings: Sendable, Equatable, Codable {
    /// AWS region (Bedrock) or Google Cloud location (Vertex).
    public var region: String
    /// Google Cloud project (Vertex only).
    public var project: String?
    /// Replaces the cloud API's scheme, host and port (tests, private endpoints).
    public var endpointURL: String?
    /// Replaces the service account's `token_uri` (Vertex only; tests, private endpoints).
    public var tokenURL: String?
    /// The API model a device names → the cloud's model ID. A model without one is refused.
    public var models: [String: String]
    /// The service account (Vertex only): who the calls are billed as, shown to operators.
    public var clientEmail: String?
    /// Bedrock's API: `messages` (the Messages API, `/anthropic/v1/messages`), or `invoke`
    /// (InvokeModel, for ARN-versioned legacy models). Nil: a workspace set up before the choice
    /// existed, which keeps InvokeModel.
    public var api: BedrockAPI?
    /// Betas the cloud has accepted since this service's table was written, allowed by an owner
    /// for this workspace (`--cloud-beta`).
    public var extraBetas: [String]?
    /// An Anthropic-compatible upstream's service, base URL, auth mode and static headers
    /// (`CompatibleSettings`); nil for the other kinds.
    public var compatible: CompatibleSettings?
    /// Where the credentials come from (`CredentialSourceKind`); nil: the sealed static keys or
    /// service-account key file, as every upstream before renewing sources existed.
    public var credentialSource: CredentialSourceKind?
    /// The role assumed with STS AssumeRole on top of the AWS source (`--assume-role`).
    public var assumeRole: String?
    /// Microsoft Entra ID: the directory (tenant) and the application or managed identity's client ID.
    public var tenantID: String?
    public var clientID: String?
    /// The scope an Entra ID token is asked for (nil: `CredentialSourceKind.defaultEntraScope`).
    public var scope: String?

    public init(region: String, project: String? = nil, endpointURL: String? = nil, tokenURL: String? = nil,
                models: [String: String], clientEmail: String? = nil, api: BedrockAPI? = nil, extraBetas: [String]? = nil,
                compatible: CompatibleSettings? = nil) {
        self.compatible = compatible
        self.region = region
        self.project = project
        self.endpointURL = endpointURL
        self.tokenURL = tokenURL
        self.models = models
        self.clientEmail = clientEmail
        self.api = api
        self.extraBetas = extraBetas
    }

    enum CodingKeys: String, CodingKey {
        case region, project, models, api, compatible
        case endpointURL = "endpoint_url"
        case tokenURL = "token_url"
        case clientEmail = "client_email"
        case extraBetas = "extra_betas"
        case credentialSource = "credential_source"
        case assumeRole = "assume_role"
        case tenantID = "tenant_id"
        case clientID = "client_id"
        case scope
    }

    /// The stored form (the `settings` column): JSON with sorted keys.
    public func encoded() -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(self)) ?? Data("{}".utf8), as: UTF8.self)
    }

    public static func decode(_ text: String) throws -> CloudUpstreamSettings {
        try JSONDecoder().decode(CloudUpstreamSettings.self, from: Data(text.utf8))
    }

    /// Where a cloud's API is when no endpoint URL replaces it.
    public func defaultOrigin(kind: UpstreamKind) -> String? {
        switch kind {
        case .anthropic: nil
        case .compatible: compatible.map { CompatibleSettings.origin(ofBaseURL: $0.baseURL) }
        case .bedrock: "https://bedrock-runtime.\(region).amazonaws.com"
        // The SDKs' hosts: `global` and the multi-regions have their own (a `global-` prefix
        // answers an HTML 404).
        case .vertex: switch region {
            case "global": "https://aiplatform.googleapis.com"
            case "us", "eu": "https://aiplatform.\(region).rep.googleapis.com"
            default: "https://\(region)-aiplatform.googleapis.com"
            }
        }
    }

    /// The origin requests go to: the endpoint URL, else the cloud's own.
    public func origin(kind: UpstreamKind) -> String? { endpointURL ?? defaultOrigin(kind: kind) }

    /// Every setting that says where the credentials go and as what, in one unambiguous byte
    /// string (each value length-prefixed, the models sorted): what a cloud upstream's credentials
    /// are sealed with, so that settings changed anywhere but through attestctl or the console
    /// (a database written by someone without the secrets key) no longer open them.
    public func binding(kind: UpstreamKind) -> [UInt8] {
        var out: [UInt8] = []
        func field(_ name: String, _ value: String?) {
            out += Array(name.utf8) + [UInt8(ascii: "=")]
            guard let value else {
                out += Array("-;".utf8)
                return
            }
            out += Array("\(value.utf8.count):".utf8) + Array(value.utf8) + [UInt8(ascii: ";")]
        }
        field("kind", kind.rawValue)
        field("region", region)
        field("project", project)
        field("endpoint_url", endpointURL)
        field("token_url", tokenURL)
        field("client_email", clientEmail)
        field("models", String(models.count))
        for (api, cloud) in models.sorted(by: { $0.key < $1.key }) {
            field("from", api)
            field("to", cloud)
        }
        // Settings added since: bound when set, so rows sealed before them keep their binding.
        if let api { field("api", api.rawValue) }
        if let extraBetas {
            field("extra_betas", String(extraBetas.count))
            for beta in extraBetas { field("beta", beta) }
        }
        if let compatible {
            field("service", compatible.service.rawValue)
            field("base_url", compatible.baseURL)
            field("auth", compatible.auth.rawValue)
            field("signing_service", compatible.signingService)
            field("headers", String(compatible.headers.count))
            for (name, value) in compatible.headers.sorted(by: { $0.key < $1.key }) {
                field("header", name)
                field("value", value)
            }
        }
        // Where the credentials come from and as whom: a row whose source, role, tenant, client
        // or scope was edited in the database no longer opens.
        if let credentialSource { field("credential_source", credentialSource.rawValue) }
        if let assumeRole { field("assume_role", assumeRole) }
        if let tenantID { field("tenant_id", tenantID) }
        if let clientID { field("client_id", clientID) }
        if let scope { field("scope", scope) }
        return out
    }
}

/// A Bedrock workspace's AWS credentials, as sealed (their JSON).
public typealias AWSAccessKey = AWSCredentials

/// The hosts a cloud upstream's credentials may be sent to, for the whole deployment
/// (`attestctl cloud-endpoints allow`); empty: any host the URL rules allow. An entry is a host
/// name or address, or `*.` and a domain for its subdomains.
public struct CloudEndpointPins: Sendable, Equatable {
    public let hosts: [String]

    public init(_ hosts: [String] = []) { self.hosts = hosts }

    public func allows(host: String) -> Bool {
        let host = host.lowercased()
        return hosts.isEmpty || hosts.contains { pin in
            pin.hasPrefix("*.") ? host.hasSuffix(String(pin.dropFirst())) && host.count > pin.count - 1 : host == pin
        }
    }

    /// The host of an absolute URL (`https://host[:port]/…`, `[v6]` without its brackets).
    public static func host(ofURL url: String) -> String? {
        guard let schemeEnd = url.range(of: "://") else { return nil }
        let authority = url[schemeEnd.upperBound...].prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        return Validate.host(of: Substring(authority.lowercased())).map { String($0) }
    }
}
