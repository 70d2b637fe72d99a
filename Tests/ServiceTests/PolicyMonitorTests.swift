import Foundation
import Testing
import UpstreamStub

/// Every rule can watch before it refuses, on the shipped binaries: the same traffic under
/// `monitor` refuses nothing and counts, by rule, exactly what `enforce` then refuses; for the
/// relay's rules (attestd relaying to the stub upstream) and for device posture at registration
/// (simulated devices from attest-sim). Read back with `attestctl usage --by rule --json`.
@Suite(.serialized) struct PolicyMonitorTests {
    typealias Fixture = RelayTests.Fixture

    /// `usage --by rule --json` for one integration: rule → (mode, refused, would_refuse), summed over days.
    static func ruleCounts(db: String, clientID: String) throws -> [String: (mode: String, refused: Int, wouldRefuse: Int)] {
        let (status, output) = try ServerProcess.attestctl(["usage", "--by", "rule", "--json", "--client-id", clientID, "--db", db])
        guard status == 0 else { throw HTTPTestError("usage --by rule exited \(status): \(output)") }
        var counts: [String: (mode: String, refused: Int, wouldRefuse: Int)] = [:]
        for line in output.split(separator: "\n") {
            let row = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            // The issue's fields, each present with its type.
            let rule = try #require(row["rule"] as? String), mode = try #require(row["mode"] as? String)
            let refused = try #require(row["refused"] as? Int), wouldRefuse = try #require(row["would_refuse"] as? Int)
            #expect((row["day"] as? String)?.count == 10)
            let old = counts[rule] ?? (mode, 0, 0)
            counts[rule] = (mode, old.refused + refused, old.wouldRefuse + wouldRefuse)
        }
        return counts
    }

    /// Polls (the ledger flushes every second) until `done` holds for the counts; the deadline is a failure.
    static func waitForCounts(db: String, clientID: String, timeout: TimeInterval = 10, sourceLocation: SourceLocation = #_sourceLocation,
                              until done: ([String: (mode: String, refused: Int, wouldRefuse: Int)]) -> Bool) async throws
        -> [String: (mode: String, refused: Int, wouldRefuse: Int)] {
        let deadline = Date() + timeout
        while true {
            let counts = try ruleCounts(db: db, clientID: clientID)
            if done(counts) { return counts }
            guard Date() <= deadline else {
                Issue.record("the rule counts never reached what was expected: \(counts)", sourceLocation: sourceLocation)
                return counts
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    static func ctl(_ db: String, _ arguments: [String]) throws -> String {
        let (status, output) = try ServerProcess.attestctl(arguments + ["--db", db])
        guard status == 0 else { throw HTTPTestError("attestctl \(arguments.joined(separator: " ")) exited \(status): \(output)") }
        return output
    }

    /// The traffic both passes send: (body, beta header), each tripping one rule at most.
    static let traffic: [(body: String, beta: String?)] = [
        (RelayTests.request(model: "claude-ok"), nil),
        (RelayTests.request(model: "claude-other"), nil),                       // models
        (RelayTests.request(model: "claude-ok", maxTokens: 101), nil),          // max-tokens
        (RelayTests.request(model: "claude-third"), nil),                       // models
        (RelayTests.request(model: "claude-ok"), "beta-not-listed-2026-01-01"), // betas
        (RelayTests.request(model: "claude-ok", maxTokens: 100), "beta-ok-2026-01-01"),
        (RelayTests.request(model: "claude-ok", maxTokens: 5000), nil),         // max-tokens
        (RelayTests.request(model: "claude-fourth"), nil),                      // models
    ]
    static let expected = ["models": 3, "max-tokens": 2, "betas": 1]

    @Test func relayRulesUnderMonitorRefuseNothingAndCountExactlyWhatEnforceThenRefuses() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        _ = try Self.ctl(fixture.db, ["integrations", "update", fixture.clientA, "--actor", "owner@example.com", "--models", "claude-ok",
                                      "--max-tokens", "100", "--betas", "beta-ok-2026-01-01",
                                      "--rule-mode", "models=monitor", "--rule-mode", "max-tokens=monitor", "--rule-mode", "betas=monitor"])
        let shown = try Self.ctl(fixture.db, ["integrations", "show", fixture.clientA, "--json"])
        #expect(shown.contains(#""monitored_rules":["betas","max-tokens","models"]"#), "\(shown)")

        func send() async throws -> [Int] {
            var statuses: [Int] = []
            for (body, beta) in Self.traffic {
                statuses.append(try await fixture.post(token: fixture.tokenA, body: body, headers: beta.map { ["anthropic-beta": $0] } ?? [:]).status)
            }
            return statuses
        }
        // Monitor: everything goes through to the upstream, as if the rules were absent.
        let watched = try await send()
        #expect(watched == Array(repeating: 200, count: Self.traffic.count), "\(watched)")
        #expect(fixture.stub.requests.count == Self.traffic.count)
        let monitorCounts = try await Self.waitForCounts(db: fixture.db, clientID: fixture.clientA) { counts in
            Self.expected.allSatisfy { counts[$0.key]?.wouldRefuse == $0.value }
        }
        for (rule, count) in Self.expected {
            #expect(monitorCounts[rule]?.wouldRefuse == count, "\(rule)")
            #expect(monitorCounts[rule]?.refused == 0, "\(rule)")
            #expect(monitorCounts[rule]?.mode == "monitor", "\(rule)")
        }
        #expect(Set(monitorCounts.keys) == Set(Self.expected.keys), "no other rule counted anything: \(monitorCounts)")

        // One command switches all three to enforce, audited.
        _ = try Self.ctl(fixture.db, ["integrations", "update", fixture.clientA, "--actor", "owner@example.com",
                                      "--rule-mode", "models=enforce", "--rule-mode", "max-tokens=enforce", "--rule-mode", "betas=enforce"])
        #expect(try Self.ctl(fixture.db, ["audit", "--client-id", fixture.clientA]).contains("integration.rule_modes_updated"))
        let enforced = try await send()
        let refusedNow = enforced.filter { $0 != 200 }.count
        #expect(refusedNow == Self.expected.values.reduce(0, +), "\(enforced)")
        #expect(enforced.filter { $0 == 400 }.count == refusedNow)
        let enforceCounts = try await Self.waitForCounts(db: fixture.db, clientID: fixture.clientA) { counts in
            Self.expected.allSatisfy { counts[$0.key]?.refused == $0.value }
        }
        for (rule, count) in Self.expected {
            // What enforce refused is exactly what monitor said it would.
            #expect(enforceCounts[rule]?.refused == monitorCounts[rule]?.wouldRefuse, "\(rule)")
            #expect(enforceCounts[rule]?.refused == count, "\(rule)")
            #expect(enforceCounts[rule]?.mode == "enforce", "\(rule)")
        }
        // The metrics carry the would-be refusals by rule.
        let metrics = String(decoding: try await TestHTTP(baseURL: fixture.server.adminBaseURL).send("GET", "/metrics").body, as: UTF8.self)
        #expect(metrics.contains(#"attestd_policy_would_refuse_total{rule="models"} 3"#), "\(metrics.split(separator: "\n").filter { $0.contains("would_refuse") })")
    }

    @Test func aMonitoredDevicePostureRuleAdmitsAtRegistrationAndCountsWhatEnforceThenRefuses() async throws {
        let deployment = try DevicePolicyEndToEndTests.Deployment(["--min-bundle-version", "2.0", "--platforms", "ios"])
        try deployment.update(["--rule-mode", "min-bundle-version=monitor", "--rule-mode", "platforms=monitor"])
        // Each device trips one rule at most: two too old, one a Mac, two fine.
        let devices: [[String]] = [["--bundle-version", "1.9"], ["--bundle-version", "2.0"], ["--platform", "macos"],
                                   ["--bundle-version", "1.0"], ["--bundle-version", "3.1"]]
        for flags in devices {
            #expect(try deployment.register(flags).ok, "monitor admits \(flags)")
        }
        let expected = ["min-bundle-version": 2, "platforms": 1]
        let monitorCounts = try await Self.waitForCounts(db: deployment.db, clientID: deployment.clientID) { counts in
            expected.allSatisfy { counts[$0.key]?.wouldRefuse == $0.value }
        }
        #expect(Set(monitorCounts.keys) == Set(expected.keys), "\(monitorCounts)")
        #expect(monitorCounts.values.allSatisfy { $0.refused == 0 && $0.mode == "monitor" }, "\(monitorCounts)")

        try deployment.update(["--rule-mode", "min-bundle-version=enforce", "--rule-mode", "platforms=enforce"])
        let admitted = try devices.map { try deployment.register($0).ok }
        #expect(admitted == [false, true, false, false, true], "\(admitted)")
        let enforceCounts = try await Self.waitForCounts(db: deployment.db, clientID: deployment.clientID) { counts in
            expected.allSatisfy { counts[$0.key]?.refused == $0.value }
        }
        for (rule, count) in expected {
            #expect(enforceCounts[rule]?.refused == monitorCounts[rule]?.wouldRefuse, "\(rule)")
            #expect(enforceCounts[rule]?.refused == count && enforceCounts[rule]?.mode == "enforce", "\(rule)")
        }
    }

    @Test func aBadRuleModeIsRefusedWithTheRulesNamed() throws {
        let deployment = try DevicePolicyEndToEndTests.Deployment()
        for bad in ["nonsense=monitor", "models=watch", "models"] {
            let (status, output) = try ServerProcess.attestctl(["integrations", "update", deployment.clientID, "--db", deployment.db,
                                                                "--actor", "owner@example.com", "--rule-mode", bad])
            #expect(status != 0 && output.contains("min-bundle-version") && output.contains("RULE=monitor"), "\(bad): \(output)")
        }
    }
}
