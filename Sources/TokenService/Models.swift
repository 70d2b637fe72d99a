import AppAttest
import Foundation

/// Roles of workspace members, from most to least privileged.
public enum Role: String, Sendable, CaseIterable {
    case primaryOwner = "primary_owner"
    case owner
    case admin
    case developer
    case user

    /// Who may create and revoke integrations.
    public var managesIntegrations: Bool { self == .primaryOwner || self == .owner || self == .admin }
}

public struct Workspace: Sendable, Equatable {
    public let id: Int64
    public let name: String
    public init(id: Int64, name: String) {
        self.id = id
        self.name = name
    }
}

/// An app integration: the registered app(s) whose genuine installs may mint tokens.
public struct Integration: Sendable, Equatable {
    public let clientID: String
    public let workspaceID: Int64
    public let workspaceName: String
    public let name: String
    public let teamID: String
    public let bundleIDs: [String]
    public let environments: Set<AttestationEnvironment>
    public let createdAt: Date
    public let revokedAt: Date?
    /// What its installs may spend through the Messages relay.
    public var policy: IntegrationPolicy
    /// Which builds, platforms and versions may register and refresh.
    public var devicePolicy: DevicePolicy

    public var isRevoked: Bool { revokedAt != nil }
    public var appIDs: [AppID] { bundleIDs.map { AppID(teamID: teamID, bundleID: $0) } }

    public init(clientID: String, workspaceID: Int64, workspaceName: String, name: String, teamID: String, bundleIDs: [String],
                environments: Set<AttestationEnvironment>, createdAt: Date, revokedAt: Date?, policy: IntegrationPolicy = IntegrationPolicy(),
                devicePolicy: DevicePolicy = DevicePolicy()) {
        self.clientID = clientID
        self.policy = policy
        self.devicePolicy = devicePolicy
        self.workspaceID = workspaceID
        self.workspaceName = workspaceName
        self.name = name
        self.teamID = teamID
        self.bundleIDs = bundleIDs
        self.environments = environments
        self.createdAt = createdAt
        self.revokedAt = revokedAt
    }
}

/// A registered App Attest key.
public struct Device: Sendable, Equatable {
    public let keyID: [UInt8]
    public let clientID: String
    public let publicKey: [UInt8]
    public let counter: UInt32
    public let environment: AttestationEnvironment
    public let appID: String
    // The inventory: what the device said (nil: registered before the inventory, or not written).
    public let platform: DevicePlatform?
    /// The validation category it registered with (or first wrote); it may never change.
    public let validationCategory: UInt32?
    /// As of its last exchange.
    public let bundleVersion: String?
    /// From the credential certificate (informational).
    public let osVersion: String?
    public let registeredAt: Date?
    public let lastRefreshAt: Date?
    /// What its latest validated receipt says and Apple's metric (nil: receipts unchecked at registration).
    public let risk: DeviceRisk?

    public var distribution: Distribution? { validationCategory.map(Distribution.init(category:)) }

    public init(keyID: [UInt8], clientID: String, publicKey: [UInt8], counter: UInt32, environment: AttestationEnvironment, appID: String,
                platform: DevicePlatform? = nil, validationCategory: UInt32? = nil, bundleVersion: String? = nil, osVersion: String? = nil,
                registeredAt: Date? = nil, lastRefreshAt: Date? = nil, risk: DeviceRisk? = nil) {
        self.keyID = keyID
        self.clientID = clientID
        self.publicKey = publicKey
        self.counter = counter
        self.environment = environment
        self.appID = appID
        self.platform = platform
        self.validationCategory = validationCategory
        self.bundleVersion = bundleVersion
        self.osVersion = osVersion
        self.registeredAt = registeredAt
        self.lastRefreshAt = lastRefreshAt
        self.risk = risk
    }
}

/// A device's latest validated receipt, as read back: its times and Apple's fraud-risk metric.
public struct DeviceRisk: Sendable, Equatable {
    public var receiptCreatedAt: Date
    public var receiptNotBefore: Date?
    public var receiptExpiresAt: Date?
    /// Nil until Apple's first refreshed receipt (an ATTEST receipt carries none).
    public var metric: Int?
    public var checkedAt: Date?
    /// When a refresh first found the metric above the integration's limit.
    public var overLimitAt: Date?

    public init(receiptCreatedAt: Date, receiptNotBefore: Date? = nil, receiptExpiresAt: Date? = nil, metric: Int? = nil,
                checkedAt: Date? = nil, overLimitAt: Date? = nil) {
        self.receiptCreatedAt = receiptCreatedAt
        self.receiptNotBefore = receiptNotBefore
        self.receiptExpiresAt = receiptExpiresAt
        self.metric = metric
        self.checkedAt = checkedAt
        self.overLimitAt = overLimitAt
    }

    /// The operator's bands, as Apple suggests watching them: 0–2, 3–5, 6–25, above 25.
    public static func band(_ metric: Int?) -> String {
        guard let metric else { return "unknown" }
        switch metric {
        case ...2: return "0-2"
        case 3...5: return "3-5"
        case 6...25: return "6-25"
        default: return "over-25"
        }
    }
}

/// The receipt a registration stores: the bytes as the device sent them and, when the verifier
/// validated them, what they say, which the refresh job needs (the certificate every later
/// receipt must name, and when Apple may be asked again).
public struct DeviceReceipt: Sendable, Equatable {
    public var der: [UInt8]
    public var credentialCertificate: [UInt8]?
    public var risk: DeviceRisk?
    /// When the refresh job first posts it (nil: never, the receipt was not validated).
    public var refreshDueAt: Date?

    public init(der: [UInt8], credentialCertificate: [UInt8]? = nil, risk: DeviceRisk? = nil, refreshDueAt: Date? = nil) {
        self.der = der
        self.credentialCertificate = credentialCertificate
        self.risk = risk
        self.refreshDueAt = refreshDueAt
    }
}

/// What a refresh learned about the device, stored with its counter.
public struct DeviceRefresh: Sendable, Equatable {
    /// Recorded only when the device had none (registered before the inventory, or on an older system).
    public let validationCategory: UInt32?
    /// Replaces the stored one when the device wrote one.
    public let bundleVersion: String?
    public let platform: DevicePlatform?

    public init(validationCategory: UInt32?, bundleVersion: String?, platform: DevicePlatform?) {
        self.validationCategory = validationCategory
        self.bundleVersion = bundleVersion
        self.platform = platform
    }
}

/// How an integration's devices divide, for `integrations show`.
public struct DeviceCounts: Sendable, Equatable {
    /// By platform name (`unknown` for devices registered before the inventory).
    public var byPlatform: [String: Int] = [:]
    /// By distribution name (`none`: the device wrote no category).
    public var byCategory: [String: Int] = [:]
    /// By bundle version (`none`: the device wrote none).
    public var byBundleVersion: [String: Int] = [:]
    /// By risk band (`DeviceRisk.band`: 0-2, 3-5, 6-25, over-25, unknown before a refreshed receipt).
    public var byRisk: [String: Int] = [:]
    public init() {}
}

/// What the service stores about an access token: never the token, only its SHA-256.
public struct TokenRecord: Sendable, Equatable {
    /// A device keeps its newest token and the one before it (for requests already in flight);
    /// minting revokes any older one in the same transaction.
    public static let liveTokensPerDevice = 2

    public let tokenHash: [UInt8]
    public let clientID: String
    public let workspaceID: Int64
    public let keyID: [UInt8]
    public let issuedAt: Date
    public let expiresAt: Date

    public init(tokenHash: [UInt8], clientID: String, workspaceID: Int64, keyID: [UInt8], issuedAt: Date, expiresAt: Date) {
        self.tokenHash = tokenHash
        self.clientID = clientID
        self.workspaceID = workspaceID
        self.keyID = keyID
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
    }
}

/// A live token as the Messages API check sees it.
public struct TokenGrant: Sendable, Equatable {
    public let clientID: String
    public let workspaceID: Int64
    public let workspaceName: String
    public let issuedAt: Date
    public let expiresAt: Date
    /// The workspace's sealed upstream key, read in the same query (the relay opens it, cached).
    public let upstreamKey: SealedUpstreamKey?
    /// The device key the token was minted for (the per-device request limit).
    public let keyID: [UInt8]
    /// The integration's policy as it is now: an update applies on the next request.
    public let policy: IntegrationPolicy
    /// The usage every instance has recorded so far, read in the same query.
    public let recorded: RecordedUsage
    /// How often the workspace's list of upstreams changed (0: never, so the workspace has its
    /// own upstream alone): the relay reads the list again when this is not what it holds.
    public let upstreamsVersion: Int64
    /// The workspace's budgets in money, read in the same query.
    public var workspaceBudget = MoneyBudget()
    /// When the workspace's newest price override took effect (Unix time), nil without one: the
    /// relay's `PriceBook` reloads the workspace's table when it changes.
    public var pricesAt: Double?

    public init(clientID: String, workspaceID: Int64 = 0, workspaceName: String, issuedAt: Date, expiresAt: Date,
                upstreamKey: SealedUpstreamKey? = nil, keyID: [UInt8] = [], policy: IntegrationPolicy = IntegrationPolicy(),
                recorded: RecordedUsage = RecordedUsage(), upstreamsVersion: Int64 = 0) {
        self.upstreamsVersion = upstreamsVersion
        self.clientID = clientID
        self.keyID = keyID
        self.policy = policy
        self.recorded = recorded
        self.workspaceID = workspaceID
        self.workspaceName = workspaceName
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
        self.upstreamKey = upstreamKey
    }
}

/// A workspace's upstream API key as stored: sealed (AES-256-GCM, bound to the workspace), with
/// its last four characters and when and by whom it was set. The key itself is never stored.
///
/// For a cloud upstream (`kind` bedrock or vertex) the sealed bytes are its credentials (the AWS
/// access key as `AWSAccessKey` JSON, or the Google service-account key file) and `settings` say
/// where to send and which models map to which.
public struct SealedUpstreamKey: Sendable, Equatable {
    public let sealed: [UInt8]
    public let last4: String
    public let setAt: Date
    public let setBy: String
    public let kind: UpstreamKind
    /// Nil for the Anthropic API.
    public let settings: CloudUpstreamSettings?
    /// The label of a labelled upstream of the workspace's list (`workspace_upstreams`); nil for
    /// the workspace's own upstream. Its credentials are bound to it.
    public let label: String?

    public init(sealed: [UInt8], last4: String, setAt: Date, setBy: String, kind: UpstreamKind = .anthropic,
                settings: CloudUpstreamSettings? = nil, label: String? = nil) {
        self.label = label
        self.sealed = sealed
        self.last4 = last4
        self.setAt = setAt
        self.setBy = setBy
        self.kind = kind
        self.settings = settings
    }

    /// The associated data a workspace's Anthropic API key is sealed with: a copy in another
    /// workspace's row does not open. (Where it is sent is this service's own `--upstream-url`.)
    public static func associatedData(workspaceID: Int64) -> [UInt8] {
        Array("attestd/upstream-key/v1/workspace/\(workspaceID)".utf8)
    }

    /// The associated data a workspace's upstream credentials are sealed with: the workspace, and
    /// for a cloud upstream its kind and every setting that says where they are sent (endpoint
    /// and token URLs, region, project, models). A row whose settings were edited in the
    /// database, or a copy in another workspace's row, does not open.
    public static func associatedData(workspaceID: Int64, kind: UpstreamKind, settings: CloudUpstreamSettings?) -> [UInt8] {
        guard kind != .anthropic, let settings else { return associatedData(workspaceID: workspaceID) }
        return Array("attestd/upstream-key/v2/workspace/\(workspaceID)/".utf8) + settings.binding(kind: kind)
    }

    /// What this row's credentials were sealed with (when its settings are the ones it was sealed with).
    public func associatedData(workspaceID: Int64) -> [UInt8] {
        Self.associatedData(workspaceID: workspaceID, label: label, kind: kind, settings: settings)
    }

    /// A labelled upstream's credentials are bound to the label as well (a row copied to another
    /// label, or to the workspace's own row, does not open), and always to kind and settings.
    public static func associatedData(workspaceID: Int64, label: String?, kind: UpstreamKind, settings: CloudUpstreamSettings?) -> [UInt8] {
        guard let label else { return associatedData(workspaceID: workspaceID, kind: kind, settings: settings) }
        let binding = settings?.binding(kind: kind) ?? Array("kind=\(kind.rawValue.utf8.count):\(kind.rawValue);".utf8)
        return Array("attestd/upstream-key/v3/workspace/\(workspaceID)/label/\(label.utf8.count):\(label)/".utf8) + binding
    }
}

/// A challenge handed to a device: 32 random bytes, bound to (client ID, key ID).
public struct IssuedChallenge: Sendable, Equatable {
    public let bytes: [UInt8]
    public let expiresAt: Date
    public init(bytes: [UInt8], expiresAt: Date) {
        self.bytes = bytes
        self.expiresAt = expiresAt
    }
}

/// One line of the audit trail.
public struct AuditEvent: Sendable {
    public let at: Date
    public let actor: String?
    public let action: String
    public let clientID: String?
    public let keyID: [UInt8]?
    public let reason: String?
    public let detail: String?
    /// How many events the row stands for: a device refusal row counts every refusal of its
    /// action, client ID and reason in one minute (`minute`, Unix time / 60); others are 1 and nil.
    public var count: Int64 = 1
    public var minute: Int64?
    /// The row's ID, as read back (nil before it is stored): the console pages by it.
    public var id: Int64?

    /// Text fields lose their control characters (each becomes U+FFFD): a client ID or detail can
    /// come straight from a request, PostgreSQL refuses NUL in text (one such event wedged every
    /// later audit write with it), and `attestctl audit` prints them to a terminal.
    public init(at: Date, actor: String? = nil, action: String, clientID: String? = nil, keyID: [UInt8]? = nil,
                reason: String? = nil, detail: String? = nil) {
        self.at = at
        self.actor = actor.map(Self.printable)
        self.action = Self.printable(action)
        self.clientID = clientID.map(Self.printable)
        self.keyID = keyID
        self.reason = reason.map(Self.printable)
        self.detail = detail.map(Self.printable)
    }

    /// The event with every text field reduced to printable ASCII (anything else as `\u{…}`):
    /// what a store that refused the event as it was can always hold.
    public var asciiOnly: AuditEvent {
        func ascii(_ text: String?) -> String? {
            text.map { $0.unicodeScalars.map { (0x20...0x7e).contains($0.value) ? String($0) : "\\u{\(String($0.value, radix: 16))}" }.joined() }
        }
        var plain = AuditEvent(at: at, actor: ascii(actor), action: ascii(action) ?? "", clientID: ascii(clientID), keyID: keyID,
                               reason: ascii(reason), detail: ascii(detail))
        plain.count = count
        plain.minute = minute
        return plain
    }

    /// One line for the error log: every field but the key ID (logs carry none), so an event the
    /// store refused is not lost.
    public var logText: String {
        "at=\(at.timeIntervalSince1970) action=\(action) actor=\(actor ?? "-") client_id=\(clientID ?? "-") "
            + "key_id=\(keyID == nil ? "-" : "(withheld)") reason=\(reason ?? "-") count=\(count) detail=\(detail ?? "-")"
    }

    static func printable(_ text: String) -> String {
        func isControl(_ scalar: Unicode.Scalar) -> Bool { scalar.value < 0x20 || (0x7f...0x9f).contains(scalar.value) }
        guard text.unicodeScalars.contains(where: isControl) else { return text }
        var cleaned = String.UnicodeScalarView()
        for scalar in text.unicodeScalars { cleaned.append(isControl(scalar) ? "\u{FFFD}" : scalar) }
        return String(cleaned)
    }
}
