import Foundation
import Testing
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// `/v1/authz/check` on the admin listener: attestd as the token check for a data plane the
/// operator already runs. Through the shipped attestd, directly (as Envoy's HTTP ext_authz and
/// nginx's auth_request ask) and behind Debian's nginx with docs/token-check-for-a-proxy.md's configuration.
@Suite(.serialized) struct AuthzCheckTests {
    typealias Fixture = RelayTests.Fixture

    /// The guide's nginx configuration, filled in: nginx in front of the Messages API (the stub),
    /// every request checked with attestd first.
    static func nginxConfiguration(directory: String, port: Int, adminPort: UInt16, upstream: String, key: String) -> String {
        """
        daemon off;
        worker_processes 1;
        pid \(directory)/nginx.pid;
        error_log \(directory)/error.log warn;
        events { worker_connections 256; }
        http {
          access_log off;
          client_body_temp_path \(directory)/body; proxy_temp_path \(directory)/proxy;
          fastcgi_temp_path \(directory)/fastcgi; uwsgi_temp_path \(directory)/uwsgi; scgi_temp_path \(directory)/scgi;
        \(Self.readmeServerBlock.replacingOccurrences(of: "listen 443 ssl;", with: "listen 127.0.0.1:\(port);")
            .replacingOccurrences(of: "http://127.0.0.1:9090", with: "http://127.0.0.1:\(adminPort)")
            .replacingOccurrences(of: "https://api.anthropic.com", with: upstream)
            .replacingOccurrences(of: "sk-ant-…", with: key)
            .replacingOccurrences(of: "api.anthropic.com", with: URL(string: upstream)!.host! + ":" + String(URL(string: upstream)!.port!))
            .split(separator: "\n").filter { !$0.contains("ssl_certificate") }.joined(separator: "\n"))
        }
        """
    }

    /// The server block as docs/token-check-for-a-proxy.md shows it (between its markers), so the test runs what the
    /// operator copies.
    static var readmeServerBlock: String {
        let readme = (try? String(contentsOfFile: ServerProcess.packageRoot.appendingPathComponent("docs/token-check-for-a-proxy.md").path, encoding: .utf8)) ?? ""
        guard let start = readme.range(of: "# nginx: attestd checks the tokens\n"), let end = readme.range(of: "# end of the nginx example", range: start.upperBound..<readme.endIndex) else {
            return "docs/token-check-for-a-proxy.md has no nginx example"
        }
        return String(readme[start.upperBound..<end.lowerBound])
    }

    @Test func aLiveTokenIsAnsweredWithItsWorkspaceAndClientAndEverythingElseIsRefusedInTheRelaysShapes() async throws {
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let admin = TestHTTP(baseURL: fixture.server.adminBaseURL)
        func check(_ method: String = "GET", _ path: String = "/v1/authz/check", token: String?, headers: [String: String] = [:]) async throws -> HTTPResult {
            try await admin.send(method, path, headers: headers.merging(token.map { ["authorization": "Bearer \($0)"] } ?? [:]) { $1 })
        }
        // nginx auth_request: GET, the original headers and the original URI.
        let messages = ["x-original-uri": "/v1/messages"]
        let live = try await check(token: fixture.tokenA, headers: messages)
        #expect(live.status == 200)
        #expect(live.header("x-attest-workspace") == "default")
        #expect(live.header("x-attest-client-id") == fixture.clientA)
        #expect(try await check(token: fixture.tokenB, headers: messages).header("x-attest-workspace") == "second")
        // A proxy that does not say what it asks about is refused: the check fails closed.
        let unsaid = try await check(token: fixture.tokenA)
        #expect(unsaid.status == 403 && UsageTests.errorType(unsaid) == "permission_error")
        // nginx's $request_uri as sent: a `#` is part of the path the upstream would get, not its end.
        #expect(try await check(token: fixture.tokenA, headers: ["x-original-uri": "/v1/messages#/../v1/files"]).status == 403)
        #expect(try await check(token: fixture.tokenA, headers: ["x-forwarded-uri": "/v1/messages"]).status == 200)
        // Envoy ext_authz: the original method, and the original path after this one.
        let envoy = try await check("POST", "/v1/authz/check/v1/messages", token: fixture.tokenA)
        #expect(envoy.status == 200 && envoy.header("x-attest-client-id") == fixture.clientA)
        #expect(try await check("POST", "/v1/authz/check/v1/messages/count_tokens", token: fixture.tokenA).status == 200)
        // Another API: 403 permission_error, as the relay answers it.
        let other = try await check("POST", "/v1/authz/check/v1/models", token: fixture.tokenA)
        #expect(other.status == 403 && UsageTests.errorType(other) == "permission_error")
        let viaNginx = try await check(token: fixture.tokenA, headers: ["x-original-uri": "/v1/files?limit=1"])
        #expect(viaNginx.status == 403 && UsageTests.errorType(viaNginx) == "permission_error")
        #expect(try await check(token: fixture.tokenA, headers: ["x-original-uri": "/v1/messages?beta=true"]).status == 200)
        // No token, a malformed one, an unknown one: 401 authentication_error with a request ID.
        for token in [nil, "not-a-token", "aat_" + String(repeating: "A", count: 43)] as [String?] {
            let refused = try await check(token: token)
            #expect(refused.status == 401 && UsageTests.errorType(refused) == "authentication_error", "\(token ?? "none")")
            #expect((refused.json["request_id"] as? String)?.hasPrefix("req_") == true)
        }
        // Never on the public listener.
        #expect(try await TestHTTP(baseURL: fixture.server.baseURL).send("GET", "/v1/authz/check",
                                                                         headers: ["authorization": "Bearer \(fixture.tokenA)"]).status == 404)
        // Revocation: refused on the next check.
        _ = try UsageTests.ctl(fixture, ["integrations", "revoke", fixture.clientA, "--actor", "owner@example.com", "--yes"])
        #expect(try await check(token: fixture.tokenA, headers: messages).status == 401)
        #expect(try await check(token: fixture.tokenB, headers: messages).status == 200)
    }

    @Test func nginxWithTheREADMEsConfigurationPassesALiveTokenAndRefusesARevokedOneOnItsNextRequest() async throws {
        let nginx = "/usr/sbin/nginx"
        try #require(FileManager.default.isExecutableFile(atPath: nginx), "nginx is missing: make installs Debian's nginx-light")
        #expect(!Self.readmeServerBlock.hasPrefix("docs/token-check-for-a-proxy.md has no"), "the nginx example of docs/token-check-for-a-proxy.md is missing")
        let fixture = try await Fixture()
        defer { fixture.stop() }
        let directory = fixture.directory.appendingPathComponent("nginx").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let port = try freePort()
        let configuration = Self.nginxConfiguration(directory: directory, port: port, adminPort: fixture.server.adminPort,
                                                    upstream: fixture.stub.baseURL, key: RelayTests.keyA)
        try configuration.write(toFile: directory + "/nginx.conf", atomically: true, encoding: .utf8)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: nginx)
        process.arguments = ["-c", directory + "/nginx.conf", "-p", directory]
        process.standardError = FileHandle.nullDevice
        try process.run()
        defer {
            process.terminate()
            process.waitUntilExit()
        }
        let front = TestHTTP(baseURL: URL(string: "http://127.0.0.1:\(port)")!)
        // nginx is up once it answers (anything).
        let deadline = Date() + 10
        while (try? await front.send("GET", "/")) == nil, Date() < deadline { try await Task.sleep(for: .milliseconds(20)) }
        func call(_ token: String) async throws -> HTTPResult {
            try await front.send("POST", "/v1/messages", body: Data(RelayTests.request().utf8), contentType: "application/json",
                                 headers: ["authorization": "Bearer \(token)", "anthropic-version": "2023-06-01"])
        }
        let passed = try await call(fixture.tokenA)
        #expect(passed.status == 200, "\(String(decoding: passed.body, as: UTF8.self)) \((try? String(contentsOfFile: directory + "/error.log", encoding: .utf8)) ?? "")")
        #expect((passed.json["content"] as? [[String: Any]])?.isEmpty == false)
        // The upstream got nginx's key and never the device's token.
        let seen = try #require(fixture.stub.requests.last)
        #expect(seen.headers.first { $0.name == "x-api-key" }?.value == RelayTests.keyA)
        #expect(!seen.headers.contains { $0.value.contains(fixture.tokenA) })
        #expect(seen.headers.first { $0.name == "x-attest-client-id" }?.value == fixture.clientA)
        // A bad token never reaches the upstream.
        let before = fixture.stub.requests.count
        let refused = try await call("aat_unknown")
        #expect(refused.status == 401 && UsageTests.errorType(refused) == "authentication_error")
        #expect(fixture.stub.requests.count == before)
        // Revoked with attestctl: refused on the very next request.
        _ = try UsageTests.ctl(fixture, ["integrations", "revoke", fixture.clientA, "--actor", "owner@example.com", "--yes"])
        let revoked = try await call(fixture.tokenA)
        #expect(revoked.status == 401 && UsageTests.errorType(revoked) == "authentication_error")
        #expect(fixture.stub.requests.count == before)
        #expect(try await call(fixture.tokenB).status == 200)
    }
}

/// A free loopback TCP port (bound, read and released).
func freePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else { throw HTTPTestError("no free port: errno \(errno)") }
    return Int(UInt16(bigEndian: address.sin_port))
}
