import AppAttest
import Foundation

/// Persistence for the token service. Every method that must not race (challenge use, counter
/// advance, registration, revocation) is one atomic operation in the implementation.
public protocol TokenStore: AnyObject, Sendable {
    // Organisation
    func workspace(named name: String) throws -> Workspace?
    func createWorkspace(name: String, at: Date) throws -> Workspace
    func role(of email: String, in workspaceID: Int64) throws -> Role?
    func primaryOwner(workspaceID: Int64) throws -> String?
    func addMember(email: String, role: Role, workspaceID: Int64, at: Date) throws

    // Integrations
    func createIntegration(_ integration: Integration) throws
    func integration(clientID: String) throws -> Integration?
    func integrations(workspaceID: Int64?) throws -> [Integration]
    /// Marks the integration revoked and revokes its live tokens, in one transaction. False if it was already revoked.
    func revokeIntegration(clientID: String, at: Date) throws -> Bool
    func counts(clientID: String, at: Date) throws -> (devices: Int, liveTokens: Int)

    // Challenges
    /// The pending (unused, unexpired) challenge for the pair, or `fresh` stored as the new one.
    func pendingOrNewChallenge(clientID: String, keyID: [UInt8], fresh: IssuedChallenge, at: Date) throws -> IssuedChallenge
    /// Marks the pending challenge for the pair used and returns it; nil when there is none.
    func consumeChallenge(clientID: String, keyID: [UInt8], at: Date) throws -> [UInt8]?

    // Devices and tokens
    func device(clientID: String, keyID: [UInt8]) throws -> Device?
    /// Stores the device and its first token atomically; false when the key is already registered.
    func registerDevice(_ device: Device, receipt: [UInt8], firstToken: TokenRecord, nextChallenge: IssuedChallenge, at: Date) throws -> Bool
    /// Advances the counter from `from` to `to` and stores the token atomically; false when the
    /// counter was no longer `from` (a concurrent request won).
    func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, token: TokenRecord, nextChallenge: IssuedChallenge, at: Date) throws -> Bool
    /// The grant behind a token hash if it is live: unexpired, unrevoked, integration not revoked.
    func liveToken(hash: [UInt8], at: Date) throws -> TokenGrant?

    // Audit
    func appendAudit(_ events: [AuditEvent]) throws
    /// Deletes challenges that are used or expired before `before`; returns how many.
    func purgeChallenges(before: Date) throws -> Int
}
