import AttestDaemon
import Foundation
import HTTPRouting
import Lifecycle
import RawHTTP
import Testing
import UpstreamStub

/// The whole attestd, started in this process as `attestd serve` starts it, stopped with traffic
/// in flight: listeners first, the flushes last, and nothing that was answered lost.
@Suite(.serialized) struct InProcessDaemonTests {
    @Test func theDaemonStopsInOrderWithTrafficInFlightAndLosesNothing() async throws {
        let (directory, db, clientID) = try DurabilityTests().makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let stub = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: [RelayTests.keyB]))
        defer { stub.stop() }
        let keyFile = directory.appendingPathComponent("upstream.key").path
        try Data(RelayTests.keyB.utf8).write(to: URL(fileURLWithPath: keyFile))
        let options = try ServeOptions(["--db", db, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                                        "--trust-anchor", ServerProcess.testAuthorityRoot, "--upstream-url", stub.baseURL,
                                        "--upstream-key-file", keyFile, "--shutdown-grace", "10"])
        let logs = LogLines()
        let daemon = try Daemon(options, logger: Logger(write: { line in logs.lines.withLock { $0.append(line) } }))
        try daemon.start()
        #expect(daemon.port != 0 && daemon.adminPort != 0)
        let http = TestHTTP(baseURL: URL(string: "http://127.0.0.1:\(daemon.port)")!)
        let token = try #require(try await http.registerFresh(try ManualDevice(clientID: clientID)).json["access_token"] as? String)

        // Five relayed requests the upstream answers after 800 ms, and a registration, in flight.
        let relayed = Task {
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<5 {
                    group.addTask {
                        try await http.send("POST", "/v1/messages", body: Data(RelayTests.request(model: "stub-latency-800").utf8),
                                            contentType: "application/json", headers: ["authorization": "Bearer \(token)"]).status
                    }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
        }
        #expect(await stub.waitUntil(timeout: .seconds(10)) { $0.requests.count == 5 })
        let stopped = Task.detached { daemon.stop() }
        // Once the stop has begun, the listener takes no new connection.
        let deadline = Date() + 10
        while !daemon.lifecycle.contains(LifecycleEvent(kind: .stopping, service: "public-listener")), Date() < deadline {
            try await Task.sleep(for: .milliseconds(5))
        }
        let statuses = try await relayed.value
        #expect(statuses == [200, 200, 200, 200, 200], "requests in flight were answered")
        await stopped.value

        // The order: listeners first, then the workers and the relay, the writes last.
        let order = daemon.lifecycle.filter { $0.kind == .stopped }.map(\.service)
        #expect(order == ["public-listener", "admin-listener", "exchange-workers", "upstream-relay", "cloud-endpoint-pins", "secrets-key-reads", "purge",
                          // The alerts stop after the relay, so no request ends after them, and before the ledger they read.
                          "webhook-delivery", "budget-alerts", "usage-ledger", "audit-log", "storage-watch", "event-loops"], "\(order)")
        let started = daemon.lifecycle.filter { $0.kind == .started }.map(\.service)
        #expect(started == order.reversed())
        // Nothing lost: every relayed request is in the ledger (written by its last flush), the
        // registration in the audit trail.
        let (status, usage) = try ServerProcess.attestctl(["usage", "--db", db, "--json"])
        #expect(status == 0)
        let requests = usage.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            .reduce(0) { $0 + ($1["requests"] as? Int ?? 0) }
        #expect(requests == 5)
        let (_, audit) = try ServerProcess.attestctl(["audit", "--db", db, "--json"])
        #expect(audit.contains("device.registered"))
        // The log says so too, in the same order.
        let events = logs.lines.withLock { $0 }.filter { $0.contains(#""event":"service_stopped""#) }
        #expect(events.count == order.count)
    }
}
