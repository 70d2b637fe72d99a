import AppAttest
import Foundation

/// The refresh of Apple's receipts, as stored: which devices are due (claimed with a lease, so a
/// killed instance's claims lapse and two instances never post the same device at once), what
/// came back, and the teams' App Attest data-service keys.
public protocol ReceiptRefreshStore: AnyObject, Sendable {
    /// Claims up to `limit` devices due at `time`: a live integration, a validated receipt not
    /// expired, active in the last 30 days, and no live claim; oldest due first, until
    /// `time + lease`, under the batch ID `claim`. PostgreSQL: `FOR UPDATE SKIP LOCKED`.
    func claimDueReceipts(at time: Date, lease: TimeInterval, limit: Int, claim: String) throws -> [DueReceipt]
    /// Stores what a refresh learned and releases the claim, only while the claim is still
    /// `claim` (a lapsed claim that another instance took over is left to it). True when stored.
    func finishReceiptRefresh(_ outcome: ReceiptRefreshOutcome) throws -> Bool
    /// When the longest-waiting due device became due (nil: none is waiting), for the metric.
    func oldestDueReceipt(at time: Date) throws -> Date?

    func setAppleKey(_ key: SealedAppleKey) throws
    func appleKey(teamID: String) throws -> SealedAppleKey?
    func appleKeys() throws -> [SealedAppleKey]
}

/// A device whose receipt is due, with what its refresh needs.
public struct DueReceipt: Sendable, Equatable {
    public let keyID: [UInt8]
    public let clientID: String
    public let teamID: String
    public let environment: AttestationEnvironment
    public let appID: String
    public let receipt: [UInt8]
    public let credentialCertificate: [UInt8]
    public let riskLimit: Int
    public let claim: String

    public init(keyID: [UInt8], clientID: String, teamID: String, environment: AttestationEnvironment, appID: String, receipt: [UInt8],
                credentialCertificate: [UInt8], riskLimit: Int, claim: String) {
        self.keyID = keyID
        self.clientID = clientID
        self.teamID = teamID
        self.environment = environment
        self.appID = appID
        self.receipt = receipt
        self.credentialCertificate = credentialCertificate
        self.riskLimit = riskLimit
        self.claim = claim
    }
}

/// What one refresh stores: a new validated receipt (200) or only when to try again.
public struct ReceiptRefreshOutcome: Sendable, Equatable {
    public struct NewReceipt: Sendable, Equatable {
        public let der: [UInt8]
        public let createdAt: Date
        public let notBefore: Date?
        public let expiresAt: Date?
        public let riskMetric: Int?
        /// Above the integration's limit: the time is kept from the first refresh that found it so.
        public let overLimit: Bool

        public init(der: [UInt8], createdAt: Date, notBefore: Date?, expiresAt: Date?, riskMetric: Int?, overLimit: Bool) {
            self.der = der
            self.createdAt = createdAt
            self.notBefore = notBefore
            self.expiresAt = expiresAt
            self.riskMetric = riskMetric
            self.overLimit = overLimit
        }
    }

    public let keyID: [UInt8]
    public let claim: String
    public let receipt: NewReceipt?
    public let checkedAt: Date
    public let nextDue: Date

    public init(keyID: [UInt8], claim: String, receipt: NewReceipt?, checkedAt: Date, nextDue: Date) {
        self.keyID = keyID
        self.claim = claim
        self.receipt = receipt
        self.checkedAt = checkedAt
        self.nextDue = nextDue
    }
}

/// A team's App Attest data-service key (the `.p8` with DeviceCheck enabled), sealed under the
/// secrets key and bound to its team ID; shown only as its key ID, when and by whom it was set.
public struct SealedAppleKey: Sendable, Equatable {
    public let teamID: String
    public let keyID: String
    public let sealed: [UInt8]
    public let setAt: Date
    public let setBy: String

    public init(teamID: String, keyID: String, sealed: [UInt8], setAt: Date, setBy: String) {
        self.teamID = teamID
        self.keyID = keyID
        self.sealed = sealed
        self.setAt = setAt
        self.setBy = setBy
    }

    /// A copy of the sealed key in another team's row (or under another key ID) does not open.
    public static func associatedData(teamID: String, keyID: String) -> [UInt8] {
        Array("attestd/apple-key/v1/team/\(teamID)/key/\(keyID)".utf8)
    }
}
