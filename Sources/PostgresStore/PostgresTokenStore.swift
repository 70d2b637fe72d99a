import AppAttest
import AttestCrypto
import AttestWire
import Foundation
import TokenService

/// `TokenStore` on PostgreSQL, for several attestd instances on one database. Behaves as
/// `SQLiteTokenStore` does; everything that must not race is decided by the database, never by
/// this process's memory:
/// - a challenge is redeemed by locking its row (`SELECT … FOR UPDATE`) and checking it is still
///   pending and still the same bytes; of concurrent redeemers exactly one sees it so;
/// - a counter advances by a compare-and-set `UPDATE … WHERE sign_counter = $from`;
/// - a key registers once (`devices` primary key, `ON CONFLICT DO NOTHING`);
/// - each exchange (redeem, advance or register, token, next challenge) is one statement built
///   from data-modifying CTEs: one transaction and one round trip.
public final class PostgresTokenStore: TokenStore {
    public let pool: PostgresPool

    /// Connects, then applies (or with `.verify` only checks) the migrations.
    public init(connectionString: PostgresConnectionString, configuration: PostgresConfiguration = .init(),
                migrations: [Migration] = Migration.postgres, mode: MigrationMode = .apply) throws {
        pool = PostgresPool(connectionString, configuration: configuration)
        try PostgresMigrator.migrate(pool, migrations, mode: mode)
    }

    public convenience init(_ connectionString: String, poolSize: Int = 4, mode: MigrationMode = .apply) throws {
        try self.init(connectionString: PostgresConnectionString(connectionString), configuration: PostgresConfiguration(poolSize: poolSize), mode: mode)
    }

    /// Round trips to the server so far (for measurement: one per exchange).
    public var roundTrips: Int { pool.counters.roundTrips }

    /// Closes the idle connections (they reopen on demand); for tools about to exit.
    public func close() { pool.closeIdleConnections() }

    private func run<T>(_ body: (PostgresConnection) throws -> T) throws -> T { try pool.withConnection(body) }

    private static func seconds(_ date: Date) -> PostgresValue { .double(date.timeIntervalSince1970) }
    private static func date(_ row: PostgresRow, _ column: Int32) throws -> Date { Date(timeIntervalSince1970: try row.double(column)) }
    private static func optional(_ value: String?) -> PostgresValue { value.map { .text($0) } ?? .nullText }
    private static func optional(_ value: [UInt8]?) -> PostgresValue { value.map { .bytes($0) } ?? .nullBytes }

    // MARK: Organisation

    public func workspace(named name: String) throws -> Workspace? {
        try run { db in
            try db.query("SELECT id, name FROM workspaces WHERE name = $1", [.text(name)]).first { Workspace(id: try $0.int(0), name: try $0.text(1)) }
        }
    }

    public func createWorkspace(name: String, at time: Date) throws -> Workspace {
        try run { db in
            let row = try db.query("INSERT INTO workspaces (name, created_at) VALUES ($1, $2) RETURNING id, name", [.text(name), Self.seconds(time)])[0]
            return Workspace(id: try row.int(0), name: try row.text(1))
        }
    }

    public func role(of email: String, in workspaceID: Int64) throws -> Role? {
        try run { db in
            try db.query("SELECT role FROM members WHERE workspace_id = $1 AND email = $2", [.int(workspaceID), .text(email)])
                .first { Role(rawValue: try $0.text(0)) } ?? nil
        }
    }

    public func primaryOwner(workspaceID: Int64) throws -> String? {
        try run { db in
            try db.query("SELECT email FROM members WHERE workspace_id = $1 AND role = 'primary_owner'", [.int(workspaceID)]).first { try $0.text(0) }
        }
    }

    public func addMember(email: String, role: Role, workspaceID: Int64, at time: Date) throws {
        try run { db in
            _ = try db.query("INSERT INTO members (workspace_id, email, role, created_at) VALUES ($1, $2, $3, $4)",
                         [.int(workspaceID), .text(email), .text(role.rawValue), Self.seconds(time)])
        }
    }

    // MARK: Integrations

    /// The integration and its bundle IDs in one statement (so one transaction).
    public func createIntegration(_ integration: Integration) throws {
        var values: [PostgresValue] = [.text(integration.clientID), .int(integration.workspaceID), .text(integration.name), .text(integration.teamID),
                                       .text(integration.environments.map(\.rawValue).sorted().joined(separator: ",")),
                                       Self.seconds(integration.createdAt)] + Self.policyValues(integration.policy)
        var sql = """
            WITH i AS (
                INSERT INTO integrations (client_id, workspace_id, name, team_id, environments, created_at,
                                          allowed_models, max_tokens, device_requests_per_minute, monthly_token_budget)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING client_id)
            """
        if integration.bundleIDs.isEmpty {
            sql += " SELECT count(*) FROM i"
        } else {
            let rows = integration.bundleIDs.enumerated().map { position, bundleID -> String in
                values.append(.text(bundleID))
                return "($\(values.count), \(position))"
            }
            sql += """

                INSERT INTO integration_bundle_ids (client_id, position, bundle_id)
                SELECT i.client_id, b.position, b.bundle_id FROM i CROSS JOIN (VALUES \(rows.joined(separator: ", "))) AS b (bundle_id, position)
                """
        }
        try run { db in _ = try db.query(sql, values) }
    }

    private static let integrationColumns = """
        SELECT i.client_id, i.workspace_id, w.name, i.name, i.team_id, i.environments, i.created_at, i.revoked_at,
               (SELECT string_agg(b.bundle_id, E'\\n' ORDER BY b.position) FROM integration_bundle_ids b WHERE b.client_id = i.client_id),
               i.allowed_models, i.max_tokens, i.device_requests_per_minute, i.monthly_token_budget
        FROM integrations i JOIN workspaces w ON w.id = i.workspace_id
        """

    private static func integration(_ row: PostgresRow) throws -> Integration {
        Integration(clientID: try row.text(0), workspaceID: try row.int(1), workspaceName: try row.text(2), name: try row.text(3),
                    teamID: try row.text(4),
                    bundleIDs: row.isNull(8) ? [] : try row.text(8).split(separator: "\n").map(String.init),
                    environments: Set(try row.text(5).split(separator: ",").compactMap { AttestationEnvironment(rawValue: String($0)) }),
                    createdAt: try date(row, 6), revokedAt: row.isNull(7) ? nil : try date(row, 7), policy: try policy(row, from: 9))
    }

    /// The four policy columns, `allowed_models` first.
    private static func policy(_ row: PostgresRow, from column: Int32) throws -> IntegrationPolicy {
        IntegrationPolicy(models: IntegrationPolicy.models(fromColumn: row.isNull(column) ? nil : try row.text(column)),
                          maxTokens: Int(try row.int(column + 1)), deviceRequestsPerMinute: Int(try row.int(column + 2)),
                          monthlyTokenBudget: Int(try row.int(column + 3)))
    }

    private static func policyValues(_ policy: IntegrationPolicy) -> [PostgresValue] {
        [optional(policy.modelsColumn), .int(Int64(policy.maxTokens)), .int(Int64(policy.deviceRequestsPerMinute)),
         .int(Int64(policy.monthlyTokenBudget))]
    }

    public func integration(clientID: String) throws -> Integration? {
        try run { db in try db.query(Self.integrationColumns + " WHERE i.client_id = $1", [.text(clientID)]).first(Self.integration) }
    }

    public func integrations(workspaceID: Int64?) throws -> [Integration] {
        try run { db in
            let result = if let workspaceID {
                try db.query(Self.integrationColumns + " WHERE i.workspace_id = $1 ORDER BY i.created_at, i.client_id", [.int(workspaceID)])
            } else {
                try db.query(Self.integrationColumns + " ORDER BY i.created_at, i.client_id")
            }
            return try result.rows.map(Self.integration)
        }
    }

    /// The integration, its live tokens and its challenges in one statement.
    public func revokeIntegration(clientID: String, at time: Date) throws -> Bool {
        try run { db in
            try db.query("""
                WITH i AS (UPDATE integrations SET revoked_at = $2 WHERE client_id = $1 AND revoked_at IS NULL RETURNING client_id),
                     t AS (UPDATE tokens SET revoked_at = $2 WHERE client_id IN (SELECT client_id FROM i) AND revoked_at IS NULL),
                     c AS (UPDATE challenges SET used = true WHERE client_id IN (SELECT client_id FROM i))
                SELECT count(*) FROM i
                """, [.text(clientID), Self.seconds(time)]).first { try $0.int(0) == 1 } ?? false
        }
    }

    public func counts(clientID: String, at time: Date) throws -> (devices: Int, liveTokens: Int) {
        try run { db in
            let row = try db.query("""
                SELECT (SELECT count(*) FROM devices WHERE client_id = $1),
                       (SELECT count(*) FROM tokens t JOIN integrations i ON i.client_id = t.client_id
                        WHERE t.client_id = $1 AND t.expires_at > $2 AND t.revoked_at IS NULL AND i.revoked_at IS NULL)
                """, [.text(clientID), Self.seconds(time)])[0]
            return (Int(try row.int(0)), Int(try row.int(1)))
        }
    }

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
                    .first({ IssuedChallenge(bytes: try $0.bytes(0), expiresAt: try Self.date($0, 1)) }) {
                    return issued
                }
            }
            throw PostgresError(.server, message: "no challenge after 5 attempts: the row kept changing", target: pool.target)
        }
    }

    public func pendingChallenge(clientID: String, keyID: [UInt8], at time: Date) throws -> [UInt8]? {
        try run { db in
            try db.query("SELECT challenge FROM challenges WHERE client_id = $1 AND key_id = $2 AND NOT used AND expires_at > $3",
                         [.text(clientID), .bytes(keyID), Self.seconds(time)]).first { try $0.bytes(0) }
        }
    }

    /// One conditional statement: of two concurrent requests, exactly one gets the challenge.
    public func consumeChallenge(clientID: String, keyID: [UInt8], challenge: [UInt8]?, at time: Date) throws -> [UInt8]? {
        try run { db in
            try db.query("""
                UPDATE challenges SET used = true
                WHERE client_id = $1 AND key_id = $2 AND NOT used AND expires_at > $3 AND ($4::bytea IS NULL OR challenge = $4)
                RETURNING challenge
                """, [.text(clientID), .bytes(keyID), Self.seconds(time), Self.optional(challenge)]).first { try $0.bytes(0) }
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

    // MARK: Workspaces' upstream keys

    public func setUpstreamKey(workspaceID: Int64, _ key: SealedUpstreamKey) throws {
        try run { db in
            _ = try db.query("""
                INSERT INTO workspace_upstream_keys (workspace_id, sealed_key, last4, set_at, set_by) VALUES ($1, $2, $3, $4, $5)
                ON CONFLICT (workspace_id) DO UPDATE SET sealed_key = excluded.sealed_key, last4 = excluded.last4,
                  set_at = excluded.set_at, set_by = excluded.set_by
                """, [.int(workspaceID), .bytes(key.sealed), .text(key.last4), Self.seconds(key.setAt), .text(key.setBy)])
        }
    }

    public func upstreamKey(workspaceID: Int64) throws -> SealedUpstreamKey? {
        try run { db in
            try db.query("SELECT sealed_key, last4, set_at, set_by FROM workspace_upstream_keys WHERE workspace_id = $1",
                         [.int(workspaceID)]).first { try Self.sealedKey($0, from: 0) }
        }
    }

    private static func sealedKey(_ row: PostgresRow, from column: Int32) throws -> SealedUpstreamKey {
        SealedUpstreamKey(sealed: try row.bytes(column), last4: try row.text(column + 1), setAt: try date(row, column + 2),
                          setBy: try row.text(column + 3))
    }

    // MARK: Devices and tokens

    public func device(clientID: String, keyID: [UInt8]) throws -> Device? {
        try run { db in
            try db.query("""
                SELECT key_id, client_id, public_key, sign_counter, environment, app_id FROM devices WHERE key_id = $1 AND client_id = $2
                """, [.bytes(keyID), .text(clientID)]).first {
                    Device(keyID: try $0.bytes(0), clientID: try $0.text(1), publicKey: try $0.bytes(2),
                           counter: UInt32(truncatingIfNeeded: try $0.int(3)),
                           environment: AttestationEnvironment(rawValue: try $0.text(4)) ?? .production, appID: try $0.text(5))
                }
        }
    }

    /// The parts every exchange shares, after its own CTE `done` (the device row written):
    /// - `ch` locks the challenge row while it is pending and still `$4`; a concurrent redeemer
    ///   waits for the lock, then re-reads the row and finds it used or replaced;
    /// - the token and the next challenge are written only when `done` returned a row;
    /// - otherwise a redeemed challenge is used up all the same (`burn`).
    /// `ch` and the final write touch the challenge row once each (a lock, then one update), as
    /// PostgreSQL requires of one statement. Lock order is challenge row, then device row, in
    /// every exchange, so two exchanges cannot deadlock.
    /// Parameters: $1 client ID, $2 key ID, $3 now, $4 challenge to redeem (NULL: none),
    /// $5… the exchange's own, then `firstTokenParameter`… token hash, client ID, workspace ID,
    /// key ID, issued, expires, next challenge, its expiry.
    private static func exchangeSQL(done: String, firstTokenParameter p: Int, grant: String, quotaOK: String = "true") -> String {
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

    /// $18: the quota (NULL: none), $19: the start of its window.
    private static let registrationQuotaOK = "($18::bigint IS NULL OR (SELECT count(*) FROM devices WHERE client_id = $1 AND registered_at > $19) < $18)"

    private static let registerSQL = exchangeSQL(done: """
        INSERT INTO devices (key_id, client_id, public_key, sign_counter, environment, app_id, receipt, registered_at)
            SELECT $2, $1, $5, $6, $7, $8, $9, $3
            WHERE ($4::bytea IS NULL OR EXISTS (SELECT 1 FROM ch))
              AND EXISTS (SELECT 1 FROM integrations WHERE client_id = $1 AND revoked_at IS NULL)
              AND \(registrationQuotaOK)
            ON CONFLICT (key_id) DO NOTHING
            RETURNING 1
        """, firstTokenParameter: 10, grant: "registration", quotaOK: registrationQuotaOK)

    private static let advanceSQL = exchangeSQL(done: """
        UPDATE devices SET sign_counter = $5
            WHERE key_id = $2 AND client_id = $1 AND sign_counter = $6
              AND ($4::bytea IS NULL OR EXISTS (SELECT 1 FROM ch))
              AND EXISTS (SELECT 1 FROM integrations WHERE client_id = $1 AND revoked_at IS NULL)
            RETURNING 1
        """, firstTokenParameter: 7, grant: "assertion")

    private static func tokenValues(_ token: TokenRecord, _ next: IssuedChallenge) -> [PostgresValue] {
        [.bytes(token.tokenHash), .text(token.clientID), .int(token.workspaceID), .bytes(token.keyID), seconds(token.issuedAt),
         seconds(token.expiresAt), .bytes(next.bytes), seconds(next.expiresAt)]
    }

    private static func outcome(_ result: PostgresResult, redeeming challenge: [UInt8]?) throws -> CommitResult {
        let row = result[0]
        if challenge != nil, try !row.bool(0) { return .challengeGone }
        if try row.bool(1) { return .committed }
        return try row.bool(2) ? .conflict : .quotaExceeded
    }

    public func registerDevice(_ device: Device, receipt: [UInt8], firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at time: Date,
                               commitTime: @Sendable () -> Date) throws -> CommitResult {
        func values(_ committing: Date) -> [PostgresValue] {
            [.text(device.clientID), .bytes(device.keyID), Self.seconds(committing), Self.optional(challenge),
             .bytes(device.publicKey), .int(Int64(device.counter)), .text(device.environment.rawValue),
             .text(device.appID), .bytes(receipt)] + Self.tokenValues(firstToken, nextChallenge)
                + [quota.map { .int(Int64($0.limit)) } ?? .nullInt, Self.seconds(committing - (quota?.window ?? 0))]
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

    public func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, token: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, at time: Date, commitTime: @Sendable () -> Date) throws -> CommitResult {
        try run { db in
            let values: [PostgresValue] = [.text(clientID), .bytes(keyID), Self.seconds(commitTime()), Self.optional(challenge),
                                           .int(Int64(to)), .int(Int64(from))] + Self.tokenValues(token, nextChallenge)
            return try Self.outcome(try db.query(Self.advanceSQL, values), redeeming: challenge)
        }
    }

    public func liveToken(hash: [UInt8], at time: Date) throws -> TokenGrant? {
        let minute = UsageClock.minute(time)
        return try run { db in
            try db.query("""
                SELECT t.client_id, w.name, t.issued_at, t.expires_at, t.token_hash, w.id,
                       k.sealed_key, k.last4, k.set_at, k.set_by, t.key_id,
                       i.allowed_models, i.max_tokens, i.device_requests_per_minute, i.monthly_token_budget,
                       coalesce(m.tokens, 0), coalesce(d0.requests, 0), coalesce(d1.requests, 0) FROM tokens t
                JOIN integrations i ON i.client_id = t.client_id JOIN workspaces w ON w.id = t.workspace_id
                LEFT JOIN workspace_upstream_keys k ON k.workspace_id = t.workspace_id
                LEFT JOIN usage_monthly m ON m.client_id = t.client_id AND m.month = $3
                LEFT JOIN device_request_minutes d0 ON d0.key_id = t.key_id AND d0.client_id = t.client_id AND d0.minute = $4
                LEFT JOIN device_request_minutes d1 ON d1.key_id = t.key_id AND d1.client_id = t.client_id AND d1.minute = $4 - 1
                WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND t.expires_at > $2 AND i.revoked_at IS NULL
                """, [.bytes(hash), Self.seconds(time), .int(UsageClock.month(time)), .int(minute)]).first { row -> TokenGrant? in
                    // The index lookup found it; confirm in constant time all the same.
                    guard constantTimeEquals(try row.bytes(4), hash) else { return nil }
                    return TokenGrant(clientID: try row.text(0), workspaceID: try row.int(5), workspaceName: try row.text(1),
                                      issuedAt: try Self.date(row, 2), expiresAt: try Self.date(row, 3),
                                      upstreamKey: row.isNull(6) ? nil : try Self.sealedKey(row, from: 6), keyID: try row.bytes(10),
                                      policy: try Self.policy(row, from: 11),
                                      recorded: RecordedUsage(monthTokens: try row.int(15), deviceRequestsThisMinute: try row.int(16),
                                                              deviceRequestsLastMinute: try row.int(17)))
                } ?? nil
        }
    }

    // MARK: Usage and policy

    public func updatePolicy(clientID: String, _ policy: IntegrationPolicy) throws -> Bool {
        try run { db in
            try db.query("""
                WITH u AS (UPDATE integrations SET allowed_models = $1, max_tokens = $2, device_requests_per_minute = $3,
                           monthly_token_budget = $4 WHERE client_id = $5 RETURNING 1)
                SELECT count(*) FROM u
                """, Self.policyValues(policy) + [.text(clientID)]).first { try $0.int(0) == 1 } ?? false
        }
    }

    /// One transaction; each table's increments go in one statement (arrays unnested), so a
    /// flush costs a handful of round trips however many rows it carries.
    ///
    /// Rows go in key order: two instances upserting the same rows in their own dictionary
    /// orders (each process hashes with its own seed) could lock them crosswise and deadlock.
    public func recordUsage(_ batch: UsageBatch, purgeDeviceMinutesBefore: Int64) throws -> Bool {
        let usage = batch.usage.sorted { ($0.key.clientID, $0.key.model, $0.key.hour) < ($1.key.clientID, $1.key.model, $1.key.hour) }
        let errors = usage.flatMap { key, c in c.errors.sorted { $0.key < $1.key }.map { (key, $0.key, $0.value) } }
        let refusals = usage.flatMap { key, c in c.refusals.sorted { $0.key < $1.key }.map { (key, $0.key, $0.value) } }
        return try run { db in
            try db.transaction {
                if let id = batch.id {
                    let at = Double(purgeDeviceMinutesBefore * 60)
                    // Written first: a retried batch whose earlier commit went through stops here.
                    guard try db.query("""
                        WITH added AS (INSERT INTO usage_flushes (batch_id, flushed_at) VALUES ($1, $2) ON CONFLICT (batch_id) DO NOTHING
                                       RETURNING 1),
                             forgotten AS (DELETE FROM usage_flushes WHERE flushed_at < $3)
                        SELECT count(*) FROM added
                        """, [.text(id), .double(at), .double(at - 86_400)]).first({ try $0.int(0) == 1 }) == true else { return false }
                }
                if !usage.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_hourly AS u (client_id, model, hour, requests, input_tokens, output_tokens,
                                                       cache_creation_input_tokens, cache_read_input_tokens, incomplete, abandoned)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[],
                                             $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[])
                        ON CONFLICT (client_id, model, hour) DO UPDATE SET requests = u.requests + excluded.requests,
                          input_tokens = u.input_tokens + excluded.input_tokens, output_tokens = u.output_tokens + excluded.output_tokens,
                          cache_creation_input_tokens = u.cache_creation_input_tokens + excluded.cache_creation_input_tokens,
                          cache_read_input_tokens = u.cache_read_input_tokens + excluded.cache_read_input_tokens,
                          incomplete = u.incomplete + excluded.incomplete, abandoned = u.abandoned + excluded.abandoned
                        """, [Self.textArray(usage.map(\.key.clientID)), Self.textArray(usage.map(\.key.model)),
                              Self.intArray(usage.map(\.key.hour)), Self.intArray(usage.map(\.value.requests)),
                              Self.intArray(usage.map(\.value.inputTokens)), Self.intArray(usage.map(\.value.outputTokens)),
                              Self.intArray(usage.map(\.value.cacheCreationInputTokens)), Self.intArray(usage.map(\.value.cacheReadInputTokens)),
                              Self.intArray(usage.map(\.value.incomplete)), Self.intArray(usage.map(\.value.abandoned))])
                }
                if !errors.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_errors AS e (client_id, model, hour, status, count)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[])
                        ON CONFLICT (client_id, model, hour, status) DO UPDATE SET count = e.count + excluded.count
                        """, [Self.textArray(errors.map(\.0.clientID)), Self.textArray(errors.map(\.0.model)), Self.intArray(errors.map(\.0.hour)),
                              Self.intArray(errors.map { Int64($0.1) }), Self.intArray(errors.map(\.2))])
                }
                if !refusals.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_refusals AS r (client_id, model, hour, reason, count)
                        SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[])
                        ON CONFLICT (client_id, model, hour, reason) DO UPDATE SET count = r.count + excluded.count
                        """, [Self.textArray(refusals.map(\.0.clientID)), Self.textArray(refusals.map(\.0.model)),
                              Self.intArray(refusals.map(\.0.hour)), Self.textArray(refusals.map(\.1)), Self.intArray(refusals.map(\.2))])
                }
                let months = batch.monthTokens.sorted { ($0.key.clientID, $0.key.month) < ($1.key.clientID, $1.key.month) }
                if !months.isEmpty {
                    _ = try db.query("""
                        INSERT INTO usage_monthly AS m (client_id, month, tokens)
                        SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
                        ON CONFLICT (client_id, month) DO UPDATE SET tokens = m.tokens + excluded.tokens
                        """, [Self.textArray(months.map(\.key.clientID)), Self.intArray(months.map(\.key.month)), Self.intArray(months.map(\.value))])
                }
                let minutes = batch.deviceMinutes.map { (hex: hexString($0.key.keyID), key: $0.key, value: $0.value) }
                    .sorted { ($0.hex, $0.key.clientID, $0.key.minute) < ($1.hex, $1.key.clientID, $1.key.minute) }
                if !minutes.isEmpty {
                    _ = try db.query("""
                        INSERT INTO device_request_minutes AS d (key_id, client_id, minute, requests)
                        SELECT decode(k, 'hex'), c, m, n FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS x (k, c, m, n)
                        ON CONFLICT (key_id, client_id, minute) DO UPDATE SET requests = d.requests + excluded.requests
                        """, [Self.textArray(minutes.map(\.hex)), Self.textArray(minutes.map(\.key.clientID)),
                              Self.intArray(minutes.map(\.key.minute)), Self.intArray(minutes.map(\.value))])
                }
                _ = try db.query("DELETE FROM device_request_minutes WHERE minute < $1", [.int(purgeDeviceMinutesBefore)])
                return true
            }
        }
    }

    /// A text[] parameter in PostgreSQL's array literal syntax (every element quoted and escaped).
    private static func textArray(_ items: [String]) -> PostgresValue {
        .text("{" + items.map { "\"" + $0.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\"" }
            .joined(separator: ",") + "}")
    }

    private static func intArray(_ items: [Int64]) -> PostgresValue {
        .text("{" + items.map(String.init).joined(separator: ",") + "}")
    }

    public func usage(_ filter: UsageFilter) throws -> [UsageRow] {
        var conditions: [String] = []
        var values: [PostgresValue] = []
        if let workspaceID = filter.workspaceID { values.append(.int(workspaceID)); conditions.append("i.workspace_id = $\(values.count)") }
        if let clientID = filter.clientID { values.append(.text(clientID)); conditions.append("u.client_id = $\(values.count)") }
        if let since = filter.since { values.append(.int(since)); conditions.append("u.hour >= $\(values.count)") }
        if let until = filter.until { values.append(.int(until)); conditions.append("u.hour < $\(values.count)") }
        let filtered = " JOIN integrations i ON i.client_id = u.client_id JOIN workspaces w ON w.id = i.workspace_id"
            + (conditions.isEmpty ? "" : " WHERE " + conditions.joined(separator: " AND "))
        return try run { db in
            var rows: [UsageKey: UsageRow] = [:]
            for row in try db.query("""
                SELECT w.name, u.client_id, u.model, u.hour, u.requests, u.input_tokens, u.output_tokens,
                       u.cache_creation_input_tokens, u.cache_read_input_tokens, u.incomplete, u.abandoned FROM usage_hourly u
                """ + filtered, values).rows {
                let key = UsageKey(clientID: try row.text(1), model: try row.text(2), hour: try row.int(3))
                var c = UsageCounters()
                c.requests = try row.int(4); c.inputTokens = try row.int(5); c.outputTokens = try row.int(6)
                c.cacheCreationInputTokens = try row.int(7); c.cacheReadInputTokens = try row.int(8); c.incomplete = try row.int(9)
                c.abandoned = try row.int(10)
                rows[key] = UsageRow(workspace: try row.text(0), key: key, counters: c)
            }
            for row in try db.query("SELECT u.client_id, u.model, u.hour, u.status, u.count FROM usage_errors u" + filtered, values).rows {
                rows[UsageKey(clientID: try row.text(0), model: try row.text(1), hour: try row.int(2))]?.counters.errors[Int(try row.int(3))] = try row.int(4)
            }
            for row in try db.query("SELECT u.client_id, u.model, u.hour, u.reason, u.count FROM usage_refusals u" + filtered, values).rows {
                rows[UsageKey(clientID: try row.text(0), model: try row.text(1), hour: try row.int(2))]?.counters.refusals[try row.text(3)] = try row.int(4)
            }
            return Array(rows.values)
        }
    }

    public func readinessProblem() -> String? {
        do { _ = try run { db in try db.query("SELECT 1", []) } } catch { return "the database does not answer: \(error)" }
        return nil
    }

    // MARK: Rate limits

    private static func window(_ row: PostgresRow) throws -> WindowCount {
        WindowCount(count: Int(try row.int(0)), oldest: row.isNull(1) ? nil : try date(row, 1))
    }

    public func mintsSince(clientID: String, keyID: [UInt8], since: Date) throws -> WindowCount {
        try run { db in
            try db.query("SELECT count(*), min(issued_at) FROM tokens WHERE key_id = $1 AND client_id = $2 AND issued_at > $3 AND grant_type = 'assertion'",
                         [.bytes(keyID), .text(clientID), Self.seconds(since)]).first(Self.window)!
        }
    }

    public func registrationsSince(clientID: String, since: Date) throws -> WindowCount {
        try run { db in
            try db.query("SELECT count(*), min(registered_at) FROM devices WHERE client_id = $1 AND registered_at > $2",
                         [.text(clientID), Self.seconds(since)]).first(Self.window)!
        }
    }

    /// One statement: the insert and the count of what was there before it, plus this one.
    public func recordChallengeRequest(caller: String, at time: Date, since: Date) throws -> WindowCount {
        try run { db in
            try db.query("""
                WITH recorded AS (INSERT INTO challenge_requests (caller, at) VALUES ($1, $2) RETURNING at)
                SELECT count(*) + 1, least(min(c.at), (SELECT at FROM recorded)) FROM challenge_requests c WHERE c.caller = $1 AND c.at > $3
                """, [.text(caller), Self.seconds(time), Self.seconds(since)]).first(Self.window)!
        }
    }

    public func purgeChallengeRequests(before: Date) throws -> Int {
        try run { db in
            try db.query("WITH d AS (DELETE FROM challenge_requests WHERE at <= $1 RETURNING 1) SELECT count(*) FROM d",
                         [Self.seconds(before)]).first { Int(try $0.int(0)) } ?? 0
        }
    }

    // MARK: Audit

    /// Rows per INSERT: 7 parameters each, well under the protocol's 65,535.
    static let auditBatch = 500

    /// One multi-row INSERT (one round trip) for up to 500 events; larger batches in one transaction.
    public func appendAudit(_ events: [AuditEvent]) throws {
        guard !events.isEmpty else { return }
        try run { db in
            func insert(_ slice: ArraySlice<AuditEvent>) throws {
                var values: [PostgresValue] = []
                values.reserveCapacity(slice.count * 7)
                var rows: [String] = []
                for event in slice {
                    let n = values.count
                    rows.append("($\(n + 1), $\(n + 2), $\(n + 3), $\(n + 4), $\(n + 5), $\(n + 6), $\(n + 7))")
                    values += [Self.seconds(event.at), Self.optional(event.actor), .text(event.action), Self.optional(event.clientID),
                               Self.optional(event.keyID), Self.optional(event.reason), Self.optional(event.detail.map { String($0.prefix(1000)) })]
                }
                try db.query("INSERT INTO audit_log (at, actor, action, client_id, key_id, reason, detail) VALUES " + rows.joined(separator: ", "), values)
            }
            if events.count <= Self.auditBatch {
                try insert(events[...])
            } else {
                try db.transaction {
                    for start in stride(from: 0, to: events.count, by: Self.auditBatch) {
                        try insert(events[start..<min(start + Self.auditBatch, events.count)])
                    }
                }
            }
        }
    }

    /// The newest audit events, newest first (for the CLI and tests).
    public func auditEvents(limit: Int = 100, clientID: String? = nil) throws -> [AuditEvent] {
        try run { db in
            let sql = "SELECT at, actor, action, client_id, key_id, reason, detail FROM audit_log"
                + (clientID == nil ? "" : " WHERE client_id = $2") + " ORDER BY id DESC LIMIT $1"
            let values: [PostgresValue] = [.int(Int64(limit))] + (clientID.map { [.text($0)] } ?? [])
            return try db.query(sql, values).rows.map { row in
                AuditEvent(at: try Self.date(row, 0), actor: row.isNull(1) ? nil : try row.text(1), action: try row.text(2),
                           clientID: row.isNull(3) ? nil : try row.text(3), keyID: row.isNull(4) ? nil : try row.bytes(4),
                           reason: row.isNull(5) ? nil : try row.text(5), detail: row.isNull(6) ? nil : try row.text(6))
            }
        }
    }
}
