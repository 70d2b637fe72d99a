import Foundation
import Testing

/// What the shipped binaries say about themselves: `--version` (the release in VERSION and the
/// commit they were built from), CHANGELOG.md's record of every migration, and `--help` after a
/// command naming that command alone.
@Suite struct VersionAndHelpTests {
    static let root = AdminCommandTests.packageRoot
    static let binaries = URL(fileURLWithPath: AdminCommandTests.binary).deletingLastPathComponent()

    static func version() throws -> String {
        try String(contentsOf: root.appendingPathComponent("VERSION"), encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// The commit the build should name: HEAD, "-dirty" when tracked files differ, "unknown" outside git.
    static func expectedCommit() throws -> String {
        let (status, head) = try ToolShapeTests.run("/usr/bin/git", ["-C", root.path, "rev-parse", "HEAD"])
        guard status == 0 else { return "unknown" }
        return head.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test(arguments: ["attestd", "attestctl", "attest-sim"])
    func versionPrintsTheReleaseAndTheCommit(_ tool: String) throws {
        let binary = Self.binaries.appendingPathComponent(tool).path
        let (status, stdout) = try ToolShapeTests.run(binary, ["--version"])
        #expect(status == 0, "\(tool) --version exited \(status)")
        let line = stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(!line.contains("\n") && !line.contains("{"), "one plain line, not a JSON error or a usage text: \(line)")
        let commit = try Self.expectedCommit(), version = try Self.version()
        // Built from this tree: its commit, "-dirty" when the build saw uncommitted changes.
        #expect(line == "\(tool) \(version) (commit \(commit))" || line == "\(tool) \(version) (commit \(commit)-dirty)",
                "\(line): run scripts/embed-version.sh (make does)")
    }

    @Test func attestctlTakesVersionAfterItsGlobalOptionsToo() throws {
        let (status, stdout) = try ToolShapeTests.run(AdminCommandTests.binary, ["--db", "/nonexistent/x.sqlite", "--version"])
        #expect(status == 0)
        let version = try Self.version()
        #expect(stdout.hasPrefix("attestctl \(version) (commit "))
    }

    @Test func theVersionHeaderIsVERSION() throws {
        let header = try String(contentsOf: Self.root.appendingPathComponent("Sources/CBuildInfo/version.h"), encoding: .utf8)
        let version = try Self.version()
        #expect(header.contains("#define ATTEST_VERSION \"\(version)\""), "run scripts/embed-version.sh")
    }

    /// Every migration of both dialects is named in CHANGELOG.md, under a version heading, and the
    /// newest heading is VERSION.
    @Test func theChangelogRecordsEveryMigration() throws {
        let changelog = try String(contentsOf: Self.root.appendingPathComponent("CHANGELOG.md"), encoding: .utf8)
        let headings = changelog.split(separator: "\n").filter { $0.hasPrefix("## ") }, version = try Self.version()
        #expect(headings.first?.hasPrefix("## \(version)") == true, "CHANGELOG.md's newest section is not VERSION: \(headings.first ?? "none")")
        for dialect in ["sqlite", "postgres"] {
            let files = try FileManager.default.contentsOfDirectory(atPath: Self.root.appendingPathComponent("Migrations/\(dialect)").path)
                .filter { $0.hasSuffix(".sql") }
            #expect(!files.isEmpty)
            for file in files {
                #expect(changelog.contains(String(file.dropLast(4))), "CHANGELOG.md does not record Migrations/\(dialect)/\(file)")
            }
        }
    }

    // MARK: --help

    /// Every command and subcommand, with what its help must begin with.
    static let commands: [[String]] = [
        ["init"], ["migrate"], ["backup"], ["members", "add"], ["members", "list"], ["members", "remove"], ["console-login"],
        ["workspaces", "create"], ["workspaces", "show"], ["workspaces", "set-upstream-key"], ["workspaces", "set-upstream-bedrock"],
        ["workspaces", "set-upstream-vertex"], ["workspaces", "bind-upstream-settings"], ["cloud-endpoints", "show"], ["cloud-endpoints", "allow"],
        ["apple-keys", "set"], ["apple-keys", "list"], ["integrations", "create"], ["integrations", "update"], ["integrations", "list"],
        ["integrations", "show"], ["integrations", "revoke"], ["devices", "list"], ["devices", "show"], ["audit"], ["usage"],
        ["secrets", "rotate"], ["secrets", "finish-rotation"], ["secrets", "status"],
        ["verify", "attestation"], ["verify", "assertion"], ["verify", "receipt"],
    ]

    /// The commands a help text describes: the words after `attestctl` on each line that begins an entry.
    static func described(_ help: String) -> [[String]] {
        help.split(separator: "\n").compactMap { line -> [String]? in
            let body = line.hasPrefix("usage: ") ? line.dropFirst(7) : line.drop { $0 == " " }
            guard line.hasPrefix("usage: attestctl ") || (line.hasPrefix("       attestctl ")) else { return nil }
            return body.split(separator: " ").dropFirst().prefix(2)
                .prefix { $0.first?.isLowercase == true && $0.allSatisfy { $0.isLowercase || $0 == "-" } }.map(String.init)
        }
    }

    @Test(arguments: commands)
    func aSubcommandsHelpDescribesItAlone(_ command: [String]) throws {
        let (status, stdout) = try ToolShapeTests.run(AdminCommandTests.binary, command + ["--help"])
        #expect(status == 0)
        #expect(stdout.hasPrefix("usage: attestctl \(command.joined(separator: " "))"), "\(command): \(stdout.prefix(200))")
        let entries = Self.described(stdout)
        #expect(entries.allSatisfy { $0 == command || (command.count == 1 && $0.first == command[0]) }, "\(command) --help also describes \(entries)")
        // -h is the same.
        #expect(try ToolShapeTests.run(AdminCommandTests.binary, command + ["-h"]).1 == stdout)
    }

    @Test func consoleLoginHelpIsAFewLinesNotTheWholeTool() throws {
        let (status, stdout) = try ToolShapeTests.run(AdminCommandTests.binary, ["console-login", "--help"])
        #expect(status == 0)
        let lines = stdout.split(separator: "\n")
        #expect(lines.count <= 12, "\(lines.count) lines:\n\(stdout)")
        for other in ["integrations create", "workspaces set-upstream", "apple-keys", "usage [--workspace"] {
            #expect(!stdout.contains(other))
        }
        // The policy's options are explained where they are taken: with create and update, not with list.
        #expect(try ToolShapeTests.run(AdminCommandTests.binary, ["integrations", "create", "--help"]).1.contains("--monthly-token-budget N"))
        #expect(try ToolShapeTests.run(AdminCommandTests.binary, ["integrations", "update", "--help"]).1.contains("--min-bundle-version V"))
        #expect(!(try ToolShapeTests.run(AdminCommandTests.binary, ["integrations", "list", "--help"]).1.contains("--monthly-token-budget")))
    }

    /// A group's help lists its subcommands, and the tool's own help every group.
    @Test func aGroupsHelpListsItsSubcommands() throws {
        let integrations = Self.described(try ToolShapeTests.run(AdminCommandTests.binary, ["integrations", "--help"]).1)
        #expect(Set(integrations.map { $0.joined(separator: " ") })
                == ["integrations create", "integrations update", "integrations list", "integrations show", "integrations revoke"])
        let (status, top) = try ToolShapeTests.run(AdminCommandTests.binary, ["--help"])
        #expect(status == 0)
        for group in Set(Self.commands.map(\.[0])) {
            #expect(top.contains(group), "attestctl --help does not mention \(group)")
        }
    }
}
