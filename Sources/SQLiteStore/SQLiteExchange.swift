import AppAttest
import AttestCrypto
import CSQLite
import Foundation
import StoreRecords
import TokenService

extension SQLiteTokenStore {
    // MARK: Challenges

    public func pendingOrNewChallenge(clientID: String, keyID: [UInt8], fresh: IssuedChallenge, at time: Date) throws -> IssuedChallenge {
        try write { db in
            try db.transaction {
                if let pending = try db.first("""
                    SELECT challenge, expires_at FROM challenges WHERE client_id = ? AND key_id = ? AND used = 0 AND expires_at > ?
                    """, [.text(clientID), .blob(keyID), .real(time.timeIntervalSince1970)], {
                        try IssuedChallenge(row: $0)
                    }) {
                    return pending
                }
                try Self.storeChallenge(db, clientID: clientID, keyID: keyID, fresh)
                return fresh
            }
        }
    }

    static func storeChallenge(_ db: SQLiteConnection, clientID: String, keyID: [UInt8], _ challenge: IssuedChallenge) throws {
        try db.run("""
            INSERT INTO challenges (client_id, key_id, challenge, expires_at, used) VALUES (?, ?, ?, ?, 0)
            ON CONFLICT (client_id, key_id) DO UPDATE SET challenge = excluded.challenge, expires_at = excluded.expires_at, used = 0
            """, [.text(clientID), .blob(keyID), .blob(challenge.bytes), .real(challenge.expiresAt.timeIntervalSince1970)])
    }

    public func pendingChallenge(clientID: String, keyID: [UInt8], at time: Date) throws -> [UInt8]? {
        try read { db in
            try db.first("SELECT challenge FROM challenges WHERE client_id = ? AND key_id = ? AND used = 0 AND expires_at > ?",
                         [.text(clientID), .blob(keyID), .real(time.timeIntervalSince1970)]) { try $0.bytes("challenge") }
        }
    }

    public func consumeChallenge(clientID: String, keyID: [UInt8], challenge: [UInt8]?, at time: Date) throws -> [UInt8]? {
        try write { db in try Self.redeem(db, clientID: clientID, keyID: keyID, challenge: challenge, at: time) }
    }

    /// One conditional statement: of two concurrent requests, exactly one gets the challenge.
    static func redeem(_ db: SQLiteConnection, clientID: String, keyID: [UInt8], challenge: [UInt8]?, at time: Date) throws -> [UInt8]? {
        if let challenge {
            return try db.first("""
                UPDATE challenges SET used = 1
                WHERE client_id = ? AND key_id = ? AND used = 0 AND expires_at > ? AND challenge = ? RETURNING challenge
                """, [.text(clientID), .blob(keyID), .real(time.timeIntervalSince1970), .blob(challenge)]) { try $0.bytes("challenge") }
        }
        return try db.first("""
            UPDATE challenges SET used = 1 WHERE client_id = ? AND key_id = ? AND used = 0 AND expires_at > ? RETURNING challenge
            """, [.text(clientID), .blob(keyID), .real(time.timeIntervalSince1970)]) { try $0.bytes("challenge") }
    }

    /// Redeems `challenge` and stores `next` in its place, in one statement: of two concurrent
    /// requests exactly one finds the row pending. An exchange that then fails writes nothing
    /// else and calls `burn`, so the row is left used, as a redeemed challenge is.
    static func redeem(_ db: SQLiteConnection, clientID: String, keyID: [UInt8], challenge: [UInt8], replacingWith next: IssuedChallenge,
                       at time: Date) throws -> Bool {
        try db.first("""
            UPDATE challenges SET challenge = ?, expires_at = ?, used = 0
            WHERE client_id = ? AND key_id = ? AND used = 0 AND expires_at > ? AND challenge = ? RETURNING 1
            """, [.blob(next.bytes), .real(next.expiresAt.timeIntervalSince1970), .text(clientID), .blob(keyID), .real(time.timeIntervalSince1970),
                  .blob(challenge)]) { $0.int(0) } != nil
    }

    /// After `redeem(…replacingWith:)`, when the exchange does not go through: no challenge stays
    /// pending. Nothing to do when the exchange redeemed none (`redeemed` nil).
    static func burn(_ db: SQLiteConnection, clientID: String, keyID: [UInt8], redeemed: [UInt8]?) throws {
        guard redeemed != nil else { return }
        try db.run("UPDATE challenges SET used = 1 WHERE client_id = ? AND key_id = ?", [.text(clientID), .blob(keyID)])
    }

    public func purgeChallenges(before time: Date) throws -> Int {
        try writeInBackground { db in
            let challenges = try db.run("DELETE FROM challenges WHERE used = 1 OR expires_at <= ?", [.real(time.timeIntervalSince1970)])
            // Token rows a day past expiry can never authenticate again.
            try db.run("DELETE FROM tokens WHERE expires_at <= ?", [.real(time.timeIntervalSince1970 - 86_400)])
            return challenges
        }
    }

    // MARK: Devices and tokens

    /// The integration, the pending challenge and the device in one statement (one read
    /// transaction, one consistent snapshot) instead of three.
    static let exchangeContextSQL = StoreColumns.exchangeContext(integrationColumns) + """

            LEFT JOIN challenges c ON c.client_id = i.client_id AND c.key_id = ? AND c.used = 0 AND c.expires_at > ?
            LEFT JOIN devices d ON d.key_id = ? AND d.client_id = i.client_id
            WHERE i.client_id = ?
            """

    /// The context's integration is its first columns (`StoreColumns.exchangeContext`).
    static let integrationColumnCount = Int32(StoreColumns.integration.count)

    public func exchangeContext(clientID: String, keyID: [UInt8], at time: Date) throws -> ExchangeContext {
        try read { db in
            try db.first(Self.exchangeContextSQL, [.blob(keyID), .real(time.timeIntervalSince1970), .blob(keyID), .text(clientID)]) { row in
                ExchangeContext(integration: try db.decodedIntegrations.integration(row, columns: Self.integrationColumnCount),
                                challenge: try row.isNull("challenge") ? nil : try row.bytes("challenge"),
                                device: try row.isNull("key_id") ? nil : try Device(row: row))
            } ?? ExchangeContext(integration: nil, challenge: nil, device: nil)
        }
    }

    static func optional(_ text: String?) -> SQLValue { text.map { .text($0) } ?? .null }
    static func optional(_ date: Date?) -> SQLValue { date.map { .real($0.timeIntervalSince1970) } ?? .null }

    public func device(clientID: String, keyID: [UInt8]) throws -> Device? {
        try read { db in
            try db.first("""
                SELECT \(StoreColumns.list(StoreColumns.device)) FROM devices WHERE key_id = ? AND client_id = ?
                """, [.blob(keyID), .text(clientID)], Device.init(row:))
        }
    }

    /// Stores a new token and revokes the device's older live tokens but the newest one before it
    /// (kept for requests already in flight), in the caller's transaction.
    static func insertToken(_ db: SQLiteConnection, _ token: TokenRecord, grant: String) throws {
        try db.run("""
            INSERT INTO tokens (token_hash, client_id, workspace_id, key_id, issued_at, expires_at, grant_type) VALUES (?, ?, ?, ?, ?, ?, ?)
            """, [.blob(token.tokenHash), .text(token.clientID), .int(token.workspaceID), .blob(token.keyID),
                  .real(token.issuedAt.timeIntervalSince1970), .real(token.expiresAt.timeIntervalSince1970), .text(grant)])
        try db.run(revokeOlderTokensSQL, [.real(token.issuedAt.timeIntervalSince1970), .blob(token.keyID), .text(token.clientID), .blob(token.tokenHash),
                                          .blob(token.keyID), .text(token.clientID), .blob(token.tokenHash)])
    }

    /// The new token stays, with the newest of the others (ties: any one of them). It reads the
    /// device's live tokens only, on their partial index (migration 0009): never every token the
    /// device minted, so a mint costs the same at any rate (a test checks the plan).
    static let revokeOlderTokensSQL = """
        UPDATE tokens SET revoked_at = ? WHERE key_id = ? AND client_id = ? AND revoked_at IS NULL AND token_hash != ?
          AND token_hash NOT IN (
            SELECT token_hash FROM tokens WHERE key_id = ? AND client_id = ? AND revoked_at IS NULL AND token_hash != ?
            ORDER BY issued_at DESC LIMIT \(TokenRecord.liveTokensPerDevice - 1))
        """

    public func registerDevice(_ device: Device, receipt: DeviceReceipt, firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at time: Date,
                               commitTime: @Sendable () -> Date) throws -> CommitResult {
        try writeInGroup { db in
            try Self.register(db, device, receipt: receipt, firstToken: firstToken, redeeming: challenge, nextChallenge: nextChallenge,
                              quota: quota, at: time, commitTime: commitTime)
        }
    }

    public func registerDevice(_ device: Device, receipt: DeviceReceipt, firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at time: Date,
                               commitTime: @escaping @Sendable () -> Date,
                               completion: @escaping @Sendable (Result<CommitResult, any Error>) -> Void) {
        submitInGroup({ db in
            try Self.register(db, device, receipt: receipt, firstToken: firstToken, redeeming: challenge, nextChallenge: nextChallenge,
                              quota: quota, at: time, commitTime: commitTime)
        }, completion: completion)
    }

    /// A registration's statements, in a transaction that holds the write lock from its start (the
    /// group's IMMEDIATE one), so the commit time is the commit's and the quota's count cannot
    /// change before the insert.
    static func register(_ db: SQLiteConnection, _ device: Device, receipt: DeviceReceipt, firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                         nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at time: Date,
                         commitTime: @Sendable () -> Date) throws -> CommitResult {
        let committing = commitTime()
        if let challenge, try !Self.redeem(db, clientID: device.clientID, keyID: device.keyID, challenge: challenge,
                                          replacingWith: nextChallenge, at: committing) {
            return .challengeGone
        }
        // Committed all the same when refused: the challenge stays used.
        func refused(_ result: CommitResult) throws -> CommitResult {
            try Self.burn(db, clientID: device.clientID, keyID: device.keyID, redeemed: challenge)
            return result
        }
        if let quota, try db.first("SELECT count(*) AS count FROM devices WHERE client_id = ? AND registered_at > ?",
                                   [.text(device.clientID), .real((committing - quota.window).timeIntervalSince1970)], { try $0.int("count") }) ?? 0
            >= Int64(quota.limit) {
            return try refused(.quotaExceeded)
        }
        let inserted = try db.run("""
            INSERT INTO devices (key_id, client_id, public_key, sign_counter, environment, app_id, registered_at,
                                 platform, validation_category, bundle_version, os_version, last_refresh_at,
                                 receipt_created_at, receipt_not_before, receipt_expires_at, risk_metric, risk_refresh_due_at)
            SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?
            WHERE EXISTS (SELECT 1 FROM integrations WHERE client_id = ? AND revoked_at IS NULL)
            ON CONFLICT (key_id) DO NOTHING
            """, [.blob(device.keyID), .text(device.clientID), .blob(device.publicKey), .int(Int64(device.counter)),
                  .text(device.environment.rawValue), .text(device.appID), .real(time.timeIntervalSince1970),
                  Self.optional(device.platform?.rawValue), device.validationCategory.map { .int(Int64($0)) } ?? .null,
                  Self.optional(device.bundleVersion), Self.optional(device.osVersion), .real(time.timeIntervalSince1970),
                  Self.optional(receipt.risk?.receiptCreatedAt),
                  Self.optional(receipt.risk?.receiptNotBefore), Self.optional(receipt.risk?.receiptExpiresAt),
                  receipt.risk?.metric.map { .int(Int64($0)) } ?? .null, Self.optional(receipt.refreshDueAt),
                  .text(device.clientID)])
        guard inserted == 1 else { return try refused(.conflict) }
        // Beside the device row, never in it (migration 0012): its searches stay off overflow pages.
        try db.run("INSERT INTO device_receipts (key_id, receipt, credential_certificate) VALUES (?, ?, ?)",
                   [.blob(device.keyID), .blob(receipt.der), receipt.credentialCertificate.map { .blob($0) } ?? .null])
        try Self.insertToken(db, firstToken, grant: "registration")
        if challenge == nil { try Self.storeChallenge(db, clientID: device.clientID, keyID: device.keyID, nextChallenge) }
        return .committed
    }

    public func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, refresh: DeviceRefresh?, token: TokenRecord,
                               redeeming challenge: [UInt8]?, nextChallenge: IssuedChallenge, at time: Date,
                               commitTime: @Sendable () -> Date) throws -> CommitResult {
        try writeInGroup { db in
            try Self.advance(db, clientID: clientID, keyID: keyID, from: from, to: to, refresh: refresh, token: token, redeeming: challenge,
                             nextChallenge: nextChallenge, at: time, commitTime: commitTime)
        }
    }

    public func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, refresh: DeviceRefresh?, token: TokenRecord,
                               redeeming challenge: [UInt8]?, nextChallenge: IssuedChallenge, at time: Date,
                               commitTime: @escaping @Sendable () -> Date,
                               completion: @escaping @Sendable (Result<CommitResult, any Error>) -> Void) {
        submitInGroup({ db in
            try Self.advance(db, clientID: clientID, keyID: keyID, from: from, to: to, refresh: refresh, token: token, redeeming: challenge,
                             nextChallenge: nextChallenge, at: time, commitTime: commitTime)
        }, completion: completion)
    }

    /// A refresh's statements, in the batch's transaction.
    static func advance(_ db: SQLiteConnection, clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, refresh: DeviceRefresh?,
                        token: TokenRecord, redeeming challenge: [UInt8]?, nextChallenge: IssuedChallenge, at time: Date,
                        commitTime: @Sendable () -> Date) throws -> CommitResult {
        if let challenge, try !Self.redeem(db, clientID: clientID, keyID: keyID, challenge: challenge, replacingWith: nextChallenge, at: commitTime()) {
            return .challengeGone
        }
        // Compare-and-set on the counter, and only while the integration is live.
        let changed = try db.run("""
            UPDATE devices SET sign_counter = ?, last_refresh_at = ?, validation_category = coalesce(validation_category, ?),
                               bundle_version = coalesce(?, bundle_version), platform = coalesce(platform, ?)
            WHERE key_id = ? AND client_id = ? AND sign_counter = ?
              AND EXISTS (SELECT 1 FROM integrations WHERE client_id = ? AND revoked_at IS NULL)
            """, [.int(Int64(to)), .real(time.timeIntervalSince1970), refresh?.validationCategory.map { .int(Int64($0)) } ?? .null,
                  Self.optional(refresh?.bundleVersion), Self.optional(refresh?.platform?.rawValue),
                  .blob(keyID), .text(clientID), .int(Int64(from)), .text(clientID)])
        guard changed == 1 else {   // committed all the same: the challenge stays used
            try Self.burn(db, clientID: clientID, keyID: keyID, redeemed: challenge)
            return .conflict
        }
        try Self.insertToken(db, token, grant: "assertion")
        if challenge == nil { try Self.storeChallenge(db, clientID: clientID, keyID: keyID, nextChallenge) }
        return .committed
    }

    /// The token check's statement (`StoreColumns.grantQuery`), in SQLite's placeholders.
    static let liveTokenSQL = StoreColumns.grantQuery(month: "?1", minute: "?2", previousMinute: "?3", hash: "?4", now: "?5")

    /// Every relayed request asks this, so a reader keeps its answers while the database stays as it
    /// was: `PRAGMA data_version` (one empty read transaction) tells whether any other connection,
    /// this process's writers or attestctl's, has committed since. A revocation, a policy change
    /// or a usage flush is therefore seen by the next request, as with the query itself; only the
    /// time-dependent parts are checked here: the expiry, and the minute the usage counts are for.
    public func liveToken(hash: [UInt8], at time: Date) throws -> TokenGrant? {
        let minute = UsageClock.minute(time)
        return try readWithCache { db, cache in
            // Read before the query: a commit in between makes the next call query again.
            let version = try db.dataVersion()
            if let grant = cache.grant(hash: hash, minute: minute, version: version, at: time) { return grant }
            let grant = try db.first(Self.liveTokenSQL, [.int(UsageClock.month(time)), .int(minute), .int(minute - 1), .blob(hash), .real(time.timeIntervalSince1970)]) {
                    try TokenGrant(row: $0, hash: hash)
                } ?? nil
            if let grant { cache.keep(grant, hash: hash, minute: minute) }
            return grant
        }
    }

    // MARK: Rate limits

    static func window(_ row: SQLiteConnection.Row) throws -> WindowCount { try WindowCount(row: row) }

    public func mintsSince(clientID: String, keyID: [UInt8], since: Date) throws -> WindowCount {
        try read { try $0.first("SELECT count(*) AS count, min(issued_at) AS oldest FROM tokens WHERE key_id = ? AND client_id = ? AND issued_at > ? AND grant_type = 'assertion'",
                                [.blob(keyID), .text(clientID), .real(since.timeIntervalSince1970)], Self.window) }!
    }

    public func registrationsSince(clientID: String, since: Date) throws -> WindowCount {
        try read { try $0.first("SELECT count(*) AS count, min(registered_at) AS oldest FROM devices WHERE client_id = ? AND registered_at > ?",
                                [.text(clientID), .real(since.timeIntervalSince1970)], Self.window) }!
    }

    public func recordChallengeRequest(caller: String, at time: Date, since: Date) throws -> WindowCount {
        try write { db in
            try db.transaction {
                try db.run("INSERT INTO challenge_requests (caller, at) VALUES (?, ?)", [.text(caller), .real(time.timeIntervalSince1970)])
                return try db.first("SELECT count(*) AS count, min(at) AS oldest FROM challenge_requests WHERE caller = ? AND at > ?",
                                    [.text(caller), .real(since.timeIntervalSince1970)], Self.window)!
            }
        }
    }

    public func purgeChallengeRequests(before: Date, registrationsBefore: Date) throws -> Int {
        try writeInBackground {
            try $0.run("DELETE FROM challenge_requests WHERE at <= ? AND (at <= ? OR substr(caller, 1, ?) <> ?)",
                       [.real(before.timeIntervalSince1970), .real(registrationsBefore.timeIntervalSince1970),
                        .int(Int64(DeviceTokenService.registrationBucketPrefix.utf8.count)), .text(DeviceTokenService.registrationBucketPrefix)])
        }
    }
}
