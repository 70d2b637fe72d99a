import Foundation
import PostgresTestSupport
import Testing
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// Alerts before the money runs out, on the shipped binaries: attestd relaying to the stub
/// upstream, a budget in money set with attestctl, and a webhook receiver (a Python process on
/// loopback, Tests/Support/cloud-stubs/webhook_receiver.py) that checks each delivery's signature
/// as an operator's receiver would and logs what it got.
@Suite(.serialized) struct BudgetWebhookTests {
    typealias Fixture = RelayTests.Fixture
    typealias Receiver = CloudUpstreamTests.CloudStub

    /// A model the shipped price table prices, so each request costs something.
    static let model = "claude-sonnet-4-6"

    /// A receiver process answering 503 to its first `failFirst` deliveries (and while `failWhile` exists).
    static func receiver(_ directory: URL, failFirst: Int = 0, failWhile: String? = nil) throws -> (Receiver, secretFile: String) {
        let secretFile = directory.appendingPathComponent("webhook-secret-\(UUID().uuidString)").path
        let receiver = try Receiver(script: "webhook_receiver", arguments: ["--secret-file", secretFile, "--fail-first", String(failFirst)]
                                        + (failWhile.map { ["--fail-while-exists", $0] } ?? []), directory: directory)
        return (receiver, secretFile)
    }

    /// `webhooks add --json`; the secret goes to the receiver's file. Returns the endpoint's ID.
    @discardableResult
    static func addWebhook(db: String, extra: [String] = [], url: String, secretFile: String, thresholds: String) throws -> Int {
        let (status, output) = try ServerProcess.attestctl(["webhooks", "add", "--db", db, "--actor", "owner@example.com", "--workspace", "default",
                                                            "--url", url, "--events", "budget.threshold", "--thresholds", thresholds, "--json"] + extra)
        guard status == 0, let record = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any],
              let secret = record["signing_secret"] as? String, let id = record["id"] as? Int else {
            throw HTTPTestError("webhooks add failed: \(output)")
        }
        #expect(secret.hasPrefix("whsec_") && secret.count > 40)
        try Data(secret.utf8).write(to: URL(fileURLWithPath: secretFile))
        return id
    }

    static func webhooks(db: String, extra: [String] = []) throws -> [[String: Any]] {
        let (status, output) = try ServerProcess.attestctl(["webhooks", "list", "--db", db, "--json"] + extra)
        guard status == 0 else { throw HTTPTestError("webhooks list failed: \(output)") }
        return (try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["webhooks"] as? [[String: Any]] ?? []
    }

    /// Polls `webhooks list` until the first endpoint's last delivery is delivered (a deadline is a failure).
    static func waitDelivered(db: String, extra: [String] = [], timeout: TimeInterval = 20,
                              sourceLocation: SourceLocation = #_sourceLocation) async throws -> [String: Any] {
        let deadline = Date() + timeout
        while true {
            let last = try webhooks(db: db, extra: extra).first?["last_delivery"] as? [String: Any] ?? [:]
            if last["state"] as? String == "delivered" { return last }
            guard Date() <= deadline else {
                Issue.record("never delivered: \(last)", sourceLocation: sourceLocation)
                return last
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }

    static func request() -> String { RelayTests.request(model: model) }

    @Test func aSignedDeliveryReachesAReceiverThatFailsTwiceExactlyOnce() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let (receiver, secretFile) = try Self.receiver(fixture.directory, failFirst: 2)
        defer { receiver.stop() }
        // http:// is refused for anything but a loopback address.
        let (refusedStatus, refused) = try ServerProcess.attestctl(["webhooks", "add", "--db", fixture.db, "--actor", "owner@example.com",
                                                                    "--workspace", "default", "--url", "http://example.com/hook",
                                                                    "--events", "budget.threshold"])
        #expect(refusedStatus != 0 && refused.contains("loopback"), "\(refused)")
        try Self.addWebhook(db: fixture.db, url: "http://127.0.0.1:\(receiver.port)/hooks/budget", secretFile: secretFile, thresholds: "80")
        // A budget the first request's cost passes: every threshold is reached at once.
        _ = try UsageTests.ctl(fixture, ["integrations", "update", fixture.clientA, "--actor", "owner@example.com", "--monthly-budget-usd", "0.000001"])
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.request()).status == 200)

        let last = try await Self.waitDelivered(db: fixture.db)
        #expect(last["attempts"] as? Int == 3 && last["last_status"] as? Int == 200, "\(last)")
        let log = receiver.log
        #expect(log.count == 3, "two refused attempts, then the accepted one: \(log)")
        #expect(log.filter { $0["answered"] as? Int == 200 }.count == 1)
        // Every attempt is the same delivery, signed, its body the same event.
        #expect(Set(log.compactMap { $0["delivery"] as? String }) == [last["id"] as? String ?? "?"])
        #expect(log.allSatisfy { $0["signature_ok"] as? Bool == true }, "\(log)")
        #expect(log.allSatisfy { ($0["timestamp_skew"] as? Double ?? 99) < 60 && $0["event"] as? String == "budget.threshold"
                                 && $0["path"] as? String == "/hooks/budget" && $0["content_type"] as? String == "application/json" })
        let body = try #require(log.last?["body"] as? [String: Any])
        let data = try #require(body["data"] as? [String: Any])
        #expect(body["type"] as? String == "budget.threshold" && body["id"] as? String == last["id"] as? String)
        #expect(data["scope"] as? String == "integration" && data["period"] as? String == "monthly" && data["threshold_percent"] as? Int == 80)
        #expect(data["client_id"] as? String == fixture.clientA && data["budget_micro_usd"] as? Int == 1)
        #expect((data["spent_micro_usd"] as? Int ?? 0) >= 1)
        // The crossing is in the audit trail (each default threshold once), and on the gauge.
        let audit = try UsageTests.ctl(fixture, ["audit", "--client-id", fixture.clientA, "--json"])
        #expect(audit.components(separatedBy: "budget.threshold_reached").count - 1 == 3, "50, 80 and 100, once each: \(audit)")
        let metrics = String(decoding: try await TestHTTP(baseURL: fixture.server.adminBaseURL).send("GET", "/metrics").body, as: UTF8.self)
        #expect(metrics.contains(#"attestd_budget_used_ratio{scope="integration",period="monthly",workspace="default",client_id="\#(fixture.clientA)"}"#),
                "\(metrics.split(separator: "\n").filter { $0.contains("budget") })")
    }

    @Test func killedBetweenTheThresholdAndTheDeliveryItIsDeliveredAfterRestartExactlyOnce() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let down = fixture.directory.appendingPathComponent("receiver-down").path
        FileManager.default.createFile(atPath: down, contents: Data())
        let (receiver, secretFile) = try Self.receiver(fixture.directory, failWhile: down)
        defer { receiver.stop() }
        try Self.addWebhook(db: fixture.db, url: "http://127.0.0.1:\(receiver.port)/hook", secretFile: secretFile, thresholds: "100")
        _ = try UsageTests.ctl(fixture, ["integrations", "update", fixture.clientA, "--actor", "owner@example.com", "--monthly-budget-usd", "0.000001"])
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.request()).status == 200)
        // The crossing is committed with its delivery: the receiver has refused it once.
        #expect(await receiver.waitForLog { $0["answered"] as? Int == 503 } != nil)
        fixture.server.kill9()
        try FileManager.default.removeItem(atPath: down)
        fixture.server = try ServerProcess(db: fixture.db, extraArguments: ["--upstream-url", fixture.stub.baseURL, "--upstream-key-file", fixture.keyFileB])
        // A kill in the middle of an attempt leaves its lease (30 s) to lapse first.
        let last = try await Self.waitDelivered(db: fixture.db, timeout: 45)
        let log = receiver.log
        #expect(log.filter { $0["answered"] as? Int == 200 }.count == 1, "\(log)")
        #expect(Set(log.compactMap { $0["delivery"] as? String }) == [last["id"] as? String ?? "?"], "one delivery, retried under its ID")
        #expect(log.allSatisfy { $0["signature_ok"] as? Bool == true })
        // Watched, a request goes through (the spend a kill lost within its last flush interval
        // aside), and the restarted instance sees every threshold reached again, yet records none twice.
        _ = try UsageTests.ctl(fixture, ["integrations", "update", fixture.clientA, "--actor", "owner@example.com",
                                         "--rule-mode", "monthly-budget-usd=monitor"])
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.request()).status == 200)
        // The gauge is set once a pass has tried every threshold of the budget.
        var metrics = ""
        let deadline = Date() + 10
        while !metrics.contains("attestd_budget_used_ratio{"), Date() < deadline {
            try await Task.sleep(for: .milliseconds(100))
            metrics = String(decoding: try await TestHTTP(baseURL: fixture.server.adminBaseURL).send("GET", "/metrics").body, as: UTF8.self)
        }
        #expect(metrics.contains("attestd_budget_used_ratio{"))
        #expect(!metrics.split(separator: "\n").contains { $0.hasPrefix("attestd_budget_thresholds_fired_total") }, "nothing fired twice")
        let audit = try UsageTests.ctl(fixture, ["audit", "--client-id", fixture.clientA, "--json"])
        #expect(audit.components(separatedBy: "budget.threshold_reached").count - 1 == 3)
        #expect(receiver.log.count == log.count, "no second delivery")
    }

    @Test func theSigningSecretSurvivesASecretsKeyRotation() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let (receiver, secretFile) = try Self.receiver(fixture.directory)
        defer { receiver.stop() }
        try Self.addWebhook(db: fixture.db, url: "http://127.0.0.1:\(receiver.port)/hook", secretFile: secretFile, thresholds: "100")
        // The webhook's secret is one of the sealed values: re-sealed under the new key, so the
        // previous key can go while the secret still opens.
        let (rotated, rotation) = try ServerProcess.attestctl(["secrets", "rotate", "--db", fixture.db, "--actor", "owner@example.com"])
        #expect(rotated == 0 && rotation.contains("re-sealed 2 values"), "the workspace's upstream key and the webhook's secret: \(rotation)")
        let (finished, finishing) = try ServerProcess.attestctl(["secrets", "finish-rotation", "--db", fixture.db, "--actor", "owner@example.com"])
        #expect(finished == 0, "\(finishing)")
        _ = try UsageTests.ctl(fixture, ["integrations", "update", fixture.clientA, "--actor", "owner@example.com", "--monthly-budget-usd", "0.000001"])
        #expect(try await fixture.post(token: fixture.tokenA, body: Self.request()).status == 200)
        _ = try await Self.waitDelivered(db: fixture.db)
        #expect(receiver.log.count == 1 && receiver.log.allSatisfy { $0["signature_ok"] as? Bool == true }, "\(receiver.log)")
    }

    @Test func twoInstancesOnPostgreSQLDeliverTheEventOnce() async throws {
        let stub = try UpstreamStubServer(UpstreamStubConfiguration())
        defer { stub.stop() }
        let deployment = try ScaleOutTests.Deployment(instanceArguments: ["--upstream-url", stub.baseURL])
        defer { deployment.stop() }
        let (receiver, secretFile) = try Self.receiver(deployment.directory)
        defer { receiver.stop() }
        let keyArguments = ["--secrets-key-file", deployment.keyFile]
        try Data("pg-webhook-upstream-key\n".utf8).write(to: URL(fileURLWithPath: deployment.upstreamKeyFile))
        func ctl(_ arguments: [String]) throws -> String {
            let (status, output) = try ServerProcess.attestctl(arguments + ["--db", deployment.url] + keyArguments)
            guard status == 0 else { throw HTTPTestError("attestctl \(arguments) failed: \(output)") }
            return output
        }
        _ = try ctl(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", deployment.upstreamKeyFile])
        try Self.addWebhook(db: deployment.url, extra: keyArguments, url: "http://127.0.0.1:\(receiver.port)/hook", secretFile: secretFile,
                            thresholds: "50,80,100")
        // The budget only watches (monitor): every request goes through on both instances, so
        // both see every threshold reached and both try to record it.
        _ = try ctl(["integrations", "update", deployment.clientID, "--actor", "owner@example.com", "--monthly-budget-usd", "0.000001",
                     "--rule-mode", "monthly-budget-usd=monitor"])
        let http = deployment.http
        let token = try #require(try await http[0].registerFresh(try ManualDevice(clientID: deployment.clientID)).json["access_token"] as? String)
        for round in 0..<6 {
            let status = try await http[round % 2].send("POST", "/v1/messages", body: Data(Self.request().utf8), contentType: "application/json",
                                                        headers: ["authorization": "Bearer \(token)"]).status
            #expect(status == 200)
        }
        // Three thresholds, one delivery each, whichever instance recorded and delivered them.
        let deadline = Date() + 20
        while receiver.log.count < 3, Date() < deadline { try await Task.sleep(for: .milliseconds(100)) }
        _ = try await Self.waitDelivered(db: deployment.url, extra: keyArguments)
        // Both instances' metrics: the thresholds fired and the deliveries made add up to one each.
        func figure(_ name: String, _ text: String) -> Int {
            text.split(separator: "\n").filter { $0.hasPrefix(name) }.compactMap { Double($0.split(separator: " ").last ?? "") }.reduce(0) { $0 + Int($1) }
        }
        var fired = 0, delivered = 0
        for instance in deployment.instances {
            let text = String(decoding: try await TestHTTP(baseURL: instance.adminBaseURL).send("GET", "/metrics").body, as: UTF8.self)
            fired += figure("attestd_budget_thresholds_fired_total", text)
            delivered += figure(#"attestd_webhook_deliveries_total{outcome="delivered"}"#, text)
        }
        let log = receiver.log
        #expect(log.count == 3, "\(log)")
        #expect(Set(log.compactMap { ($0["body"] as? [String: Any])?["data"] as? [String: Any] }.compactMap { $0["threshold_percent"] as? Int })
                == [50, 80, 100])
        #expect(Set(log.compactMap { $0["delivery"] as? String }).count == 3 && log.allSatisfy { $0["signature_ok"] as? Bool == true })
        #expect(fired == 3 && delivered == 3, "fired \(fired), delivered \(delivered)")
        // The monitored budget counted what it would have refused.
        let counts = try await PolicyMonitorTests.waitForCounts(db: deployment.url, clientID: deployment.clientID) { ($0["monthly-budget-usd"]?.wouldRefuse ?? 0) > 0 }
        #expect(counts["monthly-budget-usd"]?.mode == "monitor" && counts["monthly-budget-usd"]?.refused == 0, "\(counts)")
    }
}
