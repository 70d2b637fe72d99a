import CommandLineSupport
import TokenService

/// The credential options the `set-upstream-…` commands share: AWS's (`--access-key-id ID
/// --secret-key-file FILE [--session-token-file FILE]`, `--bedrock-api-key-file FILE`,
/// `--aws-credentials web-identity|container|instance`, each with an optional `--assume-role ARN`)
/// and Microsoft Entra ID's (`--tenant-id ID --client-id ID (--client-secret-file FILE |
/// --client-certificate-file PEM) [--scope SCOPE]` or `--managed-identity [--client-id ID]`).
/// Exactly one way must be given; secrets are read from files (or standard input), never flags.
extension AdminCommands {
    static let awsCredentialOptions: Set<String> = ["access-key-id", "secret-key-file", "session-token-file", "bedrock-api-key-file",
                                                    "aws-credentials", "assume-role"]
    static let entraCredentialOptions: Set<String> = ["tenant-id", "client-id", "client-secret-file", "client-certificate-file", "scope"]
    static let entraCredentialFlags: Set<String> = ["managed-identity"]

    /// The AWS credentials the arguments give, and the role to assume on top.
    static func awsCredentials(_ arguments: Arguments, allowsBedrockAPIKey: Bool = true) throws -> (AWSCredentialInput, assumeRole: String?) {
        let keys = arguments.has(option: "access-key-id") || arguments.has(option: "secret-key-file") || arguments.has(option: "session-token-file")
        let apiKey = arguments.has(option: "bedrock-api-key-file")
        let ambient = arguments.has(option: "aws-credentials")
        let ways = (allowsBedrockAPIKey ? "--access-key-id with --secret-key-file, --bedrock-api-key-file, or --aws-credentials"
                                        : "--access-key-id with --secret-key-file, or --aws-credentials")
        guard [keys, apiKey, ambient].filter({ $0 }).count == 1 else { throw UsageError("give exactly one of \(ways)") }
        let role = try arguments.value("assume-role")
        if apiKey {
            guard allowsBedrockAPIKey else { throw UsageError("--bedrock-api-key-file works only with set-upstream-bedrock") }
            return (.bedrockAPIKey(try readSecretFile(arguments, "bedrock-api-key-file")), role)
        }
        if ambient {
            let name = try arguments.required("aws-credentials")
            guard let kind = CredentialSourceKind(rawValue: name), CredentialSourceKind.ambientAWS.contains(kind) else {
                throw UsageError("--aws-credentials must be web-identity, container or instance")
            }
            return (.ambient(kind), role)
        }
        let sessionToken = arguments.has(option: "session-token-file") ? try readSecretFile(arguments, "session-token-file") : nil
        return (.keys(accessKeyID: try arguments.required("access-key-id"), secretKey: try readSecretFile(arguments, "secret-key-file"),
                      sessionToken: sessionToken), role)
    }

    /// The Entra ID credentials the arguments give; nil when they give none (an API key instead).
    static func entraCredentials(_ arguments: Arguments) throws -> EntraCredentialInput? {
        let managed = arguments.has("managed-identity")
        let secret = arguments.has(option: "client-secret-file"), certificate = arguments.has(option: "client-certificate-file")
        let scope = try arguments.value("scope")
        if managed {
            guard !secret, !certificate, !arguments.has(option: "tenant-id") else {
                throw UsageError("--managed-identity takes only --client-id (a user-assigned identity) and --scope")
            }
            return .managedIdentity(clientID: try arguments.value("client-id"), scope: scope)
        }
        guard secret || certificate || arguments.has(option: "tenant-id") || arguments.has(option: "client-id") else {
            guard scope == nil else { throw UsageError("--scope goes with Entra ID credentials") }
            return nil
        }
        guard secret != certificate else { throw UsageError("give one of --client-secret-file and --client-certificate-file with --tenant-id and --client-id") }
        let tenant = try arguments.required("tenant-id"), client = try arguments.required("client-id")
        if secret { return .clientSecret(tenantID: tenant, clientID: client, secret: try readSecretFile(arguments, "client-secret-file"), scope: scope) }
        return .clientCertificate(tenantID: tenant, clientID: client, pem: try readSecretFile(arguments, "client-certificate-file"), scope: scope)
    }
}
