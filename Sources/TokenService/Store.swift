import AttestWire
import AttestCrypto
import AppAttest
import Foundation
import Lifecycle

/// Persistence for the token service, by capability: each part of the service asks only for
/// what it uses (the usage ledger a `UsageStore`, the audit log an `AuditStore`), and each
/// database implements them all (`Database`). Every method that must not race
/// (challenge use, counter advance, registration, revocation) is one atomic operation in the
/// implementation.
public protocol OrganisationStore: AnyObject, Sendable {
    func workspace(named name: String) throws -> Workspace?
    func createWorkspace(name: String, at: Date) throws -> Workspace
    func role(of email: String, in workspaceID: Int64) throws -> Role?
    func primaryOwner(workspaceID: Int64) throws -> String?
    func addMember(email: String, role: Role, workspaceID: Int64, at: Date) throws
    /// Sets (or replaces) the workspace's sealed upstream key.
    func setUpstreamKey(workspaceID: Int64, _ key: SealedUpstreamKey) throws
    func upstreamKey(workspaceID: Int64) throws -> SealedUpstreamKey?
    /// The workspace's upstreams: its own (`default`, with its priority) and its labelled ones.
    func workspaceUpstreams(workspaceID: Int64) throws -> [WorkspaceUpstream]
    /// Adds or replaces a labelled upstream (and changes the workspace's `upstreams_version`).
    func setWorkspaceUpstream(workspaceID: Int64, label: String, priority: Int, _ key: SealedUpstreamKey) throws
    /// Removes one upstream (`default`: the workspace's own row); false when there was none.
    func removeWorkspaceUpstream(workspaceID: Int64, label: String) throws -> Bool
    /// Sets priorities by label, in one transaction; false when a label is not there.
    func setWorkspaceUpstreamPriorities(workspaceID: Int64, _ priorities: [(label: String, priority: Int)]) throws -> Bool

}

/// App integrations and their policy.
public protocol IntegrationStore: AnyObject, Sendable {
    func createIntegration(_ integration: Integration) throws
    func integration(clientID: String) throws -> Integration?
    func integrations(workspaceID: Int64?) throws -> [Integration]
    /// Marks the integration revoked and revokes its live tokens, in one transaction. False if it was already revoked.
    func revokeIntegration(clientID: String, at: Date) throws -> Bool
    func counts(clientID: String, at: Date) throws -> (devices: Int, liveTokens: Int)

    /// Replaces the integration's policy; false when no integration has this client ID.
    func updatePolicy(clientID: String, _ policy: IntegrationPolicy) throws -> Bool
    /// Replaces which builds the integration admits; false when no integration has this client ID.
    func updateDevicePolicy(clientID: String, _ policy: DevicePolicy) throws -> Bool
}

/// What the devices said: the inventory operators read.
public protocol DeviceInventoryStore: AnyObject, Sendable {
    /// The integration's devices, newest registration first, at most `limit`; with `riskOver`,
    /// only those whose latest Apple risk metric is above it, highest first.
    func devices(clientID: String, limit: Int, riskOver: Int?) throws -> [Device]
    /// The device with this key ID, whichever integration it belongs to (key IDs are unique).
    func device(keyID: [UInt8]) throws -> Device?
    func deviceCounts(clientID: String) throws -> DeviceCounts
}

/// The device token exchange: challenges, devices, tokens and the rolling limits.
public protocol ExchangeStore: AnyObject, Sendable {
    /// The pending (unused, unexpired) challenge for the pair, or `fresh` stored as the new one.
    func pendingOrNewChallenge(clientID: String, keyID: [UInt8], fresh: IssuedChallenge, at: Date) throws -> IssuedChallenge
    /// The pending challenge for the pair, without using it.
    func pendingChallenge(clientID: String, keyID: [UInt8], at: Date) throws -> [UInt8]?
    /// Marks the pending challenge used (only if it is still `challenge`, when given) and returns
    /// it; nil when there is none. This is how a failed attempt uses the challenge up.
    func consumeChallenge(clientID: String, keyID: [UInt8], challenge: [UInt8]?, at: Date) throws -> [UInt8]?

    /// What an exchange reads before it verifies, in one read (one round trip on PostgreSQL,
    /// one read transaction on SQLite): the integration, the pair's pending challenge, its device.
    func exchangeContext(clientID: String, keyID: [UInt8], at: Date) throws -> ExchangeContext

    // Devices and tokens
    func device(clientID: String, keyID: [UInt8]) throws -> Device?
    /// In one transaction: uses up `challenge` (when given; `.challengeGone` if it is no longer
    /// pending), checks the integration's registration quota (`.quotaExceeded`: the challenge is
    /// used up all the same), stores the device and its first token (`.conflict` if the key is
    /// registered or the integration revoked) and the next challenge. The challenge's expiry and
    /// the quota's window are read at `commitTime()`, called inside the transaction (once it holds
    /// the locks it needs), so verification that outlasts the challenge does not redeem it.
    func registerDevice(_ device: Device, receipt: DeviceReceipt, firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                        nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at: Date,
                        commitTime: @Sendable () -> Date) throws -> CommitResult
    /// In one transaction: uses up `challenge` (when given, as pending at `commitTime()`),
    /// advances the counter from `from` to `to` (`.conflict` when it was no longer `from`: a
    /// concurrent request won; the challenge is used up all the same), records what the device
    /// said (`refresh`, with the time as its last refresh), stores the token and the next challenge.
    func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, refresh: DeviceRefresh?, token: TokenRecord,
                        redeeming challenge: [UInt8]?, nextChallenge: IssuedChallenge, at: Date,
                        commitTime: @Sendable () -> Date) throws -> CommitResult
    /// `registerDevice` and `advanceCounter` answering through `completion` once the transaction
    /// has committed, on whichever thread committed it: a store that commits transactions in
    /// batches (SQLite's group commit) frees the caller's thread meanwhile. By default they run
    /// the waiting form and call `completion` before returning.
    func registerDevice(_ device: Device, receipt: DeviceReceipt, firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                        nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at: Date, commitTime: @escaping @Sendable () -> Date,
                        completion: @escaping @Sendable (Result<CommitResult, any Error>) -> Void)
    func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, refresh: DeviceRefresh?, token: TokenRecord,
                        redeeming challenge: [UInt8]?, nextChallenge: IssuedChallenge, at: Date, commitTime: @escaping @Sendable () -> Date,
                        completion: @escaping @Sendable (Result<CommitResult, any Error>) -> Void)
    /// The grant behind a token hash if it is live: unexpired, unrevoked, integration not revoked;
    /// with the workspace's sealed upstream key, in the same query.
    func liveToken(hash: [UInt8], at: Date) throws -> TokenGrant?

    // Rate limits, counted in the database so that every instance sees the same windows.
    /// Tokens minted for the device since `since` (a rolling window).
    func mintsSince(clientID: String, keyID: [UInt8], since: Date) throws -> WindowCount
    /// Devices registered for the integration since `since`.
    func registrationsSince(clientID: String, since: Date) throws -> WindowCount
    /// Records one challenge request by `caller` at `at` and counts the caller's requests since `since`, this one included.
    func recordChallengeRequest(caller: String, at: Date, since: Date) throws -> WindowCount
    /// Forgets challenge requests older than `before`; returns how many.
    /// Forgets challenge requests from before `before`, and registration requests (their bucket
    /// starts with `DeviceTokenService.registrationBucketPrefix`) from before `registrationsBefore`.
    func purgeChallengeRequests(before: Date, registrationsBefore: Date) throws -> Int

    /// Deletes challenges that are used or expired before `before`; returns how many.
    func purgeChallenges(before: Date) throws -> Int
}

/// The usage ledger.
public protocol UsageStore: AnyObject, Sendable {
    /// Adds a batch of usage (every count an increment) in one transaction, and forgets device
    /// minutes before `purgeDeviceMinutesBefore`. A batch with an `id` already recorded adds
    /// nothing (false): it was committed by an earlier attempt whose answer was lost.
    @discardableResult
    func recordUsage(_ batch: UsageBatch, purgeDeviceMinutesBefore: Int64) throws -> Bool
    /// The ledger rows the filter selects, with their errors, refusals and server-tool counts.
    func usage(_ filter: UsageFilter) throws -> [UsageRow]
    /// What every instance has flushed for one user profile (its budget's month, its limit's two minutes).
    func recordedProfileUsage(clientID: String, profile: String, month: Int64, minute: Int64) throws -> RecordedProfileUsage
    /// Each rule's refusals and would-be refusals per integration and day (`policy_rule_days`),
    /// with the rule's mode now; the filter's `since`/`until` select days.
    func ruleUsage(_ filter: UsageFilter) throws -> [RuleUsageRow]

}

/// The audit trail.
public protocol AuditStore: AnyObject, Sendable {
    /// Appends events; an event with a `minute` adds its count to the row of its action, client
    /// ID, reason and minute (one row however many refusals a minute brings).
    func appendAudit(_ events: [AuditEvent]) throws
    /// The newest audit events, newest first, older than the row `beforeID` when given (pages by
    /// key: the CLI, the console's pages, tests).
    func auditEvents(limit: Int, beforeID: Int64?, clientID: String?) throws -> [AuditEvent]
    /// The integration's events with these actions, newest first (a few rows, read by index,
    /// however many events the integration's devices wrote).
    func auditEvents(clientID: String, actions: [String]) throws -> [AuditEvent]
    /// Deletes up to `limit` of the oldest events from before `time`; returns how many.
    func purgeAudit(before time: Date, limit: Int) throws -> Int
}

extension AuditStore {
    public func auditEvents(limit: Int = 100, clientID: String? = nil) throws -> [AuditEvent] {
        try auditEvents(limit: limit, beforeID: nil, clientID: clientID)
    }
}

/// What every store says about itself, apart from what it stores: whether it can serve, what it
/// runs in the background, and whether its reads wait on another machine.
public protocol StoreHealth: AnyObject, Sendable {
    /// Nil when the store can serve (open, writable, the same database, room on disk); else why not.
    func readinessProblem() -> String?
    /// What the store runs in the background while the service runs (a watch on its file).
    var backgroundServices: [any Service] { get }
    /// True when a read waits on another machine (PostgreSQL): routes that read run on a worker
    /// then, never on an event loop (the token check excepted: it has `NonBlockingTokenChecks`). A local read (SQLite in WAL mode: the page cache, no lock
    /// held by a writer) stays on the loop, where a hop to a worker and back would cost more
    /// than the read itself.
    var readsCrossTheNetwork: Bool { get }
}

/// The device token exchange's store: challenges, registration, tokens, and the integrations
/// they belong to.
public typealias DeviceExchangeStore = ExchangeStore & IntegrationStore & StoreHealth

/// What the operators' service reads and changes (attestctl, the console).
public typealias AdministrationStore = OrganisationStore & IntegrationStore & DeviceInventoryStore & UsageStore & AuditStore
    & ReceiptRefreshStore & ConsoleStore & SealedSecretsStore & SecretsKeyReadStore & CloudEndpointPinStore & InstanceStore & PriceStore

/// Where each attestd listens (a row per host and public listener, written by the instance when
/// its listeners open, read by `attestctl console-login`).
public protocol InstanceStore: AnyObject, Sendable {
    /// Inserts the row of `instance.host` and `instance.publicAddress`, or replaces it.
    func recordInstance(_ instance: AttestdInstance) throws
    /// Every row, the most recently started first.
    func attestdInstances() throws -> [AttestdInstance]
}

/// The hosts a cloud upstream's credentials may go to, for the whole deployment (none: any).
public protocol CloudEndpointPinStore: AnyObject, Sendable {
    func cloudEndpointPins() throws -> [String]
    /// Replaces the list (empty: any host).
    func setCloudEndpointPins(_ hosts: [String], at time: Date, by actor: String) throws
}

/// What each attestd last read from its secrets key files (a row per host and key file, written
/// by the instance, read by `attestctl secrets status` and `finish-rotation`): key IDs as
/// operators see them, never a key.
public protocol SecretsKeyReadStore: AnyObject, Sendable {
    /// Inserts the row of `read.host` and `read.keyFile`, or replaces it.
    func recordSecretsKeyRead(_ read: SecretsKeyRead) throws
    /// Every row, by host, then key file.
    func secretsKeyReads() throws -> [SecretsKeyRead]
    /// Deletes the rows last reported before `time` (instances long gone); returns how many.
    func purgeSecretsKeyReads(before time: Date) throws -> Int
}

/// Every value sealed under the secrets key, for a rotation: read them all, replace them one at
/// a time, each only if nobody changed it meanwhile.
public protocol SealedSecretsStore: AnyObject, Sendable {
    func sealedSecrets() throws -> [SealedSecret]
    /// Replaces one sealed value if it still holds `old`; false when it changed or went meanwhile.
    func replaceSealedSecret(_ owner: SealedSecret.Owner, old: [UInt8], new: [UInt8]) throws -> Bool
}

/// A value sealed under the secrets key, and what it is bound to.
public struct SealedSecret: Sendable, Equatable {
    public enum Owner: Sendable, Hashable, CustomStringConvertible {
        /// A workspace's upstream credentials (an API key, AWS keys, a service account).
        case upstream(workspaceID: Int64)
        /// A team's App Attest data-service key.
        case appleKey(teamID: String, keyID: String)
        /// A labelled upstream's credentials (`workspace_upstreams`).
        case labelledUpstream(workspaceID: Int64, label: String)
        /// A webhook endpoint's signing secret (sealed to its workspace and URL).
        case webhook(endpointID: Int64, workspaceID: Int64, url: String)

        public var description: String {
            switch self {
            case .labelledUpstream(let id, let label): "the credentials of upstream \(label) of workspace #\(id)"
            case .upstream(let id): "the upstream credentials of workspace #\(id)"
            case .appleKey(let team, let key): "Apple key \(key) of team \(team)"
            case .webhook(let id, _, let url): "the signing secret of webhook #\(id) (\(url))"
            }
        }
    }
    public let owner: Owner
    public let sealed: [UInt8]
    /// A cloud upstream's kind and settings, which its credentials are sealed with.
    public let upstreamKind: UpstreamKind
    public let upstreamSettings: CloudUpstreamSettings?

    public init(owner: Owner, sealed: [UInt8], upstreamKind: UpstreamKind = .anthropic, upstreamSettings: CloudUpstreamSettings? = nil) {
        self.owner = owner
        self.sealed = sealed
        self.upstreamKind = upstreamKind
        self.upstreamSettings = upstreamSettings
    }

    /// A workspace's upstream row as a sealed value.
    public init(workspaceID: Int64, upstream: SealedUpstreamKey) {
        let owner: Owner = upstream.label.map { .labelledUpstream(workspaceID: workspaceID, label: $0) } ?? .upstream(workspaceID: workspaceID)
        self.init(owner: owner, sealed: upstream.sealed, upstreamKind: upstream.kind, upstreamSettings: upstream.settings)
    }

    /// What the value was sealed to: it opens only with the same.
    public var associatedData: [UInt8] {
        switch owner {
        case .upstream(let id): SealedUpstreamKey.associatedData(workspaceID: id, kind: upstreamKind, settings: upstreamSettings)
        case .labelledUpstream(let id, let label): SealedUpstreamKey.associatedData(workspaceID: id, label: label, kind: upstreamKind, settings: upstreamSettings)
        case .appleKey(let team, let key): SealedAppleKey.associatedData(teamID: team, keyID: key)
        case .webhook(_, let workspaceID, let url): WebhookEndpoint.associatedData(workspaceID: workspaceID, url: url)
        }
    }

    /// What it may have been sealed to, `associatedData` first: a cloud upstream sealed before its
    /// settings were bound was sealed to its workspace alone. A rotation re-seals a value to what
    /// it opened with, and never binds settings nobody looked at.
    public var associatedDataCandidates: [[UInt8]] {
        guard case .upstream(let id) = owner, upstreamKind != .anthropic else { return [associatedData] }
        return [associatedData, SealedUpstreamKey.associatedData(workspaceID: id)]
    }
}

/// One database with every capability: what `Stores.open` returns and each database
/// implements. Only the composition root (attestd, attestctl) holds it whole; each service
/// takes the capabilities it uses.
public typealias Database = DeviceExchangeStore & AdministrationStore

/// The integration, the pending challenge and the device an exchange starts from (each nil when absent).
public struct ExchangeContext: Sendable {
    public var integration: Integration?
    public var challenge: [UInt8]?
    public var device: Device?
    public init(integration: Integration?, challenge: [UInt8]?, device: Device?) {
        self.integration = integration
        self.challenge = challenge
        self.device = device
    }
}

/// Events in a rolling window: how many, and when the oldest happened (for `Retry-After`).
public struct WindowCount: Sendable, Equatable {
    public let count: Int
    public let oldest: Date?
    public init(count: Int, oldest: Date?) {
        self.count = count
        self.oldest = oldest
    }
}

/// A store failure that means "not now" rather than "never": the database is busy, locked,
/// unreachable or timed out. The service answers 503 for it, and recovers by itself.
public protocol StoreAvailabilityError: Error {
    var isUnavailable: Bool { get }
}

/// A migration file of `Migrations/<dialect>/`, by its name (`0001_initial.sql`) and SQL; each
/// store applies its dialect's list and records the checksum.
public struct Migration: Sendable {
    public let name: String
    public let sql: String
    public var version: Int { Int(name.prefix { $0.isNumber }) ?? 0 }
    /// SHA-256 of the SQL, trailing newlines ignored (so the embedded copy and the file agree).
    public var checksum: String {
        var text = Substring(sql)
        while text.last == "\n" || text.last == "\r" { text = text.dropLast() }
        return hexString(sha256(Array(text.utf8)))
    }

    public init(name: String, sql: String) {
        self.name = name
        self.sql = sql
    }
}

/// What a store does with the schema when it opens.
public enum MigrationMode: Sendable {
    /// Apply missing migrations (the default, and `attestctl migrate`).
    case apply
    /// Only check: refuse a database that lacks a migration, or differs (`attestd serve --no-migrate`).
    case verify
}

/// The outcome of a write that redeems a challenge.
public enum CommitResult: Sendable, Equatable {
    case committed
    /// The challenge was used or expired meanwhile (a concurrent request redeemed it).
    case challengeGone
    /// The row the write depended on changed: key already registered, counter moved, integration revoked.
    case conflict
    /// The integration already holds its quota of registrations in the window.
    case quotaExceeded
}

/// Successful registrations an integration may have in a rolling window, checked in the
/// registration's own transaction (with concurrent registrations of the integration serialised),
/// so that no number of concurrent requests can overshoot it.
public struct RegistrationQuota: Sendable, Equatable {
    public let limit: Int
    public let window: TimeInterval
    public init(limit: Int, window: TimeInterval) {
        self.limit = limit
        self.window = window
    }
}

extension StoreHealth {
    public var backgroundServices: [any Service] { [] }
}

extension DeviceInventoryStore {
    public func devices(clientID: String, limit: Int) throws -> [Device] { try devices(clientID: clientID, limit: limit, riskOver: nil) }
}

extension ExchangeStore {
    public func registerDevice(_ device: Device, receipt: DeviceReceipt, firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at time: Date, commitTime: @escaping @Sendable () -> Date,
                               completion: @escaping @Sendable (Result<CommitResult, any Error>) -> Void) {
        completion(Result {
            try registerDevice(device, receipt: receipt, firstToken: firstToken, redeeming: challenge, nextChallenge: nextChallenge, quota: quota,
                               at: time, commitTime: commitTime)
        })
    }

    public func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, refresh: DeviceRefresh?, token: TokenRecord,
                               redeeming challenge: [UInt8]?, nextChallenge: IssuedChallenge, at time: Date, commitTime: @escaping @Sendable () -> Date,
                               completion: @escaping @Sendable (Result<CommitResult, any Error>) -> Void) {
        completion(Result {
            try advanceCounter(clientID: clientID, keyID: keyID, from: from, to: to, refresh: refresh, token: token, redeeming: challenge,
                               nextChallenge: nextChallenge, at: time, commitTime: commitTime)
        })
    }

    public func consumeChallenge(clientID: String, keyID: [UInt8], at time: Date) throws -> [UInt8]? {
        try consumeChallenge(clientID: clientID, keyID: keyID, challenge: nil, at: time)
    }

    /// A receipt stored as it came, unread (tools and tests).
    public func registerDevice(_ device: Device, receipt: [UInt8], firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at time: Date,
                               commitTime: @Sendable () -> Date) throws -> CommitResult {
        try registerDevice(device, receipt: DeviceReceipt(der: receipt), firstToken: firstToken, redeeming: challenge,
                           nextChallenge: nextChallenge, quota: quota, at: time, commitTime: commitTime)
    }

    /// Without a challenge to redeem (tools and tests): true when committed.
    public func registerDevice(_ device: Device, receipt: [UInt8], firstToken: TokenRecord, nextChallenge: IssuedChallenge, at time: Date) throws -> Bool {
        try registerDevice(device, receipt: receipt, firstToken: firstToken, redeeming: nil, nextChallenge: nextChallenge, at: time) == .committed
    }

    /// With no quota, the challenge checked at `time`.
    public func registerDevice(_ device: Device, receipt: [UInt8], firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, at time: Date) throws -> CommitResult {
        try registerDevice(device, receipt: receipt, firstToken: firstToken, redeeming: challenge, nextChallenge: nextChallenge,
                           quota: nil, at: time, commitTime: { time })
    }

    public func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, token: TokenRecord,
                               nextChallenge: IssuedChallenge, at time: Date) throws -> Bool {
        try advanceCounter(clientID: clientID, keyID: keyID, from: from, to: to, token: token, redeeming: nil,
                           nextChallenge: nextChallenge, at: time) == .committed
    }

    /// The challenge checked at `time`.
    public func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, token: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, at time: Date) throws -> CommitResult {
        try advanceCounter(clientID: clientID, keyID: keyID, from: from, to: to, refresh: nil, token: token, redeeming: challenge,
                           nextChallenge: nextChallenge, at: time, commitTime: { time })
    }
}
