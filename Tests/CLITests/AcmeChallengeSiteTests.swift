import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

/// deploy/nginx/attestd-acme.conf as docs/deploying.md installs it for certbot's webroot plugin,
/// run by Debian's nginx on a loopback port: a file certbot writes under
/// /.well-known/acme-challenge/ is served as is, and every other path is 404, never a redirect.
@Suite struct AcmeChallengeSiteTests {
    static let nginx = "/usr/sbin/nginx"

    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard bound else { throw POSIXError(.EADDRINUSE) }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    static func get(_ url: String) async throws -> (Int, String, String?) {
        final class NoRedirects: NSObject, URLSessionTaskDelegate {
            func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                            newRequest request: URLRequest) async -> URLRequest? { nil }
        }
        let session = URLSession(configuration: .ephemeral, delegate: NoRedirects(), delegateQueue: nil)
        let (data, response) = try await session.data(from: try #require(URL(string: url)))
        let http = try #require(response as? HTTPURLResponse)
        return (http.statusCode, String(decoding: data, as: UTF8.self), http.value(forHTTPHeaderField: "Location"))
    }

    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: nginx), "nginx is missing: make installs Debian's nginx-light"))
    func theChallengeIsServedAndNothingElse() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("acme-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let webroot = directory.appendingPathComponent("acme"), challenges = webroot.appendingPathComponent(".well-known/acme-challenge")
        try FileManager.default.createDirectory(at: challenges, withIntermediateDirectories: true)
        try Data("token-123.thumbprint\n".utf8).write(to: challenges.appendingPathComponent("token-123"))
        let port = try Self.freePort()
        let shipped = try String(contentsOf: AdminCommandTests.packageRoot.appendingPathComponent("deploy/nginx/attestd-acme.conf"), encoding: .utf8)
        #expect(shipped.contains("root /var/www/acme;"), "docs/deploying.md's certbot -w /var/www/acme must be the site's root")
        let site = shipped
            .replacingOccurrences(of: "listen 80;", with: "listen 127.0.0.1:\(port);")
            .replacingOccurrences(of: "listen [::]:80;", with: "")
            .replacingOccurrences(of: "/var/www/acme", with: webroot.path)
        try site.write(to: directory.appendingPathComponent("acme.conf"), atomically: true, encoding: .utf8)
        let d = directory.path
        try """
        daemon off;
        worker_processes 1;
        pid \(d)/nginx.pid;
        error_log \(d)/error.log warn;
        events { worker_connections 64; }
        http {
          access_log off;
          client_body_temp_path \(d)/body; proxy_temp_path \(d)/proxy;
          fastcgi_temp_path \(d)/fastcgi; uwsgi_temp_path \(d)/uwsgi; scgi_temp_path \(d)/scgi;
          include \(d)/acme.conf;
        }
        """.write(to: directory.appendingPathComponent("nginx.conf"), atomically: true, encoding: .utf8)
        let nginx = Process()
        nginx.executableURL = URL(fileURLWithPath: Self.nginx)
        nginx.arguments = ["-c", "\(d)/nginx.conf", "-p", d]
        nginx.standardError = FileHandle.nullDevice
        try nginx.run()
        defer { nginx.terminate(); nginx.waitUntilExit() }
        // Up once it answers.
        let base = "http://127.0.0.1:\(port)"
        let deadline = Date() + 15
        while (try? await Self.get("\(base)/")) == nil {
            let log = (try? String(contentsOfFile: "\(d)/error.log", encoding: .utf8)) ?? ""
            try #require(Date() < deadline && nginx.isRunning, "nginx did not come up: \(log)")
            try await Task.sleep(for: .milliseconds(20))
        }
        let challenge = try await Self.get("\(base)/.well-known/acme-challenge/token-123")
        #expect(challenge.0 == 200 && challenge.1 == "token-123.thumbprint\n")
        for path in ["/", "/v1/messages", "/v1/oauth/token", "/.well-known/acme-challenge/absent"] {
            let answer = try await Self.get(base + path)
            #expect(answer.0 == 404 && answer.2 == nil, "\(path): \(answer.0) \(answer.2 ?? "")")
        }
    }
}
