import Foundation
import Synchronization

/// The real `attestd` binary, started as a child process on a free loopback port.
final class ServerProcess: @unchecked Sendable {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let attestd = packageRoot.appendingPathComponent(".build/debug/attestd").path
    static let attestctl = packageRoot.appendingPathComponent(".build/debug/attestctl").path
    static let attestSim = packageRoot.appendingPathComponent(".build/debug/attest-sim").path
    static let testAuthorityRoot = packageRoot.appendingPathComponent("Fixtures/test-authority/root.pem").path

    let process = Process()
    private let lock = NSLock()
    private var output = Data()
    private(set) var port: UInt16 = 0

    /// Starts `attestd serve` and waits for its `listening` log line.
    /// - Parameter trustingTestAuthority: false starts it as `make run` does, trusting Apple's root only.
    init(db: String, extraArguments: [String] = [], environment: [String: String] = [:], trustingTestAuthority: Bool = true) throws {
        process.executableURL = URL(fileURLWithPath: Self.attestd)
        if !environment.isEmpty { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        // The admin listener on a port of its own (its default, 9090, would clash between instances).
        let admin = extraArguments.contains("--admin-listen") ? [] : ["--admin-listen", "127.0.0.1:0"]
        let anchor = trustingTestAuthority ? ["--trust-anchor", Self.testAuthorityRoot] : []
        process.arguments = ["serve", "--db", db, "--listen", "127.0.0.1:0"] + anchor + admin + extraArguments
        let pipe = Pipe()
        process.standardError = pipe
        process.standardOutput = FileHandle.nullDevice
        pipe.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            guard let self, !data.isEmpty else { return }
            self.lock.lock()
            self.output.append(data)
            self.lock.unlock()
        }
        try process.run()
        let deadline = Date() + 30
        while Date() < deadline {
            if let port = listeningPort() { self.port = port; return }
            guard process.isRunning else { throw HTTPTestError("attestd exited: \(log)") }
            Thread.sleep(forTimeInterval: 0.02)
        }
        process.terminate()
        throw HTTPTestError("attestd did not start listening: \(log)")
    }

    var log: String {
        lock.lock(); defer { lock.unlock() }
        return String(decoding: output, as: UTF8.self)
    }

    var baseURL: URL { URL(string: "http://127.0.0.1:\(port)")! }

    /// The admin listener's port (0 when it has none), from its `admin_listening` log line.
    var adminPort: UInt16 { port(ofEvent: "admin_listening") ?? 0 }
    var adminBaseURL: URL { URL(string: "http://127.0.0.1:\(adminPort)")! }

    /// Whether the log shows `text` within `timeout` (it arrives through a pipe, a little after
    /// the response that it describes).
    func waitForLog(containing text: String, timeout: TimeInterval = 3) async -> Bool {
        let deadline = Date() + timeout
        while Date() < deadline {
            if log.contains(text) { return true }
            try? await Task.sleep(nanoseconds: 10_000_000)
        }
        return log.contains(text)
    }

    private func listeningPort() -> UInt16? { port(ofEvent: "listening") }

    private func port(ofEvent event: String) -> UInt16? {
        for line in log.split(separator: "\n") where line.contains("\"event\":\"\(event)\"") {
            guard let data = line.data(using: .utf8), let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
                  let address = object["address"] as? String, let colon = address.lastIndex(of: ":") else { continue }
            return UInt16(address[address.index(after: colon)...])
        }
        return nil
    }

    func kill9() {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    func stop() {
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
    }

    deinit { stop() }

    /// Runs attestctl with arguments; returns (status, stdout).
    @discardableResult
    static func attestctl(_ arguments: [String]) throws -> (Int32, String) {
        try run(attestctl, arguments)
    }

    /// Runs the developer tool attest-sim with arguments; returns (status, stdout).
    @discardableResult
    static func attestSim(_ arguments: [String]) throws -> (Int32, String) {
        try run(attestSim, arguments)
    }

    static func run(_ executable: String, _ arguments: [String]) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        // Both pipes drained at once, so that neither can fill up and stall the tool.
        let errors = Mutex(Data())
        let reader = Thread { errors.withLock { $0 = err.fileHandleForReading.readDataToEndOfFile() } }
        reader.start()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        while reader.isExecuting || !reader.isFinished { usleep(1000) }
        // A failure says why: its stderr follows what it printed.
        let text = String(decoding: data, as: UTF8.self)
        return (process.terminationStatus, process.terminationStatus == 0 ? text : text + errors.withLock { String(decoding: $0, as: UTF8.self) })
    }
}
