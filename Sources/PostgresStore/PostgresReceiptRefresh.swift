import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: Receipt refresh

    /// The condition for a due device, `$1` the time (the SQLite store's, in PostgreSQL's words; the
    /// receipt stays in the device row here: PostgreSQL keeps large values out of line by itself).
    static let dueCondition = """
        d.risk_refresh_due_at <= $1 AND i.revoked_at IS NULL AND d.credential_certificate IS NOT NULL
          AND (d.receipt_expires_at IS NULL OR d.receipt_expires_at > $1)
          AND coalesce(d.last_refresh_at, d.registered_at) > $1 - \(Int(StoreColumns.activeWindow))
          AND (d.risk_claimed_until IS NULL OR d.risk_claimed_until <= $1)
        """

    /// One statement: rows another instance is claiming right now are skipped, not waited for, and
    /// a row it claimed and committed meanwhile fails the re-checked condition (its claim is live).
    public func claimDueReceipts(at time: Date, lease: TimeInterval, limit: Int, claim: String) throws -> [DueReceipt] {
        try run { db in
            try db.query("""
                WITH due AS (
                  SELECT d.key_id FROM devices d JOIN integrations i ON i.client_id = d.client_id
                  WHERE \(Self.dueCondition) ORDER BY d.risk_refresh_due_at LIMIT $3 FOR UPDATE OF d SKIP LOCKED)
                UPDATE devices d SET risk_claimed_until = $2, risk_claim = $4 FROM due, integrations i
                WHERE d.key_id = due.key_id AND i.client_id = d.client_id
                RETURNING d.key_id AS key_id, d.client_id AS client_id, i.team_id AS team_id, d.environment AS environment,
                          d.app_id AS app_id, d.receipt AS receipt, d.credential_certificate AS credential_certificate,
                          i.risk_limit AS risk_limit, d.risk_claim AS risk_claim
                """, [Self.seconds(time), Self.seconds(time + lease), .int(Int64(limit)), .text(claim)]).rows.map(DueReceipt.init(row:))
        }
    }

    public func finishReceiptRefresh(_ outcome: ReceiptRefreshOutcome) throws -> Bool {
        try run { db in
            let result: PostgresResult
            if let receipt = outcome.receipt {
                result = try db.query("""
                    UPDATE devices SET receipt = $1, receipt_created_at = $2, receipt_not_before = $3, receipt_expires_at = $4, risk_metric = $5,
                           risk_checked_at = $6, risk_over_limit_at = CASE WHEN $7 THEN coalesce(risk_over_limit_at, $6) ELSE NULL END,
                           risk_refresh_due_at = $8, risk_claimed_until = NULL, risk_claim = NULL
                    WHERE key_id = $9 AND risk_claim = $10 RETURNING 1
                    """, [.bytes(receipt.der), Self.seconds(receipt.createdAt), Self.optional(receipt.notBefore), Self.optional(receipt.expiresAt),
                          Self.optional(receipt.riskMetric), Self.seconds(outcome.checkedAt), .bool(receipt.overLimit), Self.seconds(outcome.nextDue),
                          .bytes(outcome.keyID), .text(outcome.claim)])
            } else {
                result = try db.query("""
                    UPDATE devices SET risk_refresh_due_at = $1, risk_claimed_until = NULL, risk_claim = NULL
                    WHERE key_id = $2 AND risk_claim = $3 RETURNING 1
                    """, [Self.seconds(outcome.nextDue), .bytes(outcome.keyID), .text(outcome.claim)])
            }
            return result.count == 1
        }
    }

    public func oldestDueReceipt(at time: Date) throws -> Date? {
        try run { db in
            try db.query("""
                SELECT d.risk_refresh_due_at AS oldest FROM devices d JOIN integrations i ON i.client_id = d.client_id
                WHERE \(Self.dueCondition) ORDER BY d.risk_refresh_due_at LIMIT 1
                """, [Self.seconds(time)]).first { try $0.date("oldest") }
        }
    }

    public func setAppleKey(_ key: SealedAppleKey) throws {
        try run { db in
            _ = try db.query("""
                INSERT INTO apple_keys (team_id, key_id, sealed_key, set_at, set_by) VALUES ($1, $2, $3, $4, $5)
                ON CONFLICT (team_id) DO UPDATE SET key_id = excluded.key_id, sealed_key = excluded.sealed_key,
                  set_at = excluded.set_at, set_by = excluded.set_by
                """, [.text(key.teamID), .text(key.keyID), .bytes(key.sealed), Self.seconds(key.setAt), .text(key.setBy)])
        }
    }

    public func appleKey(teamID: String) throws -> SealedAppleKey? {
        try run { db in
            try db.query("SELECT \(StoreColumns.list(StoreColumns.appleKey)) FROM apple_keys WHERE team_id = $1", [.text(teamID)])
                .first(SealedAppleKey.init(row:))
        }
    }

    public func appleKeys() throws -> [SealedAppleKey] {
        try run { db in
            try db.query("SELECT \(StoreColumns.list(StoreColumns.appleKey)) FROM apple_keys ORDER BY team_id").rows.map(SealedAppleKey.init(row:))
        }
    }
}
