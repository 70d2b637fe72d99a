import AppAttest
import AttestCrypto
import CSQLite
import Foundation
import Lifecycle
import Synchronization
import TokenService

/// `TokenStore` on SQLite: WAL mode, foreign keys on, one writer connection and a few readers.
/// Everything that must not race is one conditional statement or one IMMEDIATE transaction on
/// the writer. Another process (attestctl) may write the same file; SQLite's locks serialise it.
public final class SQLiteTokenStore: TokenStore {
    public let path: String
    private let writer: LockedSQLiteConnection
    /// The database file's device and inode when it was opened: a file deleted or replaced under
    /// the running server is noticed (about once a second) and writes stop with 503, rather than
    /// acknowledging tokens written to an unlinked file.
    private let identity: (device: UInt64, inode: UInt64)?
    private let fault = Mutex<String?>(nil)
    /// Background writes (audit batches, purges) on a connection of their own, so that one waiting
    /// out a lock never holds the request path's writer: a request waits for the file lock once.
    private let background: LockedSQLiteConnection
    private let readers: [LockedSQLiteConnection]
    /// One per reader, used under that reader's lock (see `liveToken`).
    private let grantCaches: [GrantCache]
    private let nextReader = Atomic<Int>(0)

    /// Opens (creating if needed) and migrates the database.
    /// - Parameter synchronous: `FULL` (default) makes every acknowledged commit survive power loss,
    ///   `NORMAL` only process crashes.
    public init(path: String, readers readerCount: Int = 4, synchronous: String = "FULL",
                migrations: [Migration] = Migration.sqlite, mode: MigrationMode = .apply) throws {
        self.path = path
        let connection = try SQLiteConnection(path: path, synchronous: synchronous)
        try Migrator.migrate(connection, migrations, mode: mode)
        writer = LockedSQLiteConnection(connection)
        identity = Self.fileIdentity(path)
        background = LockedSQLiteConnection(try SQLiteConnection(path: path, synchronous: synchronous))
        readers = try (0..<max(1, readerCount)).map { _ in LockedSQLiteConnection(try SQLiteConnection(path: path, synchronous: synchronous)) }
        grantCaches = readers.map { _ in GrantCache() }
    }

    private func writeInBackground<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        try refuseIfFaulted()
        return try background.withConnection(body)
    }

    private func write<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        try refuseIfFaulted()
        return try writer.withConnection(body)
    }

    /// Readers in turn; each is locked only for the duration of one read.
    private func read<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        try readWithCache { db, _ in try body(db) }
    }

    private func readWithCache<T>(_ body: (SQLiteConnection, GrantCache) throws -> T) throws -> T {
        let turn = Int(UInt(bitPattern: nextReader.wrappingAdd(1, ordering: .relaxed).oldValue) % UInt(readers.count))
        let cache = grantCaches[turn]
        return try readers[turn].withConnection { db in try body(db, cache) }
    }

    private static func fileIdentity(_ path: String) -> (device: UInt64, inode: UInt64)? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return (UInt64(info.st_dev), UInt64(info.st_ino))
    }

    /// Compares the path's file with the one opened, and checks the disk has room; remembers a
    /// fault so that writes stop. Runs on a timer (`startWatching`) and for /readyz.
    @discardableResult
    public func checkStorage() -> String? {
        var problem: String?
        if let identity, path != ":memory:" {
            if let now = Self.fileIdentity(path) {
                if now.device != identity.device || now.inode != identity.inode {
                    problem = "the database file \(path) was replaced since it was opened"
                }
            } else {
                problem = "the database file \(path) was deleted since it was opened"
            }
        }
        if problem != nil { fault.withLock { if $0 == nil { $0 = problem } } }
        if let fault = fault.withLock({ $0 }) { return fault }
        var space = statvfs()
        let directory = (path as NSString).deletingLastPathComponent
        if statvfs(directory.isEmpty ? "." : directory, &space) == 0 {
            let free = UInt64(space.f_bavail) * UInt64(space.f_frsize)
            if free < 16 << 20 { return "the disk holding \(path) has \(free >> 20) MB free" }
        }
        return nil
    }

    /// A check of the file about once a second while the service runs.
    public var backgroundServices: [any Service] { [storageWatch()] }

    private func refuseIfFaulted() throws {
        if let fault = fault.withLock({ $0 }) { throw SQLiteError(code: SQLITE_CANTOPEN, message: fault + "; writes stopped") }
    }

    public func readinessProblem() -> String? {
        if let problem = checkStorage() { return problem }
        do { _ = try read { try $0.first("SELECT 1") { $0.int(0) } } } catch { return "the database does not answer: \(error)" }
        return nil
    }

    /// Runs `PRAGMA integrity_check` and returns its verdict ("ok" when sound).
    public func integrityCheck() throws -> String {
        try write { try $0.first("PRAGMA integrity_check") { $0.text(0) } ?? "no answer" }
    }

    // MARK: Organisation

    public func workspace(named name: String) throws -> Workspace? {
        try read { try $0.first("SELECT id, name FROM workspaces WHERE name = ?", [.text(name)]) { Workspace(id: $0.int(0), name: $0.text(1)) } }
    }

    public func createWorkspace(name: String, at time: Date) throws -> Workspace {
        try write { db in
            try db.run("INSERT INTO workspaces (name, created_at) VALUES (?, ?)", [.text(name), .real(time.timeIntervalSince1970)])
            return try db.first("SELECT id, name FROM workspaces WHERE name = ?", [.text(name)]) { Workspace(id: $0.int(0), name: $0.text(1)) }!
        }
    }

    public func role(of email: String, in workspaceID: Int64) throws -> Role? {
        try read { try $0.first("SELECT role FROM members WHERE workspace_id = ? AND email = ?", [.int(workspaceID), .text(email)]) { Role(rawValue: $0.text(0)) } ?? nil }
    }

    public func primaryOwner(workspaceID: Int64) throws -> String? {
        try read { try $0.first("SELECT email FROM members WHERE workspace_id = ? AND role = 'primary_owner'", [.int(workspaceID)]) { $0.text(0) } }
    }

    public func addMember(email: String, role: Role, workspaceID: Int64, at time: Date) throws {
        _ = try write { try $0.run("INSERT INTO members (workspace_id, email, role, created_at) VALUES (?, ?, ?, ?)",
                               [.int(workspaceID), .text(email), .text(role.rawValue), .real(time.timeIntervalSince1970)]) }
    }

    public func setUpstreamKey(workspaceID: Int64, _ key: SealedUpstreamKey) throws {
        _ = try write { try $0.run("""
            INSERT INTO workspace_upstream_keys (workspace_id, sealed_key, last4, set_at, set_by) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (workspace_id) DO UPDATE SET sealed_key = excluded.sealed_key, last4 = excluded.last4,
              set_at = excluded.set_at, set_by = excluded.set_by
            """, [.int(workspaceID), .blob(key.sealed), .text(key.last4), .real(key.setAt.timeIntervalSince1970), .text(key.setBy)]) }
    }

    public func upstreamKey(workspaceID: Int64) throws -> SealedUpstreamKey? {
        try read { try $0.first("SELECT sealed_key, last4, set_at, set_by FROM workspace_upstream_keys WHERE workspace_id = ?",
                                [.int(workspaceID)]) { Self.sealedKey($0, from: 0) } }
    }

    private static func sealedKey(_ row: SQLiteConnection.Row, from column: Int32) -> SealedUpstreamKey {
        SealedUpstreamKey(sealed: row.blob(column), last4: row.text(column + 1), setAt: Date(timeIntervalSince1970: row.real(column + 2)),
                          setBy: row.text(column + 3))
    }

    // MARK: Integrations

    public func createIntegration(_ integration: Integration) throws {
        try write { db in
            try db.transaction {
                try db.run("""
                    INSERT INTO integrations (client_id, workspace_id, name, team_id, environments, created_at,
                                              allowed_models, max_tokens, device_requests_per_minute, monthly_token_budget)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """, [.text(integration.clientID), .int(integration.workspaceID), .text(integration.name), .text(integration.teamID),
                          .text(integration.environments.map(\.rawValue).sorted().joined(separator: ",")),
                          .real(integration.createdAt.timeIntervalSince1970)] + Self.policyValues(integration.policy))
                for (position, bundleID) in integration.bundleIDs.enumerated() {
                    try db.run("INSERT INTO integration_bundle_ids (client_id, position, bundle_id) VALUES (?, ?, ?)",
                               [.text(integration.clientID), .int(Int64(position)), .text(bundleID)])
                }
            }
        }
    }

    private static let integrationColumns = """
        SELECT i.client_id, i.workspace_id, w.name, i.name, i.team_id, i.environments, i.created_at, i.revoked_at,
               (SELECT group_concat(bundle_id, char(10)) FROM (SELECT bundle_id FROM integration_bundle_ids b
                 WHERE b.client_id = i.client_id ORDER BY position)),
               i.allowed_models, i.max_tokens, i.device_requests_per_minute, i.monthly_token_budget
        FROM integrations i JOIN workspaces w ON w.id = i.workspace_id
        """

    private static func integration(_ row: SQLiteConnection.Row) -> Integration {
        Integration(clientID: row.text(0), workspaceID: row.int(1), workspaceName: row.text(2), name: row.text(3), teamID: row.text(4),
                    bundleIDs: row.text(8).split(separator: "\n").map(String.init),
                    environments: Set(row.text(5).split(separator: ",").compactMap { AttestationEnvironment(rawValue: String($0)) }),
                    createdAt: Date(timeIntervalSince1970: row.real(6)),
                    revokedAt: row.isNull(7) ? nil : Date(timeIntervalSince1970: row.real(7)), policy: policy(row, from: 9))
    }

    /// The four policy columns, `allowed_models` first.
    private static func policy(_ row: SQLiteConnection.Row, from column: Int32) -> IntegrationPolicy {
        IntegrationPolicy(models: IntegrationPolicy.models(fromColumn: row.isNull(column) ? nil : row.text(column)),
                          maxTokens: Int(row.int(column + 1)), deviceRequestsPerMinute: Int(row.int(column + 2)),
                          monthlyTokenBudget: Int(row.int(column + 3)))
    }

    private static func policyValues(_ policy: IntegrationPolicy) -> [SQLValue] {
        [policy.modelsColumn.map { .text($0) } ?? .null, .int(Int64(policy.maxTokens)), .int(Int64(policy.deviceRequestsPerMinute)),
         .int(Int64(policy.monthlyTokenBudget))]
    }

    public func integration(clientID: String) throws -> Integration? {
        try read { try $0.first(Self.integrationColumns + " WHERE i.client_id = ?", [.text(clientID)], Self.integration) }
    }

    public func integrations(workspaceID: Int64?) throws -> [Integration] {
        try read { db in
            var result: [Integration] = []
            if let workspaceID {
                try db.query(Self.integrationColumns + " WHERE i.workspace_id = ? ORDER BY i.created_at", [.int(workspaceID)]) { result.append(Self.integration($0)) }
            } else {
                try db.query(Self.integrationColumns + " ORDER BY i.created_at") { result.append(Self.integration($0)) }
            }
            return result
        }
    }

    public func revokeIntegration(clientID: String, at time: Date) throws -> Bool {
        try write { db in
            try db.transaction {
                let t = time.timeIntervalSince1970
                guard try db.run("UPDATE integrations SET revoked_at = ? WHERE client_id = ? AND revoked_at IS NULL", [.real(t), .text(clientID)]) == 1 else {
                    return false
                }
                try db.run("UPDATE tokens SET revoked_at = ? WHERE client_id = ? AND revoked_at IS NULL", [.real(t), .text(clientID)])
                try db.run("UPDATE challenges SET used = 1 WHERE client_id = ?", [.text(clientID)])
                return true
            }
        }
    }

    public func counts(clientID: String, at time: Date) throws -> (devices: Int, liveTokens: Int) {
        try read { db in
            let devices = try db.first("SELECT count(*) FROM devices WHERE client_id = ?", [.text(clientID)]) { Int($0.int(0)) } ?? 0
            let tokens = try db.first("""
                SELECT count(*) FROM tokens t JOIN integrations i ON i.client_id = t.client_id
                WHERE t.client_id = ? AND t.expires_at > ? AND t.revoked_at IS NULL AND i.revoked_at IS NULL
                """, [.text(clientID), .real(time.timeIntervalSince1970)]) { Int($0.int(0)) } ?? 0
            return (devices, tokens)
        }
    }

    // MARK: Challenges

    public func pendingOrNewChallenge(clientID: String, keyID: [UInt8], fresh: IssuedChallenge, at time: Date) throws -> IssuedChallenge {
        try write { db in
            try db.transaction {
                if let pending = try db.first("""
                    SELECT challenge, expires_at FROM challenges WHERE client_id = ? AND key_id = ? AND used = 0 AND expires_at > ?
                    """, [.text(clientID), .blob(keyID), .real(time.timeIntervalSince1970)], {
                        IssuedChallenge(bytes: $0.blob(0), expiresAt: Date(timeIntervalSince1970: $0.real(1)))
                    }) {
                    return pending
                }
                try Self.storeChallenge(db, clientID: clientID, keyID: keyID, fresh)
                return fresh
            }
        }
    }

    private static func storeChallenge(_ db: SQLiteConnection, clientID: String, keyID: [UInt8], _ challenge: IssuedChallenge) throws {
        try db.run("""
            INSERT INTO challenges (client_id, key_id, challenge, expires_at, used) VALUES (?, ?, ?, ?, 0)
            ON CONFLICT (client_id, key_id) DO UPDATE SET challenge = excluded.challenge, expires_at = excluded.expires_at, used = 0
            """, [.text(clientID), .blob(keyID), .blob(challenge.bytes), .real(challenge.expiresAt.timeIntervalSince1970)])
    }

    public func pendingChallenge(clientID: String, keyID: [UInt8], at time: Date) throws -> [UInt8]? {
        try read { db in
            try db.first("SELECT challenge FROM challenges WHERE client_id = ? AND key_id = ? AND used = 0 AND expires_at > ?",
                         [.text(clientID), .blob(keyID), .real(time.timeIntervalSince1970)]) { $0.blob(0) }
        }
    }

    public func consumeChallenge(clientID: String, keyID: [UInt8], challenge: [UInt8]?, at time: Date) throws -> [UInt8]? {
        try write { db in try Self.redeem(db, clientID: clientID, keyID: keyID, challenge: challenge, at: time) }
    }

    /// One conditional statement: of two concurrent requests, exactly one gets the challenge.
    private static func redeem(_ db: SQLiteConnection, clientID: String, keyID: [UInt8], challenge: [UInt8]?, at time: Date) throws -> [UInt8]? {
        if let challenge {
            return try db.first("""
                UPDATE challenges SET used = 1
                WHERE client_id = ? AND key_id = ? AND used = 0 AND expires_at > ? AND challenge = ? RETURNING challenge
                """, [.text(clientID), .blob(keyID), .real(time.timeIntervalSince1970), .blob(challenge)]) { $0.blob(0) }
        }
        return try db.first("""
            UPDATE challenges SET used = 1 WHERE client_id = ? AND key_id = ? AND used = 0 AND expires_at > ? RETURNING challenge
            """, [.text(clientID), .blob(keyID), .real(time.timeIntervalSince1970)]) { $0.blob(0) }
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

    public func device(clientID: String, keyID: [UInt8]) throws -> Device? {
        try read { db in
            try db.first("""
                SELECT key_id, client_id, public_key, sign_counter, environment, app_id FROM devices WHERE key_id = ? AND client_id = ?
                """, [.blob(keyID), .text(clientID)]) {
                    Device(keyID: $0.blob(0), clientID: $0.text(1), publicKey: $0.blob(2), counter: UInt32(truncatingIfNeeded: $0.int(3)),
                           environment: AttestationEnvironment(rawValue: $0.text(4)) ?? .production, appID: $0.text(5))
                }
        }
    }

    /// Stores a new token and revokes the device's older live tokens but the newest one before it
    /// (kept for requests already in flight), in the caller's transaction.
    private static func insertToken(_ db: SQLiteConnection, _ token: TokenRecord, grant: String) throws {
        try db.run("""
            INSERT INTO tokens (token_hash, client_id, workspace_id, key_id, issued_at, expires_at, grant_type) VALUES (?, ?, ?, ?, ?, ?, ?)
            """, [.blob(token.tokenHash), .text(token.clientID), .int(token.workspaceID), .blob(token.keyID),
                  .real(token.issuedAt.timeIntervalSince1970), .real(token.expiresAt.timeIntervalSince1970), .text(grant)])
        // The new token stays, with the newest of the others (ties: any one of them).
        try db.run("""
            UPDATE tokens SET revoked_at = ? WHERE key_id = ? AND client_id = ? AND revoked_at IS NULL AND token_hash != ?
              AND token_hash NOT IN (
                SELECT token_hash FROM tokens WHERE key_id = ? AND client_id = ? AND revoked_at IS NULL AND token_hash != ?
                ORDER BY issued_at DESC LIMIT \(TokenRecord.liveTokensPerDevice - 1))
            """, [.real(token.issuedAt.timeIntervalSince1970), .blob(token.keyID), .text(token.clientID), .blob(token.tokenHash),
                  .blob(token.keyID), .text(token.clientID), .blob(token.tokenHash)])
    }

    public func registerDevice(_ device: Device, receipt: [UInt8], firstToken: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, quota: RegistrationQuota?, at time: Date,
                               commitTime: @Sendable () -> Date) throws -> CommitResult {
        try write { db in
            // IMMEDIATE: the write lock is held from here, so this time is the commit's and the
            // quota's count cannot change before the insert.
            try db.transaction {
                let committing = commitTime()
                if let challenge, try Self.redeem(db, clientID: device.clientID, keyID: device.keyID, challenge: challenge, at: committing) == nil {
                    return .challengeGone
                }
                if let quota, try db.first("SELECT count(*) FROM devices WHERE client_id = ? AND registered_at > ?",
                                           [.text(device.clientID), .real((committing - quota.window).timeIntervalSince1970)], { $0.int(0) }) ?? 0
                    >= Int64(quota.limit) {
                    return .quotaExceeded   // committed all the same: the challenge stays used
                }
                let inserted = try db.run("""
                    INSERT INTO devices (key_id, client_id, public_key, sign_counter, environment, app_id, receipt, registered_at)
                    SELECT ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM integrations WHERE client_id = ? AND revoked_at IS NULL)
                    ON CONFLICT (key_id) DO NOTHING
                    """, [.blob(device.keyID), .text(device.clientID), .blob(device.publicKey), .int(Int64(device.counter)),
                          .text(device.environment.rawValue), .text(device.appID), .blob(receipt), .real(time.timeIntervalSince1970),
                          .text(device.clientID)])
                guard inserted == 1 else { return .conflict }   // committed all the same: the challenge stays used
                try Self.insertToken(db, firstToken, grant: "registration")
                try Self.storeChallenge(db, clientID: device.clientID, keyID: device.keyID, nextChallenge)
                return .committed
            }
        }
    }

    public func advanceCounter(clientID: String, keyID: [UInt8], from: UInt32, to: UInt32, token: TokenRecord, redeeming challenge: [UInt8]?,
                               nextChallenge: IssuedChallenge, at time: Date, commitTime: @Sendable () -> Date) throws -> CommitResult {
        try write { db in
            try db.transaction {
                if let challenge, try Self.redeem(db, clientID: clientID, keyID: keyID, challenge: challenge, at: commitTime()) == nil {
                    return .challengeGone
                }
                // Compare-and-set on the counter, and only while the integration is live.
                let changed = try db.run("""
                    UPDATE devices SET sign_counter = ? WHERE key_id = ? AND client_id = ? AND sign_counter = ?
                      AND EXISTS (SELECT 1 FROM integrations WHERE client_id = ? AND revoked_at IS NULL)
                    """, [.int(Int64(to)), .blob(keyID), .text(clientID), .int(Int64(from)), .text(clientID)])
                guard changed == 1 else { return .conflict }   // committed all the same: the challenge stays used
                try Self.insertToken(db, token, grant: "assertion")
                try Self.storeChallenge(db, clientID: clientID, keyID: keyID, nextChallenge)
                return .committed
            }
        }
    }

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
            let grant = try db.first("""
                SELECT t.client_id, w.name, t.issued_at, t.expires_at, t.token_hash, w.id,
                       k.sealed_key, k.last4, k.set_at, k.set_by, t.key_id,
                       i.allowed_models, i.max_tokens, i.device_requests_per_minute, i.monthly_token_budget,
                       coalesce(m.tokens, 0), coalesce(d0.requests, 0), coalesce(d1.requests, 0) FROM tokens t
                JOIN integrations i ON i.client_id = t.client_id JOIN workspaces w ON w.id = t.workspace_id
                LEFT JOIN workspace_upstream_keys k ON k.workspace_id = t.workspace_id
                LEFT JOIN usage_monthly m ON m.client_id = t.client_id AND m.month = ?
                LEFT JOIN device_request_minutes d0 ON d0.key_id = t.key_id AND d0.client_id = t.client_id AND d0.minute = ?
                LEFT JOIN device_request_minutes d1 ON d1.key_id = t.key_id AND d1.client_id = t.client_id AND d1.minute = ?
                WHERE t.token_hash = ? AND t.revoked_at IS NULL AND t.expires_at > ? AND i.revoked_at IS NULL
                """, [.int(UsageClock.month(time)), .int(minute), .int(minute - 1), .blob(hash), .real(time.timeIntervalSince1970)]) { row -> TokenGrant? in
                    // The index lookup found it; confirm in constant time all the same.
                    guard constantTimeEquals(row.blob(4), hash) else { return nil }
                    return TokenGrant(clientID: row.text(0), workspaceID: row.int(5), workspaceName: row.text(1),
                                      issuedAt: Date(timeIntervalSince1970: row.real(2)), expiresAt: Date(timeIntervalSince1970: row.real(3)),
                                      upstreamKey: row.isNull(6) ? nil : Self.sealedKey(row, from: 6), keyID: row.blob(10),
                                      policy: Self.policy(row, from: 11),
                                      recorded: RecordedUsage(monthTokens: row.int(15), deviceRequestsThisMinute: row.int(16),
                                                              deviceRequestsLastMinute: row.int(17)))
                } ?? nil
            if let grant { cache.keep(grant, hash: hash, minute: minute) }
            return grant
        }
    }

    // MARK: Usage and policy

    public func updatePolicy(clientID: String, _ policy: IntegrationPolicy) throws -> Bool {
        try write { db in
            try db.run("""
                UPDATE integrations SET allowed_models = ?, max_tokens = ?, device_requests_per_minute = ?, monthly_token_budget = ?
                WHERE client_id = ?
                """, Self.policyValues(policy) + [.text(clientID)]) == 1
        }
    }

    public func recordUsage(_ batch: UsageBatch, purgeDeviceMinutesBefore: Int64) throws -> Bool {
        try writeInBackground { db in
            try db.transaction {
                if let id = batch.id {
                    let at = Double(purgeDeviceMinutesBefore * 60)
                    guard try db.run("INSERT INTO usage_flushes (batch_id, flushed_at) VALUES (?, ?) ON CONFLICT (batch_id) DO NOTHING",
                                     [.text(id), .real(at)]) == 1 else { return false }
                    // An ID matters only while its batch may still be retried: a day is ample.
                    try db.run("DELETE FROM usage_flushes WHERE flushed_at < ?", [.real(at - 86_400)])
                }
                for (key, c) in batch.usage {
                    let row: [SQLValue] = [.text(key.clientID), .text(key.model), .int(key.hour)]
                    try db.run("""
                        INSERT INTO usage_hourly (client_id, model, hour, requests, input_tokens, output_tokens,
                                                  cache_creation_input_tokens, cache_read_input_tokens, incomplete, abandoned)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                        ON CONFLICT (client_id, model, hour) DO UPDATE SET requests = requests + excluded.requests,
                          input_tokens = input_tokens + excluded.input_tokens, output_tokens = output_tokens + excluded.output_tokens,
                          cache_creation_input_tokens = cache_creation_input_tokens + excluded.cache_creation_input_tokens,
                          cache_read_input_tokens = cache_read_input_tokens + excluded.cache_read_input_tokens,
                          incomplete = incomplete + excluded.incomplete, abandoned = abandoned + excluded.abandoned
                        """, row + [.int(c.requests), .int(c.inputTokens), .int(c.outputTokens), .int(c.cacheCreationInputTokens),
                                    .int(c.cacheReadInputTokens), .int(c.incomplete), .int(c.abandoned)])
                    for (status, count) in c.errors {
                        try db.run("""
                            INSERT INTO usage_errors (client_id, model, hour, status, count) VALUES (?, ?, ?, ?, ?)
                            ON CONFLICT (client_id, model, hour, status) DO UPDATE SET count = count + excluded.count
                            """, row + [.int(Int64(status)), .int(count)])
                    }
                    for (reason, count) in c.refusals {
                        try db.run("""
                            INSERT INTO usage_refusals (client_id, model, hour, reason, count) VALUES (?, ?, ?, ?, ?)
                            ON CONFLICT (client_id, model, hour, reason) DO UPDATE SET count = count + excluded.count
                            """, row + [.text(reason), .int(count)])
                    }
                }
                for (key, tokens) in batch.monthTokens {
                    try db.run("""
                        INSERT INTO usage_monthly (client_id, month, tokens) VALUES (?, ?, ?)
                        ON CONFLICT (client_id, month) DO UPDATE SET tokens = tokens + excluded.tokens
                        """, [.text(key.clientID), .int(key.month), .int(tokens)])
                }
                for (key, requests) in batch.deviceMinutes {
                    try db.run("""
                        INSERT INTO device_request_minutes (key_id, client_id, minute, requests) VALUES (?, ?, ?, ?)
                        ON CONFLICT (key_id, client_id, minute) DO UPDATE SET requests = requests + excluded.requests
                        """, [.blob(key.keyID), .text(key.clientID), .int(key.minute), .int(requests)])
                }
                try db.run("DELETE FROM device_request_minutes WHERE minute < ?", [.int(purgeDeviceMinutesBefore)])
                return true
            }
        }
    }

    public func usage(_ filter: UsageFilter) throws -> [UsageRow] {
        var conditions: [String] = []
        var values: [SQLValue] = []
        if let workspaceID = filter.workspaceID { conditions.append("i.workspace_id = ?"); values.append(.int(workspaceID)) }
        if let clientID = filter.clientID { conditions.append("u.client_id = ?"); values.append(.text(clientID)) }
        if let since = filter.since { conditions.append("u.hour >= ?"); values.append(.int(since)) }
        if let until = filter.until { conditions.append("u.hour < ?"); values.append(.int(until)) }
        let filtered = " JOIN integrations i ON i.client_id = u.client_id JOIN workspaces w ON w.id = i.workspace_id"
            + (conditions.isEmpty ? "" : " WHERE " + conditions.joined(separator: " AND "))
        return try read { db in
            var rows: [UsageKey: UsageRow] = [:]
            try db.query("""
                SELECT w.name, u.client_id, u.model, u.hour, u.requests, u.input_tokens, u.output_tokens,
                       u.cache_creation_input_tokens, u.cache_read_input_tokens, u.incomplete, u.abandoned FROM usage_hourly u
                """ + filtered, values) { row in
                    let key = UsageKey(clientID: row.text(1), model: row.text(2), hour: row.int(3))
                    var c = UsageCounters()
                    c.requests = row.int(4); c.inputTokens = row.int(5); c.outputTokens = row.int(6)
                    c.cacheCreationInputTokens = row.int(7); c.cacheReadInputTokens = row.int(8); c.incomplete = row.int(9)
                    c.abandoned = row.int(10)
                    rows[key] = UsageRow(workspace: row.text(0), key: key, counters: c)
                }
            try db.query("SELECT u.client_id, u.model, u.hour, u.status, u.count FROM usage_errors u " + filtered, values) { row in
                rows[UsageKey(clientID: row.text(0), model: row.text(1), hour: row.int(2))]?.counters.errors[Int(row.int(3))] = row.int(4)
            }
            try db.query("SELECT u.client_id, u.model, u.hour, u.reason, u.count FROM usage_refusals u " + filtered, values) { row in
                rows[UsageKey(clientID: row.text(0), model: row.text(1), hour: row.int(2))]?.counters.refusals[row.text(3)] = row.int(4)
            }
            return Array(rows.values)
        }
    }

    // MARK: Rate limits

    private static func window(_ row: SQLiteConnection.Row) -> WindowCount {
        WindowCount(count: Int(row.int(0)), oldest: row.isNull(1) ? nil : Date(timeIntervalSince1970: row.real(1)))
    }

    public func mintsSince(clientID: String, keyID: [UInt8], since: Date) throws -> WindowCount {
        try read { try $0.first("SELECT count(*), min(issued_at) FROM tokens WHERE key_id = ? AND client_id = ? AND issued_at > ? AND grant_type = 'assertion'",
                                [.blob(keyID), .text(clientID), .real(since.timeIntervalSince1970)], Self.window) }!
    }

    public func registrationsSince(clientID: String, since: Date) throws -> WindowCount {
        try read { try $0.first("SELECT count(*), min(registered_at) FROM devices WHERE client_id = ? AND registered_at > ?",
                                [.text(clientID), .real(since.timeIntervalSince1970)], Self.window) }!
    }

    public func recordChallengeRequest(caller: String, at time: Date, since: Date) throws -> WindowCount {
        try write { db in
            try db.transaction {
                try db.run("INSERT INTO challenge_requests (caller, at) VALUES (?, ?)", [.text(caller), .real(time.timeIntervalSince1970)])
                return try db.first("SELECT count(*), min(at) FROM challenge_requests WHERE caller = ? AND at > ?",
                                    [.text(caller), .real(since.timeIntervalSince1970)], Self.window)!
            }
        }
    }

    public func purgeChallengeRequests(before: Date) throws -> Int {
        try writeInBackground { try $0.run("DELETE FROM challenge_requests WHERE at <= ?", [.real(before.timeIntervalSince1970)]) }
    }

    // MARK: Audit

    public func appendAudit(_ events: [AuditEvent]) throws {
        try writeInBackground { db in
            try db.transaction {
                for event in events {
                    try db.run("""
                        INSERT INTO audit_log (at, actor, action, client_id, key_id, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?)
                        """, [.real(event.at.timeIntervalSince1970), event.actor.map { .text($0) } ?? .null, .text(event.action),
                              event.clientID.map { .text($0) } ?? .null, event.keyID.map { .blob($0) } ?? .null,
                              event.reason.map { .text($0) } ?? .null, event.detail.map { .text(String($0.prefix(1000))) } ?? .null])
                }
            }
        }
    }

    /// The newest audit events, newest first (for the CLI and tests).
    public func auditEvents(limit: Int = 100, clientID: String? = nil) throws -> [AuditEvent] {
        try read { db in
            var events: [AuditEvent] = []
            let sql = "SELECT at, actor, action, client_id, key_id, reason, detail FROM audit_log"
                + (clientID == nil ? "" : " WHERE client_id = ?") + " ORDER BY id DESC LIMIT ?"
            let values: [SQLValue] = (clientID.map { [.text($0)] } ?? []) + [.int(Int64(limit))]
            try db.query(sql, values) { row in
                events.append(AuditEvent(at: Date(timeIntervalSince1970: row.real(0)), actor: row.isNull(1) ? nil : row.text(1),
                                         action: row.text(2), clientID: row.isNull(3) ? nil : row.text(3),
                                         keyID: row.isNull(4) ? nil : row.blob(4), reason: row.isNull(5) ? nil : row.text(5),
                                         detail: row.isNull(6) ? nil : row.text(6)))
            }
            return events
        }
    }
}

/// A reader's live-token answers for one database version (see `SQLiteTokenStore.liveToken`).
/// Only tokens found live are kept, so unknown tokens cannot fill it; it is bounded all the same.
final class GrantCache: @unchecked Sendable {
    private struct Entry {
        let hash: [UInt8]
        let minute: Int64
        let grant: TokenGrant
    }
    static let capacity = 4096
    private var version: Int64 = -1
    /// Keyed by the hash's first 8 bytes; the whole hash is compared on a hit.
    private var entries: [UInt64: Entry] = [:]

    /// The kept grant when the database is still at `version`, the usage counts are for `minute`
    /// and the token has not expired by `time`. A new version empties the cache.
    func grant(hash: [UInt8], minute: Int64, version: Int64, at time: Date) -> TokenGrant? {
        guard version == self.version else {
            entries.removeAll(keepingCapacity: true)
            self.version = version
            return nil
        }
        guard let entry = entries[Self.slot(hash)], entry.minute == minute, constantTimeEquals(entry.hash, hash),
              time < entry.grant.expiresAt else { return nil }
        return entry.grant
    }

    func keep(_ grant: TokenGrant, hash: [UInt8], minute: Int64) {
        if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
        entries[Self.slot(hash)] = Entry(hash: hash, minute: minute, grant: grant)
    }

    private static func slot(_ hash: [UInt8]) -> UInt64 {
        hash.prefix(8).reduce(0) { $0 << 8 | UInt64($1) }
    }
}

extension SQLiteTokenStore {
    /// Compares the database's path with the file opened, about once a second (`checkStorage`).
    func storageWatch(every interval: Double = 1) -> PeriodicTask {
        PeriodicTask("storage-watch", every: interval) { [self] in checkStorage() }
    }
}
