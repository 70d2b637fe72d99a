import AttestCrypto
import Foundation
import SQLiteStore
import Testing
import TokenService

/// The admin commands, run as the real `attestctl` binary against a database in a fresh temp directory.
/// State is checked through the Swift store API, never through the command's own output alone.
@Suite final class AdminCommandTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let binary = packageRoot.appendingPathComponent(".build/debug/attestctl").path
    static let simBinary = packageRoot.appendingPathComponent(".build/debug/attest-sim").path

    let dir: URL
    var db: String { dir.appendingPathComponent("attestd.sqlite").path }

    init() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("attestctl-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: dir) }

    struct Outcome {
        let status: Int32
        let stdout: String
        let stderr: String
    }

    /// Runs attestctl with cwd = the temp directory (not the package root) and without any inherited ATTESTD_DB.
    /// `--db <temp dir>/attestd.sqlite` is appended unless `useDB` is false.
    func run(_ arguments: [String], useDB: Bool = true, environment extra: [String: String] = [:], cwd: URL? = nil,
             input: String? = nil) throws -> Outcome {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.binary)
        process.arguments = arguments + (useDB ? ["--db", db] : [])
        var environment = ProcessInfo.processInfo.environment
        environment["ATTESTD_DB"] = nil
        environment.merge(extra) { $1 }
        process.environment = environment
        process.currentDirectoryURL = cwd ?? dir
        // Files, not pipes: no deadlock however much either stream writes.
        let out = dir.appendingPathComponent("out-\(UUID().uuidString)"), err = dir.appendingPathComponent("err-\(UUID().uuidString)")
        try Data().write(to: out)
        try Data().write(to: err)
        process.standardOutput = try FileHandle(forWritingTo: out)
        process.standardError = try FileHandle(forWritingTo: err)
        if let input {
            let file = dir.appendingPathComponent("in-\(UUID().uuidString)")
            try Data(input.utf8).write(to: file)
            process.standardInput = try FileHandle(forReadingFrom: file)
        }
        try process.run()
        process.waitUntilExit()
        defer { try? FileManager.default.removeItem(at: out); try? FileManager.default.removeItem(at: err) }
        return Outcome(status: process.terminationStatus, stdout: try String(contentsOf: out, encoding: .utf8),
                      stderr: try String(contentsOf: err, encoding: .utf8))
    }

    func store(_ path: String? = nil) throws -> SQLiteTokenStore { try SQLiteTokenStore(path: path ?? db, readers: 1) }

    /// Everything a refused command must leave alone.
    struct Snapshot: Equatable {
        let integrations: [Integration]
        let audit: [String]
    }

    func snapshot() throws -> Snapshot {
        let store = try store()
        return Snapshot(integrations: try store.integrations(workspaceID: nil),
                        audit: try store.auditEvents(limit: 10_000).map { "\($0.action) \($0.actor ?? "-") \($0.clientID ?? "-") \($0.detail ?? "-")" })
    }

    func json(_ result: Outcome) throws -> [String: Any] {
        try #require(result.status == 0, "\(result.stderr)")
        return try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
    }

    @discardableResult
    func ok(_ arguments: [String]) throws -> Outcome {
        let result = try run(arguments)
        try #require(result.status == 0, "attestctl \(arguments.joined(separator: " ")): \(result.stderr)")
        return result
    }

    /// owner@ (primary owner), admin@, dev@ and user@ in `default`.
    func organisation() throws {
        try ok(["init", "--owner", "owner@example.com"])
        for role in ["admin", "developer", "user"] {
            let email = role == "developer" ? "dev@example.com" : "\(role)@example.com"
            try ok(["members", "add", "--actor", "owner@example.com", "--email", email, "--role", role])
        }
    }

    func createIntegration(actor: String = "owner@example.com", name: String = "Chat", extra: [String] = []) throws -> String {
        let record = try json(try run(["integrations", "create", "--actor", actor, "--name", name, "--team-id", "ABCDE12345",
                                       "--bundle-id", "com.example.chat", "--json"] + extra))
        return try #require(record["client_id"] as? String)
    }

    // MARK: init

    // MARK: Workspaces' upstream keys

    static let madeUpKey = "test-upstream-key-not-real-0123456789-wxyz"

    func writeKeyFile(_ key: String, name: String = "upstream.key") throws -> String {
        let path = dir.appendingPathComponent(name).path
        try Data("  \(key)\n".utf8).write(to: URL(fileURLWithPath: path))
        return path
    }

    @Test func initCreatesTheSecretsKeyBesideTheDatabaseOnce() throws {
        try organisation()
        let keyPath = dir.appendingPathComponent("attestd.key").path
        let attributes = try FileManager.default.attributesOfItem(atPath: keyPath)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        #expect((attributes[.size] as? NSNumber)?.intValue == 32)
        let before = try Data(contentsOf: URL(fileURLWithPath: keyPath))
        try ok(["init", "--owner", "owner@example.com"])
        #expect(try Data(contentsOf: URL(fileURLWithPath: keyPath)) == before, "init never replaces an existing key")
        // An explicit --secrets-key-file (before the command, as a global option) is honoured.
        let other = dir.appendingPathComponent("other.key").path
        #expect(try run(["--secrets-key-file", other, "init", "--owner", "owner@example.com"]).status == 0)
        #expect(FileManager.default.fileExists(atPath: other))
    }

    @Test func ownersSetTheUpstreamKeyWhichIsNeverShownNorStoredInClear() throws {
        try organisation()
        let keyFile = try writeKeyFile(Self.madeUpKey)
        // Admins manage integrations but not the workspace's billing key: refused, nothing changed.
        let refused = try run(["workspaces", "set-upstream-key", "--actor", "admin@example.com", "--workspace", "default", "--key-file", keyFile])
        #expect(refused.status == 2)
        #expect(refused.stderr.contains("may not set the upstream key"))
        #expect(try json(try run(["workspaces", "show", "default", "--json"]))["upstream_key"] as? [String: Bool] == ["set": false])

        let set = try ok(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", keyFile])
        #expect(set.stdout.contains("wxyz") && !set.stdout.contains(Self.madeUpKey))
        let shown = try json(try run(["workspaces", "show", "default", "--json"]))
        let upstream = try #require(shown["upstream_key"] as? [String: Any])
        #expect(upstream["set"] as? Bool == true && upstream["last4"] as? String == "wxyz" && upstream["set_by"] as? String == "owner@example.com")
        let text = try ok(["workspaces", "show", "default"]).stdout
        #expect(text.contains("ending in wxyz") && !text.contains(Self.madeUpKey))
        // Audited, without the key.
        let audit = try ok(["audit", "--json"]).stdout
        #expect(audit.contains("workspace.upstream_key_set") && !audit.contains(Self.madeUpKey))
        // Nowhere in the database files in clear; the stored value opens with the key file and
        // this workspace's binding only.
        var files = Data()
        for suffix in ["", "-wal", "-shm"] { files.append((try? Data(contentsOf: URL(fileURLWithPath: db + suffix))) ?? Data()) }
        #expect(files.range(of: Data(Self.madeUpKey.utf8)) == nil)
        let stored = try #require(try store().upstreamKey(workspaceID: 1))
        let secrets = try SecretsKeyFile.load(dir.appendingPathComponent("attestd.key").path)
        #expect(try secrets.open(stored.sealed, associatedData: SealedUpstreamKey.associatedData(workspaceID: 1)) == Array(Self.madeUpKey.utf8))
    }

    @Test func aSealedKeyCopiedToAnotherWorkspaceOrOpenedWithAnotherKeyFileDoesNotOpen() throws {
        try organisation()
        try ok(["workspaces", "create", "--actor", "owner@example.com", "--name", "second"])
        try ok(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default",
                "--key-file", try writeKeyFile(Self.madeUpKey)])
        let store = try store()
        let first = try #require(try store.upstreamKey(workspaceID: 1))
        let second = try #require(try store.workspace(named: "second"))
        // Copy the row's ciphertext into the other workspace, as an attacker with database access could.
        try store.setUpstreamKey(workspaceID: second.id, first)
        let secrets = try SecretsKeyFile.load(dir.appendingPathComponent("attestd.key").path)
        let copied = try #require(try store.upstreamKey(workspaceID: second.id))
        #expect(throws: CryptoError.self) { try secrets.open(copied.sealed, associatedData: SealedUpstreamKey.associatedData(workspaceID: second.id)) }
        // Another deployment's key file does not open it either.
        let otherKeyFile = dir.appendingPathComponent("other.key").path
        try SecretsKeyFile.createIfAbsent(otherKeyFile)
        #expect(throws: CryptoError.self) {
            try SecretsKeyFile.load(otherKeyFile).open(first.sealed, associatedData: SealedUpstreamKey.associatedData(workspaceID: 1))
        }
        // A malformed key file is refused before anything is stored.
        let bad = try run(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "second",
                           "--key-file", try writeKeyFile("short", name: "bad.key")])
        #expect(bad.status == 2)
    }

    @Test func globalOptionsMayComeBeforeTheCommand() throws {
        // As with git and kubectl: `attestctl --db PATH init …` and `--db=PATH` both work.
        try #require(try run(["--db", db, "init", "--owner", "owner@example.com"], useDB: false).status == 0)
        let listed = try run(["--db=\(db)", "integrations", "list", "--json"], useDB: false)
        #expect(listed.status == 0, "\(listed.stderr)")
        #expect(try store().primaryOwner(workspaceID: 1) == "owner@example.com")
        // Anything else before the command is a usage error that changes nothing.
        let bogus = try run(["--actor", "x@example.com", "init", "--owner", "o@example.com"], useDB: false)
        #expect(bogus.status == 2)
        #expect(bogus.stderr.contains("before the command"))
    }

    @Test func aCommandAwayFromTheDatabaseCreatesNoneAndSaysWhereItLooked() throws {
        let elsewhere = dir.appendingPathComponent("elsewhere")
        try FileManager.default.createDirectory(at: elsewhere, withIntermediateDirectories: true)
        for command in [["integrations", "list"], ["console-login", "--actor", "you@example.com"], ["usage"], ["workspaces", "show", "default"]] {
            let refused = try run(command, useDB: false, cwd: elsewhere)
            #expect(refused.status != 0, "\(command)")
            #expect(refused.stderr.contains("no initialised database at ./attestd.sqlite: run from where you ran init, or pass --db / ATTESTD_DB"),
                    "\(command): \(refused.stderr)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: elsewhere.path).isEmpty)
        // init creates it.
        #expect(try run(["init", "--owner", "you@example.com"], useDB: false, cwd: elsewhere).status == 0)
        #expect(FileManager.default.fileExists(atPath: elsewhere.appendingPathComponent("attestd.sqlite").path))
    }

    @Test func aTeamIDTypedInLowercaseIsTakenInCapitals() throws {
        #expect(try run(["init", "--owner", "owner@example.com"]).status == 0)
        let created = try run(["integrations", "create", "--actor", "owner@example.com", "--name", "App", "--team-id", "abcde12345",
                               "--bundle-id", "com.example.app", "--json"])
        #expect(created.status == 0, "\(created.stderr)")
        let json = try JSONSerialization.jsonObject(with: Data(created.stdout.utf8)) as? [String: Any]
        #expect(json?["team_id"] as? String == "ABCDE12345")
        let short = try run(["integrations", "create", "--actor", "owner@example.com", "--name", "App", "--team-id", "ABC",
                             "--bundle-id", "com.example.app"])
        #expect(short.status != 0 && short.stderr.contains("must be 10 characters") && short.stderr.contains("it has 3"))
        let symbols = try run(["integrations", "create", "--actor", "owner@example.com", "--name", "App", "--team-id", "ABCDE-2345",
                               "--bundle-id", "com.example.app"])
        #expect(symbols.status != 0 && symbols.stderr.contains("only the letters A-Z and the digits 0-9"))
    }

    @Test func theUpstreamKeyMayComeFromStandardInput() throws {
        #expect(try run(["init", "--owner", "owner@example.com"]).status == 0)
        let set = try run(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", "-"],
                          input: "test-key-from-standard-input-9876\n")
        #expect(set.status == 0, "\(set.stderr)")
        #expect(set.stdout.contains("ending in 9876"))
        let missing = try run(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", "nope.key"])
        #expect(missing.status != 0 && missing.stderr.contains("or - to read it from standard input"))
    }

    @Test func initTwiceChangesNothingTheSecondTime() throws {
        let first = try ok(["init", "--owner", "Owner@Example.com"])
        #expect(first.stdout.contains("owner@example.com"))
        let before = try snapshot()
        let store = try store()
        let workspace = try #require(try store.workspace(named: "default"))
        #expect(try store.primaryOwner(workspaceID: workspace.id) == "owner@example.com")
        #expect(before.audit.count == 1)

        let second = try ok(["init", "--owner", "someone.else@example.com"])
        #expect(second.stdout.contains("already initialised"))
        #expect(second.stdout.contains("owner@example.com"))
        #expect(try snapshot() == before)
        #expect(try store.primaryOwner(workspaceID: workspace.id) == "owner@example.com")
        #expect(try store.role(of: "someone.else@example.com", in: workspace.id) == nil)
    }

    // MARK: integrations

    @Test func createWithJSONPrintsTheRecord() throws {
        try organisation()
        let started = Date()
        let record = try json(try run(["integrations", "create", "--actor", "admin@example.com", "--name", "Chat", "--team-id", "ABCDE12345",
                                       "--bundle-id", "com.example.chat", "--bundle-id", "com.example.chat.beta",
                                       "--environments", "production", "--json"]))
        let clientID = try #require(record["client_id"] as? String)
        #expect(clientID.hasPrefix("clid_"))
        let random = clientID.dropFirst(5)
        #expect(random.count >= 21)  // 21 base64url characters carry 126 bits
        #expect(random.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") })
        #expect(record["name"] as? String == "Chat")
        #expect(record["workspace"] as? String == "default")
        #expect(record["team_id"] as? String == "ABCDE12345")
        #expect(record["bundle_ids"] as? [String] == ["com.example.chat", "com.example.chat.beta"])
        #expect(record["environments"] as? [String] == ["production"])
        let created = try #require((record["created_at"] as? String).flatMap { ISO8601DateFormatter().date(from: $0) })
        #expect(abs(created.timeIntervalSince(started)) < 60)
        #expect(Set(record.keys) == ["client_id", "name", "workspace", "team_id", "bundle_ids", "environments", "created_at", "policy", "device_policy"])
        // The default device policy: App Store and TestFlight in production, development builds in development.
        let devices = try #require(record["device_policy"] as? [String: Any])
        #expect(devices["distribution"] as? [String: [String]] == ["production": ["app-store", "testflight"], "development": ["development"]])
        #expect(devices["min_bundle_version"] is NSNull && devices["require_extensions"] as? Bool == false)
        #expect(devices["platforms"] as? [String] == ["ios", "macos"])
        // The default policy: any model, no max_tokens ceiling, 60 requests a minute per device, no budget.
        let policy = try #require(record["policy"] as? [String: Any])
        #expect(policy["models"] as? [String] == ["*"] && policy["max_tokens"] as? Int == 0)
        #expect(policy["device_requests_per_minute"] as? Int == 60 && policy["monthly_token_budget"] as? Int == 0)

        let stored = try #require(try store().integration(clientID: clientID))
        #expect(stored.bundleIDs == ["com.example.chat", "com.example.chat.beta"])
        #expect(stored.environments == [.production])

        let human = try ok(["integrations", "create", "--actor", "owner@example.com", "--name", "Other", "--team-id", "ABCDE12345", "--bundle-id", "com.example.other"])
        let humanID = try #require(try store().integrations(workspaceID: nil).first { $0.name == "Other" }?.clientID)
        #expect(human.stdout.contains(humanID))
        #expect(human.stdout.split(separator: "\n").count == 3)
        #expect(human.stdout.contains("devices: distribution production=app-store,testflight development=development"))
        #expect(human.stdout.split(separator: "\n").last?.hasPrefix("policy: models *, max_tokens none, device_requests_per_minute 60") == true)
    }

    @Test func listAndShowCountDevicesAndLiveTokens() throws {
        try organisation()
        let busy = try createIntegration(name: "Busy")
        let idle = try createIntegration(name: "Idle")

        // One registered device with one live token, written straight to the store.
        let store = try store()
        let integration = try #require(try store.integration(clientID: busy))
        let keyID = [UInt8](repeating: 7, count: 32), tokenHash = [UInt8](repeating: 0xAB, count: 32)
        let now = Date()
        let registered = try store.registerDevice(
            Device(keyID: keyID, clientID: busy, publicKey: [4] + [UInt8](repeating: 1, count: 64), counter: 0,
                   environment: .development, appID: "ABCDE12345.com.example.chat"),
            receipt: [1, 2, 3],
            firstToken: TokenRecord(tokenHash: tokenHash, clientID: busy, workspaceID: integration.workspaceID, keyID: keyID,
                                    issuedAt: now, expiresAt: now.addingTimeInterval(3600)),
            nextChallenge: IssuedChallenge(bytes: [UInt8](repeating: 9, count: 32), expiresAt: now.addingTimeInterval(300)), at: now)
        try #require(registered)

        let list = try json(try run(["integrations", "list", "--json"]))
        let records = try #require(list["integrations"] as? [[String: Any]])
        let byID = Dictionary(uniqueKeysWithValues: records.compactMap { r in (r["client_id"] as? String).map { ($0, r) } })
        #expect(byID.count == 2)
        #expect(byID[busy]?["devices"] as? Int == 1)
        #expect(byID[busy]?["live_tokens"] as? Int == 1)
        #expect(byID[idle]?["devices"] as? Int == 0)
        #expect(byID[idle]?["live_tokens"] as? Int == 0)
        #expect(byID[busy]?["revoked_at"] is NSNull)

        let show = try json(try run(["integrations", "show", busy, "--json"]))
        #expect(show["name"] as? String == "Busy")
        #expect(show["devices"] as? Int == 1)
        #expect(show["live_tokens"] as? Int == 1)

        let human = try ok(["integrations", "show", busy])
        #expect(human.stdout.contains("live_tokens: 1"))
        #expect(try ok(["integrations", "list"]).stdout.split(separator: "\n").count == 2)

        // Revocation kills the live token; the device stays counted.
        try ok(["integrations", "revoke", busy, "--actor", "owner@example.com", "--yes"])
        let revoked = try json(try run(["integrations", "show", busy, "--json"]))
        #expect(revoked["live_tokens"] as? Int == 0)
        #expect(revoked["devices"] as? Int == 1)
        #expect(revoked["revoked_at"] is String)

        // No hash, in any encoding, in any listing.
        let outputs = try [["integrations", "list", "--json"], ["integrations", "list"], ["integrations", "show", busy, "--json"],
                           ["audit", "--json"]].map { try ok($0).stdout }.joined()
        for encoded in [Data(tokenHash).base64EncodedString(), tokenHash.map { String(format: "%02x", $0) }.joined(), "abababab"] {
            #expect(!outputs.lowercased().contains(encoded.lowercased()))
        }
        #expect(!outputs.contains("hash"))
        #expect(!outputs.contains("secret"))
    }

    @Test func workspacesScopeMembersAndIntegrations() throws {
        try organisation()
        try ok(["workspaces", "create", "--actor", "owner@example.com", "--name", "team2"])
        #expect(try run(["workspaces", "create", "--actor", "admin@example.com", "--name", "team3"]).status == 2)
        try ok(["members", "add", "--actor", "owner@example.com", "--workspace", "team2", "--email", "t2@example.com", "--role", "admin"])
        let inTeam2 = try createIntegration(actor: "t2@example.com", extra: ["--workspace", "team2"])
        let inDefault = try createIntegration()
        // t2@ is a member of team2 only.
        #expect(try run(["integrations", "create", "--actor", "t2@example.com", "--name", "X", "--team-id", "ABCDE12345", "--bundle-id", "a.b"]).status == 2)

        let team2 = try #require(try json(try run(["integrations", "list", "--workspace", "team2", "--json"]))["integrations"] as? [[String: Any]])
        #expect(team2.compactMap { $0["client_id"] as? String } == [inTeam2])
        let all = try #require(try json(try run(["integrations", "list", "--json"]))["integrations"] as? [[String: Any]])
        #expect(Set(all.compactMap { $0["client_id"] as? String }) == [inTeam2, inDefault])
    }

    // MARK: refusals

    /// Each case must exit 2 with one `attestctl: ` line on stderr and change nothing. `CLID` stands for an existing client ID.
    static let refusals: [[String]] = [
        ["integrations", "create", "--actor", "owner@example.com", "--name", "X", "--team-id", "ABCDE1234", "--bundle-id", "com.example.x"],
        ["integrations", "create", "--actor", "owner@example.com", "--name", "X", "--team-id", "ABCDE12345"]
            + (1...33).flatMap { ["--bundle-id", "com.example.app\($0)"] },
        ["integrations", "create", "--actor", "owner@example.com", "--name", "X", "--team-id", "ABCDE12345",
         "--bundle-id", "com.example.x", "--bundle-id", "com.example.x"],
        ["integrations", "create", "--actor", "stranger@example.com", "--name", "X", "--team-id", "ABCDE12345", "--bundle-id", "com.example.x"],
        ["integrations", "create", "--actor", "dev@example.com", "--name", "X", "--team-id", "ABCDE12345", "--bundle-id", "com.example.x"],
        ["integrations", "create", "--actor", "owner@example.com", "--name", "X", "--team-id", "ABCDE12345", "--bundle-id", "com.example.x", "--bogus", "1"],
        ["integrations", "create", "--actor", "owner@example.com", "--name", "X", "--team-id", "ABCDE12345", "--bundle-id", "com.example.x",
         "--environments", "staging"],
        ["integrations", "revoke", "CLID", "--actor", "user@example.com", "--yes"],
        ["integrations", "revoke", "CLID", "--actor", "dev@example.com", "--yes"],
        ["integrations", "revoke", "CLID", "--actor", "owner@example.com"],
        ["integrations", "revoke", "clid_doesnotexist", "--actor", "owner@example.com", "--yes"],
        ["integrations", "show", "clid_doesnotexist"],
        ["members", "add", "--actor", "admin@example.com", "--email", "new@example.com", "--role", "owner"],
        ["members", "add", "--actor", "owner@example.com", "--email", "new@example.com", "--role", "superuser"],
        ["members", "add", "--actor", "owner@example.com", "--email", "not-an-email", "--role", "user"],
        ["audit", "--limit", "0"],
        ["integrations", "update", "CLID", "--actor", "dev@example.com", "--max-tokens", "5"],
        ["integrations", "update", "CLID", "--actor", "owner@example.com"],
        ["integrations", "update", "CLID", "--actor", "owner@example.com", "--models", "claude sonnet"],
        ["integrations", "update", "CLID", "--actor", "owner@example.com", "--models", ","],
        ["integrations", "update", "CLID", "--actor", "owner@example.com", "--max-tokens", "-1"],
        ["integrations", "update", "clid_doesnotexist", "--actor", "owner@example.com", "--max-tokens", "5"],
        ["integrations", "create", "--actor", "owner@example.com", "--name", "X", "--team-id", "ABCDE12345", "--bundle-id", "com.example.x",
         "--monthly-token-budget", "lots"],
        ["usage", "--since", "yesterday"],
        ["usage", "--by", "week"],
        ["usage", "--since", "2026-12-02", "--until", "2026-12-01"],
        ["usage", "--workspace", "nope"],
        ["usage", "--client-id", "clid_doesnotexist"],
        ["integrations", "frobnicate"],
    ]

    /// A partial update keeps the other settings; admins may update; the audit trail has old and new.
    @Test func updateChangesOnlyWhatItNamesAndIsAudited() throws {
        try organisation()
        let clientID = try createIntegration()
        let updated = try ok(["integrations", "update", clientID, "--actor", "admin@example.com", "--models", "claude-a, claude-b",
                              "--monthly-token-budget", "1000000", "--json"])
        let policy = try #require((try JSONSerialization.jsonObject(with: Data(updated.stdout.utf8)) as? [String: Any])?["policy"] as? [String: Any])
        #expect(policy["models"] as? [String] == ["claude-a", "claude-b"] && policy["monthly_token_budget"] as? Int == 1_000_000)
        try ok(["integrations", "update", clientID, "--actor", "owner@example.com", "--max-tokens", "512"])
        let stored = try #require(try store().integration(clientID: clientID)?.policy)
        #expect(stored == IntegrationPolicy(models: ["claude-a", "claude-b"], maxTokens: 512, deviceRequestsPerMinute: 60, monthlyTokenBudget: 1_000_000))
        try ok(["integrations", "update", clientID, "--actor", "owner@example.com", "--models", "*", "--device-requests-per-minute", "0"])
        #expect(try store().integration(clientID: clientID)?.policy == IntegrationPolicy(maxTokens: 512, deviceRequestsPerMinute: 0, monthlyTokenBudget: 1_000_000))
        let audit = try ok(["audit", "--client-id", clientID]).stdout
        #expect(audit.contains("integration.policy_updated") && audit.contains("actor=admin@example.com"))
        #expect(audit.contains("max_tokens none") && audit.contains("max_tokens 512"))
        // Nothing relayed yet: the ledger is empty and says so, and the month's forecast is nothing.
        let text = try ok(["usage"]).stdout.split(separator: "\n")
        #expect(text.first == "no usage recorded" && text.count == 2 && text[1].contains("$0.00 so far, $0.00 projected"))
        let json = try ok(["usage", "--json"]).stdout.split(separator: "\n")
        let forecast = try #require(json.count == 1 ? try JSONSerialization.jsonObject(with: Data(json[0].utf8)) as? [String: Any] : nil)
        #expect(forecast["cost_micro_usd"] as? Int == 0 && (forecast["forecast"] as? [String: Any])?["projected_cost_micro_usd"] as? Int == 0)
    }

    @Test(arguments: refusals)
    func refusedCommandsExit2AndChangeNothing(_ template: [String]) throws {
        try organisation()
        let clientID = try createIntegration()
        let before = try snapshot()
        let result = try run(template.map { $0 == "CLID" ? clientID : $0 })
        #expect(result.status == 2)
        #expect(result.stdout.isEmpty)
        #expect(result.stderr.hasPrefix("attestctl: "))
        if template != ["integrations", "frobnicate"] {  // that one prints the usage
            #expect(result.stderr.split(separator: "\n").count == 1)
        }
        #expect(try snapshot() == before)
        let store = try store()
        let workspace = try #require(try store.workspace(named: "default"))
        #expect(try store.role(of: "new@example.com", in: workspace.id) == nil)
    }

    @Test func unknownOptionCreatesNoDatabase() throws {
        let result = try run(["init", "--owner", "owner@example.com", "--bogus", "x"])
        #expect(result.status == 2)
        #expect(result.stderr == "attestctl: unknown option --bogus\n")
        #expect(!FileManager.default.fileExists(atPath: db))
    }

    // MARK: roles and revocation

    @Test func rolesDecideWhoCreatesAndRevokes() throws {
        try organisation()
        let byAdmin = try createIntegration(actor: "admin@example.com")
        let developer = try run(["integrations", "create", "--actor", "dev@example.com", "--name", "X", "--team-id", "ABCDE12345", "--bundle-id", "com.example.x"])
        #expect(developer.status == 2)
        #expect(developer.stderr.contains("may not create integrations"))

        let user = try run(["integrations", "revoke", byAdmin, "--actor", "user@example.com", "--yes"])
        #expect(user.status == 2)
        #expect(try store().integration(clientID: byAdmin)?.isRevoked == false)

        try ok(["integrations", "revoke", byAdmin, "--actor", "owner@example.com", "--yes"])
        #expect(try store().integration(clientID: byAdmin)?.isRevoked == true)

        // Admins may add developers and users but not owners or admins.
        try ok(["members", "add", "--actor", "admin@example.com", "--email", "dev2@example.com", "--role", "developer"])
        #expect(try run(["members", "add", "--actor", "admin@example.com", "--email", "adm2@example.com", "--role", "admin"]).status == 2)
        #expect(try run(["members", "add", "--actor", "owner@example.com", "--email", "dev2@example.com", "--role", "user"]).status == 2)
    }

    @Test func revokeNeedsYesIsPermanentAndHappensOnce() throws {
        try organisation()
        let clientID = try createIntegration()

        let unconfirmed = try run(["integrations", "revoke", clientID, "--actor", "owner@example.com"])
        #expect(unconfirmed.status == 2)
        #expect(unconfirmed.stderr.contains("permanent"))
        #expect(unconfirmed.stderr.contains("--yes"))
        #expect(try store().integration(clientID: clientID)?.isRevoked == false)

        let revoked = try ok(["integrations", "revoke", clientID, "--actor", "admin@example.com", "--yes"])
        #expect(revoked.stdout.contains(clientID))
        // A fresh connection after the process has exited: the revocation is on disk.
        let revokedAt = try #require(try store().integration(clientID: clientID)?.revokedAt)

        let again = try run(["integrations", "revoke", clientID, "--actor", "owner@example.com", "--yes"])
        #expect(again.status == 2)
        #expect(again.stderr.contains("already revoked"))
        #expect(try store().integration(clientID: clientID)?.revokedAt == revokedAt)
        #expect(try store().auditEvents(clientID: clientID).filter { $0.action == "integration.revoked" }.count == 1)
    }

    // MARK: audit

    @Test func auditRecordsCreateAndRevokeWithTheActor() throws {
        try organisation()
        let clientID = try createIntegration(actor: "admin@example.com")
        let other = try createIntegration(name: "Other")
        try ok(["integrations", "revoke", clientID, "--actor", "owner@example.com", "--yes"])
        let keyID: [UInt8] = Array(0..<32)
        try store().appendAudit([AuditEvent(at: Date(), action: "device.rejected", clientID: other, keyID: keyID, reason: "bad_counter")])

        let filtered = try #require(try json(try run(["audit", "--client-id", clientID, "--json"]))["events"] as? [[String: Any]])
        #expect(filtered.map { $0["action"] as? String } == ["integration.revoked", "integration.created"])  // newest first
        #expect(filtered.map { $0["actor"] as? String } == ["owner@example.com", "admin@example.com"])
        #expect(filtered.allSatisfy { $0["client_id"] as? String == clientID })

        let newest = try #require(try json(try run(["audit", "--limit", "1", "--json"]))["events"] as? [[String: Any]])
        #expect(newest.count == 1)
        #expect(newest.first?["key_id"] as? String == Data(keyID).base64EncodedString())
        #expect(newest.first?["reason"] as? String == "bad_counter")

        let all = try ok(["audit"]).stdout.split(separator: "\n")
        #expect(try all.count == store().auditEvents().count)
        #expect(all.first?.contains("key_id=\(Data(keyID).base64EncodedString())") == true)
        #expect(all.contains { $0.contains("integration.revoked") && $0.contains("actor=owner@example.com") && $0.contains(clientID) })
    }

    // MARK: database location

    @Test func dbOptionWinsOverEnvironment() throws {
        let fromFlag = dir.appendingPathComponent("flag.sqlite").path, fromEnv = dir.appendingPathComponent("env.sqlite").path
        #expect(try run(["init", "--owner", "flag@example.com", "--db", fromFlag], useDB: false, environment: ["ATTESTD_DB": fromEnv]).status == 0)
        #expect(FileManager.default.fileExists(atPath: fromFlag))
        #expect(!FileManager.default.fileExists(atPath: fromEnv))

        #expect(try run(["init", "--owner", "env@example.com"], useDB: false, environment: ["ATTESTD_DB": fromEnv]).status == 0)
        for (path, owner) in [(fromFlag, "flag@example.com"), (fromEnv, "env@example.com")] {
            let store = try store(path)
            let workspace = try #require(try store.workspace(named: "default"))
            #expect(try store.primaryOwner(workspaceID: workspace.id) == owner)
        }
        #expect(!FileManager.default.fileExists(atPath: db))
    }

    @Test func defaultDatabaseIsInTheWorkingDirectory() throws {
        let elsewhere = dir.appendingPathComponent("elsewhere")
        try FileManager.default.createDirectory(at: elsewhere, withIntermediateDirectories: true)
        #expect(try run(["init", "--owner", "owner@example.com"], useDB: false, cwd: elsewhere).status == 0)
        let created = try run(["integrations", "create", "--actor", "owner@example.com", "--name", "Chat", "--team-id", "ABCDE12345",
                               "--bundle-id", "com.example.chat"], useDB: false, cwd: elsewhere)
        #expect(created.status == 0)
        let path = elsewhere.appendingPathComponent("attestd.sqlite").path
        #expect(try store(path).integrations(workspaceID: nil).map(\.name) == ["Chat"])
        #expect(!FileManager.default.fileExists(atPath: db))
    }
}
