import AppAttest
import CommandLineSupport
import Foundation
import HTTPClient
import ProcessCPU
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `attest-sim load`: N simulated devices (in-memory test-authority keys) doing real token
/// exchanges against a running server (see `LoadRun`), over the small keep-alive HTTP/1.1
/// client of `HTTPClient`, so that the generator's own CPU stays small and is reported apart.
enum LoadCommand {
    static let usage = """
        usage: attest-sim load --base-url URL[,URL…] --client-id CLID --devices N --seconds S [--concurrency C] [--app-id TEAMID.bundle] [--cpu-of PID]…
          Registers N simulated devices (test authority: the server must trust Fixtures/test-authority/root.pem),
          then refreshes their tokens by assertion for S seconds with at most C requests in flight (default N).
          Several base URLs (comma-separated) are used round-robin by the workers, as behind a load balancer.
          Default --app-id: \(defaultAppID). http only.
          --cpu-of PID (repeatable, Linux): also report that process's CPU, with its children's, over the refresh
          phase alone (watched_refresh_cpu_seconds, and watched_refresh_cpu_seconds_pid_PID for each), beside the
          generator's own (loadgen_refresh_cpu_seconds).
        """
    static let defaultAppID = "ABCDE12345.com.example.app"
    /// A stalled request gives up after this long, so the run always ends by itself.
    static let socketTimeout: TimeInterval = 5

    static func run(_ argv: [String]) throws -> Int32 {
        let arguments = try Arguments(argv, options: ["base-url", "client-id", "devices", "seconds", "concurrency", "app-id", "cpu-of"],
                                      flags: ["help"])
        if arguments.has("help") { print(usage); return 0 }
        guard arguments.positional.isEmpty else { throw UsageError("unexpected argument \(arguments.positional[0])\n\(usage)") }
        var targets: [HTTPTarget] = []
        for text in try arguments.required("base-url").split(separator: ",") {
            let url = try SimulateDeviceCommand.parseBaseURL(String(text), option: "base-url")
            guard url.scheme?.lowercased() == "http" else { throw UsageError("--base-url: load speaks plain http only") }
            do { targets.append(try HTTPTarget(url)) } catch { throw UsageError("--base-url: \(error)") }
        }
        let clientID = try arguments.required("client-id")
        guard !clientID.isEmpty else { throw UsageError("--client-id is empty") }
        guard arguments.has(option: "devices") else { throw UsageError("--devices is required") }
        guard arguments.has(option: "seconds") else { throw UsageError("--seconds is required") }
        let devices = try arguments.integer("devices", range: 1...100_000)!
        let seconds = try arguments.integer("seconds", range: 1...3600)!
        let concurrency = try arguments.integer("concurrency", default: devices, range: 1...4096)!
        let appText = try arguments.value("app-id") ?? defaultAppID
        guard let appID = AppID(appText) else { throw UsageError("--app-id must be TEAMID.bundle.id, got \(appText)") }
        var watched: [Int32] = []
        for text in arguments.all("cpu-of") {
            guard let pid = Int32(text), pid > 0 else { throw UsageError("--cpu-of takes a process ID, got \(text)") }
            guard WatchedProcesses.cpuSeconds(of: pid) != nil else { throw UsageError("--cpu-of \(pid): no such process (or no /proc)") }
            watched.append(pid)
        }

        #if DEBUG
        FileHandle.standardError.write(Data("warning: debug build; the load generator spends more CPU than it would in release (-c release)\n".utf8))
        #endif
        // A peer closing a keep-alive connection must be an error on that request, not the end of the process.
        signal(SIGPIPE, SIG_IGN)
        let run = try LoadRun(targets: targets, clientID: clientID, appID: appID, deviceCount: devices,
                              workers: min(concurrency, devices), seconds: TimeInterval(seconds), socketTimeout: socketTimeout,
                              watched: WatchedProcesses(pids: watched))
        let report = run.execute()
        print(report.text, terminator: "")
        if let lastError = report.lastError {
            FileHandle.standardError.write(Data("attest-sim load: last error: \(lastError)\n".utf8))
        }
        if let summary = report.failureSummary {
            FileHandle.standardError.write(Data("attest-sim load: FAILED: \(summary)\n".utf8))
        }
        return report.succeeded ? 0 : 1
    }
}
