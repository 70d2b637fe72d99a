import Foundation
import Testing

/// `attest-sim load` is a measuring tool: a run in which requests failed must say so and exit
/// non-zero, so that no figure with failures in it is ever quoted.
@Suite(.serialized) struct LoadGeneratorTests {
    @Test func aRunWithFailuresExitsNonZeroAndSaysSo() async throws {
        let run = { (limits: [String]) throws -> (Int32, String) in
            let deployment = try DevicePolicyEndToEndTests.Deployment([], serverArguments: limits)
            return try ServerProcess.attestSim(["load", "--base-url", deployment.server.baseURL.absoluteString, "--client-id", deployment.clientID,
                                                "--devices", "8", "--seconds", "1", "--app-id", "ABCDE12345.com.example.app",
                                                "--cpu-of", "\(deployment.server.process.processIdentifier)"])
        }
        let (okStatus, okText) = try run([])
        #expect(okStatus == 0, "\(okText)")
        #expect(okText.contains("result: ok"))
        // The server's CPU and the generator's, over the refresh phase alone: a server that answered
        // a second of exchanges spent some, and the generator's refresh share is within its whole run.
        let figures = Dictionary(okText.split(separator: "\n").compactMap { line -> (String, Double)? in
            let parts = line.split(separator: " ")
            guard parts.count == 2, let value = Double(parts[1]) else { return nil }
            return (String(parts[0].dropLast()), value)
        }, uniquingKeysWith: { first, _ in first })
        let watched = try #require(figures["watched_refresh_cpu_seconds"], "\(okText)")
        let refresh = try #require(figures["loadgen_refresh_cpu_seconds"]), whole = try #require(figures["loadgen_cpu_seconds"])
        #expect(watched > 0)
        #expect(refresh > 0 && refresh <= whole)
        // Two connections per address for eight devices: most are refused.
        let (failedStatus, failedText) = try run(["--max-connections-per-ip", "2"])
        #expect(failedStatus != 0)
        #expect(failedText.contains("result: FAILED"))
    }

    @Test func watchingAProcessThatIsNotThereIsAUsageError() throws {
        let (status, text) = try ServerProcess.attestSim(["load", "--base-url", "http://127.0.0.1:9", "--client-id", "clid_x",
                                                          "--devices", "1", "--seconds", "1", "--cpu-of", "2147483646"])
        #expect(status != 0)
        #expect(text.contains("--cpu-of 2147483646: no such process"), "\(text)")
    }
}
