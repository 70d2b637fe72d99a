import Foundation
import SQLiteStore
import Testing
import TokenService

/// The secrets key files as the shipped binaries treat them: a file its group or others may read
/// or write is refused by attestctl and by attestd (at start, naming the file and `chmod 600`; at
/// run time, keeping the keys it holds and saying why); each attestd reports what it read, which
/// `attestctl secrets status` lists and `finish-rotation` turns into the hosts where the previous
/// key is still to remove.
@Suite(.serialized) struct SecretsKeyFilesEndToEndTests {
    static let owner = "owner@example.com"

    /// A deployment on SQLite in a new directory, initialised (its key made by attestctl, 0600).
    struct Deployment {
        let directory: URL
        var db: String { directory.appendingPathComponent("attestd.sqlite").path }
        var keyFile: String { directory.appendingPathComponent("attestd.key").path }
        var previousFile: String { keyFile + ".previous" }

        init() throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("key-files-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let (status, output) = try ServerProcess.attestctl(["--db", db, "init", "--owner", SecretsKeyFilesEndToEndTests.owner])
            try #require(status == 0, "\(output)")
        }

        func remove() { try? FileManager.default.removeItem(at: directory) }

        func ctl(_ arguments: [String]) throws -> (Int32, String) { try ServerProcess.attestctl(["--db", db] + arguments) }

        func status() throws -> [String: Any] {
            let (code, output) = try ctl(["secrets", "status", "--json"])
            try #require(code == 0, "\(output)")
            return try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])
        }

        /// This host's instance in `status --json`.
        func thisInstance() throws -> [String: Any]? {
            (try status()["instances"] as? [[String: Any]])?.first { $0["host"] as? String == SecretsKeyRead.hostName() && $0["key_file"] as? String == keyFile }
        }

        /// The rows as the store holds them (readable whatever the key files' state).
        func reads() throws -> [SecretsKeyRead] { try SQLiteTokenStore(path: db, readers: 1).secretsKeyReads() }

        /// Waits until this host's row satisfies `condition` (attestd looks at its files once a second).
        func waitForThisInstance(_ what: String, _ condition: (SecretsKeyRead) -> Bool) async throws {
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline {
                if let read = try reads().first(where: { $0.host == SecretsKeyRead.hostName() && $0.keyFile == keyFile }), condition(read) { return }
                try await Task.sleep(for: .milliseconds(20))
            }
            Issue.record("this host's instance never reported \(what): \(try reads())")
        }
    }

    /// attestd started on `deployment`, or the error it exited with.
    static func attestd(_ deployment: Deployment) -> Result<ServerProcess, any Error> {
        Result { try ServerProcess(db: deployment.db, extraArguments: ["--admin-listen", "none"]) }
    }

    @Test func aKeyFileOthersMayReadOrWriteIsRefusedByAttestctlAndAttestd() throws {
        let deployment = try Deployment()
        defer { deployment.remove() }
        let keyFile = deployment.keyFile
        for (mode, what) in [(0o640, "readable"), (0o604, "readable"), (0o602, "writable"), (0o666, "readable and writable")] as [(mode_t, String)] {
            chmod(keyFile, mode)
            let message = "the secrets key file \(keyFile) is \(what) by its group or others (mode \(String(format: "%04o", mode))): run chmod 600 \(keyFile)"
            for command in [["secrets", "status"], ["secrets", "rotate", "--actor", Self.owner], ["init", "--owner", Self.owner]] {
                let (status, output) = try deployment.ctl(command)
                #expect(status != 0 && output.contains(message), "attestctl \(command.joined(separator: " ")) with mode \(String(mode, radix: 8)): \(output)")
            }
            #expect(!FileManager.default.fileExists(atPath: deployment.previousFile), "a refused key is never rotated")
            switch Self.attestd(deployment) {
            case .success(let server):
                server.stop()
                Issue.record("attestd started with a key file of mode \(String(mode, radix: 8))")
            case .failure(let error):
                #expect("\(error)".contains(#""event":"startup_failed""#) && "\(error)".contains(message), "\(error)")
            }
        }
        // Its owner's alone: accepted by both.
        chmod(keyFile, 0o600)
        #expect(try deployment.ctl(["secrets", "status"]).0 == 0)
        let server = try Self.attestd(deployment).get()
        server.stop()
        #expect(!server.log.contains("secrets_key_refused"))
    }

    @Test func aPreviousKeyFileOthersMayReadIsRefusedToo() throws {
        let deployment = try Deployment()
        defer { deployment.remove() }
        let (rotated, output) = try deployment.ctl(["secrets", "rotate", "--actor", Self.owner, "--keys-only"])
        try #require(rotated == 0, "\(output)")
        chmod(deployment.previousFile, 0o644)
        let message = "the secrets key file \(deployment.previousFile) is readable by its group or others (mode 0644): run chmod 600 \(deployment.previousFile)"
        let (status, refusal) = try deployment.ctl(["secrets", "status"])
        #expect(status != 0 && refusal.contains(message), "\(refusal)")
        let (finished, finishing) = try deployment.ctl(["secrets", "finish-rotation", "--actor", Self.owner])
        #expect(finished != 0 && finishing.contains(message), "\(finishing)")
        #expect(FileManager.default.fileExists(atPath: deployment.previousFile))
        if case .success(let server) = Self.attestd(deployment) {
            server.stop()
            Issue.record("attestd started with a previous key file of mode 0644")
        }
    }

    @Test func statusListsWhatEachInstanceReadAndFinishNamesTheHostsStillHoldingThePreviousKey() async throws {
        let deployment = try Deployment()
        defer { deployment.remove() }
        let server = try Self.attestd(deployment).get()
        defer { server.stop() }
        let here = SecretsKeyRead.hostName()
        // Written at start, before the listeners opened.
        let before = try deployment.status()
        let current = try #require(before["current_key"] as? String)
        let started = try #require(try deployment.thisInstance(), "\(before)")
        #expect(started["current_key"] as? String == current)
        #expect(started["previous_key"] is NSNull && started["problem"] is NSNull && started["stale"] as? Bool == false)
        #expect(started["read_at"] as? String != nil && started["pid"] as? Int == Int(server.process.processIdentifier))

        // A rotation's keys: the instance reads both files within a second and reports them.
        let (rotated, rotation) = try deployment.ctl(["secrets", "rotate", "--actor", Self.owner, "--keys-only"])
        try #require(rotated == 0, "\(rotation)")
        let new = try #require(try deployment.status()["current_key"] as? String)
        try await deployment.waitForThisInstance("both keys") { $0.currentKey == new && $0.previousKey == current }
        #expect(await server.waitForLog(containing: "secrets_key_loaded"))
        #expect(!server.log.contains(current) && !server.log.contains(new), "no key ID is logged")

        // Two other hosts: one reported a minute ago holding the previous key too, one stopped
        // reporting an hour ago while it held it; a third holds only the new key.
        let store = try SQLiteTokenStore(path: deployment.db, readers: 1)
        let readAt = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 - 60).rounded(.down))
        try store.recordSecretsKeyRead(SecretsKeyRead(host: "host-b", keyFile: deployment.keyFile, currentKey: new, previousKey: current,
                                                      readAt: readAt, reportedAt: Date() - 60, processID: 4242, problem: nil))
        try store.recordSecretsKeyRead(SecretsKeyRead(host: "host-c", keyFile: "/srv/attestd/attestd.key", currentKey: new, previousKey: current,
                                                      readAt: readAt - 3600, reportedAt: readAt - 3600, processID: 77, problem: nil))
        try store.recordSecretsKeyRead(SecretsKeyRead(host: "host-d", keyFile: deployment.keyFile, currentKey: new, previousKey: nil,
                                                      readAt: readAt, reportedAt: Date(), processID: 78, problem: nil))
        let listed = try #require(try deployment.status()["instances"] as? [[String: Any]])
        #expect(listed.compactMap { $0["host"] as? String }.sorted() == ["host-b", "host-c", "host-d", here].sorted())
        #expect(listed.first { $0["host"] as? String == "host-c" }?["stale"] as? Bool == true)
        #expect(listed.first { $0["host"] as? String == "host-b" }?["stale"] as? Bool == false)
        let (_, text) = try deployment.ctl(["secrets", "status"])
        #expect(text.contains("host-c /srv/attestd/attestd.key: current key \(new), previous key \(current), read \(AdminTime.iso(readAt - 3600)); stale: no report since"), "\(text)")

        // Re-seal, finish: this host's previous key is gone, host-b's and the stale host-c's are not.
        #expect(try deployment.ctl(["secrets", "rotate", "--actor", Self.owner]).0 == 0)
        let (finished, finishing) = try deployment.ctl(["secrets", "finish-rotation", "--actor", Self.owner])
        #expect(finished == 0, "\(finishing)")
        #expect(!FileManager.default.fileExists(atPath: deployment.previousFile))
        #expect(finishing.contains("still to remove attestd.key.previous on: host-b (read \(AdminTime.iso(readAt))), "
                                   + "host-c (/srv/attestd/attestd.key.previous; read \(AdminTime.iso(readAt - 3600)); stale: no report since \(AdminTime.iso(readAt - 3600)))"),
                "\(finishing)")
        #expect(!finishing.contains(here + " (") && !finishing.contains("host-d"), "\(finishing)")
        try await deployment.waitForThisInstance("the previous key gone") { $0.currentKey == new && $0.previousKey == nil }

        // Run again on this host: nothing to remove here, the other hosts still listed.
        let (again, repeated) = try deployment.ctl(["secrets", "finish-rotation", "--actor", Self.owner])
        #expect(again == 0 && repeated.contains("no rotation is under way") && repeated.contains("host-b (read"), "\(repeated)")
        // Once they report the file gone, none is left.
        for host in ["host-b", "host-c"] {
            try store.recordSecretsKeyRead(SecretsKeyRead(host: host, keyFile: host == "host-b" ? deployment.keyFile : "/srv/attestd/attestd.key",
                                                          currentKey: new, previousKey: nil, readAt: Date(), reportedAt: Date(), processID: 1, problem: nil))
        }
        let (_, done) = try deployment.ctl(["secrets", "finish-rotation", "--actor", Self.owner])
        #expect(done.contains("no other attestd reports holding a previous key"), "\(done)")
    }

    @Test func aRunningAttestdKeepsItsKeysWhenTheFileTurnsBadAndReportsWhy() async throws {
        let deployment = try Deployment()
        defer { deployment.remove() }
        let server = try Self.attestd(deployment).get()
        defer { server.stop() }
        let current = try #require(try deployment.status()["current_key"] as? String)
        chmod(deployment.keyFile, 0o644)
        #expect(await server.waitForLog(containing: #""event":"secrets_key_refused""#, timeout: 20))
        #expect(server.log.contains("run chmod 600 \(deployment.keyFile)"))
        try await deployment.waitForThisInstance("the refusal") {
            $0.currentKey == current && $0.problem == "the secrets key file \(deployment.keyFile) is readable by its group or others (mode 0644): run chmod 600 \(deployment.keyFile)"
        }
        #expect(server.process.isRunning, "a refused file does not stop the service")
        chmod(deployment.keyFile, 0o600)
        #expect(await server.waitForLog(containing: #""event":"secrets_key_accepted""#, timeout: 20))
        try await deployment.waitForThisInstance("the refusal gone") { $0.currentKey == current && $0.problem == nil }
        let shown = try #require(try deployment.thisInstance())
        #expect(shown["problem"] is NSNull)
    }
}

/// Times as attestctl prints them.
enum AdminTime {
    static func iso(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.string(from: date)
    }
}
