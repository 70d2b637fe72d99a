import Foundation
import Testing

/// Each device-policy rule on the shipped binaries: attestd (test authority trusted), the policy
/// set with attestctl, simulated iOS 27 and macOS 27 devices from attest-sim, the refusal read
/// back from the audit trail with its typed reason, and the inventory from `attestctl devices`.
@Suite(.serialized) struct DevicePolicyEndToEndTests {
    /// One deployment: a database, an integration, a running attestd.
    final class Deployment {
        let directory: URL
        let db: String
        let clientID: String
        let server: ServerProcess
        var devices = 0

        init(_ policy: [String] = [], serverArguments: [String] = []) throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attest-policy-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            db = directory.appendingPathComponent("attestd.sqlite").path
            guard try ServerProcess.attestctl(["init", "--db", db, "--owner", "owner@example.com"]).0 == 0 else { throw HTTPTestError("init failed") }
            let (status, output) = try ServerProcess.attestctl(["integrations", "create", "--db", db, "--actor", "owner@example.com", "--name", "Policy",
                                                                "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"] + policy)
            guard status == 0, let object = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any],
                  let clientID = object["client_id"] as? String else { throw HTTPTestError("create failed: \(output)") }
            self.clientID = clientID
            // Limits off: these tests refresh the same keys often, on purpose.
            server = try ServerProcess(db: db, extraArguments: ["--mint-limit", "0", "--registration-quota", "0", "--registration-limit-per-address", "0", "--challenge-limit", "0"]
                                       + serverArguments)
        }

        deinit {
            server.stop()
            try? FileManager.default.removeItem(at: directory)
        }

        func newDevice() -> String {
            devices += 1
            return directory.appendingPathComponent("device-\(devices)").path
        }

        /// One `simulate-device` run: its JSON line and exit status.
        func run(_ state: String, _ flags: [String]) throws -> (status: Int32, json: [String: Any]) {
            let (status, output) = try ServerProcess.attestSim(["simulate-device", "--base-url", server.baseURL.absoluteString, "--client-id", clientID,
                                                                "--state-dir", state, "--app-id", "ABCDE12345.com.example.app"] + flags)
            let line = output.split(separator: "\n").first.map(String.init) ?? ""
            return (status, (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]) ?? [:])
        }

        /// A new device with these flags; whether it got a token.
        @discardableResult
        func register(_ flags: [String]) throws -> (ok: Bool, state: String, keyID: String?) {
            let state = newDevice()
            let result = try run(state, flags)
            return (result.status == 0 && result.json["source"] as? String == "registered", state, result.json["key_id"] as? String)
        }

        /// The audit trail's rejection reasons, oldest first, once `done` holds for them (the audit
        /// log writes in batches, a moment after the answer) or 15 s have passed.
        func rejections(_ action: String, until done: ([String]) -> Bool = { !$0.isEmpty }) async throws -> [String] {
            let deadline = Date() + 15
            while true {
                let reasons = try rejectionsNow(action)
                if done(reasons) || Date() > deadline { return reasons }
                try await Task.sleep(nanoseconds: 20_000_000)
            }
        }

        /// Each refusal's reason, once per refusal: a refusal row counts every refusal of its
        /// reason in one minute, so a row with `count` N stands for N of them.
        func rejectionsNow(_ action: String) throws -> [String] {
            try events(action).flatMap { event -> [String] in
                guard let reason = event["reason"] as? String else { return [] }
                return Array(repeating: reason, count: event["count"] as? Int ?? 1)
            }
        }

        /// The audit events of one action, oldest first.
        func events(_ action: String) throws -> [[String: Any]] {
            let (_, output) = try ServerProcess.attestctl(["audit", "--db", db, "--client-id", clientID, "--limit", "1000", "--json"])
            let events = (try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["events"] as? [[String: Any]] ?? []
            return events.reversed().filter { $0["action"] as? String == action }
        }

        func update(_ flags: [String]) throws {
            let (status, output) = try ServerProcess.attestctl(["integrations", "update", clientID, "--db", db, "--actor", "owner@example.com"] + flags)
            guard status == 0 else { throw HTTPTestError("update failed: \(output)") }
        }

        func json(_ arguments: [String]) throws -> [String: Any] {
            let (status, output) = try ServerProcess.attestctl(arguments + ["--db", db, "--json"])
            guard status == 0, let object = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any] else {
                throw HTTPTestError("attestctl \(arguments) failed: \(output)")
            }
            return object
        }

        func metrics() async throws -> String {
            let result = try await TestHTTP(baseURL: server.adminBaseURL).send("GET", "/metrics")
            return String(decoding: result.body, as: UTF8.self)
        }
    }

    @Test func defaultDistributionPerEnvironment() async throws {
        let deployment = try Deployment()
        // Admitted by default: development builds in development, App Store and TestFlight in production.
        #expect(try deployment.register(["--distribution", "development"]).ok)
        #expect(try deployment.register(["--distribution", "app-store"]).ok)
        #expect(try deployment.register(["--distribution", "testflight"]).ok)
        // Refused: a channel the environment does not admit, a channel nobody admits by default,
        // and the categories no policy can admit.
        #expect(try !deployment.register(["--distribution", "app-store", "--environment", "development"]).ok)
        #expect(try !deployment.register(["--distribution", "development", "--environment", "production"]).ok)
        #expect(try !deployment.register(["--distribution", "enterprise"]).ok)
        for never in ["os", "invalid", "restricted"] {
            #expect(try !deployment.register(["--distribution", never]).ok, "\(never)")
        }
        let reasons = try await deployment.rejections("register.rejected") { $0.count >= 6 }
        #expect(Set(reasons) == ["distributionNotAllowed"], "\(reasons)")
        #expect(reasons.count >= 6)
        let metrics = try await deployment.metrics()
        #expect(metrics.contains(#"attestd_registrations_total{distribution="testflight"} 1"#))
        #expect(metrics.contains(#"attestd_device_policy_refusals_total{reason="distributionNotAllowed",distribution="enterprise"}"#))

        // An operator admits ad hoc builds in production: the next request takes it, without a restart.
        try deployment.update(["--distribution", "production=app-store,testflight,enterprise"])
        #expect(try deployment.register(["--distribution", "enterprise"]).ok)
        // Audited by attestctl itself, with the old value and the new, by whom.
        let change = try #require(try deployment.events("integration.device_policy_updated").last)
        #expect(change["actor"] as? String == "owner@example.com")
        #expect(change["detail"] as? String == "distribution production=app-store,testflight development=development, min_bundle_version none, "
                    + "require_extensions false, platforms ios,macos, risk_limit none -> distribution production=app-store,enterprise,testflight "
                    + "development=development, min_bundle_version none, require_extensions false, platforms ios,macos, risk_limit none")
        // A list that names a category no policy may admit is refused by attestctl, and changes nothing.
        #expect(try ServerProcess.attestctl(["integrations", "update", deployment.clientID, "--db", deployment.db, "--actor", "owner@example.com",
                                             "--distribution", "production=app-store,os"]).0 == 2)
        let policy = try deployment.json(["integrations", "show", deployment.clientID])["device_policy"] as? [String: Any]
        #expect((policy?["distribution"] as? [String: [String]])?["production"] == ["app-store", "enterprise", "testflight"])
    }

    @Test func minimumBundleVersionAtRegistrationAndAtRefresh() async throws {
        let deployment = try Deployment(["--min-bundle-version", "2.0"])
        #expect(try !deployment.register(["--bundle-version", "1.9.9"]).ok)
        let current = try deployment.register(["--bundle-version", "2.0.1"])
        #expect(current.ok)
        let other = try deployment.register(["--bundle-version", "10"])
        #expect(other.ok)
        #expect(try await deployment.rejections("register.rejected") == ["bundleVersionTooOld"])

        // Version 2.0.1 turns out vulnerable: the operator retires it without revoking anything.
        try deployment.update(["--min-bundle-version", "2.1"])
        let stale = try deployment.run(current.state, ["--refresh", "--bundle-version", "2.0.1"])
        #expect(stale.status == 1)
        #expect(try await deployment.rejections("token.rejected") { $0.contains("bundleVersionTooOld") }.contains("bundleVersionTooOld"))
        // The app updates: the device's next refresh says 2.1 and gets its token.
        let updated = try deployment.run(other.state, ["--refresh", "--bundle-version", "2.1"])
        #expect(updated.status == 0)
        #expect(updated.json["source"] as? String == "refreshed")
        let device = try deployment.json(["devices", "show", try #require(other.keyID)])
        #expect(device["bundle_version"] as? String == "2.1")
        #expect(device["last_refresh_at"] is String)
        // Removing the minimum admits old versions again.
        try deployment.update(["--min-bundle-version", "none"])
        #expect(try deployment.register(["--bundle-version", "1"]).ok)
    }

    @Test func requireExtensionsRefusesOlderSystems() async throws {
        let deployment = try Deployment()
        // Off by default: an iOS 26 device (no map) is admitted, and its category is not checked.
        let old = try deployment.register(["--no-extensions"])
        #expect(old.ok)
        try deployment.update(["--require-extensions"])
        #expect(try !deployment.register(["--no-extensions"]).ok)
        #expect(try deployment.register([]).ok)
        // Applies at refresh too: the older device is refused from now on.
        #expect(try deployment.run(old.state, ["--refresh", "--no-extensions"]).status == 1)
        #expect(try await deployment.rejections("register.rejected").first == "extensionsMissing")
        #expect(try await deployment.rejections("token.rejected") { $0.contains("extensionsMissing") }.contains("extensionsMissing"))
        try deployment.update(["--no-require-extensions"])
        #expect(try deployment.register(["--no-extensions"]).ok)
    }

    @Test func platformsAdmitOnlyTheListed() async throws {
        let deployment = try Deployment(["--platforms", "ios", "--distribution", "production=app-store,developer-id"])
        #expect(try !deployment.register(["--platform", "macos", "--distribution", "developer-id"]).ok)
        #expect(try deployment.register(["--platform", "ios", "--distribution", "app-store"]).ok)
        #expect(try await deployment.rejections("register.rejected") == ["platformNotAllowed"])
        try deployment.update(["--platforms", "ios,macos"])
        let mac = try deployment.register(["--platform", "macos", "--distribution", "developer-id"])
        #expect(mac.ok)
        // Taken away again: the Mac's refresh is refused.
        try deployment.update(["--platforms", "ios"])
        #expect(try deployment.run(mac.state, ["--refresh", "--platform", "macos", "--distribution", "developer-id"]).status == 1)
        #expect(try await deployment.rejections("token.rejected") { $0.contains("platformNotAllowed") }.contains("platformNotAllowed"))
    }

    @Test func aChangedCategoryIsRefused() async throws {
        let deployment = try Deployment(["--distribution", "production=app-store,testflight"])
        let device = try deployment.register(["--distribution", "testflight"])
        #expect(device.ok)
        #expect(try deployment.run(device.state, ["--refresh", "--distribution", "testflight"]).status == 0)
        // The same key now says App Store: an admitted channel, but not the one it registered
        // with. The key is refused; the published client then attests a new key, which is admitted.
        let changed = try deployment.run(device.state, ["--refresh", "--distribution", "app-store"])
        #expect(changed.json["source"] as? String == "registered")
        #expect(changed.json["key_id"] as? String != device.keyID)
        #expect(try await deployment.rejections("token.rejected").first == "categoryChanged")
        let old = try deployment.json(["devices", "show", try #require(device.keyID)])
        #expect(old["distribution"] as? String == "testflight")
    }

    @Test func macsNeedApplesSecurityPosture() async throws {
        let deployment = try Deployment(["--distribution", "production=app-store,developer-id"])
        let mac = try deployment.register(["--platform", "macos", "--distribution", "developer-id"])
        #expect(mac.ok)
        let device = try deployment.json(["devices", "show", try #require(mac.keyID)])
        #expect(device["platform"] as? String == "macos")
        #expect(device["distribution"] as? String == "developer-id")
        #expect(device["bundle_version"] is NSNull)
        // SIP off (another aclBlob policy): refused, whatever else the attestation says.
        #expect(try !deployment.register(["--platform", "macos", "--distribution", "developer-id", "--mac-security-posture", "off"]).ok)
        #expect(try await deployment.rejections("register.rejected") == ["macSecurityPosture"])
        // An iPhone's aclBlob is another value, and is never compared with the Mac's.
        let phone = try deployment.register(["--platform", "ios", "--distribution", "app-store"])
        #expect(phone.ok)
        #expect(try deployment.json(["devices", "show", try #require(phone.keyID)])["platform"] as? String == "ios")
    }

    @Test func inventoryAndShowAgreeWithTheDevicesThatRan() async throws {
        let deployment = try Deployment(["--distribution", "production=app-store,developer-id"])
        var keys: [String: [String]] = [:]
        for (flags, expect) in [(["--distribution", "app-store", "--bundle-version", "5"], ["ios", "app-store", "5"]),
                                (["--distribution", "app-store", "--bundle-version", "5"], ["ios", "app-store", "5"]),
                                (["--distribution", "development", "--bundle-version", "6"], ["ios", "development", "6"]),
                                (["--platform", "macos", "--distribution", "developer-id"], ["macos", "developer-id", "-"]),
                                (["--no-extensions"], ["ios", "-", "-"])] {
            let device = try deployment.register(flags)
            #expect(device.ok, "\(flags)")
            keys[try #require(device.keyID)] = expect
        }
        let listed = try deployment.json(["devices", "list", "--client-id", deployment.clientID])["devices"] as? [[String: Any]] ?? []
        #expect(listed.count == 5)
        for device in listed {
            let keyID = try #require(device["key_id"] as? String)
            let expect = try #require(keys[keyID])
            #expect(device["platform"] as? String == expect[0])
            #expect((device["distribution"] as? String ?? "-") == expect[1])
            #expect((device["bundle_version"] as? String ?? "-") == expect[2])
            #expect(device["os_version"] as? String == "27.0")
            #expect(device["registered_at"] is String)
        }
        let show = try deployment.json(["integrations", "show", deployment.clientID])
        let counts = try #require(show["device_counts"] as? [String: [String: Int]])
        #expect(counts["by_platform"] == ["ios": 4, "macos": 1])
        #expect(counts["by_category"] == ["app-store": 2, "development": 1, "developer-id": 1, "none": 1])
        #expect(counts["by_bundle_version"] == ["5": 2, "6": 1, "none": 2])
        #expect(show["devices"] as? Int == 5)
        // A key ID as hex finds the same device; an unknown one is a clear error, exit 2.
        let someKey = try #require(keys.keys.first)
        let hex = Data(base64Encoded: someKey)!.map { String(format: "%02x", $0) }.joined()
        #expect(try deployment.json(["devices", "show", hex])["key_id"] as? String == someKey)
        #expect(try ServerProcess.attestctl(["devices", "show", String(repeating: "00", count: 32), "--db", deployment.db]).0 == 2)
    }
}
