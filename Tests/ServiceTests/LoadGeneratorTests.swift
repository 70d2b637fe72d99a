import Foundation
import Testing

/// `attest-sim load` is a measuring tool: a run in which requests failed must say so and exit
/// non-zero, so that no figure with failures in it is ever quoted.
@Suite(.serialized) struct LoadGeneratorTests {
    @Test func aRunWithFailuresExitsNonZeroAndSaysSo() async throws {
        let run = { (limits: [String]) throws -> (Int32, String) in
            let deployment = try DevicePolicyEndToEndTests.Deployment([], serverArguments: limits)
            return try ServerProcess.attestSim(["load", "--base-url", deployment.server.baseURL.absoluteString, "--client-id", deployment.clientID,
                                                "--devices", "8", "--seconds", "1", "--app-id", "ABCDE12345.com.example.app"])
        }
        let (okStatus, okText) = try run([])
        #expect(okStatus == 0, "\(okText)")
        #expect(okText.contains("result: ok"))
        // Two connections per address for eight devices: most are refused.
        let (failedStatus, failedText) = try run(["--max-connections-per-ip", "2"])
        #expect(failedStatus != 0)
        #expect(failedText.contains("result: FAILED"))
    }
}
