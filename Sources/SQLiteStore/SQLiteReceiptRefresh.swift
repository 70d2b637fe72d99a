import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: Receipt refresh

    /// The condition for a due device, `?1` the time (PostgreSQL's, with the credential certificate
    /// read from `device_receipts`: migration 0012).
    static let dueCondition = """
        d.risk_refresh_due_at <= ?1 AND i.revoked_at IS NULL
          AND EXISTS (SELECT 1 FROM device_receipts r WHERE r.key_id = d.key_id AND r.credential_certificate IS NOT NULL)
          AND (d.receipt_expires_at IS NULL OR d.receipt_expires_at > ?1)
          AND coalesce(d.last_refresh_at, d.registered_at) > ?1 - \(Int(StoreColumns.activeWindow))
          AND (d.risk_claimed_until IS NULL OR d.risk_claimed_until <= ?1)
        """

    public func claimDueReceipts(at time: Date, lease: TimeInterval, limit: Int, claim: String) throws -> [DueReceipt] {
        // An idle job asks every second: a read on the partial index answers "nothing due" without
        // taking the write lock the exchanges need.
        let anyDue = try read { db in
            try db.first("""
                SELECT 1 AS due FROM devices d JOIN integrations i ON i.client_id = d.client_id WHERE \(Self.dueCondition) LIMIT 1
                """, [.real(time.timeIntervalSince1970)]) { _ in true } ?? false
        }
        guard anyDue else { return [] }
        return try writeInBackground { db in
            // One writer at a time in SQLite: the read of the due rows (in due order, on the partial
            // index) and their claims, by primary key, are one transaction.
            try db.transaction {
                var due: [DueReceipt] = []
                try db.query("""
                    SELECT d.key_id AS key_id, d.client_id AS client_id, i.team_id AS team_id, d.environment AS environment,
                           d.app_id AS app_id, r.receipt AS receipt, r.credential_certificate AS credential_certificate,
                           i.risk_limit AS risk_limit, ?3 AS risk_claim
                    FROM devices d JOIN integrations i ON i.client_id = d.client_id JOIN device_receipts r ON r.key_id = d.key_id
                    WHERE \(Self.dueCondition) ORDER BY d.risk_refresh_due_at LIMIT ?2
                    """, [.real(time.timeIntervalSince1970), .int(Int64(limit)), .text(claim)]) { due.append(try DueReceipt(row: $0)) }
                for item in due {
                    try db.run("UPDATE devices SET risk_claimed_until = ?, risk_claim = ? WHERE key_id = ?",
                               [.real((time + lease).timeIntervalSince1970), .text(claim), .blob(item.keyID)])
                }
                return due
            }
        }
    }

    public func finishReceiptRefresh(_ outcome: ReceiptRefreshOutcome) throws -> Bool {
        try writeInBackground { db in
            if let receipt = outcome.receipt {
                // The device's times and the receipt itself (in `device_receipts`) in one transaction,
                // and only while this job's claim holds.
                return try db.transaction {
                    guard try db.run("""
                        UPDATE devices SET receipt_created_at = ?, receipt_not_before = ?, receipt_expires_at = ?, risk_metric = ?,
                               risk_checked_at = ?, risk_over_limit_at = CASE WHEN ? THEN coalesce(risk_over_limit_at, ?) ELSE NULL END,
                               risk_refresh_due_at = ?, risk_claimed_until = NULL, risk_claim = NULL
                        WHERE key_id = ? AND risk_claim = ?
                        """, [.real(receipt.createdAt.timeIntervalSince1970), Self.optional(receipt.notBefore),
                              Self.optional(receipt.expiresAt), receipt.riskMetric.map { .int(Int64($0)) } ?? .null,
                              .real(outcome.checkedAt.timeIntervalSince1970), .int(receipt.overLimit ? 1 : 0), .real(outcome.checkedAt.timeIntervalSince1970),
                              .real(outcome.nextDue.timeIntervalSince1970), .blob(outcome.keyID), .text(outcome.claim)]) == 1 else { return false }
                    try db.run("""
                        INSERT INTO device_receipts (key_id, receipt) VALUES (?, ?) ON CONFLICT (key_id) DO UPDATE SET receipt = excluded.receipt
                        """, [.blob(outcome.keyID), .blob(receipt.der)])
                    return true
                }
            }
            return try db.run("""
                UPDATE devices SET risk_refresh_due_at = ?, risk_claimed_until = NULL, risk_claim = NULL WHERE key_id = ? AND risk_claim = ?
                """, [.real(outcome.nextDue.timeIntervalSince1970), .blob(outcome.keyID), .text(outcome.claim)]) == 1
        }
    }

    public func oldestDueReceipt(at time: Date) throws -> Date? {
        try read { db in
            try db.first("""
                SELECT d.risk_refresh_due_at AS oldest FROM devices d JOIN integrations i ON i.client_id = d.client_id
                WHERE \(Self.dueCondition) ORDER BY d.risk_refresh_due_at LIMIT 1
                """, [.real(time.timeIntervalSince1970)]) { try $0.date("oldest") }
        }
    }

    public func setAppleKey(_ key: SealedAppleKey) throws {
        _ = try write { try $0.run("""
            INSERT INTO apple_keys (team_id, key_id, sealed_key, set_at, set_by) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (team_id) DO UPDATE SET key_id = excluded.key_id, sealed_key = excluded.sealed_key,
              set_at = excluded.set_at, set_by = excluded.set_by
            """, [.text(key.teamID), .text(key.keyID), .blob(key.sealed), .real(key.setAt.timeIntervalSince1970), .text(key.setBy)]) }
    }

    public func appleKey(teamID: String) throws -> SealedAppleKey? {
        try read { try $0.first("SELECT \(StoreColumns.list(StoreColumns.appleKey)) FROM apple_keys WHERE team_id = ?", [.text(teamID)],
                                SealedAppleKey.init(row:)) }
    }

    public func appleKeys() throws -> [SealedAppleKey] {
        try read { db in
            var keys: [SealedAppleKey] = []
            try db.query("SELECT \(StoreColumns.list(StoreColumns.appleKey)) FROM apple_keys ORDER BY team_id") { keys.append(try SealedAppleKey(row: $0)) }
            return keys
        }
    }
}
