import Foundation
import Testing
import UpstreamStub

/// deploy/prometheus/attestd-rules.yml: valid for Prometheus, each alert firing on a series that
/// should fire it and silent on one that should not (attestd-rules.test.yml), and every metric
/// it reads one that attestd exports.
@Suite struct AlertRulesTests {
    static let directory = ServerProcess.packageRoot.appendingPathComponent("deploy/prometheus")

    static func promtool(_ arguments: [String]) throws -> (Int32, String) {
        // Debian's prometheus package, which `make` installs; without it this test fails.
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/promtool") else {
            throw HTTPTestError("/usr/bin/promtool is missing: `make deps` installs Debian's prometheus package")
        }
        return try runCombined("/usr/bin/promtool", arguments, in: directory)
    }

    @Test func theRulesAreValidAndEachAlertFiresOnlyWhenItShould() throws {
        let (checked, checkOutput) = try Self.promtool(["check", "rules", "attestd-rules.yml"])
        #expect(checked == 0, "\(checkOutput)")
        #expect(checkOutput.contains("SUCCESS: 9 rules found"))
        let (tested, testOutput) = try Self.promtool(["test", "rules", "attestd-rules.test.yml"])
        #expect(tested == 0, "\(testOutput)")
        // Every alert has a test case that expects it to fire.
        let rules = try String(contentsOf: Self.directory.appendingPathComponent("attestd-rules.yml"), encoding: .utf8)
        let tests = try String(contentsOf: Self.directory.appendingPathComponent("attestd-rules.test.yml"), encoding: .utf8)
        let alerts = rules.split(separator: "\n").compactMap { line -> String? in
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            return trimmed.hasPrefix("- alert: ") ? String(trimmed.dropFirst(9)) : nil
        }
        #expect(alerts.count == 9)
        for alert in alerts { #expect(tests.contains("alertname: \(alert)\n        exp_alerts:\n          - exp_labels"), "\(alert) never fires in a test") }
        for alert in alerts { #expect(tests.contains("alertname: \(alert)\n        exp_alerts: []"), "\(alert) has no silent case") }
    }

    @Test func everyMetricTheRulesReadIsOneAttestdExports() throws {
        let rules = try String(contentsOf: Self.directory.appendingPathComponent("attestd-rules.yml"), encoding: .utf8)
        let names = Set(rules.matches(of: /attestd_[a-z_]+/).map { String($0.output) })
        #expect(names.count == 7)
        // Exported names: described in the sources (HELP lines), or written by the transport report.
        var sources = ""
        let enumerator = FileManager.default.enumerator(at: ServerProcess.packageRoot.appendingPathComponent("Sources"), includingPropertiesForKeys: nil)
        while let url = enumerator?.nextObject() as? URL {
            if url.pathExtension == "swift" { sources += (try? String(contentsOf: url, encoding: .utf8)) ?? "" }
        }
        for name in names { #expect(sources.contains("\"\(name)\"") || sources.contains("# TYPE \(name) "), "\(name) is not exported") }
    }
}
