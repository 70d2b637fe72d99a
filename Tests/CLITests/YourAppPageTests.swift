import Foundation
import Testing

/// `docs/your-app.md` as an app developer follows it: a throwaway package whose `Package.swift` is
/// the page's, depending on this repository through a folder named as the page names it, with the
/// page's `AttestClient` code as its sources, built once with `swift build`. The snippets are read
/// from the markdown, so the page and what is compiled cannot drift apart.
@Suite struct YourAppPageTests {
    static let root = AdminCommandTests.packageRoot
    static let page = root.appendingPathComponent("docs/your-app.md")

    /// The page's ```swift blocks, in order.
    static func swiftBlocks() throws -> [String] {
        let text = try String(contentsOf: page, encoding: .utf8)
        var blocks: [String] = [], current: [Substring]? = nil
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if current == nil, trimmed == "```swift" {
                current = []
            } else if current != nil, trimmed == "```" {
                blocks.append(current!.joined(separator: "\n"))
                current = nil
            } else if current != nil {
                current!.append(line)
            }
        }
        return blocks
    }

    /// The whole manifest the page gives for `AttestClient`, and the code that uses it.
    static func snippets() throws -> (manifest: String, sources: [String]) {
        let blocks = try swiftBlocks()
        let manifests = blocks.filter { $0.contains("let package = Package(") && $0.contains("AttestClient") }
        let sources = blocks.filter { $0.contains("import AttestClient") }
        #expect(manifests.count == 1, "docs/your-app.md should give one Package.swift for AttestClient")
        #expect(!sources.isEmpty, "docs/your-app.md shows no code that imports AttestClient")
        return (try #require(manifests.first), sources)
    }

    /// The folder name the manifest's path dependency names (`.package(path: "../NAME")`).
    static func dependencyFolder(_ manifest: String) throws -> String {
        let start = try #require(manifest.range(of: ".package(path: \"../"), "the manifest has no .package(path: \"../…\")")
        let rest = manifest[start.upperBound...]
        let end = try #require(rest.firstIndex(of: "\""))
        return String(rest[..<end])
    }

    @Test func theManifestNamesTheDependencyAfterItsFolder() throws {
        let (manifest, _) = try Self.snippets()
        let folder = try Self.dependencyFolder(manifest)
        // SwiftPM's identity for a path dependency is its last path component; the manifest's
        // `name:` (AppAttestService) is not accepted as `package:`.
        #expect(manifest.contains(".product(name: \"AttestClient\", package: \"\(folder)\")"))
        #expect(!manifest.contains("package: \"AppAttestService\""))
        let development = try String(contentsOf: Self.root.appendingPathComponent("docs/development.md"), encoding: .utf8)
        #expect(!development.contains("package: \"AppAttestService\""), "docs/development.md still names the package by its manifest name")
    }

    /// The two types the page's code makes on a device, which Linux lacks, are stood in for below
    /// with the initialisers AttestClient declares; and the page's account of the Keychain is the code's.
    @Test func theStandInsMatchTheRealInitialisers() throws {
        let attester = try String(contentsOf: Self.root.appendingPathComponent("Sources/AttestClient/DeviceAttester.swift"), encoding: .utf8)
        let store = try String(contentsOf: Self.root.appendingPathComponent("Sources/AttestClient/CredentialStore.swift"), encoding: .utf8)
        #expect(attester.contains("public struct DeviceCheckAttester: DeviceAttester {\n    public init() {}"))
        #expect(store.contains("public final class KeychainCredentialStore: CredentialStore {"))
        #expect(store.contains("public init(service: String = \"com.anthropic.app-attest\", accessGroup: String? = nil)"))
        // And the page tells the truth about where the token lives.
        let text = try String(contentsOf: Self.page, encoding: .utf8)
        #expect(text.contains("`com.anthropic.app-attest`") && text.contains("`<client ID>.token`"))
        #expect(store.contains("account: \"\\(clientID).token\"") && store.contains("kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly"))
    }

    /// One `swift build` of a package made of the page's snippets. On Linux, DeviceCheck and the
    /// Keychain do not exist: `DeviceCheckAttester` and `KeychainCredentialStore` are stood in for
    /// with the real initialisers (checked above), and URLSession comes from FoundationNetworking.
    @Test(.enabled(if: Self.swift != nil, "no `swift` on PATH: the page's snippets cannot be compiled here"))
    func aPackageMadeOfThePageBuildsAgainstThisRepository() throws {
        let (manifest, sources) = try Self.snippets()
        let folder = try Self.dependencyFolder(manifest)
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("your-app-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: work) }
        let app = work.appendingPathComponent("MyApp"), sourcesDirectory = app.appendingPathComponent("Sources/MyApp")
        try FileManager.default.createDirectory(at: sourcesDirectory, withIntermediateDirectories: true)
        // The clone, beside the app, in a folder named as the page names it.
        try FileManager.default.createSymbolicLink(at: work.appendingPathComponent(folder), withDestinationURL: Self.root)
        try Data(manifest.utf8).write(to: app.appendingPathComponent("Package.swift"))
        for (index, source) in sources.enumerated() {
            let text = "#if canImport(FoundationNetworking)\nimport FoundationNetworking\n#endif\n" + source + "\n"
            try Data(text.utf8).write(to: sourcesDirectory.appendingPathComponent("Snippet\(index + 1).swift"))
        }
        try Data(Self.standIns.utf8).write(to: sourcesDirectory.appendingPathComponent("LinuxStandIns.swift"))
        let (status, output) = try Self.run(try #require(Self.swift), ["build", "--package-path", app.path], timeout: 900)
        #expect(status == 0, "the page's package does not build:\n\(output.suffix(6000))")
    }

    static let standIns = """
    #if !canImport(DeviceCheck)
    import AttestClient
    import Foundation
    struct DeviceCheckAttester: DeviceAttester {
        init() {}
        var isSupported: Bool { false }
        func generateKey() async throws -> String { throw AttestClientError.attestationUnsupported }
        func attestKey(_ keyID: String, clientDataHash: Data) async throws -> Data { throw AttestClientError.attestationUnsupported }
        func generateAssertion(_ keyID: String, clientDataHash: Data) async throws -> Data { throw AttestClientError.attestationUnsupported }
    }
    final class KeychainCredentialStore: CredentialStore {
        private let inner = InMemoryCredentialStore()
        init(service: String = "com.anthropic.app-attest", accessGroup: String? = nil) {}
        func keyID(for clientID: String) throws -> String? { try inner.keyID(for: clientID) }
        func setKeyID(_ keyID: String?, for clientID: String) throws { try inner.setKeyID(keyID, for: clientID) }
        func token(for clientID: String) throws -> StoredToken? { try inner.token(for: clientID) }
        func setToken(_ token: StoredToken?, for clientID: String) throws { try inner.setToken(token, for: clientID) }
    }
    #endif
    """

    /// `swift` as the developer's shell finds it.
    static let swift: String? = {
        for directory in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin").split(separator: ":") {
            let candidate = "\(directory)/swift"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }()

    /// Runs to the end (or kills it at `timeout`), output and errors in one file.
    static func run(_ binary: String, _ arguments: [String], timeout: TimeInterval) throws -> (Int32, String) {
        let log = FileManager.default.temporaryDirectory.appendingPathComponent("your-app-build-\(UUID().uuidString).log")
        defer { try? FileManager.default.removeItem(at: log) }
        try Data().write(to: log)
        let handle = try FileHandle(forWritingTo: log)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = arguments
        process.standardOutput = handle
        process.standardError = handle
        let done = DispatchSemaphore(value: 0)
        process.terminationHandler = { _ in done.signal() }
        try process.run()
        if done.wait(timeout: .now() + timeout) == .timedOut {
            process.terminate()
            done.wait()
        }
        try handle.close()
        return (process.terminationStatus, (try? String(contentsOf: log, encoding: .utf8)) ?? "")
    }
}
