import AppAttest
import AttestCrypto
import Foundation

/// A refused admin request: a clear one-line message; nothing was changed.
public struct AdminError: Error, CustomStringConvertible, Sendable {
    /// What kind of refusal, for the console's status codes (the CLI exits 2 for all).
    public enum Kind: Sendable { case invalid, forbidden, notFound }
    public let description: String
    public let kind: Kind
    public init(_ description: String, kind: Kind = .invalid) {
        self.description = description
        self.kind = kind
    }
}

/// Operator actions: the organisation model and integrations. Every action is checked against the
/// actor's role and written to the audit trail synchronously.
public final class AdminService: Sendable {
    public let store: any AdministrationStore
    let now: @Sendable () -> Date

    public static let defaultWorkspace = "default"
    public static let maxBundleIDs = 32

    public init(store: any AdministrationStore, now: @escaping @Sendable () -> Date = { Date() }) {
        self.store = store
        self.now = now
    }

    // MARK: Organisation

    public enum InitResult: Equatable { case created, unchanged(primaryOwner: String) }

    /// Creates the `default` workspace's primary owner; a second run changes nothing.
    public func initialize(owner email: String) throws -> InitResult {
        let email = try Validate.email(email)
        let workspace = try defaultWorkspace()
        if let existing = try store.primaryOwner(workspaceID: workspace.id) {
            return .unchanged(primaryOwner: existing)
        }
        try store.addMember(email: email, role: .primaryOwner, workspaceID: workspace.id, at: now())
        try audit(actor: email, "organisation.initialized", detail: "primary owner \(email)")
        return .created
    }

    public func addMember(actor: String, email: String, role: Role, workspace name: String = defaultWorkspace) throws {
        let email = try Validate.email(email)
        let workspace = try existingWorkspace(name)
        let actorRole = try requireRole(actor, in: workspace, "add members") { $0.managesIntegrations }
        guard role != .primaryOwner else { throw AdminError("a workspace has one primary owner; add owners instead") }
        if actorRole == .admin && (role == .owner || role == .admin) {
            throw AdminError("\(actor) is an admin of \(workspace.name) and may add only developers and users", kind: .forbidden)
        }
        guard try store.role(of: email, in: workspace.id) == nil else { throw AdminError("\(email) is already a member of \(workspace.name)") }
        try store.addMember(email: email, role: role, workspaceID: workspace.id, at: now())
        try audit(actor: actor, "member.added", detail: "\(email) as \(role.rawValue) in \(workspace.name)")
    }

    /// Creates a workspace; the actor (an owner of the default workspace) becomes its primary owner.
    public func createWorkspace(actor: String, name: String) throws -> Workspace {
        let name = try Validate.name(name, what: "workspace name")
        let home = try defaultWorkspace()
        _ = try requireRole(actor, in: home, "create workspaces") { $0 == .primaryOwner || $0 == .owner }
        guard try store.workspace(named: name) == nil else { throw AdminError("workspace \(name) already exists") }
        let workspace = try store.createWorkspace(name: name, at: now())
        try store.addMember(email: actor, role: .primaryOwner, workspaceID: workspace.id, at: now())
        try audit(actor: actor, "workspace.created", detail: name)
        return workspace
    }

    /// Sets the workspace's key for the upstream Messages API, sealed under the deployment's
    /// secrets key and bound to the workspace. Owners and the primary owner only; audited with the
    /// key's last four characters, never the key.
    public func setUpstreamKey(actor: String, workspace name: String, key: String, secrets: SecretBox) throws {
        let key = try Validate.upstreamKey(key)
        let last4 = String(key.suffix(4))
        try setUpstream(actor: actor, workspace: name, what: "set the upstream key", kind: .anthropic, settings: nil, credentials: Array(key.utf8),
                        last4: last4, secrets: secrets, action: "workspace.upstream_key_set", detail: "key ending in \(last4)")
    }

    /// Replaces the workspace's one upstream row (whatever its kind) with `credentials` sealed to
    /// the workspace; owners and the primary owner only; audited with `detail`, never the credentials.
    func setUpstream(actor: String, workspace name: String, what: String, kind: UpstreamKind, settings: CloudUpstreamSettings?,
                     credentials: [UInt8], last4: String, secrets: SecretBox, action: String, detail: String) throws {
        let workspace = try existingWorkspace(name)
        _ = try requireRole(actor, in: workspace, what) { $0 == .primaryOwner || $0 == .owner }
        // `--upstream LABEL [--priority N]`: a labelled upstream of the workspace's list, its
        // credentials bound to the label too (`default` is the workspace's own row).
        if let placement = UpstreamPlacement.current, placement.label != WorkspaceUpstream.defaultLabel {
            let label = try Validate.upstreamLabel(placement.label)
            let unsealed = SealedUpstreamKey(sealed: [], last4: last4, setAt: now(), setBy: actor, kind: kind, settings: settings, label: label)
            let sealed = try secrets.seal(credentials, associatedData: unsealed.associatedData(workspaceID: workspace.id))
            let key = SealedUpstreamKey(sealed: sealed, last4: last4, setAt: unsealed.setAt, setBy: actor, kind: kind, settings: settings, label: label)
            let priority = try placement.priority ?? store.workspaceUpstreams(workspaceID: workspace.id).first { $0.label == label }?.priority ?? 100
            try store.setWorkspaceUpstream(workspaceID: workspace.id, label: label, priority: priority, key)
            try audit(actor: actor, action, detail: "\(workspace.name): upstream \(label) (priority \(priority)): \(detail)")
            return
        }
        let sealed = try secrets.seal(credentials, associatedData: SealedUpstreamKey.associatedData(workspaceID: workspace.id, kind: kind, settings: settings))
        try store.setUpstreamKey(workspaceID: workspace.id, SealedUpstreamKey(sealed: sealed, last4: last4, setAt: now(), setBy: actor,
                                                                             kind: kind, settings: settings))
        if let priority = UpstreamPlacement.current?.priority {
            _ = try store.setWorkspaceUpstreamPriorities(workspaceID: workspace.id, [(WorkspaceUpstream.defaultLabel, priority)])
        }
        try audit(actor: actor, action, detail: "\(workspace.name): \(detail)")
    }

    /// A workspace and what may be shown of its upstream (whether set, its kind and settings, when,
    /// by whom, last 4); the credentials stay sealed.
    public func workspaceDetails(_ name: String) throws -> (workspace: Workspace, upstreamKey: SealedUpstreamKey?) {
        let workspace = try existingWorkspace(name)
        // Within `--upstream LABEL`: that upstream of the list.
        if let label = UpstreamPlacement.current?.label, label != WorkspaceUpstream.defaultLabel {
            return (workspace, try store.workspaceUpstreams(workspaceID: workspace.id).first { $0.label == label }?.key)
        }
        return (workspace, try store.upstreamKey(workspaceID: workspace.id))
    }

    // MARK: Apple keys

    /// Stores a team's App Attest data-service key (the `.p8`), sealed and bound to the team and
    /// key ID; owners and above of the workspace, audited (the key ID only, never the key).
    public func setAppleKey(actor: String, workspace name: String = defaultWorkspace, teamID: String, keyID: String, p8: String,
                            secrets: SecretBox) throws {
        let teamID = try Validate.teamID(teamID)
        guard keyID.utf8.count == 10, keyID.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x41...0x5a).contains($0) }) else {
            throw AdminError("--key-id must be the 10-character key ID Apple shows for the key (letters and digits), got \(keyID.prefix(40))")
        }
        guard let key = try? ECPrivateKey(pem: p8), (try? key.publicKey())?.isP256 == true else {
            throw AdminError("the key file is not an Apple .p8 key (a PKCS#8 P-256 private key in PEM)")
        }
        let workspace = try existingWorkspace(name)
        _ = try requireRole(actor, in: workspace, "set Apple keys") { $0 == .primaryOwner || $0 == .owner }
        let sealed = try secrets.seal(Array(p8.utf8), associatedData: SealedAppleKey.associatedData(teamID: teamID, keyID: keyID))
        try store.setAppleKey(SealedAppleKey(teamID: teamID, keyID: keyID, sealed: sealed, setAt: now(), setBy: actor))
        try audit(actor: actor, "apple_key.set", detail: "team \(teamID) key \(keyID)")
    }

    /// Every team's key record: team, key ID, when and by whom; the key itself stays sealed.
    public func appleKeys() throws -> [SealedAppleKey] { try store.appleKeys() }

    // MARK: Integrations

    public func createIntegration(actor: String, workspace workspaceName: String = defaultWorkspace, name: String, teamID: String,
                                  bundleIDs: [String], environments: Set<AttestationEnvironment> = [.development, .production],
                                  policy: IntegrationPolicy = IntegrationPolicy(), devicePolicy: DevicePolicy = DevicePolicy()) throws -> Integration {
        let policy = try Validate.policy(policy)
        let devicePolicy = try Validate.devicePolicy(devicePolicy)
        let name = try Validate.name(name, what: "integration name")
        let teamID = try Validate.teamID(teamID)
        let bundleIDs = try Validate.bundleIDs(bundleIDs)
        guard !environments.isEmpty else { throw AdminError("allow at least one environment: development, production") }
        let workspace = try existingWorkspace(workspaceName)
        _ = try requireRole(actor, in: workspace, "create integrations") { $0.managesIntegrations }
        let integration = Integration(
            clientID: DeviceTokenService.clientIDPrefix + base64URL(secureRandomBytes(18)),  // 144 random bits
            workspaceID: workspace.id, workspaceName: workspace.name, name: name, teamID: teamID, bundleIDs: bundleIDs,
            environments: environments, createdAt: now(), revokedAt: nil, policy: policy, devicePolicy: devicePolicy)
        try store.createIntegration(integration)
        try audit(actor: actor, "integration.created", clientID: integration.clientID,
                  detail: "\(name) team \(teamID) bundles \(bundleIDs.joined(separator: ",")) in \(workspace.name); \(Self.describe(policy)); "
                      + devicePolicy.summary)
        return integration
    }

    /// Changes what the integration's installs may spend; every instance applies it on its next
    /// request (the token check reads the policy). Admin or above; audited with old and new.
    public func updatePolicy(actor: String, clientID: String, _ change: (inout IntegrationPolicy) -> Void) throws -> Integration {
        try changing(actor: actor, clientID: clientID, \.policy, change, validate: Validate.policy, write: store.updatePolicy,
                     action: "integration.policy_updated", describe: Self.describe)
    }

    /// Changes which builds the integration admits; every instance applies it on its next
    /// exchange (registration and refresh read the integration). Admin or above; audited with old and new.
    public func updateDevicePolicy(actor: String, clientID: String, _ change: (inout DevicePolicy) -> Void) throws -> Integration {
        try changing(actor: actor, clientID: clientID, \.devicePolicy, change, validate: Validate.devicePolicy, write: store.updateDevicePolicy,
                     action: "integration.device_policy_updated", describe: \.summary)
    }

    /// Switches rules between `monitor` and `enforce` (the others keep their mode); every instance
    /// applies it on its next request or exchange. Admin or above; audited with the monitored rules old and new.
    public func setRuleModes(actor: String, clientID: String, _ modes: [PolicyRule: RuleMode]) throws -> Integration {
        try changing(actor: actor, clientID: clientID, \.policy, { policy in
            for (rule, mode) in modes {
                if mode == .monitor { policy.monitored.insert(rule) } else { policy.monitored.remove(rule) }
            }
        }, validate: Validate.policy, write: store.updatePolicy, action: "integration.rule_modes_updated",
           describe: { "monitor " + ($0.monitored.isEmpty ? "none" : PolicyRule.column($0.monitored)) })
    }

    /// Each rule's refusals and would-be refusals per integration and day, since `since`.
    public func ruleUsage(workspace name: String? = nil, clientID: String? = nil, since: Date? = nil, until: Date? = nil) throws -> [RuleUsageRow] {
        let workspaceID = try name.map { try existingWorkspace($0).id }
        if let clientID { _ = try integration(clientID) }
        if let since, let until, until <= since { throw AdminError("--until must be after --since") }
        return try store.ruleUsage(UsageFilter(workspaceID: workspaceID, clientID: clientID, since: since.map { Int64($0.timeIntervalSince1970) },
                                               until: until.map { Int64($0.timeIntervalSince1970.rounded(.up)) }))
    }

    /// One of the integration's policies changed: role checked, validated, written, audited as old -> new.
    private func changing<P>(actor: String, clientID: String, _ field: KeyPath<Integration, P>, _ change: (inout P) -> Void,
                             validate: (P) throws -> P, write: (String, P) throws -> Bool, action: String,
                             describe: (P) -> String) throws -> Integration {
        let integration = try integration(clientID)
        let workspace = try existingWorkspace(integration.workspaceName)
        _ = try requireRole(actor, in: workspace, "change integrations") { $0.managesIntegrations }
        var policy = integration[keyPath: field]
        change(&policy)
        policy = try validate(policy)
        guard try write(clientID, policy) else { throw AdminError("no integration \(clientID)") }
        try audit(actor: actor, action, clientID: clientID, detail: "\(describe(integration[keyPath: field])) -> \(describe(policy))")
        return try self.integration(clientID)
    }

    // MARK: The device inventory

    /// The integration's devices, newest first.
    public func devices(_ clientID: String, limit: Int = 1000, riskOver: Int? = nil) throws -> [Device] {
        _ = try integration(clientID)
        return try store.devices(clientID: clientID, limit: limit, riskOver: riskOver)
    }

    public func device(keyID: [UInt8]) throws -> Device {
        guard let device = try store.device(keyID: keyID) else { throw AdminError("no device with this key ID") }
        return device
    }

    public func deviceCounts(_ clientID: String) throws -> DeviceCounts { try store.deviceCounts(clientID: clientID) }

    /// The budgets in money, when any is set (`, monthly_budget_usd $2000.00, …`).
    static func describeMoney(_ policy: IntegrationPolicy) -> String {
        let budgets = [("monthly_budget_usd", policy.monthlyBudgetMicroUSD), ("daily_budget_usd", policy.dailyBudgetMicroUSD),
                       ("profile_monthly_budget_usd", policy.profileMonthlyBudgetMicroUSD), ("profile_daily_budget_usd", policy.profileDailyBudgetMicroUSD)]
        guard budgets.contains(where: { $0.1 > 0 }) else { return "" }
        return budgets.map { ", \($0.0) " + ($0.1 == 0 ? "none" : MoneyText.usd($0.1)) }.joined()
    }

    /// The policy in one line, for the audit trail and the CLI.
    public static func describe(_ policy: IntegrationPolicy) -> String {
        func limit(_ n: Int) -> String { n == 0 ? "none" : String(n) }
        let tools = policy.serverTools.map { $0.isEmpty ? "none" : $0.sorted().joined(separator: ",") } ?? "*"
        return "models \(policy.models?.joined(separator: ",") ?? "*"), max_tokens \(limit(policy.maxTokens)), "
            + "device_requests_per_minute \(limit(policy.deviceRequestsPerMinute)), monthly_token_budget \(limit(policy.monthlyTokenBudget)), "
            + "server_tools \(tools), max_server_tool_uses \(limit(policy.maxServerToolUses)), betas \(policy.betas?.joined(separator: ",") ?? "*"), "
            + "profile_requests_per_minute \(limit(policy.profileRequestsPerMinute)), "
            + "profile_monthly_token_budget \(limit(policy.profileMonthlyTokenBudget))"
            + Self.describeMoney(policy)
    }

    // MARK: Usage

    /// The ledger rows for a workspace (by name) and/or an integration: the hours that overlap
    /// [since, until) (the ledger is hourly, so an hour is taken whole).
    public func usage(workspace name: String? = nil, clientID: String? = nil, since: Date? = nil, until: Date? = nil) throws -> [UsageRow] {
        let workspaceID = try name.map { try existingWorkspace($0).id }
        if let clientID { _ = try integration(clientID) }
        if let since, let until, until <= since { throw AdminError("--until must be after --since") }
        return try store.usage(UsageFilter(workspaceID: workspaceID, clientID: clientID,
                                           since: since.map(UsageClock.hour),
                                           until: until.map { UsageClock.hour($0.addingTimeInterval(3599)) }))
    }

    public func integration(_ clientID: String) throws -> Integration {
        guard let integration = try store.integration(clientID: clientID) else { throw AdminError("no integration \(clientID)", kind: .notFound) }
        return integration
    }

    public func integrations(workspace name: String? = nil) throws -> [Integration] {
        try store.integrations(workspaceID: try name.map { try existingWorkspace($0).id })
    }

    public func counts(_ clientID: String) throws -> (devices: Int, liveTokens: Int) {
        try store.counts(clientID: clientID, at: now())
    }

    /// Permanent: the integration's live tokens stop working at once and its devices can never mint again.
    public func revokeIntegration(actor: String, clientID: String) throws {
        let integration = try integration(clientID)
        let workspace = try existingWorkspace(integration.workspaceName)
        _ = try requireRole(actor, in: workspace, "revoke integrations") { $0.managesIntegrations }
        guard try store.revokeIntegration(clientID: clientID, at: now()) else { throw AdminError("\(clientID) is already revoked") }
        try audit(actor: actor, "integration.revoked", clientID: clientID, detail: integration.name)
    }

    // MARK: Helpers

    func defaultWorkspace() throws -> Workspace {
        if let workspace = try store.workspace(named: Self.defaultWorkspace) { return workspace }
        return try store.createWorkspace(name: Self.defaultWorkspace, at: now())
    }

    func existingWorkspace(_ name: String) throws -> Workspace {
        guard let workspace = try store.workspace(named: name) else { throw AdminError("no workspace named \(name)", kind: .notFound) }
        return workspace
    }

    @discardableResult
    func requireRole(_ actor: String, in workspace: Workspace, _ action: String, _ allowed: (Role) -> Bool) throws -> Role {
        guard let role = try store.role(of: actor, in: workspace.id) else {
            throw AdminError("\(actor) is not a member of workspace \(workspace.name)", kind: .forbidden)
        }
        guard allowed(role) else { throw AdminError("\(actor) is \(role.rawValue) in \(workspace.name) and may not \(action)", kind: .forbidden) }
        return role
    }

    func audit(actor: String, _ action: String, clientID: String? = nil, detail: String) throws {
        try store.appendAudit([AuditEvent(at: now(), actor: actor, action: action, clientID: clientID, detail: detail)])
    }
}

/// Input rules for operator-supplied values.
public enum Validate {
    public static func email(_ text: String) throws -> String {
        let email = text.trimmingCharacters(in: .whitespaces).lowercased()
        let parts = email.split(separator: "@", omittingEmptySubsequences: false)
        guard email.count <= 254, parts.count == 2, !parts[0].isEmpty, parts[1].contains("."),
              !email.contains(where: { $0.isWhitespace || $0.isNewline }) else {
            throw AdminError("'\(text)' is not an email address")
        }
        return email
    }

    public static func name(_ text: String, what: String) throws -> String {
        let name = text.trimmingCharacters(in: .whitespaces)
        guard (1...100).contains(name.count), !name.contains(where: { $0.isNewline || $0.asciiValue.map { $0 < 0x20 } == true }) else {
            throw AdminError("\(what) must be 1 to 100 printable characters")
        }
        return name
    }

    /// An Apple Developer Team ID: 10 characters, A–Z and 0–9. Apple shows them in capitals; one
    /// typed in lowercase is the same ID, so it is taken in capitals.
    public static func teamID(_ text: String) throws -> String {
        let upper = text.trimmingCharacters(in: .whitespaces).uppercased()
        guard upper.count == 10 else {
            throw AdminError("team ID '\(text.prefix(40))' must be 10 characters, A-Z and 0-9; it has \(upper.count)")
        }
        guard upper.utf8.allSatisfy({ (0x41...0x5a).contains($0) || (0x30...0x39).contains($0) }) else {
            throw AdminError("team ID '\(text)' may hold only the letters A-Z and the digits 0-9")
        }
        return upper
    }

    /// 1 to 32 distinct bundle IDs, each reverse-DNS characters only (A–Z a–z 0–9 - .), at most 155 characters.
    public static func bundleIDs(_ ids: [String]) throws -> [String] {
        guard !ids.isEmpty else { throw AdminError("give at least one --bundle-id") }
        guard ids.count <= AdminService.maxBundleIDs else { throw AdminError("at most \(AdminService.maxBundleIDs) bundle IDs (got \(ids.count))") }
        var seen = Set<String>()
        for id in ids {
            guard (1...155).contains(id.utf8.count) else { throw AdminError("bundle ID '\(id.prefix(40))…' must be 1 to 155 characters") }
            let allowed = id.utf8.allSatisfy { b in
                (0x41...0x5a).contains(b) || (0x61...0x7a).contains(b) || (0x30...0x39).contains(b) || b == 0x2d || b == 0x2e
            }
            guard allowed, !id.hasPrefix("."), !id.hasSuffix("."), !id.contains("..") else {
                throw AdminError("bundle ID '\(id)' may contain only A-Z, a-z, 0-9, '-' and '.' in dot-separated parts")
            }
            guard seen.insert(id.lowercased()).inserted else { throw AdminError("bundle ID '\(id)' is given twice") }
        }
        return ids
    }

    /// An upstream API key: printable ASCII without spaces, 8 to 256 characters, white space
    /// around it trimmed (key files usually end with a newline).
    public static func upstreamKey(_ text: String) throws -> String {
        let key = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard (8...256).contains(key.utf8.count), key.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) else {
            throw AdminError("the upstream key must be 8 to 256 printable ASCII characters without spaces")
        }
        return key
    }

    /// Model IDs as the API spells them, at most 64 of them; limits not negative.
    public static func policy(_ policy: IntegrationPolicy) throws -> IntegrationPolicy {
        var policy = policy
        if let models = policy.models {
            guard !models.isEmpty else { throw AdminError("--models needs at least one model ID, or '*' for any") }
            guard models.count <= 64 else { throw AdminError("at most 64 models (got \(models.count))") }
            for model in models where !IntegrationPolicy.isValidModelID(model) {
                throw AdminError("model ID '\(model.prefix(60))' may contain only letters, digits and . _ : @ / - (at most 128)")
            }
            var seen = Set<String>()
            policy.models = models.filter { seen.insert($0).inserted }
        }
        for (name, value) in [("--max-tokens", policy.maxTokens), ("--device-requests-per-minute", policy.deviceRequestsPerMinute),
                              ("--monthly-token-budget", policy.monthlyTokenBudget), ("--max-server-tool-uses", policy.maxServerToolUses),
                              ("--profile-requests-per-minute", policy.profileRequestsPerMinute),
                              ("--profile-monthly-token-budget", policy.profileMonthlyTokenBudget)] where value < 0 {
            throw AdminError("\(name) must be 0 (no limit) or more, got \(value)")
        }
        if let tools = policy.serverTools, let unknown = tools.first(where: { !IntegrationPolicy.serverToolNames.contains($0) }) {
            throw AdminError("--server-tools: '\(unknown.prefix(60))' is not a server tool; use "
                             + IntegrationPolicy.serverToolNames.joined(separator: ", ") + ", '*' for any or 'none'")
        }
        if let betas = policy.betas {
            guard betas.count <= 64 else { throw AdminError("--betas: at most 64 betas (got \(betas.count))") }
            for beta in betas where !IntegrationPolicy.isValidBetaName(beta) {
                throw AdminError("--betas: '\(beta.prefix(60))' may contain only letters, digits and . _ - (at most 128)")
            }
            var seen = Set<String>()
            policy.betas = betas.filter { seen.insert($0).inserted }
        }
        return policy
    }

    /// `--server-tools`: a comma list of `IntegrationPolicy.serverToolNames`, `*` (nil: any) or `none` (empty).
    public static func serverTools(_ text: String) throws -> Set<String>? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed == "*" { return nil }
        if trimmed.lowercased() == "none" { return [] }
        let names = trimmed.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        guard !names.isEmpty else { throw AdminError("--server-tools needs a list, '*' for any or 'none'") }
        return try policy(IntegrationPolicy(serverTools: Set(names))).serverTools
    }

    /// `--betas`: a comma list, or `*` (nil: any).
    public static func betas(_ text: String) throws -> [String]? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed == "*" { return nil }
        let names = trimmed.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        return try policy(IntegrationPolicy(betas: names)).betas
    }

    /// Every environment admits at least one channel (refusing an environment is `--environments`'
    /// job), at least one platform.
    public static func devicePolicy(_ policy: DevicePolicy) throws -> DevicePolicy {
        for environment in AttestationEnvironment.allCases where policy.admitted(environment).isEmpty {
            throw AdminError("--distribution \(environment.rawValue)= admits nothing: name at least one of "
                             + Distribution.admissible.map(\.rawValue).joined(separator: ", ") + " (use --environments to refuse an environment)")
        }
        for environment in AttestationEnvironment.allCases {
            if let never = policy.admitted(environment).first(where: \.isAlwaysRefused) {
                throw AdminError("--distribution: \(never.rawValue) builds are never admitted")
            }
        }
        guard !policy.platforms.isEmpty else { throw AdminError("--platforms needs at least one of ios, macos") }
        return policy
    }

    /// `ENV=NAME,NAME`: the channels one environment admits.
    public static func distribution(_ text: String) throws -> (AttestationEnvironment, Set<Distribution>) {
        guard let equals = text.firstIndex(of: "=") else {
            throw AdminError("--distribution \(text.prefix(80)): use ENVIRONMENT=NAME,… such as production=app-store,testflight")
        }
        let name = text[..<equals].trimmingCharacters(in: .whitespaces)
        guard let environment = AttestationEnvironment(rawValue: name) else {
            throw AdminError("--distribution: unknown environment '\(name.prefix(40))': use development or production")
        }
        var set = Set<Distribution>()
        for part in text[text.index(after: equals)...].split(separator: ",") {
            let word = part.trimmingCharacters(in: .whitespaces)
            guard let distribution = Distribution(rawValue: word) else {
                throw AdminError("--distribution: unknown channel '\(word.prefix(40))': use " + Distribution.admissible.map(\.rawValue).joined(separator: ", "))
            }
            guard !distribution.isAlwaysRefused else {
                throw AdminError("--distribution: \(word) builds are never admitted (invalid, os and restricted are always refused)")
            }
            set.insert(distribution)
        }
        return (environment, set)
    }

    public static func platforms(_ text: String) throws -> Set<DevicePlatform> {
        var result = Set<DevicePlatform>()
        for part in text.split(separator: ",") {
            let word = part.trimmingCharacters(in: .whitespaces)
            guard let platform = DevicePlatform(rawValue: word) else { throw AdminError("--platforms: unknown platform '\(word.prefix(40))': use ios, macos") }
            result.insert(platform)
        }
        return result
    }

    public static func bundleVersion(_ text: String) throws -> BundleVersion {
        guard let version = BundleVersion(text.trimmingCharacters(in: .whitespaces)) else {
            throw AdminError("--min-bundle-version \(text.prefix(40)): use dotted numbers such as 1314 or 2.1.0 (at most 8 parts)")
        }
        return version
    }

    public static func environments(_ text: String) throws -> Set<AttestationEnvironment> {
        var result = Set<AttestationEnvironment>()
        for part in text.split(separator: ",") {
            guard let environment = AttestationEnvironment(rawValue: part.trimmingCharacters(in: .whitespaces)) else {
                throw AdminError("unknown environment '\(part)': use development, production or both")
            }
            result.insert(environment)
        }
        guard !result.isEmpty else { throw AdminError("--environments needs development, production or both") }
        return result
    }
}
