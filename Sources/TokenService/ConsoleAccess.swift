import AttestCrypto
import Foundation

/// A member of a workspace, as the console's settings list them.
public struct Member: Sendable, Equatable {
    public let email: String
    public let role: Role
    public let addedAt: Date
    public init(email: String, role: Role, addedAt: Date) {
        self.email = email
        self.role = role
        self.addedAt = addedAt
    }
}

/// A signed-in console session, as each request finds it: who, in which workspace, with the role
/// they hold now (a changed or removed membership takes effect on the next request).
public struct ConsoleSession: Sendable, Equatable {
    public let email: String
    public let workspace: Workspace
    public let role: Role
    public let createdAt: Date
    public init(email: String, workspace: Workspace, role: Role, createdAt: Date) {
        self.email = email
        self.workspace = workspace
        self.role = role
        self.createdAt = createdAt
    }
}

/// What became of a sign-in link presented to the console.
public enum SignInLinkState: Sendable, Equatable {
    /// Good: now used up. The member and workspace it was made for.
    case redeemed(email: String, workspaceID: Int64)
    case alreadyUsed
    case expired
    /// No such link (mistyped, tampered, or from another deployment).
    case unknown
}

/// The console's sign-in links and sessions. Only hashes of their tokens are stored; every
/// check that must not race (a link used once, a session's idle and absolute ends) is one
/// statement in the implementation.
public protocol ConsoleStore: AnyObject, Sendable {
    func members(workspaceID: Int64) throws -> [Member]
    /// Removes the membership (and so every console session of it); false when there was none.
    func removeMember(email: String, workspaceID: Int64, at: Date) throws -> Bool

    func insertSignInLink(hash: [UInt8], email: String, workspaceID: Int64, at: Date, expiresAt: Date) throws
    /// Uses the link up if it is unused and unexpired at `at`; otherwise says why not.
    func redeemSignInLink(hash: [UInt8], at: Date) throws -> SignInLinkState
    func insertSession(hash: [UInt8], email: String, workspaceID: Int64, at: Date, expiresAt: Date) throws
    /// The session if it is live at `at` (not ended, seen within `idle`, before its absolute end,
    /// its membership still there), marked as seen at `at`; nil otherwise.
    func touchSession(hash: [UInt8], at: Date, idle: TimeInterval) throws -> ConsoleSession?
    func endSession(hash: [UInt8], at: Date) throws
    /// Forgets links and sessions that ended before `before`; returns how many.
    func purgeConsoleAccess(before: Date) throws -> Int
}

/// How long the console's credentials last.
public enum ConsoleAccess {
    public static let signInLinkLifetime: TimeInterval = 10 * 60
    public static let sessionIdleTimeout: TimeInterval = 30 * 60
    public static let sessionLifetime: TimeInterval = 12 * 3600
    /// 256 random bits, base64url: links and session cookies alike.
    static func newToken() -> String { base64URL(secureRandomBytes(32)) }
    /// What is stored of a token: SHA-256 of its text.
    public static func hash(_ token: String) -> [UInt8] { sha256(Array(token.utf8)) }
    /// A session's CSRF token: derived from its cookie, which only the browser holding it knows,
    /// so every instance can check it without storing it.
    public static func csrfToken(session token: String) -> String {
        base64URL(sha256(Array("attestd-console-csrf\u{0}".utf8) + Array(token.utf8)))
    }
    /// Tokens are 43 base64url characters; anything far off is refused before any hashing.
    public static func isPlausibleToken(_ token: String) -> Bool {
        token.utf8.count == 43 && token.utf8.allSatisfy { b in
            (0x41...0x5a).contains(b) || (0x61...0x7a).contains(b) || (0x30...0x39).contains(b) || b == 0x2d || b == 0x5f
        }
    }
}

extension AdminService {
    // MARK: Members

    public func members(workspace name: String = defaultWorkspace) throws -> [Member] {
        try store.members(workspaceID: try existingWorkspace(name).id)
    }

    /// Removes a member: owners remove anyone but the primary owner; admins only developers and
    /// users (as they may add only those). The member's console sessions end with it. Audited.
    public func removeMember(actor: String, email: String, workspace name: String = defaultWorkspace) throws {
        let email = try Validate.email(email)
        let workspace = try existingWorkspace(name)
        let actorRole = try requireRole(actor, in: workspace, "remove members") { $0.managesIntegrations }
        guard let role = try store.role(of: email, in: workspace.id) else {
            throw AdminError("\(email) is not a member of \(workspace.name)", kind: .notFound)
        }
        guard role != .primaryOwner else { throw AdminError("the primary owner cannot be removed", kind: .forbidden) }
        if actorRole == .admin && (role == .owner || role == .admin) {
            throw AdminError("\(actor) is an admin of \(workspace.name) and may remove only developers and users", kind: .forbidden)
        }
        guard try store.removeMember(email: email, workspaceID: workspace.id, at: now()) else {
            throw AdminError("\(email) is not a member of \(workspace.name)", kind: .notFound)
        }
        try audit(actor: actor, "member.removed", detail: "\(email) (\(role.rawValue)) from \(workspace.name)")
    }

    // MARK: Console sign-in

    /// A single-use sign-in link's token for a member, valid 10 minutes; audited (never the token).
    public func createSignInLink(for email: String, workspace name: String = defaultWorkspace) throws -> String {
        let email = try Validate.email(email)
        let workspace = try existingWorkspace(name)
        guard try store.role(of: email, in: workspace.id) != nil else {
            throw AdminError("\(email) is not a member of workspace \(workspace.name): only members may sign in", kind: .forbidden)
        }
        let token = ConsoleAccess.newToken()
        let time = now()
        try store.insertSignInLink(hash: ConsoleAccess.hash(token), email: email, workspaceID: workspace.id, at: time,
                                   expiresAt: time + ConsoleAccess.signInLinkLifetime)
        try audit(actor: email, "console.sign_in_link_created", detail: "for \(email) in \(workspace.name), valid 10 minutes")
        return token
    }

    public enum SignIn: Sendable, Equatable {
        /// The session's token (the cookie) and who it is for.
        case signedIn(token: String, session: ConsoleSession)
        case refused(SignInLinkState)
    }

    /// Uses a sign-in link up and starts a session for its member (if still one).
    public func signIn(linkToken: String) throws -> SignIn {
        guard ConsoleAccess.isPlausibleToken(linkToken) else { return .refused(.unknown) }
        let time = now()
        let state = try store.redeemSignInLink(hash: ConsoleAccess.hash(linkToken), at: time)
        guard case .redeemed(let email, let workspaceID) = state else { return .refused(state) }
        let token = ConsoleAccess.newToken()
        try store.insertSession(hash: ConsoleAccess.hash(token), email: email, workspaceID: workspaceID, at: time,
                                expiresAt: time + ConsoleAccess.sessionLifetime)
        guard let session = try store.touchSession(hash: ConsoleAccess.hash(token), at: time, idle: ConsoleAccess.sessionIdleTimeout) else {
            // Removed between the link and now.
            return .refused(.unknown)
        }
        try audit(actor: email, "console.signed_in", detail: "in \(session.workspace.name) as \(session.role.rawValue)")
        return .signedIn(token: token, session: session)
    }

    /// The live session a cookie names, now marked as seen; nil when there is none.
    public func consoleSession(token: String) throws -> ConsoleSession? {
        guard ConsoleAccess.isPlausibleToken(token) else { return nil }
        return try store.touchSession(hash: ConsoleAccess.hash(token), at: now(), idle: ConsoleAccess.sessionIdleTimeout)
    }

    public func signOut(token: String, actor: String) throws {
        guard ConsoleAccess.isPlausibleToken(token) else { return }
        try store.endSession(hash: ConsoleAccess.hash(token), at: now())
        try audit(actor: actor, "console.signed_out", detail: "session ended")
    }

    // MARK: Reading for the console

    /// Who created the integration and who revoked it, and when, from its audit trail.
    public func history(_ clientID: String) throws -> (created: AuditEvent?, revoked: AuditEvent?) {
        let events = try store.auditEvents(clientID: clientID, actions: ["integration.created", "integration.revoked"])
        return (events.last { $0.action == "integration.created" }, events.first { $0.action == "integration.revoked" })
    }

    /// One page of the integration's audit events, newest first, older than the row `beforeID`
    /// (the last one the previous page showed): by key, so a deep page costs what the first does.
    public func auditPage(_ clientID: String, beforeID: Int64?, perPage: Int = 50) throws -> [AuditEvent] {
        try store.auditEvents(limit: perPage, beforeID: beforeID, clientID: clientID)
    }
}
