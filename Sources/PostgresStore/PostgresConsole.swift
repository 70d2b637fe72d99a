import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: Members

    public func members(workspaceID: Int64) throws -> [Member] {
        try run { db in
            try db.query("SELECT email, role, created_at FROM members WHERE workspace_id = $1 ORDER BY created_at, email", [.int(workspaceID)])
                .rows.compactMap { row in
                    try Role(rawValue: try row.text("role")).map {
                        Member(email: try row.text("email"), role: $0, addedAt: Date(timeIntervalSince1970: try row.double("created_at")))
                    }
                }
        }
    }

    public func removeMember(email: String, workspaceID: Int64, at time: Date) throws -> Bool {
        try run { db in
            try db.transaction {
                let removed = try db.query("DELETE FROM members WHERE workspace_id = $1 AND email = $2 AND role <> 'primary_owner' RETURNING email",
                                           [.int(workspaceID), .text(email)]).count > 0
                // Their sessions would fail the membership check anyway; this ends them for good.
                try db.query("UPDATE console_sessions SET ended_at = $3 WHERE workspace_id = $1 AND email = $2 AND ended_at IS NULL",
                             [.int(workspaceID), .text(email), Self.seconds(time)])
                return removed
            }
        }
    }

    // MARK: Console sign-in links and sessions

    public func insertSignInLink(hash: [UInt8], email: String, workspaceID: Int64, at time: Date, expiresAt: Date) throws {
        _ = try run { db in
            try db.query("INSERT INTO console_sign_in_links (token_hash, workspace_id, email, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)",
                         [.bytes(hash), .int(workspaceID), .text(email), Self.seconds(time), Self.seconds(expiresAt)])
        }
    }

    public func redeemSignInLink(hash: [UInt8], at time: Date) throws -> SignInLinkState {
        try run { db in
            // One statement: of two requests with the same link, on any instances, exactly one uses it.
            if let (email, workspaceID) = try db.query("""
                UPDATE console_sign_in_links SET used_at = $1 WHERE token_hash = $2 AND used_at IS NULL AND expires_at > $1
                RETURNING email, workspace_id
                """, [Self.seconds(time), .bytes(hash)]).first({ (try $0.text("email"), try $0.int("workspace_id")) }) {
                return .redeemed(email: email, workspaceID: workspaceID)
            }
            return try db.query("SELECT (CASE WHEN used_at IS NULL THEN 0 ELSE 1 END)::bigint AS used FROM console_sign_in_links WHERE token_hash = $1",
                                [.bytes(hash)]).first { try $0.int("used") == 1 ? SignInLinkState.alreadyUsed : .expired } ?? .unknown
        }
    }

    public func insertSession(hash: [UInt8], email: String, workspaceID: Int64, at time: Date, expiresAt: Date) throws {
        _ = try run { db in
            try db.query("""
                INSERT INTO console_sessions (token_hash, workspace_id, email, created_at, last_seen_at, expires_at) VALUES ($1, $2, $3, $4, $4, $5)
                """, [.bytes(hash), .int(workspaceID), .text(email), Self.seconds(time), Self.seconds(expiresAt)])
        }
    }

    public func touchSession(hash: [UInt8], at time: Date, idle: TimeInterval) throws -> ConsoleSession? {
        try run { db in
            // One round trip: checked (not ended, within its idle and absolute ends, still a
            // member) and marked as seen together.
            try db.query("""
                UPDATE console_sessions s SET last_seen_at = $2 FROM members m, workspaces w
                WHERE s.token_hash = $1 AND s.ended_at IS NULL AND s.expires_at > $2 AND s.last_seen_at > $3
                  AND m.workspace_id = s.workspace_id AND m.email = s.email AND w.id = s.workspace_id
                RETURNING s.created_at AS created_at, m.role AS role, w.id AS workspace_id, w.name AS workspace_name, s.email AS email
                """, [.bytes(hash), Self.seconds(time), Self.seconds(time - idle)]).first { row -> ConsoleSession? in
                guard let role = Role(rawValue: try row.text("role")) else { return nil }
                return ConsoleSession(email: try row.text("email"), workspace: Workspace(id: try row.int("workspace_id"), name: try row.text("workspace_name")),
                                      role: role, createdAt: Date(timeIntervalSince1970: try row.double("created_at")))
            } ?? nil
        }
    }

    public func endSession(hash: [UInt8], at time: Date) throws {
        _ = try run { db in
            try db.query("UPDATE console_sessions SET ended_at = $2 WHERE token_hash = $1 AND ended_at IS NULL", [.bytes(hash), Self.seconds(time)])
        }
    }

    public func purgeConsoleAccess(before time: Date) throws -> Int {
        try run { db in
            try db.transaction {
                try db.query("DELETE FROM console_sign_in_links WHERE expires_at < $1 RETURNING 1", [Self.seconds(time)]).count
                    + db.query("DELETE FROM console_sessions WHERE expires_at < $1 OR ended_at < $1 RETURNING 1", [Self.seconds(time)]).count
            }
        }
    }
}
