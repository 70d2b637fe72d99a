import AttestWire
import CloudUpstreams
import Foundation
import Synchronization
import TokenService
import UpstreamClient

/// A credential as an upstream takes it: AWS keys to sign with, or a bearer token.
enum CloudCredential: Sendable, Equatable {
    case aws(AWSCredentials)
    case bearer(String)
}

/// Why no credential could be had, in words for the operator's log (never a secret).
struct CredentialFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The endpoints of the clouds' credential sources, read from attestd's environment as the
/// clouds' SDKs read them, once at start (tests give their own).
struct CredentialEnvironment: Sendable {
    let values: [String: String]

    init(_ values: [String: String] = ProcessInfo.processInfo.environment) { self.values = values }

    subscript(_ name: String) -> String? {
        guard let value = values[name]?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        return value
    }
}

/// Where a workspace's credential comes from, opened: a value used as it is, or a source fetched
/// and renewed by `CloudCredentials`.
indirect enum CredentialSource: Sendable {
    /// Static AWS keys or a Bedrock API key: never fetched, never renewed.
    case fixed(CloudCredential)
    case googleServiceAccount(GoogleServiceAccount, tokenURL: String)
    case googleMetadataServer
    case awsWebIdentity(region: String)
    case awsContainer
    case awsInstance
    case awsAssumeRole(base: CredentialSource, roleARN: String, region: String)
    case entraClientSecret(tenant: String, clientID: String, secret: String, scope: String)
    case entraClientCertificate(tenant: String, clientID: String, certificate: EntraClientCertificate, scope: String)
    case entraManagedIdentity(clientID: String?, scope: String)

    /// The source's name in logs and metrics.
    var name: String {
        switch self {
        case .fixed(.aws): "static"
        case .fixed(.bearer): "api-key"
        case .googleServiceAccount: "service-account"
        case .googleMetadataServer: "metadata-server"
        case .awsWebIdentity: "web-identity"
        case .awsContainer: "container"
        case .awsInstance: "instance"
        case .awsAssumeRole(let base, _, _): "assume-role on \(base.name)"
        case .entraClientSecret: "client-secret"
        case .entraClientCertificate: "client-certificate"
        case .entraManagedIdentity: "managed-identity"
        }
    }

    /// Fetched and renewed (a 401 upstream drops it and fetches once more), unlike a fixed value.
    var renews: Bool {
        if case .fixed = self { return false }
        return true
    }

    /// The source a workspace's settings and opened credentials name. Throws a description for
    /// the log when the opened bytes are not what the source needs.
    static func resolve(kind: UpstreamKind, settings: CloudUpstreamSettings, opened: [UInt8]) throws(CredentialFailure) -> CredentialSource {
        let base: CredentialSource
        switch settings.credentialSource {
        case nil where kind == .vertex:
            do {
                let account = try GoogleServiceAccount(keyFile: opened)
                return .googleServiceAccount(account, tokenURL: settings.tokenURL ?? account.tokenURI)
            } catch {
                throw CredentialFailure("the service account key does not load: \(error)")
            }
        case nil:
            guard let keys = try? JSONDecoder().decode(AWSAccessKey.self, from: Data(opened)) else { throw CredentialFailure("the AWS credentials do not decode") }
            base = .fixed(.aws(keys))
        case .bedrockAPIKey?: base = .fixed(.bearer(String(decoding: opened, as: UTF8.self)))
        case .webIdentity?: base = .awsWebIdentity(region: settings.region)
        case .container?: base = .awsContainer
        case .instance?: base = .awsInstance
        case .metadataServer?: base = .googleMetadataServer
        case .clientSecret?:
            guard let tenant = settings.tenantID, let client = settings.clientID else { throw CredentialFailure("the Entra ID settings lack the tenant or client") }
            base = .entraClientSecret(tenant: tenant, clientID: client, secret: String(decoding: opened, as: UTF8.self),
                                      scope: settings.scope ?? CredentialSourceKind.defaultEntraScope)
        case .clientCertificate?:
            guard let tenant = settings.tenantID, let client = settings.clientID else { throw CredentialFailure("the Entra ID settings lack the tenant or client") }
            do {
                base = .entraClientCertificate(tenant: tenant, clientID: client, certificate: try EntraClientCertificate(pem: opened),
                                               scope: settings.scope ?? CredentialSourceKind.defaultEntraScope)
            } catch {
                throw CredentialFailure("the client certificate does not load: \(error)")
            }
        case .managedIdentity?:
            base = .entraManagedIdentity(clientID: settings.clientID, scope: settings.scope ?? CredentialSourceKind.defaultEntraScope)
        }
        if let role = settings.assumeRole { return .awsAssumeRole(base: base, roleARN: role, region: settings.region) }
        return base
    }
}

/// Every workspace's renewing credential, whatever its source: fetched once and shared by every
/// request until it nears its end, renewed in the background from half its life on (requests
/// keep the current one meanwhile), fetched by one chain of transfers at a time however many
/// requests wait for it, and dropped when the upstream refuses it (`drop`), so the request's one
/// retry fetches a fresh one. The fetches go through the relay's own upstream client, so they
/// never block a loop; each step has a deadline. Credentials are kept by what they came from (the
/// sealed bytes and the settings), so a workspace whose credentials change mid-fetch never gets
/// the old ones for its new settings, and the old fetch still answers its own waiters. A failed
/// fetch is answered from memory for a few seconds rather than asked again by every request.
final class CloudCredentials: Sendable {
    typealias Completion = @Sendable (Result<CloudCredential, CredentialFailure>) -> Void
    typealias Start = @Sendable (UpstreamRequest, any UpstreamDelegate) -> Void

    /// The credentials a value is for: the workspace and which of its upstreams (nil: its own,
    /// else the label in its list), the sealed bytes and the settings' binding.
    struct Identity: Hashable, Sendable {
        let workspace: Int64
        let label: String?
        let sealed: [UInt8]
        let binding: [UInt8]

        init(workspace: Int64, label: String? = nil, sealed: [UInt8], binding: [UInt8]) {
            self.workspace = workspace
            self.label = label
            self.sealed = sealed
            self.binding = binding
        }

        /// The same upstream of the same workspace (with the same or other credentials).
        func isSlot(of other: Identity) -> Bool { workspace == other.workspace && label == other.label }
    }

    private struct Entry {
        var credential: CloudCredential?
        /// Monotonic nanoseconds.
        var expiresAt: UInt64 = 0
        var lifetime: UInt64 = 0
        var fetching = false
        var waiters: [Completion] = []
        var failure: (CredentialFailure, until: UInt64)?
    }

    /// How long a failed fetch is answered from memory.
    static let failureHold: UInt64 = 5_000_000_000
    /// The most one step of a fetch may take, connection included.
    static let fetchDeadline: Duration = .seconds(20)
    /// The longest lifetime taken from any endpoint: a larger one is read as this, so no number
    /// it sends can overflow the clock's arithmetic.
    static let maxLifetimeSeconds = 86_400

    private let entries = Mutex<[Identity: Entry]>([:])
    private let now: @Sendable () -> UInt64
    let environment: CredentialEnvironment
    /// Fetches begun (tests, metrics).
    let fetches = Atomic<Int>(0)

    init(environment: CredentialEnvironment = CredentialEnvironment(),
         now: @escaping @Sendable () -> UInt64 = { DispatchTime.now().uptimeNanoseconds }) {
        self.environment = environment
        self.now = now
    }

    /// Calls `completion` with a usable credential: at once for a fixed one or one cached, else
    /// once the fetch under way (or begun now) ends. `start` starts a transfer.
    func credential(_ identity: Identity, source: CredentialSource, start: @escaping Start, completion: @escaping Completion) {
        if case .fixed(let value) = source {
            completion(.success(value))
            return
        }
        enum Step { case ready(CloudCredential, renew: Bool), wait(fetch: Bool), failed(CredentialFailure) }
        let time = now()
        let step: Step = entries.withLock { all in
            // Entries of this upstream's earlier credentials go once nobody waits on them (the
            // workspace's other upstreams keep theirs).
            if all[identity] == nil {
                all = all.filter { $0.key == identity || !$0.key.isSlot(of: identity) || $0.value.fetching }
            }
            var entry = all[identity] ?? Entry()
            defer { all[identity] = entry }
            // Usable until a tenth of its life (at most a minute) before its end.
            let margin = min(60_000_000_000, entry.lifetime / 10)
            if let credential = entry.credential, entry.expiresAt > time + margin {
                let renew = !entry.fetching && entry.expiresAt - time < entry.lifetime / 2
                if renew { entry.fetching = true }
                return .ready(credential, renew: renew)
            }
            if let (failure, until) = entry.failure, time < until { return .failed(failure) }
            entry.waiters.append(completion)
            let fetch = !entry.fetching
            entry.fetching = true
            return .wait(fetch: fetch)
        }
        switch step {
        case .ready(let credential, let renew):
            if renew { fetch(identity, source, start) }
            completion(.success(credential))
        case .wait(let fetch):
            if fetch { self.fetch(identity, source, start) }
        case .failed(let failure):
            completion(.failure(failure))
        }
    }

    /// The upstream refused `used`: it is dropped (unless a newer one replaced it meanwhile), so
    /// the next request for it fetches afresh.
    func drop(_ identity: Identity, used: CloudCredential) {
        entries.withLock { all in
            guard var entry = all[identity], entry.credential == used else { return }
            entry.credential = nil
            entry.expiresAt = 0
            all[identity] = entry
        }
    }

    private func fetch(_ identity: Identity, _ source: CredentialSource, _ start: @escaping Start) {
        fetches.add(1, ordering: .relaxed)
        CredentialFetch(http: CredentialHTTP(start: start), environment: environment).fetch(source) { [self] result in
            finish(identity, result)
        }
    }

    private func finish(_ identity: Identity, _ result: Result<(CloudCredential, Int), CredentialFailure>) {
        let time = now()
        let waiters = entries.withLock { all -> [Completion] in
            guard var entry = all[identity] else { return [] }
            entry.fetching = false
            switch result {
            case .success(let (credential, seconds)):
                entry.credential = credential
                entry.lifetime = UInt64(min(max(1, seconds), Self.maxLifetimeSeconds)) * 1_000_000_000
                entry.expiresAt = time + entry.lifetime
                entry.failure = nil
            case .failure(let failure):
                entry.failure = (failure, time + Self.failureHold)
            }
            let waiters = entry.waiters
            entry.waiters = []
            all[identity] = entry
            return waiters
        }
        let outcome = result.map(\.0)
        for waiter in waiters { waiter(outcome) }
    }

    /// `scheme://host[:port]` and `/path?query` of an absolute URL.
    static func split(_ url: String) -> (origin: String, path: String)? {
        let lower = url.lowercased()
        guard lower.hasPrefix("https://") || lower.hasPrefix("http://"), let schemeEnd = url.range(of: "://") else { return nil }
        let rest = url[schemeEnd.upperBound...]
        guard !rest.isEmpty else { return nil }
        guard let slash = rest.firstIndex(where: { $0 == "/" || $0 == "?" }) else { return (url, "/") }
        let path = String(url[slash...])
        return (String(url[..<slash]), path.hasPrefix("?") ? "/" + path : path)
    }
}

/// One HTTP exchange with a credential endpoint through the relay's upstream client.
struct CredentialHTTP: Sendable {
    let start: CloudCredentials.Start

    struct Reply: Sendable {
        let status: Int
        let headers: [(name: String, value: String)]
        let body: [UInt8]

        func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }
    }

    /// Sends `method url` with `headers` and `body`; answers the reply (any status) or why there is none.
    func send(_ method: String, _ url: String, headers: [(name: String, value: String)] = [], body: [UInt8] = [], what: String,
              done: @escaping @Sendable (Result<Reply, CredentialFailure>) -> Void) {
        guard let (origin, path) = CloudCredentials.split(url) else {
            done(.failure(CredentialFailure("\(what): \(url) is not an absolute http(s) URL")))
            return
        }
        let request = UpstreamRequest(method: method, path: path, headers: headers, body: body, origin: origin, totalTimeout: CloudCredentials.fetchDeadline)
        start(request, CredentialExchange(what: what, done: done))
    }

    /// As `send`, and the body of a 200 (any other status is a failure naming it and the start of its body).
    func fetch(_ method: String, _ url: String, headers: [(name: String, value: String)] = [], body: [UInt8] = [], what: String,
               done: @escaping @Sendable (Result<Reply, CredentialFailure>) -> Void) {
        send(method, url, headers: headers, body: body, what: what) { result in
            done(result.flatMap { reply in
                guard reply.status == 200 else {
                    let excerpt = String(decoding: reply.body.prefix(200).map { $0 >= 0x20 && $0 < 0x7f ? $0 : 0x3f }, as: UTF8.self)
                    return .failure(CredentialFailure("\(what) answered HTTP \(reply.status): \(excerpt)"))
                }
                return .success(reply)
            })
        }
    }
}

/// One credential endpoint's reply: its status, headers and body (bounded: a longer body fails).
private final class CredentialExchange: UpstreamDelegate {
    private struct State {
        var status = 0
        var headers: [(name: String, value: String)] = []
        var body: [UInt8] = []
        var tooLong = false
    }
    private let state = Mutex(State())
    private let what: String
    private let done: @Sendable (Result<CredentialHTTP.Reply, CredentialFailure>) -> Void

    init(what: String, done: @escaping @Sendable (Result<CredentialHTTP.Reply, CredentialFailure>) -> Void) {
        self.what = what
        self.done = done
    }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        state.withLock { $0.status = status; $0.headers = headers }
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        state.withLock { s in
            if s.body.count + chunk.count > CredentialReplies.maxReply { s.tooLong = true } else { s.body.append(contentsOf: chunk) }
        }
        return true
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        let s = state.withLock { $0 }
        if let error {
            done(.failure(CredentialFailure("\(what) could not be reached: \(error)")))
        } else if s.tooLong {
            done(.failure(CredentialFailure("\(what) answered more than \(CredentialReplies.maxReply) bytes")))
        } else {
            done(.success(CredentialHTTP.Reply(status: s.status, headers: s.headers, body: s.body)))
        }
    }
}

/// The fetch of one source, step by step: each step's callback starts the next.
struct CredentialFetch: Sendable {
    typealias Done = @Sendable (Result<(CloudCredential, Int), CredentialFailure>) -> Void
    let http: CredentialHTTP
    let environment: CredentialEnvironment

    /// The most read of a token file (a projected service-account token is about 1 KiB).
    static let maxTokenFile = 16_384
    /// The session name STS records for the relay's sessions.
    static let sessionName = "attestd"

    func fetch(_ source: CredentialSource, done: @escaping Done) {
        switch source {
        case .fixed(let value): done(.success((value, CloudCredentials.maxLifetimeSeconds)))
        case .googleServiceAccount(let account, let tokenURL): googleServiceAccount(account, tokenURL: tokenURL, done: done)
        case .googleMetadataServer: googleMetadataServer(done: done)
        case .awsWebIdentity(let region): awsWebIdentity(region: region, done: done)
        case .awsContainer: awsContainer(done: done)
        case .awsInstance: awsInstance(done: done)
        case .awsAssumeRole(let base, let role, let region):
            fetch(base) { result in
                switch result {
                case .success((.aws(let keys), _)): assumeRole(role, region: region, with: keys, done: done)
                case .success: done(.failure(CredentialFailure("--assume-role needs AWS keys from its base source")))
                case .failure(let failure): done(.failure(CredentialFailure("the base credentials for assuming \(role): \(failure)")))
                }
            }
        case .entraClientSecret(let tenant, let client, let secret, let scope):
            entraToken(tenant: tenant, fields: [("client_id", client), ("scope", scope), ("grant_type", "client_credentials"), ("client_secret", secret)],
                       done: done)
        case .entraClientCertificate(let tenant, let client, let certificate, let scope):
            let audience = entraTokenURL(tenant)
            do {
                let assertion = try certificate.assertion(clientID: client, audience: audience, issuedAt: Int(Date().timeIntervalSince1970))
                entraToken(tenant: tenant, fields: [("client_id", client), ("scope", scope), ("grant_type", "client_credentials"),
                                                    ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
                                                    ("client_assertion", assertion)], done: done)
            } catch {
                done(.failure(CredentialFailure("\(error)")))
            }
        case .entraManagedIdentity(let client, let scope): managedIdentity(clientID: client, scope: scope, done: done)
        }
    }

    // MARK: Google

    private func googleServiceAccount(_ account: GoogleServiceAccount, tokenURL: String, done: @escaping Done) {
        let body: [UInt8]
        do {
            let assertion = try account.assertion(scope: "https://www.googleapis.com/auth/cloud-platform", audience: tokenURL,
                                                  issuedAt: Int(Date().timeIntervalSince1970))
            body = account.tokenRequestBody(assertion: assertion)
        } catch {
            done(.failure(CredentialFailure("cannot make the service account's JWT grant: \(error)")))
            return
        }
        http.fetch("POST", tokenURL, headers: [("content-type", "application/x-www-form-urlencoded"), ("accept", "application/json")], body: body,
                   what: "the token endpoint") { result in
            done(result.flatMap { reply in
                do {
                    let (token, expiresIn) = try GoogleTokenResponse.parse(reply.body)
                    return .success((.bearer(token), expiresIn))
                } catch {
                    return .failure(CredentialFailure("the token endpoint's answer does not parse: \(error)"))
                }
            })
        }
    }

    /// `GCE_METADATA_HOST` (host[:port]) else `metadata.google.internal`, as Google's libraries read it.
    private func googleMetadataServer(done: @escaping Done) {
        let host = environment["GCE_METADATA_HOST"] ?? "metadata.google.internal"
        http.fetch("GET", "http://\(host)/computeMetadata/v1/instance/service-accounts/default/token", headers: [("metadata-flavor", "Google")],
                   what: "the metadata server") { result in
            done(result.flatMap { reply in
                // Anything else answering on the address is not Google's metadata server.
                guard reply.header("metadata-flavor") == "Google" else {
                    return .failure(CredentialFailure("the metadata server's answer lacks Metadata-Flavor: Google"))
                }
                do {
                    let (token, expiresIn) = try GoogleTokenResponse.parse(reply.body)
                    guard token.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) else { return .failure(CredentialFailure("the metadata server's token is not printable")) }
                    return .success((.bearer(token), expiresIn))
                } catch {
                    return .failure(CredentialFailure("the metadata server's answer does not parse: \(error)"))
                }
            })
        }
    }

    // MARK: AWS

    /// STS's endpoint: `AWS_ENDPOINT_URL_STS`, else the region's own.
    private func stsEndpoint(region: String) -> String {
        environment["AWS_ENDPOINT_URL_STS"] ?? "https://sts.\(region).amazonaws.com"
    }

    /// Temporary keys and their lifetime from now, or why they cannot be used.
    static func lifetime(of keys: TemporaryAWSKeys) -> Result<(CloudCredential, Int), CredentialFailure> {
        // To the second below: an expiration a fraction of a second away is not taken as a whole one.
        let seconds = Int64((Double(keys.expiration) - Date().timeIntervalSince1970).rounded(.down))
        guard seconds > 0 else { return .failure(CredentialFailure("the credentials given have already expired")) }
        return .success((.aws(AWSCredentials(accessKeyID: keys.accessKeyID, secretAccessKey: keys.secretAccessKey, sessionToken: keys.sessionToken)),
                         Int(min(seconds, Int64(CloudCredentials.maxLifetimeSeconds)))))
    }

    private func stsReply(_ result: Result<CredentialHTTP.Reply, CredentialFailure>) -> Result<(CloudCredential, Int), CredentialFailure> {
        result.flatMap { reply in
            // STS's errors are XML too: read for their code and message whatever the status.
            do {
                return Self.lifetime(of: try CredentialReplies.stsCredentials(reply.body))
            } catch {
                return .failure(CredentialFailure("STS answered HTTP \(reply.status): \(error)"))
            }
        }
    }

    private static func form(_ fields: [(String, String)]) -> [UInt8] {
        Array(fields.map { "\(FormEncoding.percentEncode($0.0))=\(FormEncoding.percentEncode($0.1))" }.joined(separator: "&").utf8)
    }

    /// A small file a source names by an environment variable (read on each fetch: EKS and ECS rotate them).
    func readTokenFile(_ variable: String) -> Result<String, CredentialFailure> {
        guard let path = environment[variable] else { return .failure(CredentialFailure("\(variable) is not set in attestd's environment")) }
        guard let handle = FileHandle(forReadingAtPath: path) else { return .failure(CredentialFailure("\(variable): cannot read \(path)")) }
        defer { try? handle.close() }
        guard let data = try? handle.read(upToCount: Self.maxTokenFile + 1) ?? Data() else { return .failure(CredentialFailure("\(variable): cannot read \(path)")) }
        guard data.count <= Self.maxTokenFile else { return .failure(CredentialFailure("\(variable): \(path) is larger than \(Self.maxTokenFile) bytes")) }
        let token = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard !token.isEmpty, token.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) else {
            return .failure(CredentialFailure("\(variable): \(path) does not hold one printable token"))
        }
        return .success(token)
    }

    /// STS AssumeRoleWithWebIdentity with the token in `AWS_WEB_IDENTITY_TOKEN_FILE` for the role
    /// in `AWS_ROLE_ARN` (EKS IRSA sets both); unsigned, as STS takes it.
    private func awsWebIdentity(region: String, done: @escaping Done) {
        let token: String
        switch readTokenFile("AWS_WEB_IDENTITY_TOKEN_FILE") {
        case .success(let value): token = value
        case .failure(let failure): return done(.failure(failure))
        }
        guard let role = environment["AWS_ROLE_ARN"] else { return done(.failure(CredentialFailure("AWS_ROLE_ARN is not set in attestd's environment"))) }
        let body = Self.form([("Action", "AssumeRoleWithWebIdentity"), ("Version", "2011-06-15"), ("RoleArn", role),
                              ("RoleSessionName", environment["AWS_ROLE_SESSION_NAME"] ?? Self.sessionName), ("WebIdentityToken", token)])
        http.send("POST", stsEndpoint(region: region) + "/", headers: [("content-type", "application/x-www-form-urlencoded; charset=utf-8")],
                  body: body, what: "STS (AssumeRoleWithWebIdentity)") { result in done(stsReply(result)) }
    }

    /// STS AssumeRole, signed with SigV4 for `sts` with the base source's keys.
    private func assumeRole(_ role: String, region: String, with keys: AWSCredentials, done: @escaping Done) {
        let endpoint = stsEndpoint(region: region)
        guard let (origin, _) = CloudCredentials.split(endpoint) else { return done(.failure(CredentialFailure("STS's endpoint \(endpoint) is not a URL"))) }
        let body = Self.form([("Action", "AssumeRole"), ("Version", "2011-06-15"), ("RoleArn", role), ("RoleSessionName", Self.sessionName),
                              ("DurationSeconds", "3600")])
        var headers: [(name: String, value: String)] = [("host", CloudRoute.authority(of: origin)),
                                                        ("content-type", "application/x-www-form-urlencoded; charset=utf-8")]
        headers += SigV4Signer(service: "sts", region: region, credentials: keys).sign(method: "POST", path: "/", headers: headers, body: body, date: Date())
        http.send("POST", origin + "/", headers: headers, body: body, what: "STS (AssumeRole \(role))") { result in done(stsReply(result)) }
    }

    /// ECS and EKS Pod Identity: `AWS_CONTAINER_CREDENTIALS_FULL_URI` (or the relative URI on
    /// ECS's link-local address) with the token in `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (or
    /// `AWS_CONTAINER_AUTHORIZATION_TOKEN`) as `Authorization`.
    private func awsContainer(done: @escaping Done) {
        let url: String
        if let full = environment["AWS_CONTAINER_CREDENTIALS_FULL_URI"] {
            // As the SDKs allow it: https anywhere, plain http only to the hosts the container
            // agents listen on (loopback, ECS's and EKS Pod Identity's link-local addresses).
            guard Self.isAllowedContainerURI(full) else {
                return done(.failure(CredentialFailure("AWS_CONTAINER_CREDENTIALS_FULL_URI must be https, or http to a loopback address, "
                                                       + "169.254.170.2, 169.254.170.23 or fd00:ec2::23")))
            }
            url = full
        } else if let relative = environment["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"] {
            url = "http://169.254.170.2" + relative
        } else {
            return done(.failure(CredentialFailure("neither AWS_CONTAINER_CREDENTIALS_FULL_URI nor AWS_CONTAINER_CREDENTIALS_RELATIVE_URI is set in attestd's environment")))
        }
        var headers: [(name: String, value: String)] = [("accept", "application/json")]
        if environment["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"] != nil {
            switch readTokenFile("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
            case .success(let token): headers.append(("authorization", token))
            case .failure(let failure): return done(.failure(failure))
            }
        } else if let token = environment["AWS_CONTAINER_AUTHORIZATION_TOKEN"] {
            headers.append(("authorization", token))
        }
        http.fetch("GET", url, headers: headers, what: "the container credentials endpoint") { result in
            done(result.flatMap { reply in
                do {
                    return Self.lifetime(of: try CredentialReplies.awsJSONCredentials(reply.body, source: "the container credentials endpoint"))
                } catch {
                    return .failure(CredentialFailure("\(error)"))
                }
            })
        }
    }

    static func isAllowedContainerURI(_ url: String) -> Bool {
        let lower = url.lowercased()
        if lower.hasPrefix("https://") { return true }
        guard lower.hasPrefix("http://") else { return false }
        let authority = lower.dropFirst("http://".count).prefix { $0 != "/" && $0 != "?" }
        let host: Substring
        if authority.hasPrefix("["), let close = authority.firstIndex(of: "]") {
            host = authority[authority.index(after: authority.startIndex)..<close]
        } else {
            host = authority.prefix { $0 != ":" }
        }
        return host == "localhost" || host == "::1" || host.hasPrefix("127.") || host == "169.254.170.2" || host == "169.254.170.23"
            || host == "fd00:ec2::23"
    }

    /// EC2's instance role through IMDSv2: a PUT for a session token, the role's name, then its
    /// credentials, each GET with the token (`AWS_EC2_METADATA_SERVICE_ENDPOINT` moves it).
    private func awsInstance(done: @escaping Done) {
        var endpoint = environment["AWS_EC2_METADATA_SERVICE_ENDPOINT"] ?? "http://169.254.169.254"
        while endpoint.hasSuffix("/") { endpoint.removeLast() }
        let base = endpoint
        let http = self.http
        http.fetch("PUT", base + "/latest/api/token", headers: [("x-aws-ec2-metadata-token-ttl-seconds", "21600")],
                   what: "IMDSv2's token endpoint") { result in
            let reply: CredentialHTTP.Reply
            switch result {
            case .success(let value): reply = value
            case .failure(let failure): return done(.failure(failure))
            }
            let token = String(decoding: reply.body, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            guard !token.isEmpty, token.utf8.count <= 4096, token.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) else {
                return done(.failure(CredentialFailure("IMDSv2's session token is not printable text")))
            }
            let path = base + "/latest/meta-data/iam/security-credentials/"
            http.fetch("GET", path, headers: [("x-aws-ec2-metadata-token", token)], what: "IMDSv2's role list") { result in
                let reply: CredentialHTTP.Reply
                switch result {
                case .success(let value): reply = value
                case .failure(let failure): return done(.failure(failure))
                }
                let role = String(decoding: reply.body, as: UTF8.self).split(whereSeparator: \.isNewline).first.map(String.init) ?? ""
                guard (1...128).contains(role.utf8.count), role.utf8.allSatisfy({ ($0 > 0x2f && $0 < 0x3a) || ($0 | 0x20 > 0x60 && $0 | 0x20 < 0x7b) || "+=,.@_-".utf8.contains($0) }) else {
                    return done(.failure(CredentialFailure("the instance has no IAM role (IMDSv2 named none)")))
                }
                http.fetch("GET", path + role, headers: [("x-aws-ec2-metadata-token", token)], what: "IMDSv2's credentials of \(role)") { result in
                    done(result.flatMap { reply in
                        do {
                            return Self.lifetime(of: try CredentialReplies.awsJSONCredentials(reply.body, source: "IMDSv2"))
                        } catch {
                            return .failure(CredentialFailure("\(error)"))
                        }
                    })
                }
            }
        }
    }

    // MARK: Azure

    /// `{AZURE_AUTHORITY_HOST or https://login.microsoftonline.com}/{tenant}/oauth2/v2.0/token`.
    func entraTokenURL(_ tenant: String) -> String {
        var authority = environment["AZURE_AUTHORITY_HOST"] ?? "https://login.microsoftonline.com"
        while authority.hasSuffix("/") { authority.removeLast() }
        return "\(authority)/\(tenant)/oauth2/v2.0/token"
    }

    private func entraToken(tenant: String, fields: [(String, String)], done: @escaping Done) {
        http.send("POST", entraTokenURL(tenant), headers: [("content-type", "application/x-www-form-urlencoded"), ("accept", "application/json")],
                  body: Self.form(fields), what: "Entra ID's token endpoint") { result in
            done(result.flatMap { reply in Self.entraReply(reply, what: "Entra ID's token endpoint") })
        }
    }

    /// A token answer (any status: Entra's errors are JSON with `error` and `error_description`).
    static func entraReply(_ reply: CredentialHTTP.Reply, what: String) -> Result<(CloudCredential, Int), CredentialFailure> {
        do {
            let (token, expiresIn) = try CredentialReplies.entraToken(reply.body, now: Int64(Date().timeIntervalSince1970))
            guard reply.status == 200 else { return .failure(CredentialFailure("\(what) answered HTTP \(reply.status)")) }
            return .success((.bearer(token), expiresIn))
        } catch {
            return .failure(CredentialFailure("\(what) answered HTTP \(reply.status): \(error)"))
        }
    }

    /// App Service's `IDENTITY_ENDPOINT` with `IDENTITY_HEADER`, else the VM's IMDS (on
    /// `AZURE_POD_IDENTITY_AUTHORITY_HOST` when set, as Azure's SDKs allow); the resource is the
    /// scope without `/.default`.
    private func managedIdentity(clientID: String?, scope: String, done: @escaping Done) {
        let resource = scope.hasSuffix("/.default") ? String(scope.dropLast("/.default".count)) : scope
        var query = "resource=" + FormEncoding.percentEncode(resource)
        if let clientID { query += "&client_id=" + FormEncoding.percentEncode(clientID) }
        let url: String, headers: [(name: String, value: String)], what: String
        if let endpoint = environment["IDENTITY_ENDPOINT"], let secret = environment["IDENTITY_HEADER"] {
            url = endpoint + (endpoint.contains("?") ? "&" : "?") + "api-version=2019-08-01&" + query
            headers = [("x-identity-header", secret)]
            what = "App Service's identity endpoint"
        } else {
            var host = environment["AZURE_POD_IDENTITY_AUTHORITY_HOST"] ?? "http://169.254.169.254"
            while host.hasSuffix("/") { host.removeLast() }
            url = host + "/metadata/identity/oauth2/token?api-version=2018-02-01&" + query
            headers = [("metadata", "true")]
            what = "Azure's instance metadata (managed identity)"
        }
        http.send("GET", url, headers: headers, what: what) { result in
            done(result.flatMap { reply in Self.entraReply(reply, what: what) })
        }
    }
}
