import Foundation
import Testing

/// `attestctl verify` on the real iPhone samples in ../shared/fixtures/apple (reported as skipped
/// when that folder is absent), run as the real binary.
@Suite struct VerifyCommandTests {
    static let root = AdminCommandTests.packageRoot
    static let samples = root.deletingLastPathComponent().appendingPathComponent("shared/fixtures/apple")
    static let samplesAvailable = FileManager.default.fileExists(atPath: samples.appendingPathComponent("ios-14.4.json").path)

    func attestctl(_ arguments: [String]) throws -> (status: Int32, json: [String: Any], stderr: String, stdout: String) {
        try tool(AdminCommandTests.binary, arguments)
    }

    func tool(_ binary: String, _ arguments: [String]) throws -> (status: Int32, json: [String: Any], stderr: String, stdout: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        let stderr = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let json = (try? JSONSerialization.jsonObject(with: stdout) as? [String: Any]) ?? [:]
        return (process.terminationStatus, json, String(decoding: stderr, as: UTF8.self), String(decoding: stdout, as: UTF8.self))
    }

    func sample(_ name: String) throws -> [String: Any] {
        let url = Self.samples.appendingPathComponent(name)
        return try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
    }

    @Test(.enabled(if: samplesAvailable, "../shared/fixtures/apple is absent: attestctl verify not tested on a real sample"))
    func attestationVerifiesAtItsTimeAndNotAWeekLater() throws {
        let sample = try sample("ios-14.4.json")
        let attestation = sample["attestation"] as! [String: Any]
        let arguments = ["verify", "attestation", "--object", attestation["object"] as! String, "--key-id", sample["keyId"] as! String,
                         "--challenge", attestation["clientData"] as! String, "--app-id", sample["appId"] as! String]
        let good = try attestctl(arguments + ["--at", attestation["at"] as! String])
        #expect(good.status == 0)
        #expect(good.json["verified"] as? Bool == true)
        #expect(good.json["environment"] as? String == "development")
        #expect(good.json["keyId"] as? String == sample["keyId"] as? String)
        #expect(good.json["appId"] as? String == sample["appId"] as? String)
        #expect((good.json["receiptBytes"] as? Int ?? 0) > 1000)
        #expect((good.json["publicKey"] as? String).flatMap { Data(base64Encoded: $0) }?.count == 65)

        let late = try attestctl(arguments + ["--at", "2021-01-30T12:13:33Z"])
        #expect(late.status == 1)
        #expect(late.json["verified"] as? Bool == false)
        #expect(late.json["reason"] as? String == "certificateNotValidAtTime")
        #expect((late.json["detail"] as? String)?.isEmpty == false)

        let otherApp = try attestctl(Array(arguments.dropLast(2)) + ["--app-id", "6MURL8TA57.com.example.other", "--at", attestation["at"] as! String])
        #expect(otherApp.json["reason"] as? String == "rpIDMismatch")
        let hash = try attestctl(Array(arguments[0..<6]) + ["--client-data-hash", attestation["clientDataHash"] as! String,
                                                            "--app-id", sample["appId"] as! String, "--at", attestation["at"] as! String])
        #expect(hash.status == 0)
    }

    @Test(.enabled(if: samplesAvailable, "../shared/fixtures/apple is absent: attestctl verify not tested on a real sample"))
    func assertionVerifiesAndAReplayIsRefused() throws {
        let sample = try sample("ios-14.4.json")
        let assertion = (sample["assertions"] as! [[String: Any]])[0]
        let attested = try attestctl(["verify", "attestation", "--object", (sample["attestation"] as! [String: Any])["object"] as! String,
                                      "--key-id", sample["keyId"] as! String, "--client-data-hash",
                                      (sample["attestation"] as! [String: Any])["clientDataHash"] as! String,
                                      "--app-id", sample["appId"] as! String, "--at", (sample["attestation"] as! [String: Any])["at"] as! String])
        let point = try #require(attested.json["publicKey"] as? String)
        let arguments = ["verify", "assertion", "--object", assertion["object"] as! String, "--public-key", point,
                         "--client-data", assertion["clientData"] as! String, "--app-id", sample["appId"] as! String]
        let good = try attestctl(arguments + ["--previous-counter", "0"])
        #expect(good.status == 0)
        #expect(good.json["counter"] as? Int == 1)
        let replay = try attestctl(arguments + ["--previous-counter", "1"])
        #expect(replay.status == 1)
        #expect(replay.json["reason"] as? String == "counterNotIncreasing")
    }

    /// Every 2026 sample through the shipped binary: the fields an operator scripts against are
    /// what the sample's `expect` block says.
    @Test(.enabled(if: samplesAvailable, "../shared/fixtures/apple is absent: attestctl verify not tested on a real sample"))
    func every2026SampleReportsWhatItsExpectSays() throws {
        let folder = Self.samples.appendingPathComponent("2026")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".json") }.sorted()
        #expect(files.count >= 9)
        for file in files {
            let sample = try self.sample("2026/" + file)
            let expect = sample["expect"] as? [String: Any] ?? [:]
            let appID = try #require(sample["appId"] as? String)
            if let attestation = sample["attestation"] as? [String: Any], let keyID = sample["keyId"] as? String {
                let expected = expect["attestation"] as? [String: Any] ?? [:]
                let result = try attestctl(["verify", "attestation", "--object", attestation["object"] as! String, "--key-id", keyID,
                                            "--client-data-hash", attestation["clientDataHash"] as! String, "--app-id", appID,
                                            "--at", attestation["at"] as! String])
                let accepted = expected["accepted"] as? Bool ?? true
                #expect(result.json["verified"] as? Bool == accepted, "\(file): \(result.stdout)")
                #expect(result.status == (accepted ? 0 : 1), "\(file)")
                if accepted { checkReport(result.json, expected, file, attestation: true) }
                if accepted, let receipt = expected["receipt"] as? [String: Any] {
                    let reported = try #require(result.json["receipt"] as? [String: Any], "\(file): no receipt object")
                    #expect(reported["valid"] as? Bool == true, "\(file): \(reported)")
                    #expect(reported["type"] as? String == receipt["receiptType"] as? String, "\(file)")
                    #expect(reported["environment"] as? String == receipt["environment"] as? String, "\(file)")
                    #expect(reported["app_id"] as? String == receipt["appId"] as? String, "\(file)")
                    #expect(reported["created_at"] as? String == receipt["creationTime"] as? String, "\(file)")
                    #expect(reported["expires_at"] as? String == receipt["expirationTime"] as? String, "\(file)")
                    #expect(reported["risk_metric"] is NSNull && reported["not_before"] is NSNull, "\(file)")
                    #expect(Set(reported.keys) == ["valid", "type", "environment", "app_id", "created_at", "not_before", "expires_at", "risk_metric"])
                }
            }
            for assertion in sample["assertions"] as? [[String: Any]] ?? [] {
                let expected = expect["assertions"] as? [String: Any] ?? [:]
                let keyFile = FileManager.default.temporaryDirectory.appendingPathComponent("verify-\(UUID().uuidString).pem")
                try (sample["publicKeyPEM"] as! String).write(to: keyFile, atomically: true, encoding: .utf8)
                defer { try? FileManager.default.removeItem(at: keyFile) }
                let result = try attestctl(["verify", "assertion", "--object", assertion["object"] as! String, "--public-key", "@" + keyFile.path,
                                            "--client-data-hash", assertion["clientDataHash"] as! String, "--app-id", appID,
                                            "--previous-counter", String(assertion["previousCounter"] as? Int ?? 0)])
                #expect(result.json["verified"] as? Bool == true, "\(file): \(result.stdout)")
                #expect(result.json["counter"] as? Int == assertion["counter"] as? Int, "\(file)")
                checkReport(result.json, expected, file, attestation: false)
            }
        }
    }

    func checkReport(_ json: [String: Any], _ expected: [String: Any], _ file: String, attestation: Bool) {
        let map = expected["extensions"] as? [String: Any]
        let category = map?["apple_validation_category_01"] as? Int
        #expect(json["validation_category"] as? Int == category, "\(file) validation_category")
        if let category {
            let names = ["invalid", "os", "testflight", "development", "app-store", "enterprise", "developer-id", "restricted", "restricted", "restricted", "other"]
            #expect(json["distribution"] as? String == names[category], "\(file) distribution")
        } else {
            #expect(json["distribution"] is NSNull, "\(file) distribution")
        }
        #expect(json["bundle_version"] as? String == map?["apple_bundle_version_01"] as? String, "\(file) bundle_version")
        if let flags = expected["flags"] as? String { #expect(json["flags"] as? String == flags, "\(file) flags") }
        if let map {
            let reported = json["extensions"] as? [String: Any] ?? [:]
            #expect(Set(reported.keys) == Set(map.keys), "\(file) extension keys")
            #expect(NSDictionary(dictionary: reported).isEqual(to: map), "\(file) extensions: \(reported)")
        }
        guard attestation else { return }
        let mac = (expected["osInfo_1.2.840.113635.100.8.7"] as? [String: String])?["1026"] == "macosx"
        #expect(json["platform"] as? String == (mac ? "macos" : "ios"), "\(file) platform")
        if let isMac = expected["aclBlobIsApplesMacValue"] as? Bool { #expect(json["mac_security_posture_ok"] as? Bool == isMac, "\(file)") }
        if let acl = expected["aclBlob"] as? String { #expect(json["acl_blob"] as? String == acl, "\(file) acl_blob") }
        if let version = (expected["osInfo_1.2.840.113635.100.8.7"] as? [String: String])?["1400"] {
            #expect(json["os_version"] as? String == version, "\(file) os_version")
        }
    }

    /// `verify receipt` on the refreshed receipts published with the iOS 14 samples: valid at their
    /// time, with the risk metric; a week after their signer's chain allows, and altered, refused.
    @Test(.enabled(if: samplesAvailable, "../shared/fixtures/apple is absent: attestctl verify not tested on a real sample"))
    func verifyReceiptReadsRefreshedReceipts() throws {
        let sample = try sample("ios-14.4.json")
        let receipts = try #require(sample["receipts"] as? [[String: Any]])
        for item in receipts {
            let properties = try #require(item["properties"] as? [String: Any])
            let result = try attestctl(["verify", "receipt", "--object", item["object"] as! String, "--at", item["at"] as! String])
            #expect(result.status == 0, "\(result.stdout)")
            #expect(result.json["valid"] as? Bool == true)
            #expect(result.json["type"] as? String == properties["type"] as? String)
            #expect(result.json["risk_metric"] as? Int == properties["riskMetric"] as? Int)
            #expect(result.json["app_id"] as? String == sample["appId"] as? String)
        }
        var bytes = [UInt8](Data(base64Encoded: receipts[0]["object"] as! String)!)
        bytes[bytes.count / 2] ^= 0x40
        let altered = try attestctl(["verify", "receipt", "--object", Data(bytes).base64EncodedString(), "--at", receipts[0]["at"] as! String])
        #expect(altered.status == 1 && altered.json["valid"] as? Bool == false)
        #expect(["receiptSignature", "receiptMalformed"].contains(altered.json["reason"] as? String ?? ""))
        // The verify commands' verdict, then exactly the receipt object's fields, the reason among
        // them; the detail goes to stderr.
        #expect(Set(altered.json.keys) == ["verified", "valid", "reason", "type", "environment", "app_id", "created_at", "not_before",
                                           "expires_at", "risk_metric"])
        #expect(altered.stderr.contains("receipt"))
        let late = try attestctl(["verify", "receipt", "--object", receipts[0]["object"] as! String, "--at", "2040-01-01T00:00:00Z"])
        #expect(late.json["reason"] as? String == "receiptSignature")
    }

    @Test func usageErrorsExitTwo() throws {
        #expect(try attestctl(["verify", "attestation", "--object", "AAAA"]).status == 2)
        #expect(try attestctl(["verify", "attestation", "--object", "AAAA", "--key-id", "AAAA", "--challenge", "AA",
                               "--client-data-hash", "AA", "--app-id", "A.b"]).status == 2)
        #expect(try attestctl(["verify", "assertion", "--object", "AAAA", "--public-key", "AAAA", "--client-data", "AA",
                               "--app-id", "ABCDE12345.a.b", "--previous-counter", "0"]).status == 2)   // not a point
        #expect(try attestctl(["verify", "sideways"]).status == 2)
        #expect(try attestctl(["verify", "attestation", "--bogus", "1"]).stderr.contains("unknown option --bogus"))
    }

    @Test func malformedObjectIsAVerdictNotACrash() throws {
        let result = try attestctl(["verify", "attestation", "--object", "oWNmbXRkbm9uZQ==", "--key-id", Data(count: 32).base64EncodedString(),
                                    "--challenge", "AA==", "--app-id", "ABCDE12345.com.example.app"])
        #expect(result.status == 1)
        #expect(result.json["reason"] as? String == "malformed")
    }

    @Test func benchPrintsItsFigures() throws {
        let result = try tool(AdminCommandTests.simBinary, ["bench", "verify", "--seconds", "1"])
        #expect(result.status == 0)
        #expect(result.stderr.contains("debug build"))   // tests run a debug build; the figures are not meaningful here
        for line in ["attestation_verifications_per_second: ", "assertion_verifications_per_second: ", "attestation_ratio_to_p384: "] {
            let value = result.stdout.split(separator: "\n").first { $0.hasPrefix(line) }.map { Double($0.dropFirst(line.count)) ?? 0 } ?? 0
            #expect(value > 0, "\(line) missing")
        }
    }
}
