import Foundation
import Testing
import UpstreamStub

/// `docs/deploying.md` as an operator follows it: every `attestctl`, `openssl` and `promtool` line
/// of its `sh` blocks runs, in order, with the system paths moved into a temporary directory and
/// an attestd started with the shipped unit's own flags; every other line names only files that
/// exist here (the unit, nginx and the rules are run by their own suites).
@Suite struct DeployingGuideTests {
    static let guide = ServerProcess.packageRoot.appendingPathComponent("docs/deploying.md").path

    /// The lines of the guide's `sh` blocks, in order.
    static func commands() throws -> [String] {
        let text = try String(contentsOfFile: guide, encoding: .utf8)
        var lines: [String] = [], inBlock = false
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("```") {
                inBlock = line == "```sh"
                continue
            }
            if inBlock, !line.trimmingCharacters(in: .whitespaces).isEmpty { lines.append(String(line)) }
        }
        return lines
    }

    /// Words as a POSIX shell splits a line without expansions: spaces, and double quotes.
    static func words(_ line: String) -> [String] {
        var words: [String] = [], current = "", quoted = false, started = false
        for character in line {
            if character == "\"" {
                quoted.toggle()
                started = true
            } else if character == " " && !quoted {
                if started { words.append(current) }
                current = ""
                started = false
            } else {
                current.append(character)
                started = true
            }
        }
        if started { words.append(current) }
        return words
    }

    @Test func everyCommandOfTheGuideRunsInOrder() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("deploying-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        let moved = [("/var/lib/attestd", "state"), ("/var/backups/attestd", "backups"), ("/etc/ssl/attestd", "ssl")]
        func relocate(_ line: String) -> String {
            moved.reduce(line) { $0.replacingOccurrences(of: $1.0, with: root.appendingPathComponent($1.1).path) }
        }
        let lines = try Self.commands()
        var server: ServerProcess?
        defer { server?.stop() }
        var ran: [String] = []
        for original in lines {
            var words = Self.words(relocate(original))
            if words.starts(with: ["sudo", "-u", "attestd"]) { words.removeFirst(3) }
            guard let command = words.first else { continue }
            switch command {
            case "attestctl":
                let (status, output) = try ServerProcess.attestctl(Array(words.dropFirst()))
                #expect(status == 0, "\(original)\n\(output)")
                ran.append(words.prefix(3).joined(separator: " "))
                if words.dropFirst().first == "backup", let to = words.firstIndex(of: "--to").map({ words[$0 + 1] }) {
                    #expect(FileManager.default.fileExists(atPath: to), "\(original): no copy at \(to)")
                }
            case "openssl", "promtool":
                let (status, output) = try runCombined("/usr/bin/\(command)", Array(words.dropFirst()), in: ServerProcess.packageRoot)
                #expect(status == 0, "\(original)\n\(output)")
                ran.append(command)
            case "systemctl" where words.contains("attestd") && words.contains("--now"):
                // The service as the unit starts it: its flags, the test's own ports.
                server = try ServerProcess(db: root.appendingPathComponent("state/attestd.sqlite").path, extraArguments: try Self.unitFlags(),
                                           trustingTestAuthority: false)
                ran.append("service")
            case "chmod":
                let (status, output) = try runCombined("/usr/bin/chmod", Array(words.dropFirst()))
                #expect(status == 0, "\(original)\n\(output)")
            case "install" where words.dropFirst().first == "-d":
                // The directories, without the owner a test cannot give them.
                for path in words.dropFirst() where path.hasPrefix("/") {
                    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
                }
            default:
                // Not runnable here (a system user, systemctl, apt-get): the files it names exist.
                for word in words where word.hasPrefix("deploy/") || word.hasPrefix(".build/") {
                    let path = ServerProcess.packageRoot.appendingPathComponent(word.hasPrefix(".build/release/") ? word.replacingOccurrences(of: "release", with: "debug") : word).path
                    #expect(FileManager.default.fileExists(atPath: path), "\(original): \(word) is missing")
                }
            }
        }
        // The guide's steps, all of them: init, sign-in, an integration, a backup, a rotation, alerts.
        for expected in ["service", "attestctl init --db", "attestctl console-login --db", "attestctl integrations create", "attestctl backup --db",
                         "attestctl secrets status", "attestctl secrets rotate", "attestctl secrets finish-rotation", "openssl", "promtool"] {
            #expect(ran.contains(expected), "the guide no longer runs \(expected): \(ran)")
        }
        #expect(server?.log.contains("\"event\":\"listening\"") == true)
        // The key the guide made is the one everything is sealed under, mode 0600.
        let key = root.appendingPathComponent("state/attestd.key").path
        #expect((try FileManager.default.attributesOfItem(atPath: key)[.posixPermissions] as? Int) == 0o600)
    }

    /// The unit's `ExecStart=` flags, without the database and the listeners (the test's own).
    static func unitFlags() throws -> [String] {
        let unit = try String(contentsOfFile: ServerProcess.packageRoot.appendingPathComponent("deploy/systemd/attestd.service").path, encoding: .utf8)
        let start = try #require(unit.range(of: "ExecStart=")), end = try #require(unit.range(of: "\nRestart=", range: start.upperBound..<unit.endIndex))
        let words = unit[start.upperBound..<end.lowerBound].replacingOccurrences(of: "\\\n", with: " ").split(separator: " ").map(String.init)
        var flags: [String] = [], index = 2   // after "/usr/local/bin/attestd serve"
        while index < words.count {
            if ["--db", "--listen", "--admin-listen"].contains(words[index]) { index += 2; continue }
            flags.append(words[index])
            index += 1
        }
        return flags
    }
}
