import Foundation
import Lifecycle
import Testing
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// The shipped unit (deploy/systemd/attestd.service) and attestd's side of `Type=notify`.
@Suite(.serialized) struct SystemdTests {
    /// A datagram socket standing in for systemd's notification socket.
    final class NotifySocket {
        let path: String
        let fd: Int32

        init() throws {
            path = FileManager.default.temporaryDirectory.appendingPathComponent("notify-\(UUID().uuidString.prefix(8))").path
            fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8) + [0]) }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            guard fd >= 0, bound == 0 else { throw HTTPTestError("cannot bind \(path)") }
        }

        /// The next datagram, waiting up to `timeout` seconds for it.
        func receive(timeout: Int32 = 30) -> String? {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, timeout * 1000) == 1 else { return nil }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = recv(fd, &buffer, buffer.count, 0)
            return count > 0 ? String(decoding: buffer.prefix(count), as: UTF8.self) : nil
        }

        deinit {
            close(fd)
            unlink(path)
        }
    }

    @Test func attestdSaysReadyOnceItListensAndStoppingWhenItStops() throws {
        let socket = try NotifySocket()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-notify-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let server = try ServerProcess(db: directory.appendingPathComponent("a.sqlite").path, environment: ["NOTIFY_SOCKET": socket.path])
        let ready = try #require(socket.receive())
        #expect(ready.split(separator: "\n").first == "READY=1")
        #expect(ready.contains("STATUS=serving on port \(server.port)"))
        // It was listening when it said so.
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = server.port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let probe = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(probe) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(probe, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        #expect(connected == 0)
        server.stop()   // SIGTERM
        #expect(socket.receive() == "STOPPING=1")
        #expect(socket.receive(timeout: 1) == nil)
    }

    @Test func withoutNotifySocketNothingIsSent() {
        #expect(SystemdNotify.send("READY=1", socketPath: nil) == false)
        #expect(SystemdNotify.send("READY=1", socketPath: "") == false)
        #expect(SystemdNotify.send("READY=1", socketPath: "relative/path") == false)
    }

    @Test func anAbstractSocketNameIsReached() throws {
        let name = "attestd-test-\(UUID().uuidString.prefix(8))"
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = [UInt8(0)] + Array(name.utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)) }
        }
        #expect(bound == 0)
        #expect(SystemdNotify.send("READY=1", socketPath: "@" + name))
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
        #expect(count == 7 && String(decoding: buffer.prefix(max(0, count)), as: UTF8.self) == "READY=1")
    }

    static let unitPath = ServerProcess.packageRoot.appendingPathComponent("deploy/systemd/attestd.service").path

    /// The `[Service]` section's assignments, in order, by key (continuation lines joined).
    static func serviceSettings(_ unit: String) -> [String: [String]] {
        var settings: [String: [String]] = [:], section = "", pending = ""
        for raw in unit.split(separator: "\n", omittingEmptySubsequences: false) {
            let line = pending + raw.trimmingCharacters(in: .whitespaces)
            if line.hasSuffix("\\") { pending = String(line.dropLast()) + " "; continue }
            pending = ""
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") { section = line; continue }
            guard section == "[Service]", let equals = line.firstIndex(of: "=") else { continue }
            settings[String(line[..<equals]), default: []].append(String(line[line.index(after: equals)...]))
        }
        return settings
    }

    /// The sandbox of issue 46: each setting's last assignment (the one systemd keeps) has this value.
    @Test func theShippedUnitKeepsItsSandbox() throws {
        let settings = Self.serviceSettings(try String(contentsOfFile: Self.unitPath, encoding: .utf8))
        for (key, value) in [("ProtectKernelTunables", "yes"), ("ProtectKernelModules", "yes"), ("ProtectControlGroups", "yes"),
                             ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"), ("LockPersonality", "yes"),
                             ("MemoryDenyWriteExecute", "yes"), ("RestrictRealtime", "yes"), ("CapabilityBoundingSet", ""),
                             ("AmbientCapabilities", ""), ("NoNewPrivileges", "yes"), ("SystemCallArchitectures", "native"),
                             ("SystemCallErrorNumber", "EPERM"), ("PrivateUsers", "yes"), ("PrivateMounts", "yes"),
                             ("ProtectProc", "invisible"), ("ProcSubset", "pid"), ("RemoveIPC", "yes"), ("UMask", "0077")] {
            #expect(settings[key]?.last == value, "\(key)=\(value), found \(settings[key] ?? [])")
        }
        // An allow list, then what it takes away (an empty assignment would reset both).
        #expect(settings["SystemCallFilter"] == ["@system-service", "~@privileged"])
    }

    /// systemd-analyze where it can review a unit file offline (systemd 250 and later).
    static let securityAnalysis: String? = {
        guard let analyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first(where: FileManager.default.isExecutableFile),
              let help = try? runCombined(analyze, ["security", "--help"]), help.1.contains("--offline") else { return nil }
        return analyze
    }()

    /// `systemd-analyze security --offline=true` on the unit as it was before this sandbox (commit
    /// 8d8b214), systemd 252: "Overall exposure level for attestd.service: 3.2 OK". The shipped
    /// unit scored 1.2 when it was added.
    static let exposureBeforeSandbox = 3.2

    @Test(.enabled(if: SystemdTests.securityAnalysis != nil, "needs systemd-analyze with `security --offline`"))
    func theShippedUnitIsLessExposedThanBefore() throws {
        let analyze = try #require(Self.securityAnalysis)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("unit-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("attestd.service").path
        try FileManager.default.copyItem(atPath: Self.unitPath, toPath: path)
        let (status, text) = try runCombined(analyze, ["security", "--offline=true", "--no-pager", path], in: directory)
        #expect(status == 0, "\(text)")
        // "→ Overall exposure level for attestd.service: 1.2 OK 🙂"
        let line = try #require(text.split(separator: "\n").first { $0.contains("Overall exposure level for attestd.service:") }, "\(text)")
        let score = try #require(line.split(separator: ":").last?.split(separator: " ").first.flatMap { Double($0) }, "\(line)")
        #expect(score < Self.exposureBeforeSandbox, "\(text)")
    }

    /// The unit as shipped, checked by systemd's own tool with the ExecStart binary pointed at
    /// the one just built (verify refuses a command that does not exist).
    @Test func theShippedUnitVerifies() throws {
        let unit = try String(contentsOfFile: Self.unitPath, encoding: .utf8)
        for setting in ["Type=notify", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "CapabilityBoundingSet=\n",
                        "StateDirectory=attestd", "LimitNOFILE=65536", "User=attestd"] {
            #expect(unit.contains(setting), "\(setting)")
        }
        guard let analyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first(where: FileManager.default.isExecutableFile) else {
            return   // the issue: "where the command exists"
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("unit-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("attestd.service").path
        try unit.replacingOccurrences(of: "/usr/local/bin/attestd", with: ServerProcess.attestd).write(toFile: path, atomically: true, encoding: .utf8)
        let (status, text) = try runCombined(analyze, ["verify", path])
        #expect(status == 0, "\(text)")
    }
}
