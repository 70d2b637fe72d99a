import Foundation
import PostgresTestSupport
import RawHTTP
import Testing
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// Two shipped attestd processes on one PostgreSQL database (a throwaway cluster the tests start
/// themselves): every guarantee holds across instances because the database enforces it.
@Suite(.serialized) struct ScaleOutTests {
    /// A fresh database on the shared cluster, initialised with attestctl, and an integration.
    final class Deployment {
        let url: String
        let database: String
        let cluster: PostgresCluster
        let clientID: String
        let directory: URL
        var instances: [ServerProcess] = []

        init(cluster: PostgresCluster? = nil, instanceArguments: [String] = []) throws {
            let cluster = try cluster ?? PostgresCluster.shared.get()
            self.cluster = cluster
            database = try cluster.createDatabase()
            url = cluster.url(database)
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-pg-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let keyFile = directory.appendingPathComponent("attestd.key").path
            #expect(try ServerProcess.attestctl(["--db", url, "--secrets-key-file", keyFile, "init", "--owner", "owner@example.com"]).0 == 0)
            let (status, output) = try ServerProcess.attestctl(["integrations", "create", "--db", url, "--actor", "owner@example.com",
                                                                "--name", "App", "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
            try #require(status == 0)
            clientID = try #require((try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])?["client_id"] as? String)
            for _ in 0..<2 {
                instances.append(try ServerProcess(db: url, extraArguments: ["--secrets-key-file", keyFile] + instanceArguments))
            }
        }

        var http: [TestHTTP] { instances.map { TestHTTP(baseURL: $0.baseURL) } }
        /// The deployment's secrets key file, and a place for a workspace's upstream key.
        var keyFile: String { directory.appendingPathComponent("attestd.key").path }
        var upstreamKeyFile: String { directory.appendingPathComponent("upstream.key").path }

        func stop() {
            instances.forEach { $0.stop() }
            try? FileManager.default.removeItem(at: directory)
        }
    }

    @Test func aDeviceAlternatingBetweenInstancesRegistersAndRefreshes() async throws {
        let deployment = try Deployment()
        defer { deployment.stop() }
        let http = deployment.http
        let device = try ManualDevice(clientID: deployment.clientID)
        #expect(try await http[0].registerFresh(device).status == 200)
        for round in 0..<6 {
            let challenge = try await http[round % 2].challengeBytes(device)
            let minted = try await http[(round + 1) % 2].token(device, assertion: try device.assertion(challenge: challenge))
            #expect(minted.status == 200, "round \(round)")
            let token = try #require(minted.json["access_token"] as? String)
            // The token works on both instances (503: authenticated, no upstream key configured).
            for instance in http { #expect(try await instance.messages(token: token).status == 503) }
        }
        // The password of the database URL never reaches the logs.
        for instance in deployment.instances {
            #expect(!instance.log.contains(PostgresCluster.password))
            #expect(instance.log.contains("postgresql://attest:***@127.0.0.1"), "the start-up log shows the redacted URL")
        }
    }

    @Test func oneChallengeRedeemedOnBothInstancesYieldsOneToken() async throws {
        let deployment = try Deployment(instanceArguments: ["--mint-limit", "0"])
        defer { deployment.stop() }
        let http = deployment.http
        let device = try ManualDevice(clientID: deployment.clientID)
        #expect(try await http[0].registerFresh(device).status == 200)
        for _ in 0..<5 {
            let challenge = try await http[0].challengeBytes(device)
            let first = try device.assertion(challenge: challenge), second = try device.assertion(challenge: challenge)
            async let a = http[0].token(device, assertion: first)
            async let b = http[1].token(device, assertion: second)
            let statuses = [try await a.status, try await b.status].sorted()
            #expect(statuses == [200, 401])
        }
    }

    @Test func sixtyFourRefreshesWithOneCounterAcrossBothInstancesMintOneToken() async throws {
        let deployment = try Deployment(instanceArguments: ["--mint-limit", "0", "--challenge-limit", "0"])
        defer { deployment.stop() }
        let http = deployment.http
        let device = try ManualDevice(clientID: deployment.clientID)
        let registered = try await http[0].registerFresh(device)
        let next = Array(Data(base64Encoded: registered.json["next_challenge"] as! String)!)
        let assertions = try (0..<64).map { _ in try device.assertion(challenge: next, counter: 1) }
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for (index, assertion) in assertions.enumerated() {
                group.addTask { try await http[index % 2].token(device, assertion: assertion).status }
            }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(statuses.filter { $0 == 200 }.count == 1)
        #expect(statuses.filter { $0 == 401 }.count == 63)
    }

    @Test func revocationAndTheMintLimitHoldOnEveryInstance() async throws {
        let deployment = try Deployment(instanceArguments: ["--mint-limit", "3"])
        defer { deployment.stop() }
        let http = deployment.http
        let device = try ManualDevice(clientID: deployment.clientID)
        #expect(try await http[0].registerFresh(device).status == 200)
        // Three mints a minute for the device, wherever they happen: the fourth is refused by both.
        var token = ""
        for round in 0..<3 {
            let minted = try await http[round % 2].token(device, assertion: try device.assertion(challenge: try await http[round % 2].challengeBytes(device)))
            #expect(minted.status == 200)
            token = minted.json["access_token"] as? String ?? ""
        }
        for instance in http {
            let limited = try await instance.token(device, assertion: try device.assertion(challenge: try await instance.challengeBytes(device)))
            #expect(limited.status == 429)
            #expect(Int(limited.header("retry-after") ?? "") ?? 0 >= 1)
        }
        // Revoked by attestctl: the very next request is refused on both instances.
        for instance in http { #expect(try await instance.messages(token: token).status == 503) }
        #expect(try ServerProcess.attestctl(["integrations", "revoke", deployment.clientID, "--db", deployment.url,
                                             "--actor", "owner@example.com", "--yes"]).0 == 0)
        for instance in http {
            #expect(try await instance.messages(token: token).status == 401)
            #expect(try await instance.challenge(device).error == "invalid_client")
        }
    }

    /// The token checks go out on each loop's own connection (no worker): a token superseded by
    /// the device's newest two is refused by the next request on both instances, the proxy's
    /// check on the admin listener answers from the same checks, and requests arriving together
    /// are answered alike (that they share queries is `PostgresLoopTokenCheckTests`' to show).
    @Test func theLoopsOwnChecksRefuseASupersededTokenAtOnceOnBothInstances() async throws {
        let deployment = try Deployment(instanceArguments: ["--mint-limit", "0", "--challenge-limit", "0", "--threads", "1"])
        defer { deployment.stop() }
        let http = deployment.http
        let device = try ManualDevice(clientID: deployment.clientID)
        var tokens = [try #require(try await http[0].registerFresh(device).json["access_token"] as? String)]
        for round in 0..<2 {
            let minted = try await http[round % 2].token(device, assertion: try device.assertion(challenge: try await http[round % 2].challengeBytes(device)))
            tokens.append(try #require(minted.json["access_token"] as? String))
        }
        // The newest two live; the first, superseded, is refused by both at once.
        for instance in http {
            #expect(try await instance.messages(token: tokens[0]).status == 401)
            #expect(try await instance.messages(token: tokens[1]).status == 503)   // authenticated, no upstream key
            #expect(try await instance.messages(token: tokens[2]).status == 503)
        }
        for (index, instance) in deployment.instances.enumerated() {
            let admin = TestHTTP(baseURL: instance.adminBaseURL)
            let live = try await admin.send("GET", "/v1/authz/check/v1/messages", headers: ["authorization": "Bearer \(tokens[2])"])
            #expect(live.status == 200 && live.header("x-attest-client-id") == deployment.clientID, "instance \(index)")
            let superseded = try await admin.send("GET", "/v1/authz/check/v1/messages", headers: ["authorization": "Bearer \(tokens[0])"])
            #expect(superseded.status == 401, "instance \(index)")
        }
        // 64 at once on the one loop.
        let (instance, newest) = (http[0], tokens[2])
        try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<64 { group.addTask { try await instance.messages(token: newest).status } }
            for try await status in group { #expect(status == 503) }
        }
        let metrics = try await TestHTTP(baseURL: deployment.instances[0].adminBaseURL).send("GET", "/metrics")
        func figure(_ name: String) -> Int {
            String(decoding: metrics.body, as: UTF8.self).split(separator: "\n").first { $0.hasPrefix(name + " ") }
                .flatMap { Int($0.split(separator: " ")[1]) } ?? -1
        }
        let checks = figure("attestd_token_checks_sent_total"), queries = figure("attestd_token_check_queries_total")
        #expect(checks >= 64 + 5, "every check went out on the loop's connection: \(checks)")
        #expect(queries > 0 && queries <= checks, "\(queries) queries carried \(checks) checks")
    }

    @Test func killDashNineOfOneInstanceLosesNoAcknowledgedTokenAndTheOtherServesOn() async throws {
        let deployment = try Deployment(instanceArguments: ["--mint-limit", "0", "--challenge-limit", "0"])
        defer { deployment.stop() }
        let http = deployment.http
        let devices = try (0..<4).map { _ in try ManualDevice(clientID: deployment.clientID) }
        for device in devices { #expect(try await http[0].registerFresh(device).status == 200) }
        let collector = TokenCollector()
        let burst = Task {
            await withTaskGroup(of: Void.self) { group in
                for device in devices {
                    group.addTask {
                        while !collector.stopped {
                            guard let challenge = try? await http[0].challengeBytes(device),
                                  let assertion = try? device.assertion(challenge: challenge),
                                  let result = try? await http[0].token(device, assertion: assertion) else { return }
                            if result.status == 200, let token = result.json["access_token"] as? String {
                                collector.add(token: token, device: device.keyIDBase64)
                            }
                        }
                    }
                }
            }
        }
        let deadline = Date() + 60
        while collector.tokens.count < 30 && Date() < deadline { try await Task.sleep(nanoseconds: 10_000_000) }
        deployment.instances[0].kill9()
        collector.stop()
        await burst.value
        #expect(collector.tokens.count >= 30)
        // Each device's newest acknowledged token works on the surviving instance, which keeps minting.
        for token in collector.newestByDevice.values { #expect(try await http[1].messages(token: token).status == 503) }
        for device in devices {
            let minted = try await http[1].token(device, assertion: try device.assertion(challenge: try await http[1].challengeBytes(device)))
            #expect(minted.status == 200)
        }
    }

    @Test func aDatabaseOutageGivesFast503sAndTheServiceRecoversByItself() async throws {
        // A cluster of its own: the outage must not touch the other suites' database.
        let cluster = try PostgresCluster.start()
        defer { cluster.stop() }
        let deployment = try Deployment(cluster: cluster, instanceArguments: ["--mint-limit", "0"])
        defer { deployment.stop() }
        let http = deployment.http[0]
        let device = try ManualDevice(clientID: deployment.clientID)
        let token = try #require(try await http.registerFresh(device).json["access_token"] as? String)

        // Devices keep refreshing through the outage: whatever was acknowledged must have been committed.
        let devices = try (0..<3).map { _ in try ManualDevice(clientID: deployment.clientID) }
        for device in devices { #expect(try await http.registerFresh(device).status == 200) }
        let collector = TokenCollector()
        let burst = Task {
            await withTaskGroup(of: Void.self) { group in
                for device in devices {
                    group.addTask {
                        while !collector.stopped {
                            guard let challenge = try? await http.challenge(device) else { continue }
                            guard challenge.status == 200, let text = challenge.json["challenge"] as? String,
                                  let bytes = Data(base64Encoded: text), let assertion = try? device.assertion(challenge: Array(bytes)),
                                  let result = try? await http.token(device, assertion: assertion) else {
                                try? await Task.sleep(nanoseconds: 20_000_000)
                                continue
                            }
                            if result.status == 200, let token = result.json["access_token"] as? String {
                                collector.add(token: token, device: device.keyIDBase64)
                            }
                        }
                    }
                }
            }
        }
        // The outage comes once the refreshes are flowing.
        let flowing = Date() + 30
        while collector.tokens.count < 8 && Date() < flowing { try await Task.sleep(for: .milliseconds(10)) }
        try cluster.halt()
        for _ in 0..<3 {
            var started = Date()
            let challenge = try await http.challenge(device)
            #expect(challenge.status == 503 && challenge.error == "server_error")
            #expect(Date().timeIntervalSince(started) < 2.5, "a device request took \(Date().timeIntervalSince(started)) s")
            started = Date()
            let messages = try await http.messages(token: token)
            #expect(messages.status == 503)
            #expect((messages.json["error"] as? [String: Any])?["type"] as? String == "api_error")
            #expect(Date().timeIntervalSince(started) < 2.5, "a Messages request took \(Date().timeIntervalSince(started)) s")
        }
        try cluster.resume()
        // Back without a restart: the pool replaces its broken connections.
        var recovered = false
        for _ in 0..<50 where !recovered {
            recovered = try await http.challenge(device).status == 200
            if !recovered { try await Task.sleep(nanoseconds: 100_000_000) }
        }
        #expect(recovered)
        collector.stop()
        await burst.value
        // Nothing was acknowledged without a commit: each device's newest acknowledged token works.
        for acknowledged in collector.newestByDevice.values { #expect(try await http.messages(token: acknowledged).status == 503) }
        #expect(try await http.messages(token: token).status == 503)   // authenticated again (no upstream key)
        let minted = try await http.token(device, assertion: try device.assertion(challenge: try await http.challengeBytes(device)))
        #expect(minted.status == 200)
    }

    /// The ledger and the policy on PostgreSQL with two instances relaying to the stub: both
    /// instances' usage lands in one ledger, a policy change applies on both at the next request,
    /// and the per-device limit counts the device's requests on either instance.
    /// A token check waiting on a stalled database holds a worker, never the event loop: with one
    /// loop, `/healthz` answers and a relayed stream keeps flowing while the check still waits.
    /// The proof is the order of events: all of that happens before the waiting request ends (on
    /// a loop that waited, nothing else could be answered until it did).
    @Test func aStalledDatabaseLeavesTheEventLoopServing() async throws {
        let stub = try UpstreamStubServer(UpstreamStubConfiguration(deltaCount: 200, streamDuration: .seconds(20)))
        defer { stub.stop() }
        let deployment = try Deployment(instanceArguments: ["--upstream-url", stub.baseURL, "--threads", "1"])
        defer { deployment.stop() }
        let secrets = deployment.directory.appendingPathComponent("attestd.key").path
        let keyFile = deployment.directory.appendingPathComponent("upstream.key").path
        try Data("pg-stall-upstream-key\n".utf8).write(to: URL(fileURLWithPath: keyFile))
        #expect(try ServerProcess.attestctl(["--db", deployment.url, "--secrets-key-file", secrets, "workspaces", "set-upstream-key",
                                              "--actor", "owner@example.com", "--workspace", "default", "--key-file", keyFile]).0 == 0)
        let instance = deployment.instances[0]
        let device = try ManualDevice(clientID: deployment.clientID)
        let token = try #require(try await TestHTTP(baseURL: instance.baseURL).registerFresh(device).json["access_token"] as? String)
        func messages(stream: Bool) -> String {
            let body = RelayTests.request(stream: stream)
            return "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAuthorization: Bearer \(token)\r\n"
                + "Content-Length: \(body.utf8.count)\r\n\r\n\(body)"
        }
        let stream = try RawConnection(port: instance.port, timeout: 10)
        #expect(stream.sendAll(messages(stream: true)))
        #expect(stream.readHead()?.status == 200)
        #expect(stream.readChunk()?.isEmpty == false)

        // The stall: every token check now waits behind this lock.
        let release = try deployment.cluster.lockTable("tokens", in: deployment.database)
        var released = false
        defer { if !released { release() } }
        let waiting = try RawConnection(port: instance.port, timeout: 10)
        #expect(waiting.sendAll(messages(stream: false)))
        var stalled = 0
        for _ in 0..<500 where stalled == 0 {
            stalled = try deployment.cluster.sessionsWaitingForALock(in: deployment.database)
            if stalled == 0 { try await Task.sleep(for: .milliseconds(10)) }
        }
        try #require(stalled > 0, "attestd's token check never reached the lock")

        // While it waits: the loop answers /healthz and forwards the stream's next chunks.
        for _ in 0..<5 {
            let probe = try RawConnection(port: instance.port, timeout: 10)
            #expect(probe.sendAll("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
            #expect(probe.readResponse()?.status == 200)
        }
        #expect(stream.readChunk()?.isEmpty == false)
        // attestd's lock timeout (1 s) ends the wait; everything above took a small part of it.
        #expect(try deployment.cluster.sessionsWaitingForALock(in: deployment.database) > 0,
                "the check was still waiting while the loop answered")
        release()
        released = true
        // The waiting request ends either way: relayed once the lock went, or 503 at the lock timeout.
        let answer = waiting.readFramedResponse()
        #expect(answer?.status == 200 || answer?.status == 503, "\(String(describing: answer?.status))")
    }

    @Test func usageFromBothInstancesAddsUpAndThePolicyAndLimitsAreShared() async throws {
        let stub = try UpstreamStubServer(UpstreamStubConfiguration())
        defer { stub.stop() }
        let deployment = try Deployment(instanceArguments: ["--upstream-url", stub.baseURL])
        defer { deployment.stop() }
        // The workspace's upstream key, set with attestctl (sealed in the shared database).
        let keyFile = deployment.directory.appendingPathComponent("upstream.key").path
        try Data("pg-scale-out-upstream-key\n".utf8).write(to: URL(fileURLWithPath: keyFile))
        #expect(try ServerProcess.attestctl(["--db", deployment.url, "--secrets-key-file", deployment.directory.appendingPathComponent("attestd.key").path,
                                              "workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default",
                                              "--key-file", keyFile]).0 == 0)
        let http = deployment.http
        let device = try ManualDevice(clientID: deployment.clientID)
        let token = try #require(try await http[0].registerFresh(device).json["access_token"] as? String)
        func post(_ instance: Int, maxTokens: Int = 16) async throws -> Int {
            try await http[instance].send("POST", "/v1/messages", body: Data(RelayTests.request(maxTokens: maxTokens).utf8),
                                          contentType: "application/json", headers: ["authorization": "Bearer \(token)"]).status
        }
        // The per-device window weighs the last minute's requests down as the minute ages: start
        // early in a minute so that everything below falls in the same one.
        let intoMinute = Date().timeIntervalSince1970.truncatingRemainder(dividingBy: 60)
        if intoMinute > 35 { try await Task.sleep(for: .milliseconds(Int((60.5 - intoMinute) * 1000))) }
        for round in 0..<6 { #expect(try await post(round % 2) == 200) }
        func ctl(_ arguments: [String]) throws -> String {
            let (status, output) = try ServerProcess.attestctl(["--db", deployment.url] + arguments)
            try #require(status == 0, "attestctl \(arguments)")
            return output
        }
        var recorded = 0
        for _ in 0..<30 where recorded < 6 {
            try await Task.sleep(for: .milliseconds(200))
            recorded = try ctl(["usage", "--json", "--by", "integration"]).split(separator: "\n")
                .compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
                .reduce(0) { $0 + ($1["requests"] as? Int ?? 0) }
        }
        #expect(recorded == 6, "both instances' requests in one ledger")
        let output = stub.requests.reduce(0) { $0 + ($1.usage?.outputTokens ?? 0) }
        #expect(try ctl(["usage", "--json", "--by", "integration"]).contains(#""output_tokens":\#(output)"#))

        _ = try ctl(["integrations", "update", deployment.clientID, "--actor", "owner@example.com", "--max-tokens", "8"])
        #expect(try await post(0) == 400)
        #expect(try await post(1) == 400)
        _ = try ctl(["integrations", "update", deployment.clientID, "--actor", "owner@example.com", "--max-tokens", "0",
                     "--device-requests-per-minute", "8"])
        // 6 relayed in the last seconds, flushed: 2 more fit in the window across both instances, then 429.
        var statuses: [Int] = []
        for round in 0..<4 { statuses.append(try await post(round % 2)); try await Task.sleep(for: .milliseconds(1100)) }
        #expect(statuses.contains(429), "the device limit counted both instances: \(statuses)")
        #expect(statuses.filter { $0 == 200 }.count <= 2, "\(statuses)")
    }

    /// The user-profile limit and the server-tool refusal on PostgreSQL with two instances: the
    /// profile's requests on either instance count against one window, and a policy change reaches
    /// both at their next request.
    @Test func theProfileLimitAndTheServerToolRefusalHoldAcrossInstances() async throws {
        let stub = try UpstreamStubServer(UpstreamStubConfiguration())
        defer { stub.stop() }
        let deployment = try Deployment(instanceArguments: ["--upstream-url", stub.baseURL])
        defer { deployment.stop() }
        let secrets = deployment.directory.appendingPathComponent("attestd.key").path
        let keyFile = deployment.directory.appendingPathComponent("upstream.key").path
        try Data("pg-profile-upstream-key\n".utf8).write(to: URL(fileURLWithPath: keyFile))
        func ctl(_ arguments: [String]) throws -> String {
            let (status, output) = try ServerProcess.attestctl(["--db", deployment.url, "--secrets-key-file", secrets] + arguments)
            try #require(status == 0, "attestctl \(arguments): \(output)")
            return output
        }
        _ = try ctl(["workspaces", "set-upstream-key", "--actor", "owner@example.com", "--workspace", "default", "--key-file", keyFile])
        _ = try ctl(["integrations", "update", deployment.clientID, "--actor", "owner@example.com", "--server-tools", "web_fetch",
                     "--profile-requests-per-minute", "4", "--device-requests-per-minute", "0"])
        let http = deployment.http
        let token = try #require(try await http[0].registerFresh(try ManualDevice(clientID: deployment.clientID)).json["access_token"] as? String)
        func post(_ instance: Int, profile: String, tools: String? = nil) async throws -> HTTPResult {
            let body = PublishedClientTests.body(model: "claude-opus-4-8", fallbacks: nil, stream: false, tools: tools)
            return try await http[instance].send("POST", "/v1/messages", body: Data(body.utf8), contentType: "application/json",
                                                 headers: ["authorization": "Bearer \(token)", "anthropic-user-profile-id": profile,
                                                           "anthropic-beta": PublishedClientTests.profileBeta])
        }
        // The server tool the policy leaves out is refused on both instances, before the upstream.
        let search = #"[{"name":"web_search","type":"web_search_20260209","max_uses":1}]"#
        for instance in 0..<2 { #expect(try await post(instance, profile: "uprof_shared", tools: search).status == 400) }
        #expect(stub.requests.isEmpty)
        // Early in a minute, so that the window holds everything below.
        let intoMinute = Date().timeIntervalSince1970.truncatingRemainder(dividingBy: 60)
        if intoMinute > 35 { try await Task.sleep(for: .milliseconds(Int((60.5 - intoMinute) * 1000))) }
        // Four requests of one profile, alternating instances; each is awaited in the shared ledger
        // (its instance flushes every second), so the other instance sees it.
        func flushedRequests() throws -> Int {
            try ctl(["usage", "--json", "--by", "integration"]).split(separator: "\n")
                .compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
                .reduce(0) { $0 + ($1["requests"] as? Int ?? 0) }
        }
        for round in 0..<4 {
            #expect(try await post(round % 2, profile: "uprof_shared").status == 200, "round \(round)")
            let deadline = Date() + 10
            while try flushedRequests() < round + 1, Date() < deadline { try await Task.sleep(for: .milliseconds(50)) }
        }
        var statuses: [Int] = []
        for instance in 0..<2 { statuses.append(try await post(instance, profile: "uprof_shared").status) }
        #expect(statuses == [429, 429], "the profile's four requests on both instances fill its window: \(statuses)")
        #expect(try await post(1, profile: "uprof_other").status == 200, "another profile is not held back")
        #expect(stub.requests.count == 5)
    }
}
