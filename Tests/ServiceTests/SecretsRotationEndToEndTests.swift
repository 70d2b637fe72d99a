import Foundation
import PostgresTestSupport
import Synchronization
import Testing
import UpstreamStub

/// `attestctl secrets rotate` and `finish-rotation` against running attestd: relayed traffic
/// loses no request to a key that does not open, on one SQLite instance and on two PostgreSQL
/// instances; a rotation killed between re-seals resumes and finishes; nothing is ever left
/// sealed under a key that is gone.
@Suite(.serialized) struct SecretsRotationEndToEndTests {
    static let owner = "owner@example.com"

    /// Relays through the instances in turn until stopped, keeping every status.
    final class Traffic: Sendable {
        final class Record: Sendable {
            let statuses = Mutex<[Int]>([])
            let stopped = Atomic<Bool>(false)
        }
        private let record = Record()
        private let task: Task<Void, Never>

        init(_ instances: [TestHTTP], token: String) {
            let record = record
            task = Task {
                var turn = 0
                while !record.stopped.load(ordering: .relaxed) {
                    let status = (try? await instances[turn % instances.count].send("POST", "/v1/messages", body: Data(RelayTests.request().utf8),
                                                                                     contentType: "application/json",
                                                                                     headers: ["authorization": "Bearer \(token)"]).status) ?? -1
                    record.statuses.withLock { $0.append(status) }
                    turn += 1
                }
            }
        }

        var count: Int { record.statuses.withLock { $0.count } }

        /// Waits until `more` requests beyond those answered so far have been answered.
        func waitForMore(_ more: Int) async throws {
            let target = count + more
            for _ in 0..<3000 where count < target { try await Task.sleep(for: .milliseconds(10)) }
            try #require(count >= target, "traffic stalled at \(count) answers")
        }

        /// Stops and returns every status seen.
        func stop() async -> [Int] {
            record.stopped.store(true, ordering: .relaxed)
            await task.value
            return record.statuses.withLock { $0 }
        }
    }

    static func ctl(_ arguments: [String]) throws -> (Int32, String) { try ServerProcess.attestctl(arguments) }

    func relay(_ instance: TestHTTP, _ token: String) async throws -> Int {
        try await instance.send("POST", "/v1/messages", body: Data(RelayTests.request().utf8), contentType: "application/json",
                                headers: ["authorization": "Bearer \(token)"]).status
    }

    static func status(_ db: [String]) throws -> [String: Any] {
        let (code, output) = try ctl(db + ["secrets", "status", "--json"])
        try #require(code == 0, "\(output)")
        return try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])
    }

    /// Rotates and finishes while `traffic` flows, checking each step: a refused actor changes
    /// nothing, finish refuses while a value needs the previous key, every status is 200.
    static func rotateDuringTraffic(_ db: [String], keyFile: String, sealedValues: Int, traffic: Traffic) async throws {
        let before = try status(db)
        #expect(before["rotation_under_way"] as? Bool == false)
        #expect((before["sealed_values"] as? [String: Int])?.values.reduce(0, +) == sealedValues)
        try await traffic.waitForMore(20)
        // Not an owner: refused before any file is touched.
        let keyBytes = try Data(contentsOf: URL(fileURLWithPath: keyFile))
        #expect(try ctl(db + ["secrets", "rotate", "--actor", "nobody@example.com"]).0 == 2)
        #expect(try Data(contentsOf: URL(fileURLWithPath: keyFile)) == keyBytes)
        #expect(!FileManager.default.fileExists(atPath: keyFile + ".previous"))
        // The new key first, then (with traffic flowing in between) the re-seal.
        let (keysOnly, keysOutput) = try ctl(db + ["secrets", "rotate", "--actor", owner, "--keys-only"])
        #expect(keysOnly == 0, "\(keysOutput)")
        try await traffic.waitForMore(20)
        let (refused, refusal) = try ctl(db + ["secrets", "finish-rotation", "--actor", owner])
        #expect(refused == 2 && refusal.contains("still need the previous key"), "\(refusal)")
        let (rotated, rotation) = try ctl(db + ["secrets", "rotate", "--actor", owner])
        #expect(rotated == 0, "\(rotation)")
        #expect(rotation.contains("resuming") && rotation.contains("re-sealed \(sealedValues) values"), "\(rotation)")
        try await traffic.waitForMore(20)
        let during = try status(db)
        #expect(during["rotation_under_way"] as? Bool == true)
        #expect((during["sealed_values"] as? [String: Int]) == [during["current_key"] as? String ?? "?": sealedValues])
        let (finished, finishing) = try ctl(db + ["secrets", "finish-rotation", "--actor", owner])
        #expect(finished == 0, "\(finishing)")
        #expect(!FileManager.default.fileExists(atPath: keyFile + ".previous"))
        try await traffic.waitForMore(20)
        let after = try status(db)
        #expect(after["rotation_under_way"] as? Bool == false && after["current_key"] as? String != before["current_key"] as? String)
        let statuses = await traffic.stop()
        #expect(statuses.count >= 80 && statuses.allSatisfy { $0 == 200 }, "every relayed request answered 200: \(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count))")
        let audit = try ctl(db + ["audit", "--limit", "20"]).1
        for action in ["secrets.rotation_started", "secrets.resealed", "secrets.rotation_finished"] { #expect(audit.contains(action), "\(action)") }
    }

    @Test func aRotationUnderTrafficOnSQLiteLosesNoRequest() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rotation-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = ["--db", directory.appendingPathComponent("attestd.sqlite").path]
        let keyFile = directory.appendingPathComponent("attestd.key").path
        #expect(try Self.ctl(db + ["init", "--owner", Self.owner]).0 == 0)
        let (created, output) = try Self.ctl(db + ["integrations", "create", "--actor", Self.owner, "--name", "App", "--team-id", "ABCDE12345",
                                                   "--bundle-id", "com.example.app", "--json"])
        try #require(created == 0)
        let clientID = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
        let upstreamKey = directory.appendingPathComponent("upstream.key").path
        try Data("rotation-upstream-key\n".utf8).write(to: URL(fileURLWithPath: upstreamKey))
        #expect(try Self.ctl(db + ["workspaces", "set-upstream-key", "--actor", Self.owner, "--workspace", "default", "--key-file", upstreamKey]).0 == 0)
        #expect(try Self.ctl(db + ["apple-keys", "set", "--actor", Self.owner, "--team-id", AppleDataStub.teamID, "--key-id", AppleDataStub.keyID,
                                   "--key-file", AppleDataStub.keyFile]).0 == 0)
        #expect(try Self.ctl(db + ["integrations", "update", clientID, "--actor", Self.owner, "--device-requests-per-minute", "0"]).0 == 0)
        let stub = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: ["rotation-upstream-key"]))
        defer { stub.stop() }
        let server = try ServerProcess(db: db[1], extraArguments: ["--upstream-url", stub.baseURL])
        defer { server.stop() }
        let http = TestHTTP(baseURL: server.baseURL)
        let token = try #require(try await http.registerFresh(try ManualDevice(clientID: clientID)).json["access_token"] as? String)
        let traffic = Traffic([http], token: token)
        try await Self.rotateDuringTraffic(db, keyFile: keyFile, sealedValues: 2, traffic: traffic)
        #expect(!server.log.contains("upstream_key_unavailable"))
    }

    /// Two instances on PostgreSQL relaying to a stub that takes only the workspace's key, with
    /// that key in a file beside the deployment's secrets key.
    static func postgresDeployment() throws -> (UpstreamStubServer, ScaleOutTests.Deployment) {
        let stub = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: ["rotation-upstream-key"]))
        do {
            let deployment = try ScaleOutTests.Deployment(instanceArguments: ["--upstream-url", stub.baseURL])
            try Data("rotation-upstream-key\n".utf8).write(to: URL(fileURLWithPath: deployment.upstreamKeyFile))
            return (stub, deployment)
        } catch {
            stub.stop()
            throw error
        }
    }

    @Test func aRotationUnderTrafficOnTwoPostgreSQLInstancesLosesNoRequest() async throws {
        let (stub, deployment) = try Self.postgresDeployment()
        defer {
            deployment.stop()
            stub.stop()
        }
        let (keyFile, upstreamKey) = (deployment.keyFile, deployment.upstreamKeyFile)
        let db = ["--db", deployment.url, "--secrets-key-file", keyFile]
        #expect(try Self.ctl(db + ["workspaces", "set-upstream-key", "--actor", Self.owner, "--workspace", "default", "--key-file", upstreamKey]).0 == 0)
        #expect(try Self.ctl(db + ["integrations", "update", deployment.clientID, "--actor", Self.owner, "--device-requests-per-minute", "0"]).0 == 0)
        let token = try #require(try await deployment.http[0].registerFresh(try ManualDevice(clientID: deployment.clientID)).json["access_token"] as? String)
        let traffic = Traffic(deployment.http, token: token)
        try await Self.rotateDuringTraffic(db, keyFile: keyFile, sealedValues: 1, traffic: traffic)
        for instance in deployment.instances { #expect(!instance.log.contains("upstream_key_unavailable")) }
    }

    /// Killed with SIGKILL while it waits to re-seal the second of three values (a row lock holds
    /// it there): some values are under the new key and some under the previous one, the instances
    /// open both, finish refuses, and running rotate again finishes the job.
    @Test func aRotationKilledBetweenReSealsResumesAndFinishes() async throws {
        let (stub, deployment) = try Self.postgresDeployment()
        defer {
            deployment.stop()
            stub.stop()
        }
        let (keyFile, upstreamKey) = (deployment.keyFile, deployment.upstreamKeyFile)
        let db = ["--db", deployment.url, "--secrets-key-file", keyFile]
        for workspace in ["default", "second", "third"] {
            if workspace != "default" { #expect(try Self.ctl(db + ["workspaces", "create", "--actor", Self.owner, "--name", workspace]).0 == 0) }
            #expect(try Self.ctl(db + ["workspaces", "set-upstream-key", "--actor", Self.owner, "--workspace", workspace, "--key-file", upstreamKey]).0 == 0)
        }
        let token = try #require(try await deployment.http[0].registerFresh(try ManualDevice(clientID: deployment.clientID)).json["access_token"] as? String)
        let release = try deployment.cluster.holdLocks("""
            SELECT 1 FROM workspace_upstream_keys WHERE workspace_id = (SELECT id FROM workspaces WHERE name = 'second') FOR UPDATE
            """, in: deployment.database)
        var released = false
        defer { if !released { release() } }
        let rotate = Process()
        rotate.executableURL = URL(fileURLWithPath: ServerProcess.attestctl)
        rotate.arguments = db + ["secrets", "rotate", "--actor", Self.owner]
        rotate.standardOutput = FileHandle.nullDevice
        rotate.standardError = FileHandle.nullDevice
        try rotate.run()
        var waiting = 0
        for _ in 0..<1000 where waiting == 0 && rotate.isRunning {
            waiting = try deployment.cluster.sessionsWaitingForALock(in: deployment.database)
            if waiting == 0 { try await Task.sleep(for: .milliseconds(5)) }
        }
        try #require(waiting > 0, "attestctl never reached the locked value")
        kill(rotate.processIdentifier, SIGKILL)
        while rotate.isRunning { try await Task.sleep(for: .milliseconds(5)) }
        #expect(rotate.terminationStatus != 0)
        release()
        released = true

        // Halfway: the first value under the new key, the third still under the previous one, both
        // files there. (The second is either: the killed client's statement was already waiting
        // in the server, which runs it to its end once the lock goes.)
        let halfway = try Self.status(db)
        #expect(halfway["rotation_under_way"] as? Bool == true)
        let counts = try #require(halfway["sealed_values"] as? [String: Int])
        let underNew = counts[halfway["current_key"] as? String ?? "?"] ?? 0, underPrevious = counts[halfway["previous_key"] as? String ?? "?"] ?? 0
        #expect(underNew >= 1 && underPrevious >= 1 && underNew + underPrevious == 3, "\(counts)")
        // The instances open the default workspace's value, whichever key it is under now.
        for instance in deployment.http { #expect(try await relay(instance, token) == 200) }
        #expect(try Self.ctl(db + ["secrets", "finish-rotation", "--actor", Self.owner]).0 == 2)
        // Resumed: the rest re-sealed, then finished; nothing is left under the removed key.
        let (resumed, output) = try Self.ctl(db + ["secrets", "rotate", "--actor", Self.owner])
        #expect(resumed == 0 && output.contains("resuming") && output.contains("re-sealed \(underPrevious) values")
                && output.contains("\(underNew) were under it already"), "\(output)")
        #expect(try Self.ctl(db + ["secrets", "finish-rotation", "--actor", Self.owner]).0 == 0)
        let done = try Self.status(db)
        #expect((done["sealed_values"] as? [String: Int]) == [done["current_key"] as? String ?? "?": 3])
        for instance in deployment.http { #expect(try await relay(instance, token) == 200) }
    }
}
