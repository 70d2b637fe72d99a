import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

/// `attestctl console-login` links to the console that is really there: each attestd records its
/// listeners and `--base-url` values in the database when they open, and the link goes to the
/// one started last; `--base-url` still overrides, and attestd's own start-up hint says what to
/// pass. Run as the shipped binaries do, against a database in a fresh directory.
@Suite(.serialized) final class ConsoleLoginLinkTests {
    let dir: URL
    var db: String { dir.appendingPathComponent("attestd.sqlite").path }
    let attestdPath = URL(fileURLWithPath: AdminCommandTests.binary).deletingLastPathComponent().appendingPathComponent("attestd").path

    init() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("console-link-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: dir) }

    /// An attestd on this test's database, its log in a file; stopped (SIGTERM, then waited for) by `stop`.
    final class Attestd {
        let process = Process()
        let log: URL

        init(_ binary: String, db: String, directory: URL, arguments: [String]) throws {
            log = directory.appendingPathComponent("attestd-\(UUID().uuidString).log")
            try Data().write(to: log)
            process.executableURL = URL(fileURLWithPath: binary)
            process.arguments = ["serve", "--db", db, "--listen", "127.0.0.1:0"] + arguments
            process.currentDirectoryURL = directory
            let handle = try FileHandle(forWritingTo: log)
            process.standardOutput = handle
            process.standardError = handle
            try process.run()
        }

        var text: String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }

        /// The first log line of `event`, once attestd has written it (it exits or 30 s pass: nil).
        func event(_ name: String) async throws -> [String: Any]? {
            let deadline = Date() + 30
            while Date() < deadline {
                for line in text.split(separator: "\n") {
                    if let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], object["event"] as? String == name {
                        return object
                    }
                }
                if !process.isRunning { return nil }
                try await Task.sleep(for: .milliseconds(20))
            }
            return nil
        }

        func stop() {
            guard process.isRunning else { return }
            process.terminate()
            process.waitUntilExit()
        }

        deinit { stop() }
    }

    func attestctl(_ arguments: [String]) throws -> AdminCommandTests.Outcome {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: AdminCommandTests.binary)
        process.arguments = arguments + ["--db", db]
        var environment = ProcessInfo.processInfo.environment
        environment["ATTESTD_DB"] = nil
        process.environment = environment
        process.currentDirectoryURL = dir
        let out = dir.appendingPathComponent("out-\(UUID().uuidString)"), err = dir.appendingPathComponent("err-\(UUID().uuidString)")
        try Data().write(to: out)
        try Data().write(to: err)
        process.standardOutput = try FileHandle(forWritingTo: out)
        process.standardError = try FileHandle(forWritingTo: err)
        try process.run()
        process.waitUntilExit()
        return AdminCommandTests.Outcome(status: process.terminationStatus, stdout: try String(contentsOf: out, encoding: .utf8),
                                         stderr: try String(contentsOf: err, encoding: .utf8))
    }

    func link() throws -> String {
        let result = try attestctl(["console-login", "--actor", "owner@example.com"])
        try #require(result.status == 0, "\(result.stderr)")
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// GET of a sign-in link: the console's page with its one button (a GET spends nothing).
    static func opens(_ link: String) async throws -> Bool {
        let (data, response) = try await URLSession.shared.data(from: try #require(URL(string: link)))
        return (response as? HTTPURLResponse)?.statusCode == 200 && String(decoding: data, as: UTF8.self).contains("id=\"sign-in\"")
    }

    @Test func theLinkGoesToTheAdminListenerTheServerOpened() async throws {
        #expect(try attestctl(["init", "--owner", "owner@example.com"]).status == 0)
        // Before any attestd has started on this database: the default admin listener, said so.
        let before = try attestctl(["console-login", "--actor", "owner@example.com"])
        #expect(before.stdout.hasPrefix("http://127.0.0.1:9090/console/sign-in?token="))
        #expect(before.stderr.contains("no attestd has started on this database yet"))

        // An admin listener on a port of the system's choosing, never 9090.
        let server = try Attestd(attestdPath, db: db, directory: dir, arguments: ["--admin-listen", "127.0.0.1:0"])
        defer { server.stop() }
        let admin = try #require(try await server.event("admin_listening"), "\(server.text)")
        _ = try #require(try await server.event("listening"), "\(server.text)")
        let address = try #require(admin["address"] as? String)
        #expect(address.hasPrefix("127.0.0.1:") && address != "127.0.0.1:9090")
        // attestd's hint names what attestctl needs here: this database and this console.
        #expect(admin["sign_in"] as? String == "attestctl console-login --actor EMAIL --db \(db) --base-url http://\(address)")

        let link = try link()
        #expect(link.hasPrefix("http://\(address)/console/sign-in?token="), "\(link) is not on \(address)")
        #expect(try await Self.opens(link))

        // --base-url still decides.
        let given = try attestctl(["console-login", "--actor", "owner@example.com", "--base-url", "https://admin.example.com/console/"])
        #expect(given.stdout.hasPrefix("https://admin.example.com/console/sign-in?token="))
    }

    @Test func theLinkUsesTheServersBaseURLAndTheInstanceStartedLast() async throws {
        #expect(try attestctl(["init", "--owner", "owner@example.com"]).status == 0)
        let first = try Attestd(attestdPath, db: db, directory: dir, arguments: ["--admin-listen", "127.0.0.1:0"])
        defer { first.stop() }
        _ = try #require(try await first.event("listening"), "\(first.text)")
        // A second instance, behind a TLS proxy that operators reach by name.
        let second = try Attestd(attestdPath, db: db, directory: dir,
                                 arguments: ["--admin-listen", "127.0.0.1:0", "--base-url", "https://attest-admin.example.com/"])
        defer { second.stop() }
        let admin = try #require(try await second.event("admin_listening"), "\(second.text)")
        _ = try #require(try await second.event("listening"), "\(second.text)")
        #expect(admin["sign_in"] as? String == "attestctl console-login --actor EMAIL --db \(db) --base-url https://attest-admin.example.com")
        #expect(try link().hasPrefix("https://attest-admin.example.com/console/sign-in?token="))

        // Each instance's row, as it recorded it.
        let (status, rows) = try ToolShapeTests.run("/usr/bin/sqlite3", [db, "SELECT admin_address, base_urls, version FROM attestd_instances ORDER BY started_at"])
        #expect(status == 0)
        let lines = rows.split(separator: "\n")
        #expect(lines.count == 2)
        #expect(lines.last?.contains("|https://attest-admin.example.com|") == true)
        #expect(lines.allSatisfy { $0.hasSuffix("(commit \(try! VersionAndHelpTests.expectedCommit()))") || $0.hasSuffix("-dirty)") })
    }

    @Test func aServerWithoutAnAdminListenerIsNamedNotGuessed() async throws {
        #expect(try attestctl(["init", "--owner", "owner@example.com"]).status == 0)
        let server = try Attestd(attestdPath, db: db, directory: dir, arguments: ["--admin-listen", "none"])
        defer { server.stop() }
        _ = try #require(try await server.event("listening"), "\(server.text)")
        let refused = try attestctl(["console-login", "--actor", "owner@example.com"])
        #expect(refused.status == 2)
        #expect(refused.stderr.contains("--admin-listen none") && refused.stderr.contains("--base-url"))
        #expect(try attestctl(["console-login", "--actor", "owner@example.com", "--base-url", "http://127.0.0.1:9999"]).status == 0)
    }
}
