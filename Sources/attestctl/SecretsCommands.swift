import AttestCrypto
import CommandLineSupport
import Foundation
import TokenService

/// `attestctl secrets rotate|finish-rotation|status`: a new secrets key, with every sealed value
/// (upstream credentials, Apple keys, webhook signing secrets) re-sealed under it while attestd keeps serving.
enum SecretsCommands {
    static let usage = """
    usage: attestctl secrets rotate --actor EMAIL [--keys-only]
             makes a new secrets key the current one, keeps the old one beside it (KEYFILE.previous), then re-seals
             every sealed value under the new key, one at a time. attestd reads both files while a rotation is under
             way, so every instance keeps opening every value throughout. Interrupted at any point, rotate resumes
             where it stopped. With instances on several hosts, run rotate --keys-only, copy both key files to every
             host, then run rotate again to re-seal.
           attestctl secrets finish-rotation --actor EMAIL
             removes the previous key once no sealed value needs it, and refuses while one does; then it names the
             hosts whose attestd still reports holding a previous key (remove KEYFILE.previous there too).
           attestctl secrets status [--json]
             lists what each attestd last read from its key files (stale: no report for 15 minutes).
      Key files must be readable and writable by their owner only (chmod 600), and owned by the user that
      reads them (root may read any user's): others are refused, by attestctl and by attestd.
      Owners and the primary owner of the default workspace; every step is audited (never a key).
    """
    static let help = CommandHelp(usage, tool: "attestctl")

    static func run(_ argv: [String]) throws -> Int32 {
        if wantsHelp(argv) {
            print(help.text(for: ["secrets"] + argv) ?? usage)
            return 0
        }
        do {
            switch argv.first {
            case "rotate": return try rotate(Array(argv.dropFirst()))
            case "finish-rotation": return try finish(Array(argv.dropFirst()))
            case "status": return try status(Array(argv.dropFirst()))
            default: throw UsageError(usage)
            }
        } catch let error as AdminError {
            throw UsageError(error.description)
        }
    }

    static func rotate(_ argv: [String]) throws -> Int32 {
        let arguments = try AdminCommands.parse(argv, options: ["actor"], flags: ["keys-only"])
        let actor = try arguments.required("actor")
        let path = try AdminCommands.secretsKeyPath(arguments)
        return try locked(path) { try rotate(arguments, actor: actor, path: path) }
    }

    /// Under the key file's rotation lock: a second rotate, or a finish, waits its turn.
    static func locked(_ path: String, _ body: () throws -> Int32) throws -> Int32 {
        do {
            return try SecretsKeyFile.withRotationLock(path, body)
        } catch let error as CryptoError {
            throw UsageError(error.description)
        }
    }

    static func rotate(_ arguments: Arguments, actor: String, path: String) throws -> Int32 {
        let (service, _) = try AdminCommands.open(arguments)
        // Refused before any file is touched.
        try service.authorizeSecretsRotation(actor: actor)
        let began: Bool
        do { began = try SecretsKeyFile.beginRotation(path) } catch { throw UsageError("\(error)") }
        let keyring = try loadKeyring(path)
        let current = SecretBox.describe(keyID: keyring.current.keyID)
        let previous = SecretBox.describe(keyID: keyring.previous?.keyID)
        if began {
            try service.auditSecrets(actor: actor, "secrets.rotation_started", detail: "new key \(current), previous key \(previous)")
            print("made a new secrets key \(current) in \(path); the previous key \(previous) stays in \(SecretsKeyFile.previousPath(path)) until the rotation finishes")
        } else {
            print("a rotation is under way (new key \(current), previous key \(previous)): resuming")
        }
        if arguments.has("keys-only") {
            print("keys only: copy \(path) and \(SecretsKeyFile.previousPath(path)) to every host that runs attestd (mode 0600, owned by the user attestd runs as), "
                  + "then run attestctl secrets rotate again to re-seal")
            return 0
        }
        let report = try service.resealSecrets(actor: actor, keyring: keyring) { owner in
            print("re-sealed \(owner)")
            fflush(nil)   // each line as it happens: a rotation stopped midway shows how far it got
        }
        print("re-sealed \(report.resealed.count) values under \(current) (\(report.alreadyCurrent) were under it already)")
        guard report.unopenable.isEmpty else {
            for (owner, why) in report.unopenable { printError("cannot re-seal \(owner): \(why)") }
            printError("\(report.unopenable.count) values open with neither the new nor the previous key: they were left as they are, and the rotation cannot finish "
                       + "until each is set again (workspaces set-upstream-…, apple-keys set)")
            return 1
        }
        print("next: attestctl secrets finish-rotation --actor \(actor)   (removes the previous key)")
        return 0
    }

    static func finish(_ argv: [String]) throws -> Int32 {
        let arguments = try AdminCommands.parse(argv, options: ["actor"])
        let actor = try arguments.required("actor")
        let path = try AdminCommands.secretsKeyPath(arguments)
        return try locked(path) { try finish(arguments, actor: actor, path: path) }
    }

    static func finish(_ arguments: Arguments, actor: String, path: String) throws -> Int32 {
        let (service, _) = try AdminCommands.open(arguments)
        try service.authorizeSecretsRotation(actor: actor)
        let keyring = try loadKeyring(path)
        guard let previous = keyring.previous else {
            print("no rotation is under way: \(path) holds the only key (\(SecretBox.describe(keyID: keyring.current.keyID)))")
            try printPreviousKeyHolders(service, path: path)
            return 0
        }
        let left = try service.sealedUnderOtherKeys(keyring)
        guard left.isEmpty else {
            for value in left { printError("still under key \(SecretBox.describe(keyID: SecretBox.keyID(ofSealed: value.sealed))): \(value.owner)") }
            throw UsageError("\(left.count) sealed values still need the previous key: run attestctl secrets rotate --actor EMAIL to re-seal them first")
        }
        do { try SecretsKeyFile.finishRotation(path) } catch { throw UsageError("\(error)") }
        try service.auditSecrets(actor: actor, "secrets.rotation_finished",
                                 detail: "previous key \(SecretBox.describe(keyID: previous.keyID)) removed; current key \(SecretBox.describe(keyID: keyring.current.keyID))")
        print("removed the previous key \(SecretBox.describe(keyID: previous.keyID)): every sealed value is under \(SecretBox.describe(keyID: keyring.current.keyID))")
        try printPreviousKeyHolders(service, path: path)
        return 0
    }

    /// The instances on other hosts (or reading other key files) whose last report says they hold
    /// a previous key: its file is still to remove there. This host's own file at `path` is gone
    /// (its instances read it again within a second), so its rows are left out.
    static func printPreviousKeyHolders(_ service: AdminService, path: String) throws {
        let here = SecretsKeyRead.hostName(), file = SecretsKeyRead.absolutePath(path), now = Date()
        let holders = try service.secretsKeyReads().filter { $0.previousKey != nil && !($0.host == here && $0.keyFile == file) }
        guard !holders.isEmpty else {
            print("no other attestd reports holding a previous key")
            return
        }
        let name = (SecretsKeyFile.previousPath(path) as NSString).lastPathComponent
        print("still to remove \(name) on: " + holders.map { read in
            var detail: [String] = []
            if read.keyFile != file { detail.append(SecretsKeyFile.previousPath(read.keyFile)) }
            detail.append("read " + (read.readAt.map(AdminCommands.iso8601) ?? "never"))
            if read.isStale(at: now) { detail.append("stale: no report since \(AdminCommands.iso8601(read.reportedAt))") }
            return "\(read.host) (\(detail.joined(separator: "; ")))"
        }.joined(separator: ", "))
        print("(run attestctl secrets finish-rotation on each, or remove the file; each attestd reads its key files again within a second)")
    }

    static func status(_ argv: [String]) throws -> Int32 {
        let arguments = try AdminCommands.parse(argv, options: [], flags: ["json"])
        let path = try AdminCommands.secretsKeyPath(arguments)
        let (service, _) = try AdminCommands.open(arguments)
        let keyring = try loadKeyring(path)
        let counts = try service.sealedValuesByKey()
        let reads = try service.secretsKeyReads()
        let current = SecretBox.describe(keyID: keyring.current.keyID)
        let now = Date()
        if arguments.has("json") {
            var object: [String: Any] = ["key_file": path, "current_key": current, "rotation_under_way": keyring.previous != nil,
                                         "sealed_values": Dictionary(uniqueKeysWithValues: counts.map { (SecretBox.describe(keyID: $0.keyID), $0.count) }),
                                         "instances": reads.map { instanceRecord($0, at: now) }]
            if let previous = keyring.previous { object["previous_key"] = SecretBox.describe(keyID: previous.keyID) }
            printJSON(object)
            return 0
        }
        print("current key \(current) (\(path))")
        if let previous = keyring.previous { print("previous key \(SecretBox.describe(keyID: previous.keyID)): a rotation is under way") }
        for (keyID, count) in counts { print("\(count) sealed values under \(SecretBox.describe(keyID: keyID))") }
        if reads.isEmpty { print("no attestd has reported reading its key files yet") }
        for read in reads {
            var line = "\(read.host) \(read.keyFile): current key \(read.currentKey ?? "none"), previous key \(read.previousKey ?? "none"), "
                + "read \(read.readAt.map(AdminCommands.iso8601) ?? "never")"
            if read.isStale(at: now) { line += "; stale: no report since \(AdminCommands.iso8601(read.reportedAt))" }
            if let problem = read.problem { line += "; refuses the files on disk: \(problem)" }
            print(line)
        }
        return 0
    }

    /// One instance's last report as `status --json` prints it.
    static func instanceRecord(_ read: SecretsKeyRead, at now: Date) -> [String: Any] {
        var record: [String: Any] = ["host": read.host, "key_file": read.keyFile, "reported_at": AdminCommands.iso8601(read.reportedAt),
                                     "stale": read.isStale(at: now), "pid": Int(read.processID)]
        record["current_key"] = read.currentKey ?? NSNull()
        record["previous_key"] = read.previousKey ?? NSNull()
        record["read_at"] = read.readAt.map(AdminCommands.iso8601) ?? NSNull()
        record["problem"] = read.problem ?? NSNull()
        return record
    }

    static func loadKeyring(_ path: String) throws -> SecretsKeyring {
        do { return try SecretsKeyring.load(path) } catch { throw UsageError("\(error)") }
    }

    static func printError(_ line: String) {
        FileHandle.standardError.write(Data((line + "\n").utf8))
    }
}
