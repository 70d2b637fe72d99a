import Foundation
import PostgresTestSupport
import Testing

/// The refresh job across shipped attestd processes on one PostgreSQL database: the database's
/// claims decide who posts each device, and a claim held by a killed process lapses.
@Suite(.serialized) struct ReceiptScaleOutTests {
    final class Deployment {
        let url: String
        let clientID: String
        let directory: URL
        let keyFile: String
        let stub: AppleDataStub
        var instances: [ServerProcess] = []

        init(stub: AppleDataStub) throws {
            self.stub = stub
            let cluster = try PostgresCluster.shared.get()
            url = cluster.url(try cluster.createDatabase())
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-receipts-pg-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            keyFile = directory.appendingPathComponent("attestd.key").path
            guard try ServerProcess.attestctl(["--db", url, "--secrets-key-file", keyFile, "init", "--owner", "owner@example.com"]).0 == 0
            else { throw HTTPTestError("init failed") }
            let (status, output) = try ServerProcess.attestctl(["integrations", "create", "--db", url, "--actor", "owner@example.com",
                                                                "--name", "App", "--team-id", AppleDataStub.teamID, "--bundle-id", "com.example.app", "--json"])
            guard status == 0, let object = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any],
                  let clientID = object["client_id"] as? String else { throw HTTPTestError("create failed: \(output)") }
            self.clientID = clientID
            let (keyStatus, keyOutput) = try ServerProcess.attestctl(["apple-keys", "set", "--db", url, "--secrets-key-file", keyFile,
                                                                      "--actor", "owner@example.com", "--team-id", AppleDataStub.teamID,
                                                                      "--key-id", AppleDataStub.keyID, "--key-file", AppleDataStub.keyFile])
            guard keyStatus == 0 else { throw HTTPTestError("apple-keys set failed: \(keyOutput)") }
        }

        @discardableResult
        func startInstance() throws -> ServerProcess {
            let instance = try ServerProcess(db: url, extraArguments: ["--secrets-key-file", keyFile, "--mint-limit", "0", "--registration-quota", "0", "--registration-limit-per-address", "0",
                                                                       "--challenge-limit", "0", "--risk-refresh-interval", "1",
                                                                       "--risk-refresh-lease", "2"] + stub.serverArguments)
            instances.append(instance)
            return instance
        }

        /// A new simulated device registered through `instance`; its key ID.
        func register(through instance: ServerProcess) throws -> String {
            let state = directory.appendingPathComponent("device-\(UUID().uuidString)").path
            let (status, output) = try ServerProcess.attestSim(["simulate-device", "--base-url", instance.baseURL.absoluteString, "--client-id", clientID,
                                                                "--state-dir", state, "--app-id", "ABCDE12345.com.example.app"])
            let line = output.split(separator: "\n").first.map(String.init) ?? ""
            guard status == 0, let json = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                  let keyID = json["key_id"] as? String else { throw HTTPTestError("simulate-device failed: \(output)") }
            return keyID
        }

        func metric(_ keyID: String) throws -> Int? {
            let (_, output) = try ServerProcess.attestctl(["devices", "show", keyID, "--db", url, "--json"])
            return (try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["risk_metric"] as? Int
        }

        func stop() {
            instances.forEach { $0.stop() }
            try? FileManager.default.removeItem(at: directory)
        }
    }

    @Test func twoInstancesNeverRefreshTheSameDeviceTwice() async throws {
        let stub = try AppleDataStub(answer: .refreshed(metric: 2))
        defer { stub.stop() }
        let deployment = try Deployment(stub: stub)
        defer { deployment.stop() }
        let a = try deployment.startInstance(), b = try deployment.startInstance()
        var keys: [String] = []
        for index in 0..<24 { keys.append(try deployment.register(through: index % 2 == 0 ? a : b)) }
        #expect(try await ReceiptEndToEndTests.eventually(60) { try keys.allSatisfy { try deployment.metric($0) == 2 } })
        // One request per device, whoever made it: the refreshed receipts' "not before" is a day on.
        let seen = stub.seen
        #expect(seen.count == keys.count)
        #expect(Set(seen.map(\.certificate)).count == keys.count)
    }

    @Test func aKillDuringARefreshLosesNothingAndItsClaimLapses() async throws {
        let stub = try AppleDataStub(answer: .refreshed(metric: 5))
        defer { stub.stop() }
        let deployment = try Deployment(stub: stub)
        defer { deployment.stop() }
        stub.hold()
        let first = try deployment.startInstance()
        let keyID = try deployment.register(through: first)
        // The refresh is in flight (Apple has the request) when the process dies.
        #expect(await ReceiptEndToEndTests.eventually { stub.arrivals == 1 })
        first.kill9()
        stub.releaseHeld()
        // The registration's receipt is intact, and no answer was stored.
        #expect(try deployment.metric(keyID) == nil)
        let (_, shown) = try ServerProcess.attestctl(["devices", "show", keyID, "--db", deployment.url, "--json"])
        #expect(shown.contains("\"receipt_expires_at\" : \"") || shown.contains("\"receipt_expires_at\":\""))
        // Another instance takes the device once the dead one's claim lapses (2 s), and stores the answer.
        try deployment.startInstance()
        #expect(try await ReceiptEndToEndTests.eventually(30) { try deployment.metric(keyID) == 5 })
        #expect(stub.arrivals == 2)
    }
}
