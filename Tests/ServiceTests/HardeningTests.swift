import AttestCrypto
import Foundation
import RawHTTP
import SQLiteStore
import Testing
import TokenService
#if canImport(Glibc)
import Glibc
#endif

/// What an adversarial review found, each on the shipped attestd: refusals that filled the audit
/// log, an admin listener that answered any Host, one device using up its integration's
/// registrations, and names the issues gave that the tools refused.
@Suite(.serialized) struct HardeningTests {
    final class Deployment {
        let directory: URL
        let db: String
        let clientID: String
        let server: ServerProcess

        init(_ arguments: [String] = []) throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-hardening-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            db = directory.appendingPathComponent("attestd.sqlite").path
            #expect(try ServerProcess.attestctl(["init", "--db", db, "--owner", "owner@example.com"]).0 == 0)
            let (status, output) = try ServerProcess.attestctl(["integrations", "create", "--db", db, "--actor", "owner@example.com", "--name", "App",
                                                                "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
            try #require(status == 0)
            clientID = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
            server = try ServerProcess(db: db, extraArguments: arguments)
        }

        func stop() {
            server.stop()
            try? FileManager.default.removeItem(at: directory)
        }

        /// Every audit row (attestctl audit --json), newest first.
        func auditRows() throws -> [[String: Any]] {
            let (_, output) = try ServerProcess.attestctl(["audit", "--db", db, "--limit", "100000", "--json"])
            return (try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["events"] as? [[String: Any]] ?? []
        }
    }

    /// Junk device requests, pipelined on keep-alive connections from one address: refusals of
    /// every kind (unknown and random client IDs, a real client's unregistered keys, malformed
    /// bodies, the per-address limit's 429s) are counted in a few rows, not journaled one each.
    @Test func aFloodOfJunkRequestsAddsAFewCountedAuditRows() async throws {
        let deployment = try Deployment()
        defer { deployment.stop() }
        let connections = 8, perConnection = 2_500, batch = 250
        let realClient = deployment.clientID
        let port = deployment.server.port
        let refused = try await withThrowingTaskGroup(of: Int.self) { group in
            for c in 0..<connections {
                group.addTask {
                    let connection = try RawConnection(port: port, timeout: 30)
                    defer { connection.disconnect() }
                    var answered = 0
                    for start in stride(from: 0, to: perConnection, by: batch) {
                        let requests = (start..<(start + batch)).map { Self.junk(c * perConnection + $0, realClient: realClient) }.joined()
                        guard connection.sendAll(requests) else { break }
                        for _ in 0..<batch {
                            guard let response = connection.readFramedResponse() else { return answered }
                            if response.status >= 400 { answered += 1 }
                        }
                    }
                    return answered
                }
            }
            return try await group.reduce(0, +)
        }
        #expect(refused == connections * perConnection, "every junk request was answered with a refusal")
        // The refusals land in the log within a flush or two (four a second).
        let deadline = Date() + 10
        var rows: [[String: Any]] = []
        var counted = 0
        while Date() < deadline {
            rows = try deployment.auditRows().filter { ($0["action"] as? String)?.hasSuffix(".rejected") == true }
            counted = rows.reduce(0) { $0 + ($1["count"] as? Int ?? 1) }
            if counted >= refused { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(counted == refused, "each refusal counted once: \(counted) of \(refused)")
        #expect(rows.count <= 100, "\(rows.count) audit rows for \(refused) refusals")
        print("audit flood: \(refused) refusals in \(rows.count) rows")
        let bytes = try JSONSerialization.data(withJSONObject: rows).count
        #expect(bytes <= 100_000, "\(bytes) bytes of audit rows")
        // Still specific: each row says its action, reason and (for a real client) its client ID.
        #expect(rows.contains { $0["client_id"] as? String == deployment.clientID && $0["action"] as? String == "register.rejected" })
        #expect(rows.contains { $0["reason"] as? String == "unknownClient" && ($0["count"] as? Int ?? 0) > 1 })
    }

    /// One junk device request: challenges for client IDs with no integration; registrations and
    /// token requests with random keys and proofs, a third of them for unknown client IDs.
    static func junk(_ n: Int, realClient: String) -> String {
        let key = Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
        let clientID = n % 9 == 1 || n % 9 == 2 ? "clid_random\(n)" : realClient
        let path: String, type: String, body: String
        switch n % 3 {
        case 0:
            // Refused (no integration), then held to the per-address limit (429): both are refusals.
            (path, type, body) = ("/v1/oauth/app-attest/challenge", "application/json", #"{"client_id":"clid_random\#(n)","key_id":"\#(key)"}"#)
        case 1:
            (path, type, body) = ("/v1/oauth/app-attest/register", "application/json",
                                  #"{"client_id":"\#(clientID)","key_id":"\#(key)","attestation_object":"AAAA"}"#)
        default:
            (path, type, body) = ("/v1/oauth/token", "application/x-www-form-urlencoded",
                                  "grant_type=urn%3Aanthropic%3Aparams%3Aoauth%3Agrant-type%3Aapp-attest&client_id=\(clientID)"
                                  + "&key_id=\(key.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)&assertion=AAAA")
        }
        return "POST \(path) HTTP/1.1\r\nHost: a\r\nContent-Type: \(type)\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body
    }

    @Test func theAdminListenerAnswersOnlyItsOwnHostNames() async throws {
        let deployment = try Deployment(["--base-url", "https://attest-admin.example.com"])
        defer { deployment.stop() }
        func metrics(host: String) throws -> Int {
            let connection = try RawConnection(port: deployment.server.adminPort)
            defer { connection.disconnect() }
            _ = connection.sendAll("GET /metrics HTTP/1.1\r\nHost: \(host)\r\nConnection: close\r\n\r\n")
            return connection.readFramedResponse()?.status ?? 0
        }
        // A DNS-rebinding page sends its own name: 421, and /metrics stays unread.
        #expect(try metrics(host: "evil.example") == 421)
        #expect(try metrics(host: "evil.example:9090") == 421)
        #expect(try metrics(host: "") == 421)
        for host in ["127.0.0.1:\(deployment.server.adminPort)", "localhost:\(deployment.server.adminPort)", "[::1]:9090",
                     "attest-admin.example.com", "ATTEST-ADMIN.example.com:443"] {
            #expect(try metrics(host: host) == 200, "\(host)")
        }
        #expect(await deployment.server.waitForLog(containing: "misdirected_request"))
        // The public listener is not the admin listener: any Host reaches its routes.
        let outside = try RawConnection(port: deployment.server.port)
        _ = outside.sendAll("GET /healthz HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n")
        #expect(outside.readFramedResponse()?.status == 200)
    }

    @Test func oneAddressGetsItsOwnRegistrationsAnHour() async throws {
        let deployment = try Deployment(["--registration-limit-per-address", "3"])
        defer { deployment.stop() }
        let http = TestHTTP(baseURL: deployment.server.baseURL)
        for n in 0..<3 { #expect(try await http.registerFresh(try ManualDevice(clientID: deployment.clientID)).status == 200, "registration \(n)") }
        let over = try await http.registerFresh(try ManualDevice(clientID: deployment.clientID))
        #expect(over.status == 429 && over.error == "rate_limit_error")
        #expect(Int(over.header("retry-after") ?? "") ?? 0 >= 1)
        // Audited with its own reason (the log is written a few times a second).
        let deadline = Date() + 10
        var refusals: [[String: Any]] = []
        while refusals.isEmpty, Date() < deadline {
            refusals = try deployment.auditRows().filter { $0["reason"] as? String == "registrationAddressLimit" }
            if refusals.isEmpty { try await Task.sleep(for: .milliseconds(50)) }
        }
        #expect(refusals.reduce(0) { $0 + ($1["count"] as? Int ?? 1) } == 1)
    }

    @Test func verifyTakesJSONAsTheIssuesNamedIt() throws {
        // The output is JSON either way; the flag is accepted so scripts written to it run.
        for kind in ["attestation", "assertion", "receipt"] {
            let (status, output) = try ServerProcess.attestctl(["verify", kind, "--json", "--object", "AAAA"])
            #expect(!output.contains("unknown option --json"), "\(kind): \(output)")
            #expect(status != 0 || output.contains("\"verified\""), "\(kind)")
        }
    }
}

/// The audit log's retention, in bounded batches, on a real database.
@Suite struct AuditRetentionTests {
    @Test func rowsPastTheRetentionArePurgedInBoundedBatchesAndNewerOnesStay() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("audit-retention-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteTokenStore(path: directory.appendingPathComponent("attestd.sqlite").path)
        let now = Date()
        let old = (0..<2_500).map { AuditEvent(at: now - 401 * 86_400 + Double($0), action: "device.registered", clientID: "clid_old") }
        let recent = (0..<10).map { AuditEvent(at: now - 399 * 86_400 + Double($0), action: "device.registered", clientID: "clid_new") }
        try store.appendAudit(old + recent)
        let before = now - 400 * 86_400
        #expect(try store.purgeAudit(before: before, limit: 1000) == 1000)
        #expect(try store.purgeAudit(before: before, limit: 1000) == 1000)
        #expect(try store.purgeAudit(before: before, limit: 1000) == 500)
        #expect(try store.purgeAudit(before: before, limit: 1000) == 0)
        let left = try store.auditEvents(limit: 10_000)
        #expect(left.count == 10 && left.allSatisfy { $0.clientID == "clid_new" })
    }

    @Test func refusalsOfOneMinuteShareARowThatCounts() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("audit-counts-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteTokenStore(path: directory.appendingPathComponent("attestd.sqlite").path)
        let log = BufferedAuditLog(store: store)
        let minute = (Date().timeIntervalSince1970 / 60).rounded(.down) * 60
        // 100,000 refusals in one minute, from 1,000 client IDs and three reasons, in two flushes.
        for n in 0..<100_000 {
            log.record(AuditEvent(at: Date(timeIntervalSince1970: minute + Double(n % 50)), action: "token.rejected",
                                  clientID: "clid_\(n % 1_000)", keyID: Array(repeating: UInt8(n % 256), count: 32),
                                  reason: ["signatureInvalid", "unknownKey", "noPendingChallenge"][n % 3], detail: "junk \(n)"))
            if n == 50_000 { log.flush() }
        }
        log.flush()
        // A state change keeps a row of its own.
        log.record(AuditEvent(at: Date(timeIntervalSince1970: minute), action: "device.registered", clientID: "clid_1"))
        log.flush()
        let rows = try store.auditEvents(limit: 100_000)
        #expect(rows.reduce(0) { $0 + Int($1.count) } == 100_001)
        // Sixteen client IDs get rows of their own; the rest share client ID "" (per reason).
        #expect(rows.count == (BufferedAuditLog.clientsPerMinute + 1) * 3 + 1, "\(rows.count) rows")
        #expect(rows.filter { $0.clientID == "" }.allSatisfy { $0.detail?.hasPrefix("client ID clid_") == true })
        #expect(rows.contains { $0.action == "device.registered" && $0.count == 1 && $0.minute == nil })
    }
}
