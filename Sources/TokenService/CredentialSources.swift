import AttestCrypto
import CloudUpstreams
import Foundation

/// Where a cloud upstream's credentials come from. The kind and its non-secret parameters (role,
/// tenant, client, scope) are settings, bound into the seal; the secret material (static keys, a
/// Bedrock API key, a client secret, a certificate's key) is sealed. An ambient source (web
/// identity, container, instance, metadata server, managed identity) seals no secret: attestd
/// fetches and renews its credentials where it runs, through the endpoints its environment names
/// as the clouds' SDKs read them.
public enum CredentialSourceKind: String, Sendable, Codable, CaseIterable {
    /// AWS: a Bedrock API key, sent as `Authorization: Bearer` (sealed).
    case bedrockAPIKey = "bedrock-api-key"
    /// AWS: STS AssumeRoleWithWebIdentity with `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN` (EKS IRSA).
    case webIdentity = "web-identity"
    /// AWS: `AWS_CONTAINER_CREDENTIALS_FULL_URI` with `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (ECS, EKS Pod Identity).
    case container
    /// AWS: the EC2 instance role through IMDSv2 (`AWS_EC2_METADATA_SERVICE_ENDPOINT`).
    case instance
    /// Google: the metadata server (GCE, Cloud Run, GKE Workload Identity; `GCE_METADATA_HOST`).
    case metadataServer = "metadata-server"
    /// Azure: client credentials with a client secret (sealed).
    case clientSecret = "client-secret"
    /// Azure: client credentials with a certificate's signed assertion (the PEM sealed).
    case clientCertificate = "client-certificate"
    /// Azure: managed identity, through IMDS or App Service's `IDENTITY_ENDPOINT`.
    case managedIdentity = "managed-identity"

    /// The scope an Entra ID token is asked for when none is given: Azure AI services' (Cognitive
    /// Services) audience, as Anthropic's Foundry documentation passes it to
    /// `get_bearer_token_provider`.
    public static let defaultEntraScope = "https://cognitiveservices.azure.com/.default"

    /// The AWS kinds `--aws-credentials` names.
    public static let ambientAWS: [CredentialSourceKind] = [.webIdentity, .container, .instance]

    /// Whether the kind seals no secret of its own.
    public var isAmbient: Bool { [.webIdentity, .container, .instance, .metadataServer, .managedIdentity].contains(self) }
}

/// How an operator gives AWS credentials (`set-upstream-bedrock`, `set-upstream-claude-platform-aws`).
public enum AWSCredentialInput: Sendable {
    /// `--access-key-id ID --secret-key-file FILE [--session-token-file FILE]`.
    case keys(accessKeyID: String, secretKey: String, sessionToken: String?)
    /// `--bedrock-api-key-file FILE` (Bedrock only).
    case bedrockAPIKey(String)
    /// `--aws-credentials web-identity|container|instance`.
    case ambient(CredentialSourceKind)
}

/// How an operator gives Microsoft Entra ID credentials (`set-upstream-foundry`).
public enum EntraCredentialInput: Sendable {
    /// `--tenant-id ID --client-id ID --client-secret-file FILE [--scope SCOPE]`.
    case clientSecret(tenantID: String, clientID: String, secret: String, scope: String?)
    /// `--tenant-id ID --client-id ID --client-certificate-file PEM [--scope SCOPE]`.
    case clientCertificate(tenantID: String, clientID: String, pem: String, scope: String?)
    /// `--managed-identity [--client-id ID] [--scope SCOPE]`.
    case managedIdentity(clientID: String?, scope: String?)
}

/// Credentials as an owner gave them, checked: the settings that say where they come from, the
/// bytes to seal (`{}` for an ambient source: the seal then still binds the settings), what may
/// be shown of them, and a line for the audit trail (never a secret).
public struct CloudCredentialChoice: Sendable {
    public var source: CredentialSourceKind?
    public var assumeRole: String?
    public var tenantID: String?
    public var clientID: String?
    public var scope: String?
    public var sealed: [UInt8]
    public var last4: String
    public var description: String

    /// The settings with this choice's source fields.
    public func applied(to settings: CloudUpstreamSettings) -> CloudUpstreamSettings {
        var settings = settings
        settings.credentialSource = source
        settings.assumeRole = assumeRole
        settings.tenantID = tenantID
        settings.clientID = clientID
        settings.scope = scope
        return settings
    }
}

/// The sealed form of an ambient source: nothing secret, only a marker the seal covers.
let ambientSealed = Array("{}".utf8)

extension Validate {
    /// AWS credentials as given, with an optional role on top (`--assume-role ARN`).
    public static func awsCredentials(_ input: AWSCredentialInput, assumeRole: String?, allowsBedrockAPIKey: Bool = true) throws -> CloudCredentialChoice {
        let role = try given(assumeRole).map(roleARN)
        switch input {
        case .keys(let id, let secret, let token):
            let id = try awsAccessKeyID(id)
            let secret = try cloudSecret(secret, what: "the secret access key", limit: 256)
            let token = try given(token).map { try cloudSecret($0, what: "the session token", limit: 4096) }
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            let sealed = Array(try encoder.encode(AWSAccessKey(accessKeyID: id, secretAccessKey: secret, sessionToken: token)))
            let last4 = String(id.suffix(4))
            return CloudCredentialChoice(source: nil, assumeRole: role, sealed: sealed, last4: last4,
                                         description: "access key ending in \(last4)" + (role.map { ", assuming \($0)" } ?? ""))
        case .bedrockAPIKey(let key):
            guard allowsBedrockAPIKey else { throw AdminError("a Bedrock API key works only with Bedrock") }
            guard role == nil else { throw AdminError("--assume-role needs AWS credentials to sign with; a Bedrock API key is not one") }
            let key = try cloudSecret(key, what: "the Bedrock API key", limit: 8192)
            let last4 = String(key.suffix(4))
            return CloudCredentialChoice(source: .bedrockAPIKey, sealed: Array(key.utf8), last4: last4, description: "Bedrock API key ending in \(last4)")
        case .ambient(let kind):
            guard CredentialSourceKind.ambientAWS.contains(kind) else {
                throw AdminError("--aws-credentials must be web-identity, container or instance")
            }
            return CloudCredentialChoice(source: kind, assumeRole: role, sealed: ambientSealed, last4: "-",
                                         description: "\(kind.rawValue) credentials" + (role.map { ", assuming \($0)" } ?? ""))
        }
    }

    /// Microsoft Entra ID credentials as given; the scope defaults to `defaultEntraScope`.
    public static func entraCredentials(_ input: EntraCredentialInput) throws -> CloudCredentialChoice {
        switch input {
        case .clientSecret(let tenant, let client, let secret, let scope):
            let (tenant, client, scope) = (try tenantID(tenant), try entraClientID(client), try entraScope(scope))
            let secret = try cloudSecret(secret, what: "the client secret", limit: 1024)
            return CloudCredentialChoice(source: .clientSecret, tenantID: tenant, clientID: client, scope: scope, sealed: Array(secret.utf8),
                                         last4: "-", description: "Entra ID client \(client) of tenant \(tenant) with a client secret, scope \(scope)")
        case .clientCertificate(let tenant, let client, let pem, let scope):
            let (tenant, client, scope) = (try tenantID(tenant), try entraClientID(client), try entraScope(scope))
            guard pem.utf8.count <= 32 << 10 else { throw AdminError("the client certificate file must be at most 32 KiB") }
            let certificate: EntraClientCertificate
            do {
                certificate = try EntraClientCertificate(pem: Array(pem.utf8))
            } catch {
                throw AdminError("the client certificate file (a PEM certificate and its unencrypted RSA private key) does not load: \(error)")
            }
            let thumbprint = certificate.thumbprintSHA256
            return CloudCredentialChoice(source: .clientCertificate, tenantID: tenant, clientID: client, scope: scope, sealed: Array(pem.utf8),
                                         last4: String(thumbprint.suffix(4)),
                                         description: "Entra ID client \(client) of tenant \(tenant) with certificate x5t#S256 \(thumbprint), scope \(scope)")
        case .managedIdentity(let client, let scope):
            let client = try given(client).map(entraClientID)
            let scope = try entraScope(scope)
            return CloudCredentialChoice(source: .managedIdentity, clientID: client, scope: scope, sealed: ambientSealed, last4: "-",
                                         description: "managed identity" + (client.map { " \($0)" } ?? "") + ", scope \(scope)")
        }
    }

    /// An IAM role's ARN: `arn:PARTITION:iam::ACCOUNT:role/NAME`.
    public static func roleARN(_ text: String) throws -> String {
        let arn = text.trimmingCharacters(in: .whitespaces)
        let parts = arn.split(separator: ":", maxSplits: 5, omittingEmptySubsequences: false)
        guard parts.count == 6, parts[0] == "arn", parts[1].hasPrefix("aws"), parts[2] == "iam", parts[3].isEmpty,
              parts[4].count == 12, parts[4].allSatisfy(\.isNumber), parts[5].hasPrefix("role/"), parts[5].count > 5,
              matches(arn, 20...2048, { isAlphanumeric($0) || "+=,.@_-/:".utf8.contains($0) }) else {
            throw AdminError("--assume-role must be a role's ARN, such as arn:aws:iam::123456789012:role/bedrock-relay")
        }
        return arn
    }

    /// A tenant: its GUID or a verified domain (letters, digits, '.', '-').
    static func tenantID(_ text: String) throws -> String {
        let tenant = text.trimmingCharacters(in: .whitespaces).lowercased()
        guard matches(tenant, 3...253, { isLowerOrDigit($0) || $0 == 0x2e || $0 == 0x2d }) else {
            throw AdminError("--tenant-id must be the directory's ID (a GUID) or one of its domains, such as contoso.onmicrosoft.com")
        }
        return tenant
    }

    /// An application's or managed identity's client ID: a GUID.
    static func entraClientID(_ text: String) throws -> String {
        let id = text.trimmingCharacters(in: .whitespaces).lowercased()
        let groups = id.split(separator: "-", omittingEmptySubsequences: false).map(\.count)
        guard groups == [8, 4, 4, 4, 12], id.utf8.allSatisfy({ isLowerOrDigit($0) && ($0 <= 0x39 || $0 <= 0x66) || $0 == 0x2d }) else {
            throw AdminError("--client-id must be the application's client ID, a GUID such as 00000000-0000-0000-0000-000000000000")
        }
        return id
    }

    /// A token scope: an https URI ending `/.default`, as the client-credentials grant takes it.
    static func entraScope(_ text: String?) throws -> String {
        guard let scope = given(text)?.trimmingCharacters(in: .whitespaces) else { return CredentialSourceKind.defaultEntraScope }
        guard scope.hasPrefix("https://"), scope.hasSuffix("/.default"), matches(scope, 20...300, { $0 > 0x20 && $0 < 0x7f && $0 != 0x22 }) else {
            throw AdminError("--scope must be a resource's scope, https://…/.default, such as \(CredentialSourceKind.defaultEntraScope)")
        }
        return scope
    }
}

extension AdminService {
    /// Bedrock with any AWS credential source: static keys, a Bedrock API key, or an ambient
    /// source (web identity, container, instance), each optionally with a role assumed on top.
    public func setUpstreamBedrock(actor: String, workspace name: String, region: String, credentials input: AWSCredentialInput, assumeRole: String?,
                                   endpointURL: String? = nil, models: [String], api: BedrockAPI = .messages, extraBetas: [String] = [],
                                   secrets: SecretBox) throws {
        let region = try Validate.cloudRegion(region)
        let choice = try Validate.awsCredentials(input, assumeRole: assumeRole)
        let endpoint = try Validate.given(endpointURL).map { try Validate.cloudURL($0, what: "the endpoint URL") }
        let settings = choice.applied(to: CloudUpstreamSettings(region: region, endpointURL: endpoint, models: try Validate.modelMappings(models),
                                                                api: api, extraBetas: try Validate.cloudBetas(extraBetas)))
        try Validate.pinned(settings, kind: .bedrock, pins: CloudEndpointPins(try store.cloudEndpointPins()))
        try setUpstream(actor: actor, workspace: name, what: "set the upstream", kind: .bedrock, settings: settings, credentials: choice.sealed,
                        last4: choice.last4, secrets: secrets, action: "workspace.upstream_set",
                        detail: Self.describe(.bedrock, settings) + "; " + choice.description)
    }

    /// Vertex AI as the service account of the metadata server where attestd runs (GCE, Cloud
    /// Run, GKE Workload Identity): no key file at all.
    public func setUpstreamVertexFromMetadataServer(actor: String, workspace name: String, project: String, region: String, endpointURL: String? = nil,
                                                    models: [String], extraBetas: [String] = [], secrets: SecretBox) throws {
        let project = try Validate.cloudProject(project)
        let region = try Validate.cloudRegion(region)
        let endpoint = try Validate.given(endpointURL).map { try Validate.cloudURL($0, what: "the endpoint URL") }
        var settings = CloudUpstreamSettings(region: region, project: project, endpointURL: endpoint, models: try Validate.modelMappings(models),
                                             extraBetas: try Validate.cloudBetas(extraBetas))
        settings.credentialSource = .metadataServer
        try Validate.pinned(settings, kind: .vertex, pins: CloudEndpointPins(try store.cloudEndpointPins()))
        try setUpstream(actor: actor, workspace: name, what: "set the upstream", kind: .vertex, settings: settings, credentials: ambientSealed,
                        last4: "-", secrets: secrets, action: "workspace.upstream_set",
                        detail: Self.describe(.vertex, settings) + "; the metadata server's service account")
    }
}

extension Validate {
    /// A credential source's settings as read back: the kinds its upstream takes, and each
    /// parameter in the form an owner's was stored in.
    static func storedCredentialSource(_ settings: CloudUpstreamSettings, kind: UpstreamKind) throws {
        if let source = settings.credentialSource {
            let fits = switch source {
            case .bedrockAPIKey, .webIdentity, .container, .instance: kind == .bedrock || kind == .compatible
            case .metadataServer: kind == .vertex
            case .clientSecret, .clientCertificate, .managedIdentity: kind == .compatible
            }
            guard fits else { throw AdminError("credential source \(source.rawValue) does not serve a \(kind.rawValue) upstream") }
            let entra = [CredentialSourceKind.clientSecret, .clientCertificate, .managedIdentity].contains(source)
            guard entra || (settings.tenantID == nil && settings.clientID == nil && settings.scope == nil) else {
                throw AdminError("only an Entra ID source has a tenant, client or scope")
            }
            if entra {
                guard (settings.tenantID != nil) == (source != .managedIdentity) else { throw AdminError("the tenant does not fit the source") }
                if let tenant = settings.tenantID, try tenantID(tenant) != tenant { throw AdminError("the tenant is not in its stored form") }
                if let client = settings.clientID, try entraClientID(client) != client { throw AdminError("the client ID is not in its stored form") }
                guard let scope = settings.scope, try entraScope(scope) == scope else { throw AdminError("the scope is missing or not in its stored form") }
            }
        } else if settings.tenantID != nil || settings.clientID != nil || settings.scope != nil {
            throw AdminError("a tenant, client or scope without an Entra ID source")
        }
        if let role = settings.assumeRole {
            guard try roleARN(role) == role else { throw AdminError("the role to assume is not in its stored form") }
            guard settings.credentialSource == nil || CredentialSourceKind.ambientAWS.contains(settings.credentialSource!),
                  kind == .bedrock || kind == .compatible else { throw AdminError("a role to assume needs AWS credentials") }
        }
    }
}
