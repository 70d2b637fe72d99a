import Foundation
import Testing
import UpstreamClient
#if canImport(Glibc)
import Glibc
#endif

/// Opt-in measurement (not part of `make test`): N concurrent slow streams from one client to the
/// stub executable in another process, reporting this process's RSS, threads and CPU.
///
///     UPSTREAM_BENCH_STREAMS=1000 UPSTREAM_BENCH_SECONDS=30 \
///       swift test --skip-build --filter ConcurrencyBenchmark
@Suite(.serialized)
struct ConcurrencyBenchmark {
    static let environment = ProcessInfo.processInfo.environment

    @Test(.enabled(if: environment["UPSTREAM_BENCH_STREAMS"] != nil))
    func concurrentSlowStreams() async throws {
        let streams = Int(Self.environment["UPSTREAM_BENCH_STREAMS"] ?? "") ?? 1000
        let seconds = Int(Self.environment["UPSTREAM_BENCH_SECONDS"] ?? "") ?? 30
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let release = root.appendingPathComponent(".build/release/upstream-stub").path
        let binary = FileManager.default.isExecutableFile(atPath: release) ? release : root.appendingPathComponent(".build/debug/upstream-stub").path

        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["--stream-seconds", "\(seconds)", "--deltas", "10"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        defer {
            process.terminate()
            process.waitUntilExit()
        }
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let more = output.fileHandleForReading.availableData
            if more.isEmpty { break }
            line += more
        }
        let baseURL = try #require(jsonObject(String(decoding: line, as: UTF8.self))?["base_url"] as? String)

        let client = try UpstreamClient(UpstreamConfiguration(baseURL: baseURL))
        defer { client.shutdown() }
        let before = Self.processStatus()
        let cpuBefore = Self.cpuSeconds()
        let started = ContinuousClock.now
        let recorders = (0..<streams).map { _ in Recorder() }
        for recorder in recorders { client.start(messagesRequest(stream: true), delegate: recorder) }
        try await Task.sleep(for: .seconds(Double(seconds) / 2))
        let during = Self.processStatus()
        #expect(client.activeTransfers == streams)
        #expect(await waitFor(timeout: .seconds(seconds * 2 + 30)) { recorders.allSatisfy(\.finished) })
        let elapsed = started.duration(to: .now)
        let failures = recorders.filter { $0.snapshot.error != nil || !$0.text.contains("message_stop") }.count
        #expect(failures == 0)
        let rssPerStream = Double(during.rssKiB - before.rssKiB) / Double(streams)
        print("""
            {"streams":\(streams),"seconds":\(seconds),"elapsed":"\(elapsed)","failures":\(failures),\
            "rss_kib_before":\(before.rssKiB),"rss_kib_during":\(during.rssKiB),"rss_kib_per_stream":\(rssPerStream),\
            "threads_before":\(before.threads),"threads_during":\(during.threads),\
            "client_cpu_seconds":\(Self.cpuSeconds() - cpuBefore)}
            """)
    }

    static func processStatus() -> (rssKiB: Int, threads: Int) {
        let text = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        func value(_ key: String) -> Int {
            let line = text.split(separator: "\n").first { $0.hasPrefix(key + ":") } ?? ""
            return Int(line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first ?? "") ?? -1
        }
        return (value("VmRSS"), value("Threads"))
    }

    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
            + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }
}
