import AppAttest
import AttestCrypto
import AttestWire
import CPostgres
import Foundation
import StoreRecords
import TokenService

extension PostgresTokenStore {
    // MARK: Challenges

    /// One statement: the pending challenge, or `fresh` written over a used or expired one.
    /// When a concurrent caller stores its own fresh challenge in between, the upsert finds a
    /// pending row it may not replace and returns nothing; the next attempt reads that one.
    public func pendingOrNewChallenge(clientID: String, keyID: [UInt8], fresh: IssuedChallenge, at time: Date) throws -> IssuedChallenge {
        try run { db in
            for _ in 0..<5 {
                if let issued = try db.query("""
                    WITH pending AS (
                        SELECT challenge, expires_at FROM challenges WHERE client_id = $1 AND key_id = $2 AND NOT used AND expires_at > $3),
                    stored AS (
                        INSERT INTO challenges (client_id, key_id, challenge, expires_at, used)
                        SELECT $1, $2, $4, $5, false WHERE NOT EXISTS (SELECT 1 FROM pending)
                        ON CONFLICT (client_id, key_id) DO UPDATE
                            SET challenge = excluded.challenge, expires_at = excluded.expires_at, used = false
                            WHERE challenges.used OR challenges.expires_at <= $3
                        RETURNING challenge, expires_at)
                    SELECT challenge, expires_at FROM pending UNION ALL SELECT challenge, expires_at FROM stored
                    """, [.text(clientID), .bytes(keyID), Self.seconds(time), .bytes(fresh.bytes), Self.seconds(fresh.expiresAt)])
                    .first(IssuedChallenge.init(row:)) {
                    return issued
                }
            }
            throw PostgresError(.server, message: "no challenge after 5 attempts: the row kept changing", target: pool.target)
        }
    }

    public func pendingChallenge(clientID: String, keyID: [UInt8], at time: Date) throws -> [UInt8]? {
        try run { db in
            try db.query("SELECT challenge FROM challenges WHERE client_id = $1 AND key_id = $2 AND NOT used AND expires_at > $3",
                         [.text(clientID), .bytes(keyID), Self.seconds(time)]).first { try $0.bytes("challenge") }
        }
    }

    /// One conditional statement: of two concurrent requests, exactly one gets the challenge.
    public func consumeChallenge(clientID: String, keyID: [UInt8], challenge: [UInt8]?, at time: Date) throws -> [UInt8]? {
        try run { db in
            try db.query("""
                UPDATE challenges SET used = true
                WHERE client_id = $1 AND key_id = $2 AND NOT used AND expires_at > $3 AND ($4::bytea IS NULL OR challenge = $4)
                RETURNING challenge
                """, [.text(clientID), .bytes(keyID), Self.seconds(time), Self.optional(challenge)]).first { try $0.bytes("challenge") }
        }
    }

    public func purgeChallenges(before time: Date) throws -> Int {
        try run { db in
            // Token rows a day past expiry can never authenticate again.
            try db.query("""
                WITH c AS (DELETE FROM challenges WHERE used OR expires_at <= $1 RETURNING 1),
                     t AS (DELETE FROM tokens WHERE expires_at <= $2)
                SELECT count(*) FROM c
                """, [Self.seconds(time), .double(time.timeIntervalSince1970 - 86_400)]).first { Int(try $0.int(0)) } ?? 0
        }
    }

    // MARK: Devices and tokens

    /// The integration, the pending challenge and the device in one round trip instead of three.
    /// The device is found by its primary key alone, and a device of another client is dropped
    /// below: with `d.client_id = i.client_id` in the join, a plan made while the table was small
    /// and not yet analysed (every new connection's, in a fresh deployment) scanned the index on
    /// the client's devices and read each of them: 245 rows per exchange at 256 devices.
    static let exchangeContextSQL = StoreColumns.exchangeContext(integrationColumns) + """

            LEFT JOIN challenges c ON c.client_id = i.client_id AND c.key_id = $2 AND NOT c.used AND c.expires_at > $3
            LEFT JOIN devices d ON d.key_id = $2
            WHERE i.client_id = $1
            """

    public func exchangeContext(clientID: String, keyID: [UInt8], at time: Date) throws -> ExchangeContext {
        try run { db in
            try db.query(Self.exchangeContextSQL, [.text(clientID), .bytes(keyID), Self.seconds(time)]).first { row in
                // `client_id` is the integration's; the device's own is `device_client_id`.
                let ours = try !row.isNull("key_id") && row.text("device_client_id") == clientID
                return ExchangeContext(integration: try Integration(row: row), challenge: try row.isNull("challenge") ? nil : try row.bytes("challenge"),
                                       device: ours ? try Device(row: row) : nil)
            } ?? ExchangeContext(integration: nil, challenge: nil, device: nil)
        }
    }

    public func device(clientID: String, keyID: [UInt8]) throws -> Device? {
        try run { db in
            try db.query("""
                SELECT \(StoreColumns.list(StoreColumns.device)) FROM devices WHERE key_id = $1 AND client_id = $2
                """, [.bytes(keyID), .text(clientID)]).first(Device.init(row:))
        }
    }

    /// The parts every exchange shares, after its own CTE `done` (the device row written):
    /// - `ch` locks the challenge row while it is pending and still `$4`; a concurrent redeemer
    ///   waits for the lock, then re-reads the row and finds it used or replaced;
    /// - the token and the next challenge are written only when `done` returned a row; `done`
    ///   requires `liveIntegration` (the token's integration, not revoked, in the token's
    ///   workspace), which stands in for the token's foreign keys (migration 0012);
    /// - otherwise a redeemed challenge is used up all the same (`burn`).
    /// `ch` and the final write touch the challenge row once each (a lock, then one update), as
    /// PostgreSQL requires of one statement. Lock order is challenge row, then device row, in
    /// every exchange, so two exchanges cannot deadlock.
    /// Parameters: $1 client ID, $2 key ID, $3 now, $4 challenge to redeem (NULL: none),
    /// $5… the exchange's own, then `firstTokenParameter`… token hash, client ID, workspace ID,
    /// key ID, issued, expires, next challenge, its expiry.
    static func exchangeSQL(done: String, firstTokenParameter p: Int, grant: String, quotaOK: String = "true") -> String {
        """
        WITH ch AS (
            SELECT 1 FROM challenges
            WHERE client_id = $1 AND key_id = $2 AND NOT used AND expires_at > $3 AND challenge = $4
            FOR UPDATE
        ), done AS (
            \(done)
        ), token AS (
            INSERT INTO tokens (token_hash, client_id, workspace_id, key_id, issued_at, expires_at, grant_type)
            SELECT $\(p), $\(p + 1), $\(p + 2), $\(p + 3), $\(p + 4), $\(p + 5), '\(grant)' WHERE EXISTS (SELECT 1 FROM done)
        ), pruned AS (
            -- A device keeps the new token and the newest of its others (requests in flight).
            UPDATE tokens SET revoked_at = $3
            WHERE key_id = $2 AND client_id = $1 AND revoked_at IS NULL AND token_hash <> $\(p) AND EXISTS (SELECT 1 FROM done)
              AND token_hash NOT IN (SELECT token_hash FROM tokens WHERE key_id = $2 AND client_id = $1 AND revoked_at IS NULL
                                     AND token_hash <> $\(p) ORDER BY issued_at DESC LIMIT \(TokenRecord.liveTokensPerDevice - 1))
        ), next AS (
            INSERT INTO challenges (client_id, key_id, challenge, expires_at, used)
            SELECT $1, $2, $\(p + 6), $\(p + 7), false WHERE EXISTS (SELECT 1 FROM done)
            ON CONFLICT (client_id, key_id) DO UPDATE SET challenge = excluded.challenge, expires_at = excluded.expires_at, used = false
        ), burn AS (
            UPDATE challenges SET used = true
            WHERE client_id = $1 AND key_id = $2 AND EXISTS (SELECT 1 FROM ch) AND NOT EXISTS (SELECT 1 FROM done)
        )
        SELECT EXISTS (SELECT 1 FROM ch), EXISTS (SELECT 1 FROM done), \(quotaOK)
        """
    }

    /// The exchange's integration exists and is not revoked, and the token is for it and for its
    /// workspace (`$\(p + 1)`, `$\(p + 2)`): otherwise nothing is written at all.
    static func liveIntegration(firstTokenParameter p: Int) -> String {
        "$\(p + 1) = $1 AND EXISTS (SELECT 1 FROM integrations WHERE client_id = $1 AND revoked_at IS NULL AND workspace_id = $\(p + 2))"
    }

    /// $18: the quota (NULL: none), $19: the start of its window.
    static let registrationQuotaOK = "($18::bigint IS NULL OR (SELECT count(*) FROM devices WHERE client_id = $1 AND registered_at > $19) < $18)"

    static let registerSQL = exchangeSQL(done: """
        INSERT INTO devices (key_id, client_id, public_key, sign_counter, environment, app_id, receipt, registered_at,
                             platform, validation_category, bundle_version, os_version, last_refresh_at,
                             credential_certificate, receipt_created_at, receipt_not_before, receipt_expires_at, risk_metric, risk_refresh_due_at)
            SELECT $2, $1, $5, $6, $7, $8, $9, $3, $20, $21, $22, $23, $3, $24, $25, $26, $27, $28, $29
            WHERE ($4::bytea IS NULL OR EXISTS (SELECT 1 FROM ch))
              AND \(liveIntegration(firstTokenParameter: 10))
              AND \(registrationQuotaOK)
            ON CONFLICT (key_id) DO NOTHING
            RETURNING 1
        """, firstTokenParameter: 10, grant: "registration", quotaOK: registrationQuotaOK)

    static let advanceSQL = exchangeSQL(done: """
        UPDATE devices SET sign_counter = $5, last_refresh_at = $3, validation_category = coalesce(validation_category, $15),
                           bundle_version = coalesce($16, bundle_version), platform = coalesce(platform, $17)
            -- IS NOT DISTINCT FROM (the same as = for this NOT NULL column) is not an index
            -- condition, so the row is found by its primary key whatever the statistics say
            -- (see exchangeContextSQL).
            WHERE key_id = $2 AND client_id IS NOT DISTINCT FROM $1 AND sign_counter = $6
              AND ($4::bytea IS NULL OR EXISTS (SELECT 1 FROM ch))
              AND \(liveIntegration(firstTokenParameter: 7))
            RETURNING 1
        """, firstTokenParameter: 7, grant: "assertion")

    static func tokenValues(_ token: TokenRecord, _ next: IssuedChallenge) -> [PostgresValue] {
        [.bytes(token.tokenHash), .text(token.clientID), .int(token.workspaceID), .bytes(token.keyID), seconds(token.issuedAt),
         seconds(token.expiresAt), .bytes(next.bytes), seconds(next.expiresAt)]
    }

    static func outcome(_ result: PostgresResult, redeeming challenge: [UInt8]?) throws -> CommitResult {
        let row = result[0]
        if challenge != nil, try !row.bool(0) { return .challengeGone }
        if try row.bool(1) { return .committed }
        return try row.bool(2) ? .conflict : .quotaExceeded
    }

    public func registerDevice(_ device: Device, receipt: DeviceReceipt, firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at time: Date,
                               commitTime: @Sendable () -> Date) throws -> CommitResult {
        func values(_ committing: Date) -> [PostgresValue] {
            [.text(device.clientID), .bytes(device.keyID), Self.seconds(committing), Self.optional(challenge),
             .bytes(device.publicKey), .int(Int64(device.counter)), .text(device.environment.rawValue),
             .text(device.appID), .bytes(receipt.der)] + Self.tokenValues(firstToken, nextChallenge)
                + [quota.map { .int(Int64($0.limit)) } ?? .nullInt, Self.seconds(committing - (quota?.window ?? 0))]
                + [Self.optional(device.platform?.rawValue), Self.optional(device.validationCategory), Self.optional(device.bundleVersion),
                   Self.optional(device.osVersion)]
                + [Self.optional(receipt.credentialCertificate), Self.optional(receipt.risk?.receiptCreatedAt),
                   Self.optional(receipt.risk?.receiptNotBefore), Self.optional(receipt.risk?.receiptExpiresAt),
                   Self.optional(receipt.risk?.metric), Self.optional(receipt.refreshDueAt)]
        }
        return try run { db in
            guard quota != nil else { return try Self.outcome(try db.query(Self.registerSQL, values(commitTime())), redeeming: challenge) }
            // The integration's row is locked first, so its registrations are counted one at a
            // time: the statement after the lock sees every registration committed before it (one
            // statement alone would count from a snapshot taken before a concurrent one committed).
            return try db.transaction {
                _ = try db.query("SELECT 1 FROM integrations WHERE client_id = $1 FOR UPDATE", [.text(device.clientID)])
                return try Self.outcome(try db.query(Self.registerSQL, values(commitTime())), redeeming: challenge)
            }
        }
    }

    public func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, refresh: DeviceRefresh?, token: TokenRecord,
                               redeeming challenge: [UInt8]?, nextChallenge: IssuedChallenge, at time: Date,
                               commitTime: @Sendable () -> Date) throws -> CommitResult {
        try run { db in
            let values: [PostgresValue] = [.text(clientID), .bytes(keyID), Self.seconds(commitTime()), Self.optional(challenge),
                                           .int(Int64(to)), .int(Int64(from))] + Self.tokenValues(token, nextChallenge)
                + [Self.optional(refresh?.validationCategory), Self.optional(refresh?.bundleVersion), Self.optional(refresh?.platform?.rawValue)]
            return try Self.outcome(try db.query(Self.advanceSQL, values), redeeming: challenge)
        }
    }

    /// The token check's statement (`StoreColumns.grantQuery`), in PostgreSQL's placeholders.
    static let liveTokenSQL = StoreColumns.grantQuery(month: "$3", minute: "$4", previousMinute: "$4 - 1", hash: "$1", now: "$2")

    public func liveToken(hash: [UInt8], at time: Date) throws -> TokenGrant? {
        let minute = UsageClock.minute(time)
        return try run { db in
            try db.query(Self.liveTokenSQL, [.bytes(hash), Self.seconds(time), .int(UsageClock.month(time)), .int(minute)]).first {
                try TokenGrant(row: $0, hash: hash)
            } ?? nil
        }
    }

    // MARK: Rate limits

    static func window(_ row: PostgresRow) throws -> WindowCount { try WindowCount(row: row) }

    /// The mint limit's count: the device's tokens of the window, on tokens_by_device.
    static let mintsSinceSQL =
        "SELECT count(*) AS count, min(issued_at) AS oldest FROM tokens WHERE key_id = $1 AND client_id = $2 AND issued_at > $3 AND grant_type = 'assertion'"

    public func mintsSince(clientID: String, keyID: [UInt8], since: Date) throws -> WindowCount {
        try run { db in
            try db.query(Self.mintsSinceSQL, [.bytes(keyID), .text(clientID), Self.seconds(since)]).first(Self.window)!
        }
    }

    public func registrationsSince(clientID: String, since: Date) throws -> WindowCount {
        try run { db in
            try db.query("SELECT count(*) AS count, min(registered_at) AS oldest FROM devices WHERE client_id = $1 AND registered_at > $2",
                         [.text(clientID), Self.seconds(since)]).first(Self.window)!
        }
    }

    /// One statement: the insert and the count of what was there before it, plus this one.
    public func recordChallengeRequest(caller: String, at time: Date, since: Date) throws -> WindowCount {
        try run { db in
            try db.query("""
                WITH recorded AS (INSERT INTO challenge_requests (caller, at) VALUES ($1, $2) RETURNING at)
                SELECT count(*) + 1 AS count, least(min(c.at), (SELECT at FROM recorded)) AS oldest FROM challenge_requests c WHERE c.caller = $1 AND c.at > $3
                """, [.text(caller), Self.seconds(time), Self.seconds(since)]).first(Self.window)!
        }
    }

    public func purgeChallengeRequests(before: Date, registrationsBefore: Date) throws -> Int {
        try run { db in
            try db.query("""
                WITH d AS (DELETE FROM challenge_requests WHERE at <= $1 AND (at <= $2 OR left(caller, $3) <> $4) RETURNING 1) SELECT count(*) FROM d
                """, [Self.seconds(before), Self.seconds(registrationsBefore), .int(Int64(DeviceTokenService.registrationBucketPrefix.count)),
                      .text(DeviceTokenService.registrationBucketPrefix)]).first { Int(try $0.int(0)) } ?? 0
        }
    }
}
