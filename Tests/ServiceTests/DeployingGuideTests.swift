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
        // The package's copies of the shipped files are the repository's deploy/ (make install puts them there).
        func relocate(_ line: String) -> String {
            moved.reduce(line) { $0.replacingOccurrences(of: $1.0, with: root.appendingPathComponent($1.1).path) }
                .replacingOccurrences(of: "/usr/share/attestd/", with: "deploy/")
        }
        /// Paths a line may change: only the moved directories, inside this test's own.
        func ownPaths(_ words: [String]) -> Bool {
            words.filter { $0.hasPrefix("/") }.allSatisfy { $0.hasPrefix(root.path + "/") }
        }
        func startService() throws -> ServerProcess {
            try ServerProcess(db: root.appendingPathComponent("state/attestd.sqlite").path, extraArguments: try Self.unitFlags(), trustingTestAuthority: false)
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
            case "systemctl" where words.contains("attestd") && (words.contains("--now") || words.contains("start")):
                // The service as the unit starts it: its flags, the test's own ports.
                #expect(server == nil, "\(original): the service is already running")
                server = try startService()
                ran.append(words.contains("--now") ? "service" : "service start")
            case "systemctl" where words.contains("attestd") && words.contains("stop"):
                #expect(server != nil, "\(original): the service is not running")
                server?.stop()
                server = nil
                ran.append("service stop")
            case "curl":
                // Against the service as the guide started it (its public listener, the test's port).
                let running = try #require(server, "\(original): no service is running")
                let arguments = words.dropFirst().map { $0.replacingOccurrences(of: "http://127.0.0.1:8080", with: "http://127.0.0.1:\(running.port)") }
                let (status, output) = try runCombined("/usr/bin/curl", arguments)
                #expect(status == 0, "\(original)\n\(output)")
                ran.append("curl \(words.last.map { URL(string: $0)?.path ?? $0 } ?? "")")
            case "attestd" where words.dropFirst().first == "--version":
                let (status, output) = try runCombined(ServerProcess.attestd, ["--version"])
                #expect(status == 0 && output.hasPrefix("attestd "), "\(original)\n\(output)")
                ran.append("attestd --version")
            case "rm" where ownPaths(words):
                let (status, output) = try runCombined("/usr/bin/rm", Array(words.dropFirst()))
                #expect(status == 0, "\(original)\n\(output)")
                ran.append("rm")
            case "install" where words.dropFirst().first == "-m" && ownPaths(words):
                // A file put in place, without the owner a test cannot give it.
                var arguments = Array(words.dropFirst())
                for option in ["-o", "-g"] { if let i = arguments.firstIndex(of: option) { arguments.removeSubrange(i...(i + 1)) } }
                let (status, output) = try runCombined("/usr/bin/install", arguments)
                #expect(status == 0, "\(original)\n\(output)")
                ran.append("install a file")
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
                for word in words where word.hasPrefix("deploy/") || word.hasPrefix(".build/") || word.hasPrefix("/usr/share/attestd/") {
                    let path = ServerProcess.packageRoot.appendingPathComponent(word.hasPrefix(".build/release/") ? word.replacingOccurrences(of: "release", with: "debug") : word).path
                    #expect(FileManager.default.fileExists(atPath: path), "\(original): \(word) is missing")
                }
            }
        }
        // The guide's steps, all of them: init, sign-in, an integration, a backup, a rotation, alerts.
        for expected in ["service", "attestctl init --db", "attestctl console-login --db", "attestctl integrations create", "attestctl backup --db",
                         "attestctl secrets status", "attestctl secrets rotate", "attestctl secrets finish-rotation", "openssl", "promtool",
                         // The upgrade and the way back: version, backup, stop, migrate, start, readiness, restore.
                         "attestd --version", "service stop", "attestctl migrate --db", "service start", "curl /readyz", "rm", "install a file"] {
            #expect(ran.contains(expected), "the guide no longer runs \(expected): \(ran)")
        }
        #expect(server?.log.contains("\"event\":\"listening\"") == true)
        // The guide ends with the service running on the restored backup, which has what init wrote.
        let (status, members) = try ServerProcess.attestctl(["members", "list", "--db", root.appendingPathComponent("state/attestd.sqlite").path])
        #expect(status == 0 && members.contains("ops@example.com"), "\(members)")
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
