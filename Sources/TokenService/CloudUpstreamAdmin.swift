import CloudUpstreams
import AttestCrypto
import Foundation

extension AdminService {
    // MARK: Cloud upstreams

    /// Sends the workspace's Messages requests to Amazon Bedrock. The AWS credentials are sealed
    /// like an upstream key and replace it (one upstream per workspace). Owners and the primary
    /// owner only; audited with the region and models, never the credentials.
    public func setUpstreamBedrock(actor: String, workspace name: String, region: String, accessKeyID: String, secretKey: String,
                                   sessionToken: String? = nil, endpointURL: String? = nil, models: [String], api: BedrockAPI = .messages,
                                   extraBetas: [String] = [], secrets: SecretBox) throws {
        let region = try Validate.cloudRegion(region)
        let accessKeyID = try Validate.awsAccessKeyID(accessKeyID)
        let secretKey = try Validate.cloudSecret(secretKey, what: "the secret access key", limit: 256)
        let sessionToken = try Validate.given(sessionToken).map { try Validate.cloudSecret($0, what: "the session token", limit: 4096) }
        let endpoint = try Validate.given(endpointURL).map { try Validate.cloudURL($0, what: "the endpoint URL") }
        let settings = CloudUpstreamSettings(region: region, endpointURL: endpoint, models: try Validate.modelMappings(models), api: api,
                                             extraBetas: try Validate.cloudBetas(extraBetas))
        try Validate.pinned(settings, kind: .bedrock, pins: CloudEndpointPins(try store.cloudEndpointPins()))
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let credentials = try encoder.encode(AWSAccessKey(accessKeyID: accessKeyID, secretAccessKey: secretKey, sessionToken: sessionToken))
        let last4 = String(accessKeyID.suffix(4))
        try setUpstream(actor: actor, workspace: name, what: "set the upstream", kind: .bedrock, settings: settings, credentials: Array(credentials),
                        last4: last4, secrets: secrets, action: "workspace.upstream_set",
                        detail: Self.describe(.bedrock, settings) + "; access key ending in \(last4)")
    }

    /// Sends the workspace's Messages requests to Google Vertex AI as this service account (its
    /// key file sealed as given, replacing any upstream key). Owners and the primary owner only;
    /// audited with the project, region, account and models, never the key.
    public func setUpstreamVertex(actor: String, workspace name: String, project: String, region: String, serviceAccountJSON: String,
                                  endpointURL: String? = nil, tokenURL: String? = nil, models: [String], extraBetas: [String] = [],
                                  secrets: SecretBox) throws {
        let project = try Validate.cloudProject(project)
        let region = try Validate.cloudRegion(region)
        let account = try Validate.serviceAccount(serviceAccountJSON)
        let endpoint = try Validate.given(endpointURL).map { try Validate.cloudURL($0, what: "the endpoint URL") }
        let token = try Validate.given(tokenURL).map { try Validate.cloudURL($0, what: "the token URL", path: true) }
        let settings = CloudUpstreamSettings(region: region, project: project, endpointURL: endpoint, tokenURL: token,
                                             models: try Validate.modelMappings(models), clientEmail: account.clientEmail,
                                             extraBetas: try Validate.cloudBetas(extraBetas))
        try Validate.pinned(settings, kind: .vertex, pins: CloudEndpointPins(try store.cloudEndpointPins()), accountTokenURI: account.tokenURI)
        try setUpstream(actor: actor, workspace: name, what: "set the upstream", kind: .vertex, settings: settings,
                        credentials: Array(serviceAccountJSON.utf8), last4: account.last4, secrets: secrets, action: "workspace.upstream_set",
                        detail: Self.describe(.vertex, settings) + "; key ending in \(account.last4)")
    }

    /// Seals a cloud upstream's credentials, sealed before settings were bound to them, again with
    /// the settings the row holds now: an owner's word that those settings are theirs (the command
    /// prints them first). Owners and the primary owner only; audited with the settings.
    public func bindUpstreamSettings(actor: String, workspace name: String, secrets: SecretBox, keyring: SecretsKeyring? = nil) throws -> SealedUpstreamKey {
        let workspace = try existingWorkspace(name)
        _ = try requireRole(actor, in: workspace, "bind the upstream's settings") { $0 == .primaryOwner || $0 == .owner }
        guard let row = try store.upstreamKey(workspaceID: workspace.id), row.kind != .anthropic, let settings = row.settings else {
            throw AdminError("workspace \(workspace.name) has no cloud upstream: only a Bedrock or Vertex AI upstream has settings to bind")
        }
        try Validate.storedCloudSettings(settings, kind: row.kind, pins: CloudEndpointPins(try store.cloudEndpointPins()))
        let bound = row.associatedData(workspaceID: workspace.id)
        let opener = keyring ?? SecretsKeyring(current: secrets)
        if (try? opener.open(row.sealed, associatedData: bound)) != nil {
            throw AdminError("workspace \(workspace.name)'s credentials are already sealed with these settings")
        }
        let credentials: [UInt8]
        do {
            credentials = try opener.open(row.sealed, associatedData: SealedUpstreamKey.associatedData(workspaceID: workspace.id))
        } catch {
            throw AdminError("workspace \(workspace.name)'s credentials open neither with their settings nor without them: "
                             + "set the upstream again (attestctl workspaces set-upstream-\(row.kind.rawValue))")
        }
        let sealed = try secrets.seal(credentials, associatedData: bound)
        let fresh = SealedUpstreamKey(sealed: sealed, last4: row.last4, setAt: row.setAt, setBy: row.setBy, kind: row.kind, settings: settings)
        guard try store.replaceSealedSecret(.upstream(workspaceID: workspace.id), old: row.sealed, new: sealed) else {
            throw AdminError("workspace \(workspace.name)'s upstream changed meanwhile: look at it again")
        }
        try audit(actor: actor, "workspace.upstream_settings_bound", detail: "\(workspace.name): " + Self.describe(row.kind, settings))
        return fresh
    }

    /// The hosts cloud credentials may be sent to, for the whole deployment (empty: any).
    public func cloudEndpointPins() throws -> CloudEndpointPins { CloudEndpointPins(try store.cloudEndpointPins()) }

    /// Replaces the hosts cloud credentials may be sent to (empty: any). Owners and the primary
    /// owner of the default workspace only: it is the deployment's. Returns the workspaces whose
    /// upstream the new list refuses (their requests then get 503 until an owner changes them).
    public func setCloudEndpointPins(actor: String, hosts: [String]) throws -> [String] {
        let actor = try Validate.email(actor)
        _ = try requireRole(actor, in: try defaultWorkspace(), "pin the deployment's cloud hosts") { $0 == .primaryOwner || $0 == .owner }
        let pins = CloudEndpointPins(try hosts.map(Validate.cloudEndpointPin).reduce(into: [String]()) { if !$0.contains($1) { $0.append($1) } })
        var refused: [String] = []
        for value in try store.sealedSecrets() {
            guard case .upstream(let id) = value.owner, value.upstreamKind != .anthropic, let settings = value.upstreamSettings else { continue }
            if (try? Validate.pinned(settings, kind: value.upstreamKind, pins: pins)) == nil { refused.append("workspace #\(id)") }
        }
        try store.setCloudEndpointPins(pins.hosts, at: now(), by: actor)
        try audit(actor: actor, "deployment.cloud_endpoints_pinned", detail: pins.hosts.isEmpty ? "any host" : pins.hosts.joined(separator: ", "))
        return refused
    }

    /// A cloud upstream in one line, for the audit trail: no credentials in it.
    public static func describe(_ kind: UpstreamKind, _ settings: CloudUpstreamSettings) -> String {
        var parts = ["\(kind.rawValue)" + (settings.api.map { " (\($0.rawValue) API)" } ?? "")]
        if let project = settings.project { parts.append("project \(project)") }
        parts.append("region \(settings.region)")
        if let account = settings.clientEmail { parts.append("service account \(account)") }
        if let endpoint = settings.endpointURL { parts.append("endpoint \(endpoint)") }
        if let token = settings.tokenURL { parts.append("token URL \(token)") }
        if let betas = settings.extraBetas { parts.append("extra betas " + betas.joined(separator: ",")) }
        if let compatible = settings.compatible {
            parts[0] = "\(compatible.service.rawValue) (\(compatible.auth.rawValue)" + (compatible.signingService.map { " for \($0)" } ?? "") + ")"
            parts.append("base URL \(compatible.baseURL)")
            for (name, value) in compatible.headers.sorted(by: { $0.key < $1.key }) { parts.append("header \(name): \(value)") }
        }
        if let source = settings.credentialSource { parts.append("credentials from \(source.rawValue)") }
        if let role = settings.assumeRole { parts.append("assuming \(role)") }
        parts.append("models " + settings.models.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ","))
        return parts.joined(separator: ", ")
    }
}

extension Validate {
    public static let maxModelMappings = 64
    public static let maxServiceAccountBytes = 16 << 10

    /// An optional value as a form or flag gives it: blank is absent.
    static func given(_ text: String?) -> String? {
        guard let text, !text.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else { return nil }
        return text
    }

    /// Every byte of `text` in `allowed` and its length in `lengths`.
    static func matches(_ text: String, _ lengths: ClosedRange<Int>, _ allowed: (UInt8) -> Bool) -> Bool {
        lengths.contains(text.utf8.count) && text.utf8.allSatisfy(allowed)
    }

    static func isLowerOrDigit(_ b: UInt8) -> Bool { (0x61...0x7a).contains(b) || (0x30...0x39).contains(b) }
    static func isAlphanumeric(_ b: UInt8) -> Bool { isLowerOrDigit(b) || (0x41...0x5a).contains(b) }

    /// An AWS region or Google Cloud location: `us-east-1`, `europe-west4`, `global`.
    public static func cloudRegion(_ text: String) throws -> String {
        let region = text.trimmingCharacters(in: .whitespaces)
        guard matches(region, 2...32, { isLowerOrDigit($0) || $0 == 0x2d }) else {
            throw AdminError("region '\(region.prefix(40))' must be 2 to 32 lowercase letters, digits and '-', such as us-east-1")
        }
        return region
    }

    /// Betas an owner allows through a cloud beyond this service's table: 0 to 32 names of
    /// lowercase letters, digits and '-'. Nil for none.
    public static func cloudBetas(_ betas: [String]) throws -> [String]? {
        guard !betas.isEmpty else { return nil }
        guard betas.count <= 32 else { throw AdminError("at most 32 --cloud-beta values") }
        var seen: [String] = []
        for beta in betas.map({ $0.trimmingCharacters(in: .whitespaces) }) {
            guard matches(beta, 3...100, { isLowerOrDigit($0) || $0 == 0x2d }) else {
                throw AdminError("--cloud-beta '\(beta.prefix(60))' must be a beta's name: lowercase letters, digits and '-', such as context-1m-2025-08-07")
            }
            if !seen.contains(beta) { seen.append(beta) }
        }
        return seen
    }

    /// A Google Cloud project ID (6 to 63 characters, a lowercase letter first, no '-' last) or
    /// a project number (digits).
    public static func cloudProject(_ text: String) throws -> String {
        let project = text.trimmingCharacters(in: .whitespaces)
        if matches(project, 1...20, { (0x30...0x39).contains($0) }) { return project }
        let bytes = Array(project.utf8)
        guard matches(project, 6...63, { isLowerOrDigit($0) || $0 == 0x2d }), let first = bytes.first, (0x61...0x7a).contains(first),
              bytes.last != 0x2d else {
            throw AdminError("project '\(project.prefix(70))' must be a Google Cloud project ID (6 to 63 lowercase letters, digits and '-', "
                             + "starting with a letter and not ending with '-') or a project number")
        }
        return project
    }

    /// An AWS access key ID (`AKIA…`, `ASIA…`): 16 to 128 uppercase letters and digits. Never echoed.
    public static func awsAccessKeyID(_ text: String) throws -> String {
        let id = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard matches(id, 16...128, { (0x41...0x5a).contains($0) || (0x30...0x39).contains($0) }) else {
            throw AdminError("the access key ID must be 16 to 128 uppercase letters and digits (such as AKIA followed by 16 more)")
        }
        return id
    }

    /// A secret: 1 to `limit` printable ASCII characters without spaces, white space around it
    /// trimmed (files usually end with a newline). Never echoed.
    public static func cloudSecret(_ text: String, what: String, limit: Int) throws -> String {
        let secret = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard matches(secret, 1...limit, { $0 > 0x20 && $0 < 0x7f }) else {
            throw AdminError("\(what) must be 1 to \(limit) printable ASCII characters without spaces")
        }
        return secret
    }

    /// `API_MODEL=CLOUD_MODEL` entries, 1 to 64, each API model once. The API model as devices
    /// name it; the cloud's model ID (a Bedrock ID may be an inference profile's ARN).
    public static func modelMappings(_ entries: [String]) throws -> [String: String] {
        let example = "API_MODEL=CLOUD_MODEL, such as claude-sonnet-4-5=anthropic.claude-sonnet-4-5-20250929-v1:0"
        guard !entries.isEmpty else { throw AdminError("map at least one model: \(example)") }
        guard entries.count <= maxModelMappings else { throw AdminError("at most \(maxModelMappings) model mappings (got \(entries.count))") }
        var models: [String: String] = [:]
        for entry in entries {
            guard let equals = entry.firstIndex(of: "=") else { throw AdminError("model mapping '\(entry.prefix(80))' is not \(example)") }
            let api = entry[..<equals].trimmingCharacters(in: .whitespaces)
            let cloud = entry[entry.index(after: equals)...].trimmingCharacters(in: .whitespaces)
            guard matches(api, 1...128, { isAlphanumeric($0) || [0x2e, 0x5f, 0x3a, 0x40, 0x2d].contains($0) }) else {
                throw AdminError("API model '\(api.prefix(60))' may contain only letters, digits and . _ : @ - (1 to 128)")
            }
            guard matches(cloud, 1...256, { isAlphanumeric($0) || [0x2e, 0x5f, 0x3a, 0x2f, 0x40, 0x2d].contains($0) }) else {
                throw AdminError("cloud model ID '\(cloud.prefix(60))' for \(api) may contain only letters, digits and . _ : / @ - (1 to 256)")
            }
            guard models.updateValue(cloud, forKey: api) == nil else { throw AdminError("model \(api) is mapped twice") }
        }
        return models
    }

    /// A cloud API's origin, `https://host[:port]` (no path, query or user name), kept in lowercase
    /// without a trailing '/'; with `path`, an absolute URL whose path stays as given (a token
    /// endpoint). Plain http only to a loopback address: anything else could be read or altered
    /// on the way, credentials included.
    public static func cloudURL(_ text: String, what: String, path allowsPath: Bool = false) throws -> String {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        let shape = allowsPath ? "\(what) must be https://host[:port]/path, without a query or user name"
            : "\(what) must be https://host or https://host:port, without a path, query or user name"
        let lower = trimmed.lowercased()
        let scheme = lower.hasPrefix("https://") ? "https" : lower.hasPrefix("http://") ? "http" : nil
        guard let scheme else { throw AdminError(shape) }
        let rest = trimmed.dropFirst(scheme.count + 3)
        var authority = rest.prefix { $0 != "/" }.lowercased()[...]
        var path = rest.dropFirst(authority.count)
        if !allowsPath, path == "/" { path = "" }
        if authority.hasSuffix("/") { authority = authority.dropLast() }
        guard path.isEmpty || allowsPath, path.utf8.allSatisfy({ isLowerOrDigit($0) || (0x41...0x5a).contains($0) || "/._~-".utf8.contains($0) }),
              let host = host(of: authority) else { throw AdminError(shape) }
        guard scheme == "https" || isLoopback(host) else {
            throw AdminError("\(what) must use https://: plain http:// is allowed only to a loopback address (127.0.0.0/8, ::1, localhost)")
        }
        return "\(scheme)://\(authority)\(path)"
    }

    /// The host of `host[:port]` or `[v6][:port]`; nil for anything else (a path, a query, a user name, a bad port).
    static func host(of authority: Substring) -> Substring? {
        var host = authority, port: Substring?
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return nil }
            host = authority[authority.index(after: authority.startIndex)..<close]
            let rest = authority[authority.index(after: close)...]
            if !rest.isEmpty {
                guard rest.hasPrefix(":") else { return nil }
                port = rest.dropFirst()
            }
            guard !host.isEmpty, host.utf8.allSatisfy({ isAlphanumeric($0) || $0 == 0x3a || $0 == 0x2e }) else { return nil }
        } else {
            if let colon = authority.lastIndex(of: ":") {
                host = authority[..<colon]
                port = authority[authority.index(after: colon)...]
            }
            guard !host.isEmpty, host.count <= 253, host.utf8.allSatisfy({ isLowerOrDigit($0) || $0 == 0x2e || $0 == 0x2d }) else { return nil }
        }
        if let port {
            guard (1...5).contains(port.count), port.utf8.allSatisfy({ (0x30...0x39).contains($0) }), let number = Int(port),
                  (1...65535).contains(number) else { return nil }
        }
        return host
    }

    /// 127.0.0.0/8, ::1 or localhost.
    static func isLoopback(_ host: Substring) -> Bool {
        if host == "localhost" || host == "::1" { return true }
        let octets = host.split(separator: ".", omittingEmptySubsequences: false)
        guard octets.count == 4, octets.allSatisfy({ (1...3).contains($0.count) && UInt8($0) != nil }) else { return false }
        return octets[0] == "127"
    }

    /// A settings row as read back: the rules an owner's settings met when set, again, and the
    /// deployment's pinned hosts. A database edited by someone without the secrets key could
    /// hold anything here.
    public static func storedCloudSettings(_ settings: CloudUpstreamSettings, kind: UpstreamKind, pins: CloudEndpointPins) throws {
        guard try cloudRegion(settings.region) == settings.region else { throw AdminError("the region is not in its stored form") }
        if kind == .vertex || settings.project != nil {
            guard let project = settings.project, try cloudProject(project) == project else { throw AdminError("the project is missing or not in its stored form") }
        }
        if let endpoint = settings.endpointURL, try cloudURL(endpoint, what: "the endpoint URL") != endpoint {
            throw AdminError("the endpoint URL is not in its stored form")
        }
        if let token = settings.tokenURL, try cloudURL(token, what: "the token URL", path: true) != token {
            throw AdminError("the token URL is not in its stored form")
        }
        _ = try modelMappings(settings.models.map { "\($0.key)=\($0.value)" })
        if let betas = settings.extraBetas, try cloudBetas(betas) != betas { throw AdminError("the extra betas are not in their stored form") }
        try storedCredentialSource(settings, kind: kind)
        if kind == .compatible { try storedCompatible(settings.compatible) } else if settings.compatible != nil {
            throw AdminError("a \(kind.rawValue) upstream has an Anthropic-compatible service's settings")
        }
        try pinned(settings, kind: kind, pins: pins)
    }

    /// Refuses settings that would send credentials to a host the deployment does not allow: the
    /// endpoint (or the cloud's own), the token URL, and the service account's `token_uri`.
    public static func pinned(_ settings: CloudUpstreamSettings, kind: UpstreamKind, pins: CloudEndpointPins, accountTokenURI: String? = nil) throws {
        guard !pins.hosts.isEmpty else { return }
        var urls = [settings.origin(kind: kind)].compactMap { $0 }
        // Vertex's token endpoint: the settings' own, else the service account's (checked when the
        // account is at hand: the relay opens it after these checks).
        if kind == .vertex, let token = settings.tokenURL ?? accountTokenURI { urls.append(token) }
        for url in urls {
            guard let host = CloudEndpointPins.host(ofURL: url), pins.allows(host: host) else {
                throw AdminError("\(url) is on a host this deployment does not allow cloud credentials to go to (allowed: "
                                 + pins.hosts.joined(separator: ", ") + "; an owner changes them with attestctl cloud-endpoints allow)")
            }
        }
    }

    /// An entry of the deployment's cloud hosts: a host name (lowercase letters, digits, '.', '-'),
    /// an IP address, or `*.` and a domain of at least two labels.
    public static func cloudEndpointPin(_ text: String) throws -> String {
        let entry = text.trimmingCharacters(in: .whitespaces).lowercased()
        let domain = entry.hasPrefix("*.") ? String(entry.dropFirst(2)) : entry
        let labels = domain.split(separator: ".", omittingEmptySubsequences: false)
        let isName = matches(domain, 1...253, { isLowerOrDigit($0) || $0 == 0x2e || $0 == 0x2d })
            && labels.allSatisfy { label in
                guard let first = label.utf8.first, let last = label.utf8.last else { return false }
                return isLowerOrDigit(first) && isLowerOrDigit(last) && label.utf8.count <= 63
            }
        let isAddress = !entry.hasPrefix("*.") && host(of: Substring(entry.contains(":") ? "[\(entry)]" : entry)) != nil && entry.contains(where: { $0 == ":" || $0.isNumber })
        guard isName || isAddress, !entry.hasPrefix("*.") || domain.contains(".") else {
            throw AdminError("cloud host '\(entry.prefix(80))' must be a host name such as bedrock-runtime.us-east-1.amazonaws.com, "
                             + "an address, or *. and a domain such as *.googleapis.com")
        }
        return entry
    }

    /// A Google service-account key file as Google Cloud gives it: a JSON object of type
    /// `service_account` with `client_email`, a PEM `private_key` and an https `token_uri`.
    /// Returns the account and the last 4 characters shown for it (of the key's ID, else of the
    /// account). Errors never quote the file.
    public static func serviceAccount(_ json: String) throws -> (clientEmail: String, last4: String, tokenURI: String) {
        guard json.utf8.count <= maxServiceAccountBytes else { throw AdminError("the service account key file must be at most 16 KiB") }
        guard let object = (try? JSONSerialization.jsonObject(with: Data(json.utf8))) as? [String: Any] else {
            throw AdminError("the service account key file is not a JSON object: give the key file Google Cloud made, as it is")
        }
        guard object["type"] as? String == "service_account" else {
            throw AdminError("the service account key file's \"type\" must be \"service_account\"")
        }
        guard let email = object["client_email"] as? String, (try? Validate.email(email)) == email.lowercased() else {
            throw AdminError("the service account key file has no \"client_email\" address")
        }
        // The PEM header in two pieces: attestctl's binary must hold no whole PEM private-key marker (ToolShapeTests).
        guard let key = object["private_key"] as? String, key.hasPrefix("-----BEGIN PRIVATE KEY"), key.dropFirst(22).hasPrefix("-----") else {
            throw AdminError("the service account key file's \"private_key\" must be a PEM private key (BEGIN PRIVATE KEY), as Google Cloud writes it")
        }
        guard let tokenURI = object["token_uri"] as? String, let url = URL(string: tokenURI), url.scheme?.lowercased() == "https",
              url.host?.isEmpty == false else {
            throw AdminError("the service account key file's \"token_uri\" must be an https:// URL")
        }
        // What the relay will do with it, now: a key that does not load (not RSA, damaged) is
        // refused here rather than on the first device request.
        do {
            _ = try GoogleServiceAccount(keyFile: Array(json.utf8))
        } catch {
            throw AdminError("the service account key file does not load: \(error)")
        }
        let keyID = (object["private_key_id"] as? String).flatMap { $0.isEmpty ? nil : $0 }
        return (email, String((keyID ?? email).suffix(4)), tokenURI)
    }
}
