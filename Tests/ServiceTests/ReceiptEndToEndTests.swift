import Foundation
import PostgresTestSupport
import Testing

/// Receipts on the shipped binaries: attestd trusting the test authority and the test receipt
/// authority, simulated devices from attest-sim, the refresh against a TLS stub of Apple's data
/// service, and what attestctl shows. Each wait is for an event (a stored metric, a log line).
@Suite(.serialized) struct ReceiptEndToEndTests {
    typealias Deployment = DevicePolicyEndToEndTests.Deployment

    /// Polls `condition` every 50 ms until it holds or `seconds` pass.
    static func eventually(_ seconds: Double = 20, _ condition: () throws -> Bool) async rethrows -> Bool {
        let deadline = Date() + seconds
        while Date() < deadline {
            if try condition() { return true }
            try? await Task.sleep(nanoseconds: 50_000_000)
        }
        return try condition()
    }

    static func eventuallyAsync(_ seconds: Double = 20, _ condition: () async throws -> Bool) async rethrows -> Bool {
        let deadline = Date() + seconds
        while Date() < deadline {
            if try await condition() { return true }
            try? await Task.sleep(nanoseconds: 50_000_000)
        }
        return try await condition()
    }

    /// A counter's value in /metrics text (0 when absent).
    static func counter(_ text: String, _ series: String) -> Int {
        text.split(separator: "\n").first { $0.hasPrefix(series + " ") }.flatMap { Int($0.split(separator: " ").last ?? "") } ?? 0
    }

    static func setAppleKey(_ deployment: Deployment, keyID: String = AppleDataStub.keyID) throws {
        let (status, output) = try ServerProcess.attestctl(["apple-keys", "set", "--db", deployment.db, "--actor", "owner@example.com",
                                                            "--team-id", AppleDataStub.teamID, "--key-id", keyID, "--key-file", AppleDataStub.keyFile])
        guard status == 0 else { throw HTTPTestError("apple-keys set failed: \(output)") }
    }

    static func device(_ deployment: Deployment, _ keyID: String) throws -> [String: Any] {
        try deployment.json(["devices", "show", keyID])
    }

    @Test func registrationRefusesEachBadReceiptWithItsReason() async throws {
        let stub = try AppleDataStub()
        defer { stub.stop() }
        let deployment = try Deployment(serverArguments: stub.serverArguments)
        #expect(await deployment.server.waitForLog(containing: "receipt_trust_anchor"))
        let valid = try deployment.register([])
        #expect(valid.ok)
        // No receipt at all is a malformed statement (every genuine attestation carries one).
        let expected: [(String, String)] = [("none", "malformed"), ("bad-signature", "receiptSignature"),
                                            ("wrong-app-id", "receiptMismatch"), ("other-certificate", "receiptMismatch"),
                                            ("stale", "receiptStale"),
                                            // Pinned beyond the root: another intermediate, a signer without digitalSignature,
                                            // a "not before" that would keep the device from ever being asked about.
                                            ("rogue-intermediate", "receiptSignature"), ("key-agreement-signer", "receiptSignature"),
                                            ("far-future-not-before", "receiptMalformed")]
        for (kind, _) in expected { #expect(try !deployment.register(["--receipt", kind]).ok, "\(kind)") }
        let reasons = try await deployment.rejections("register.rejected") { $0.count >= expected.count }
        #expect(reasons.sorted() == expected.map(\.1).sorted())
        let metrics = try await deployment.metrics()
        #expect(metrics.contains(#"reason="receiptSignature""#))
        // The valid device's receipt was read and stored: its expiry is known, its metric not yet.
        let shown = try Self.device(deployment, try #require(valid.keyID))
        #expect(shown["receipt_expires_at"] is String)
        #expect(shown["risk"] as? String == "unknown")
        #expect(shown["risk_metric"] is NSNull)
    }

    @Test func aTestRootWithoutAReceiptRootLeavesReceiptsUncheckedAndSaysSo() async throws {
        let deployment = try Deployment()
        #expect(await deployment.server.waitForLog(containing: "receipts_unchecked"))
        #expect(try deployment.register(["--receipt", "bad-signature"]).ok)
        #expect(try deployment.register(["--receipt", "stale"]).ok)
    }

    @Test func theMetricArrivesAfterNotBeforeAndOldReceiptsSurvive304And404() async throws {
        let stub = try AppleDataStub(answer: .status(304))
        defer { stub.stop() }
        let deployment = try Deployment(serverArguments: stub.serverArguments + ["--risk-refresh-interval", "1"])
        try Self.setAppleKey(deployment)
        let registered = try deployment.register([])
        let keyID = try #require(registered.keyID)
        let before = try Self.device(deployment, keyID)
        // 304, then 404: asked, answered, the registration's receipt kept.
        #expect(await Self.eventually { stub.seen.count >= 1 })
        stub.answer(.status(404))
        #expect(await Self.eventually { stub.seen.count >= 2 })
        let kept = try Self.device(deployment, keyID)
        #expect(kept["receipt_expires_at"] as? String == before["receipt_expires_at"] as? String)
        #expect(kept["risk_metric"] is NSNull)
        // Then Apple answers: the refreshed receipt is validated and stored with its metric.
        stub.answer(.refreshed(metric: 4))
        #expect(try await Self.eventually { try Self.device(deployment, keyID)["risk_metric"] as? Int == 4 })
        let refreshed = try Self.device(deployment, keyID)
        #expect(refreshed["risk"] as? String == "3-5")
        #expect(refreshed["risk_checked_at"] is String)
        #expect(stub.seen.allSatisfy { $0.environment == "sandbox" }, "a development device is posted to the development URL")
        // The new receipt's "not before" is a day away: no further request meanwhile.
        let count = stub.seen.count
        let metrics = try await deployment.metrics()
        #expect(metrics.contains(#"attestd_receipt_refreshes_total{outcome="refreshed"} 1"#))
        #expect(metrics.contains(#"attestd_receipt_refreshes_total{outcome="not_modified"} 1"#))
        #expect(metrics.contains(#"attestd_receipt_refreshes_total{outcome="not_found"}"#))
        #expect(metrics.contains("attestd_risk_metric_bucket"))
        #expect(metrics.contains("attestd_receipt_refresh_oldest_due_seconds"))
        #expect(stub.seen.count == count)
        let counts = try deployment.json(["integrations", "show", deployment.clientID])["device_counts"] as? [String: Any]
        #expect((counts?["by_risk"] as? [String: Int])?["3-5"] == 1)
    }

    @Test func riskLimitRefusesAtTheNextTokenRefreshAndNotBefore() async throws {
        let stub = try AppleDataStub(answer: .status(304))
        defer { stub.stop() }
        let deployment = try Deployment(serverArguments: stub.serverArguments + ["--risk-refresh-interval", "1"])
        try Self.setAppleKey(deployment)
        try deployment.update(["--risk-limit", "10"])
        let farm = try deployment.register([])
        let farmKey = try #require(farm.keyID)
        // No metric yet (Apple answered 304): the device's refreshes are admitted.
        #expect(await Self.eventually { stub.seen.count >= 1 })
        #expect(try deployment.run(farm.state, ["--refresh"]).json["source"] as? String == "refreshed")
        // Apple now says the device attested 30 keys lately; a second device, 1.
        stub.answer(.refreshed(metric: 30))
        #expect(try await Self.eventually { try Self.device(deployment, farmKey)["risk_metric"] as? Int == 30 })
        stub.answer(.refreshed(metric: 1))
        let calm = try deployment.register([])
        let calmKey = try #require(calm.keyID)
        #expect(try await Self.eventually { try Self.device(deployment, calmKey)["risk_metric"] as? Int == 1 })
        #expect(try deployment.run(calm.state, ["--refresh"]).json["source"] as? String == "refreshed")
        let farmShown = try Self.device(deployment, farmKey)
        #expect(farmShown["risk_over_limit_at"] is String)
        // Refused at its next token refresh, with the typed reason (the published client then
        // attests a new key, which starts without a metric: Apple's count for the device grows).
        #expect(try deployment.run(farm.state, ["--refresh"]).json["source"] as? String != "refreshed")
        let reasons = try await deployment.rejections("token.rejected") { $0.contains("riskMetricTooHigh") }
        #expect(reasons.contains("riskMetricTooHigh"))
        // The operator's view: the devices above 25, and the bands.
        let listed = try deployment.json(["devices", "list", "--client-id", deployment.clientID, "--risk-over", "25"])["devices"] as? [[String: Any]]
        #expect(listed?.map { $0["key_id"] as? String } == [farmKey])
        #expect(listed?.first?["risk_metric"] as? Int == 30)
        let counts = try deployment.json(["integrations", "show", deployment.clientID])["device_counts"] as? [String: Any]
        #expect((counts?["by_risk"] as? [String: Int])?["over-25"] == 1)
    }

    @Test func aRefusedKeyIsReportedOnceAndANewKeyResumes() async throws {
        let stub = try AppleDataStub()
        defer { stub.stop() }
        let deployment = try Deployment(serverArguments: stub.serverArguments + ["--risk-refresh-interval", "1"])
        // A key Apple does not know (its kid differs): every request would be 401.
        try Self.setAppleKey(deployment, keyID: "WRONGKEY99")
        var keys: [String] = []
        for _ in 0..<3 { keys.append(try #require(try deployment.register([]).keyID)) }
        #expect(await deployment.server.waitForLog(containing: "apple_key_refused", timeout: 20))
        // Every device comes due: once Apple refused the key the others wait for a new one, without a
        // request or another report (the job's two workers may each have had one request in flight).
        #expect(try await Self.eventuallyAsync {
            let text = try await deployment.metrics()
            return Self.counter(text, #"attestd_receipt_refreshes_total{outcome="unauthorized"}"#)
                + Self.counter(text, #"attestd_receipt_refreshes_total{outcome="key_refused"}"#) >= 3
        })
        #expect(deployment.server.log.components(separatedBy: "apple_key_refused").count - 1 == 1)
        #expect(deployment.server.log.contains("\"status\":\"401\"") || deployment.server.log.contains("\"status\":401"))
        #expect((1...2).contains(stub.seen.count), "\(stub.seen.count) requests")
        // The operator sets the right key: the job picks it up and every device gets its metric.
        try Self.setAppleKey(deployment)
        for key in keys {
            #expect(try await Self.eventually { try Self.device(deployment, key)["risk_metric"] as? Int == 3 }, "\(key)")
        }
        let listed = try ServerProcess.attestctl(["apple-keys", "list", "--db", deployment.db, "--json"]).1
        #expect(listed.contains(AppleDataStub.keyID) && !listed.contains("PRIVATE KEY"))
    }

    @Test func withoutAKeyDevicesShowRiskUnknownAndNothingIsSent() async throws {
        let stub = try AppleDataStub()
        defer { stub.stop() }
        let deployment = try Deployment(serverArguments: stub.serverArguments + ["--risk-refresh-interval", "1"])
        let registered = try deployment.register([])
        #expect(await deployment.server.waitForLog(containing: "apple_key_missing", timeout: 20))
        #expect(stub.seen.isEmpty && stub.arrivals == 0)
        #expect(try Self.device(deployment, try #require(registered.keyID))["risk"] as? String == "unknown")
    }

    @Test func tooManyRequestsAndOutagesBackOffAndABadRequestHoldsBackOnlyItsDevice() async throws {
        let stub = try AppleDataStub(answer: .status(429))
        defer { stub.stop() }
        let deployment = try Deployment(serverArguments: stub.serverArguments + ["--risk-refresh-interval", "1"])
        try Self.setAppleKey(deployment)
        let keyID = try #require(try deployment.register([]).keyID)
        // 429, then 503: the device is tried again after the back-off, its receipt kept meanwhile.
        #expect(await Self.eventually { stub.seen.contains { $0.status == 429 } })
        stub.answer(.status(503))
        #expect(await Self.eventually { stub.seen.contains { $0.status == 503 } })
        #expect(try Self.device(deployment, keyID)["risk_metric"] is NSNull)
        stub.answer(.refreshed(metric: 6))
        #expect(try await Self.eventually(30) { try Self.device(deployment, keyID)["risk_metric"] as? Int == 6 })
        let metrics = try await deployment.metrics()
        #expect(metrics.contains(#"attestd_receipt_refreshes_total{outcome="rate_limited"}"#))
        #expect(metrics.contains(#"attestd_receipt_refreshes_total{outcome="unavailable"}"#))
        #expect(try Self.device(deployment, keyID)["risk"] as? String == "6-25")
        // A 400 is about one receipt (a forged one can ask for it): that device waits for its next
        // turn, each is asked about on its own, and the team's key is not paused.
        stub.answer(.status(400))
        for _ in 0..<2 { _ = try deployment.register([]) }
        #expect(try await Self.eventuallyAsync {
            Self.counter(try await deployment.metrics(), #"attestd_receipt_refreshes_total{outcome="bad_request"}"#) >= 2
        })
        #expect(!deployment.server.log.contains("apple_key_refused"))
        #expect(deployment.server.log.contains("receipt_refresh_refused"))
        stub.answer(.refreshed(metric: 9))
        let after = try #require(try deployment.register([]).keyID)
        #expect(try await Self.eventually(30) { try Self.device(deployment, after)["risk_metric"] as? Int == 9 }, "the team goes on after a 400")
    }

    @Test func aStopIsNotHeldUpByARequestAppleHolds() async throws {
        let stub = try AppleDataStub()
        defer { stub.stop() }
        let deployment = try Deployment(serverArguments: stub.serverArguments + ["--risk-refresh-interval", "1", "--shutdown-grace", "2"])
        try Self.setAppleKey(deployment)
        stub.hold()
        _ = try deployment.register([])
        #expect(await Self.eventually { stub.arrivals == 1 })
        // SIGTERM while the request is in flight: attestd is gone by the grace, not by curl's time-out.
        let stopped = Date()
        deployment.server.process.terminate()
        #expect(await Self.eventually(12) { !deployment.server.process.isRunning })
        #expect(Date().timeIntervalSince(stopped) < 12)
        #expect(deployment.server.log.contains("service_stopped"))
    }
}
