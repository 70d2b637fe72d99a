import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: Members

    public func members(workspaceID: Int64) throws -> [Member] {
        try read { db in
            var members: [Member] = []
            try db.query("SELECT email, role, created_at FROM members WHERE workspace_id = ? ORDER BY created_at, email", [.int(workspaceID)]) { row in
                guard let role = Role(rawValue: try row.text("role")) else { return }
                members.append(Member(email: try row.text("email"), role: role, addedAt: Date(timeIntervalSince1970: try row.double("created_at"))))
            }
            return members
        }
    }

    public func removeMember(email: String, workspaceID: Int64, at time: Date) throws -> Bool {
        try write { db in
            try db.transaction {
                let removed = try db.run("DELETE FROM members WHERE workspace_id = ? AND email = ? AND role <> 'primary_owner'",
                                         [.int(workspaceID), .text(email)])
                // Their sessions would fail the membership check anyway; this ends them for good.
                _ = try db.run("UPDATE console_sessions SET ended_at = ? WHERE workspace_id = ? AND email = ? AND ended_at IS NULL",
                               [.real(time.timeIntervalSince1970), .int(workspaceID), .text(email)])
                return removed > 0
            }
        }
    }

    // MARK: Console sign-in links and sessions

    public func insertSignInLink(hash: [UInt8], email: String, workspaceID: Int64, at time: Date, expiresAt: Date) throws {
        _ = try write { try $0.run("INSERT INTO console_sign_in_links (token_hash, workspace_id, email, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
                                   [.blob(hash), .int(workspaceID), .text(email), .real(time.timeIntervalSince1970), .real(expiresAt.timeIntervalSince1970)]) }
    }

    public func redeemSignInLink(hash: [UInt8], at time: Date) throws -> SignInLinkState {
        try write { db in
            // One statement: of two requests with the same link, exactly one uses it.
            if let (email, workspaceID) = try db.first("""
                UPDATE console_sign_in_links SET used_at = ? WHERE token_hash = ? AND used_at IS NULL AND expires_at > ?
                RETURNING email, workspace_id
                """, [.real(time.timeIntervalSince1970), .blob(hash), .real(time.timeIntervalSince1970)], { (try $0.text("email"), try $0.int("workspace_id")) }) {
                return .redeemed(email: email, workspaceID: workspaceID)
            }
            return try db.first("SELECT used_at IS NOT NULL AS used FROM console_sign_in_links WHERE token_hash = ?", [.blob(hash)]) { row in
                try row.int("used") == 1 ? SignInLinkState.alreadyUsed : .expired
            } ?? .unknown
        }
    }

    public func insertSession(hash: [UInt8], email: String, workspaceID: Int64, at time: Date, expiresAt: Date) throws {
        _ = try write { try $0.run("""
            INSERT INTO console_sessions (token_hash, workspace_id, email, created_at, last_seen_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)
            """, [.blob(hash), .int(workspaceID), .text(email), .real(time.timeIntervalSince1970), .real(time.timeIntervalSince1970),
                  .real(expiresAt.timeIntervalSince1970)]) }
    }

    public func touchSession(hash: [UInt8], at time: Date, idle: TimeInterval) throws -> ConsoleSession? {
        let now = time.timeIntervalSince1970
        // Reading first: a page view finds the session without the write lock unless a minute has
        // passed since it was last marked (the idle end is then at most a minute late).
        let found = try read { db in
            try db.first("""
                SELECT s.last_seen_at AS last_seen_at, s.created_at AS created_at, m.role AS role, w.id AS workspace_id,
                       w.name AS workspace_name, s.email AS email FROM console_sessions s
                JOIN members m ON m.workspace_id = s.workspace_id AND m.email = s.email
                JOIN workspaces w ON w.id = s.workspace_id
                WHERE s.token_hash = ? AND s.ended_at IS NULL AND s.expires_at > ? AND s.last_seen_at > ?
                """, [.blob(hash), .real(now), .real(now - idle)]) { row in
                let role = Role(rawValue: try row.text("role"))
                let session = try role.map {
                    ConsoleSession(email: try row.text("email"), workspace: Workspace(id: try row.int("workspace_id"), name: try row.text("workspace_name")),
                                   role: $0, createdAt: Date(timeIntervalSince1970: try row.double("created_at")))
                }
                return (lastSeen: try row.double("last_seen_at"), session: session)
            }
        }
        guard let found, let session = found.session else { return nil }
        if now - found.lastSeen >= 60 {
            let marked = try write { try $0.run("UPDATE console_sessions SET last_seen_at = ? WHERE token_hash = ? AND ended_at IS NULL AND last_seen_at > ?",
                                                [.real(now), .blob(hash), .real(now - idle)]) }
            guard marked == 1 else { return nil }
        }
        return session
    }

    public func endSession(hash: [UInt8], at time: Date) throws {
        _ = try write { try $0.run("UPDATE console_sessions SET ended_at = ? WHERE token_hash = ? AND ended_at IS NULL",
                                   [.real(time.timeIntervalSince1970), .blob(hash)]) }
    }

    public func purgeConsoleAccess(before time: Date) throws -> Int {
        try write { db in
            try db.transaction {
                try db.run("DELETE FROM console_sign_in_links WHERE expires_at < ?", [.real(time.timeIntervalSince1970)])
                    + db.run("DELETE FROM console_sessions WHERE expires_at < ? OR ended_at < ?",
                             [.real(time.timeIntervalSince1970), .real(time.timeIntervalSince1970)])
            }
        }
    }
}
