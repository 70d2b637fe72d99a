import Foundation
import Testing

/// What the shipped tools are made of: the operator's binary carries no test authority, the
/// client module reaches nothing an iPhone lacks, and every command answers --help.
@Suite struct ToolShapeTests {
    static let root = AdminCommandTests.packageRoot

    @Test func releaseAttestctlHoldsNoPEMPrivateKey() throws {
        // `make test` builds the release attestctl first; a missing binary is a failure, not a skip.
        let release = Self.root.appendingPathComponent(".build/release/attestctl").path
        #expect(FileManager.default.fileExists(atPath: release), "run `swift build -c release --product attestctl` (make test does)")
        for binary in [release, AdminCommandTests.binary] where FileManager.default.fileExists(atPath: binary) {
            #expect(!(try Self.containsPrivateKey(binary)), "\(binary) contains a PEM private key")
        }
        // The developer tool does carry the test authority: the search would find it.
        #expect(try Self.containsPrivateKey(AdminCommandTests.simBinary))
    }

    static func containsPrivateKey(_ path: String) throws -> Bool {
        let bytes = try Data(contentsOf: URL(fileURLWithPath: path))
        for marker in ["-----BEGIN PRIVATE KEY-----", "-----BEGIN EC PRIVATE KEY-----", "PRIVATE KEY-----"] {
            if bytes.range(of: Data(marker.utf8)) != nil { return true }
        }
        return false
    }

    /// The dependency closure of AttestClient, read from the package description: the wire module,
    /// and on Linux only, the crypto module for SHA-256 (CryptoKit provides it on Apple platforms).
    @Test func attestClientReachesOnlyTheWireModuleAndFoundation() throws {
        let description = try Self.describePackage()
        let targets = try #require(description["targets"] as? [[String: Any]])
        var dependencies: [String: [String]] = [:]
        for target in targets {
            guard let name = target["name"] as? String else { continue }
            dependencies[name] = (target["target_dependencies"] as? [String] ?? []) + (target["product_dependencies"] as? [String] ?? [])
        }
        #expect(Set(dependencies["AttestClient"] ?? []) == ["AttestWire", "AttestCrypto"])
        #expect(dependencies["AttestWire"] ?? ["missing"] == [], "the wire module must have no dependencies")
        #expect((description["dependencies"] as? [Any] ?? []).isEmpty, "no package dependencies at all")

        // AttestCrypto (OpenSSL) may only be a Linux-only dependency: check the manifest's condition.
        let manifest = try String(contentsOf: Self.root.appendingPathComponent("Package.swift"), encoding: .utf8)
        let clientTarget = try #require(manifest.range(of: #".target(name: "AttestClient""#))
        let rest = manifest[clientTarget.lowerBound...]
        let declaration = rest[..<(rest.range(of: "]),")?.upperBound ?? rest.endIndex)]
        #expect(declaration.contains(#".target(name: "AttestCrypto", condition: .when(platforms: [.linux]))"#))
        #expect(declaration.components(separatedBy: "AttestCrypto").count == 2, "AttestCrypto appears once, with its condition")

        // And no source file of the module imports anything else.
        let sources = Self.root.appendingPathComponent("Sources/AttestClient")
        let allowed: Set<String> = ["Foundation", "FoundationNetworking", "AttestWire", "AttestCrypto", "CryptoKit",
                                    "Security", "DeviceCheck", "Glibc", "Musl", "Darwin"]
        for file in try FileManager.default.contentsOfDirectory(atPath: sources.path) where file.hasSuffix(".swift") {
            let text = try String(contentsOf: sources.appendingPathComponent(file), encoding: .utf8)
            for line in text.split(separator: "\n") where line.hasPrefix("import ") {
                let module = String(line.dropFirst(7).split(separator: " ").first ?? "")
                #expect(allowed.contains(module), "\(file) imports \(module)")
            }
        }
    }

    /// `swift package describe`, in its own scratch directory so that it never waits for the lock
    /// of the build that is running these tests.
    static func describePackage() throws -> [String: Any] {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("describe-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: scratch) }
        let (status, output) = try run("/usr/bin/env", ["swift", "package", "--package-path", root.path, "--scratch-path", scratch.path,
                                                        "describe", "--type", "json"])
        #expect(status == 0)
        return try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])
    }

    @Test(arguments: [
        (["--help"], "usage: attestctl"), (["init", "--help"], "attestctl init"), (["integrations", "--help"], "integrations create"),
        (["verify", "--help"], "verify attestation"), (["audit", "-h"], "attestctl audit"),
    ])
    func everyAttestctlCommandAnswersHelp(_ arguments: [String], _ expected: String) throws {
        let (status, stdout) = try Self.run(AdminCommandTests.binary, arguments)
        #expect(status == 0)
        #expect(stdout.contains(expected))
    }

    @Test(arguments: [(["--help"], "usage: attest-sim"), (["load", "--help"], "attest-sim load"),
                      (["simulate-device", "--help"], "attest-sim simulate-device"), (["bench", "--help"], "attest-sim bench verify")])
    func everyAttestSimCommandAnswersHelp(_ arguments: [String], _ expected: String) throws {
        let (status, stdout) = try Self.run(AdminCommandTests.simBinary, arguments)
        #expect(status == 0)
        #expect(stdout.contains(expected))
    }

    /// Every attestd option, the ledger's included, is in `attestd serve --help` (on stdout, exit 0).
    @Test(arguments: [["--help"], ["serve", "--help"], ["serve", "--listen", "127.0.0.1:0", "-h"]])
    func attestdAnswersHelpWithEveryOption(_ arguments: [String]) throws {
        let attestd = URL(fileURLWithPath: AdminCommandTests.binary).deletingLastPathComponent().appendingPathComponent("attestd").path
        let (status, stdout) = try Self.run(attestd, arguments)
        #expect(status == 0)
        for option in ["--upstream-url", "--upstream-key-file", "--secrets-key-file", "--admin-listen", "--trusted-proxy", "--head-deadline",
                       "--usage-flush-interval", "--no-usage-ledger", "--shutdown-grace"] {
            #expect(stdout.contains(option), "\(option) missing from attestd \(arguments.joined(separator: " "))")
        }
    }

    @Test func simulationCommandsAreGoneFromAttestctl() throws {
        for command in ["simulate-device", "load", "bench"] {
            #expect(try Self.run(AdminCommandTests.binary, [command, "--help"]).0 == 2)
        }
    }

    static func run(_ binary: String, _ arguments: [String]) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = arguments
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}
