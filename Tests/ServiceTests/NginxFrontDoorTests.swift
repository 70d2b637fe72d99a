import Foundation
import Testing
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// deploy/nginx/attestd.conf as shipped, in front of the shipped attestd, with Debian's nginx
/// and a certificate from a test CA made here: a device's whole flow over HTTPS (curl, trusting
/// only that CA), streams that nothing buffers, and the device's own address on attestd's side.
/// The devices connect from 127.0.0.2 and 127.0.0.3, nginx from 127.0.0.1, so the addresses differ.
@Suite(.serialized) struct NginxFrontDoorTests {
    static let key = "test-key-nginx-front-door-0000"

    final class Deployment {
        let directory: URL
        let stub: UpstreamStubServer
        let certificates: StubCertificates
        let server: ServerProcess
        let nginx = Process()
        let port: Int
        let clientID: String

        init() throws {
            let nginxPath = "/usr/sbin/nginx"
            guard FileManager.default.isExecutableFile(atPath: nginxPath) else {
                throw HTTPTestError("nginx is missing: make installs Debian's nginx-light")
            }
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-nginx-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory.appendingPathComponent("nginx"), withIntermediateDirectories: true)
            let db = directory.appendingPathComponent("attestd.sqlite").path
            #expect(try ServerProcess.attestctl(["init", "--db", db, "--owner", "owner@example.com"]).0 == 0)
            let (status, output) = try ServerProcess.attestctl(["integrations", "create", "--db", db, "--actor", "owner@example.com", "--name", "App",
                                                                "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"])
            guard status == 0, let json = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any],
                  let clientID = json["client_id"] as? String else { throw HTTPTestError("integration: \(output)") }
            self.clientID = clientID
            stub = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: [NginxFrontDoorTests.key]))
            certificates = try StubCertificates.generate()
            let keyFile = directory.appendingPathComponent("upstream.key").path
            try Data(NginxFrontDoorTests.key.utf8).write(to: URL(fileURLWithPath: keyFile))
            // As the unit runs it behind nginx, with a per-address registration limit of 2 to see
            // whose address it counts.
            server = try ServerProcess(db: db, extraArguments: ["--upstream-url", stub.baseURL, "--upstream-key-file", keyFile,
                                                                "--trusted-proxy", "127.0.0.1/32", "--max-connections-per-ip", "0",
                                                                "--registration-limit-per-address", "2"])
            port = try freePort()
            let shipped = try String(contentsOfFile: ServerProcess.packageRoot.appendingPathComponent("deploy/nginx/attestd.conf").path, encoding: .utf8)
            let site = shipped
                .replacingOccurrences(of: "listen 443 ssl http2;", with: "listen 127.0.0.1:\(port) ssl http2;")
                .replacingOccurrences(of: "listen [::]:443 ssl http2;", with: "")
                .replacingOccurrences(of: "server 127.0.0.1:8080;", with: "server 127.0.0.1:\(server.port);")
                .replacingOccurrences(of: "/etc/ssl/attestd/fullchain.pem", with: certificates.certificatePath)
                .replacingOccurrences(of: "/etc/ssl/attestd/privkey.pem", with: certificates.keyPath)
            let nginxDirectory = directory.appendingPathComponent("nginx").path
            try site.write(toFile: nginxDirectory + "/attestd.conf", atomically: true, encoding: .utf8)
            try """
            daemon off;
            worker_processes 1;
            pid \(nginxDirectory)/nginx.pid;
            error_log \(nginxDirectory)/error.log warn;
            events { worker_connections 256; }
            http {
              access_log off;
              client_body_temp_path \(nginxDirectory)/body; proxy_temp_path \(nginxDirectory)/proxy;
              fastcgi_temp_path \(nginxDirectory)/fastcgi; uwsgi_temp_path \(nginxDirectory)/uwsgi; scgi_temp_path \(nginxDirectory)/scgi;
              include \(nginxDirectory)/attestd.conf;
            }
            """.write(toFile: nginxDirectory + "/nginx.conf", atomically: true, encoding: .utf8)
            nginx.executableURL = URL(fileURLWithPath: nginxPath)
            nginx.arguments = ["-c", nginxDirectory + "/nginx.conf", "-p", nginxDirectory]
            nginx.standardError = FileHandle.nullDevice
            try nginx.run()
            // Up once it answers over TLS.
            let deadline = Date() + 15
            while (try? curl("/healthz").status) != 200 {
                guard Date() < deadline, nginx.isRunning else {
                    stop()
                    throw HTTPTestError("nginx did not come up: \((try? String(contentsOfFile: nginxDirectory + "/error.log", encoding: .utf8)) ?? "")")
                }
                usleep(20_000)
            }
        }

        func stop() {
            if nginx.isRunning {
                nginx.terminate()
                nginx.waitUntilExit()
            }
            server.stop()
            stub.stop()
            certificates.remove()
            try? FileManager.default.removeItem(at: directory)
        }

        /// One request over HTTPS through nginx with curl, trusting only the test CA, from `from`.
        func curl(_ path: String, method: String = "GET", body: String? = nil, contentType: String = "application/json",
                  headers: [String: String] = [:], from: String = "127.0.0.2") throws -> (status: Int, body: String) {
            var arguments = ["-sS", "--http2", "--cacert", certificates.caPath, "--interface", from, "-X", method,
                             "-w", "\n%{http_code} %{http_version}", "--max-time", "30"]
            for (name, value) in headers { arguments += ["-H", "\(name): \(value)"] }
            if let body { arguments += ["-H", "content-type: \(contentType)", "--data-binary", body] }
            arguments.append("https://127.0.0.1:\(port)\(path)")
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
            process.arguments = arguments
            let output = Pipe()
            process.standardOutput = output
            process.standardError = FileHandle.nullDevice
            try process.run()
            let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            guard let newline = text.lastIndex(of: "\n") else { throw HTTPTestError("curl: \(text)") }
            let trailer = text[text.index(after: newline)...].split(separator: " ")
            guard trailer.count == 2, let status = Int(trailer[0]) else { throw HTTPTestError("curl: \(text)") }
            #expect(status == 0 || trailer[1] == "2", "not HTTP/2 through nginx: \(trailer[1])")
            return (status, String(text[..<newline]))
        }

        func json(_ text: String) -> [String: Any] {
            (try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]) ?? [:]
        }

        /// A device's registration through nginx: its access token, or the refusal's status.
        func register(_ device: ManualDevice, from: String = "127.0.0.2") throws -> (status: Int, token: String?) {
            let challenge = try curl("/v1/oauth/app-attest/challenge", method: "POST",
                                     body: #"{"client_id":"\#(clientID)","key_id":"\#(device.keyIDBase64)"}"#, from: from)
            guard challenge.status == 200, let text = json(challenge.body)["challenge"] as? String, let bytes = Data(base64Encoded: text) else {
                return (challenge.status, nil)
            }
            let attestation = try device.attestation(challenge: Array(bytes))
            let registered = try curl("/v1/oauth/app-attest/register", method: "POST",
                                      body: #"{"client_id":"\#(clientID)","key_id":"\#(device.keyIDBase64)","attestation_object":"\#(attestation)"}"#,
                                      from: from)
            return (registered.status, json(registered.body)["access_token"] as? String)
        }
    }

    @Test func aDeviceRegistersRefreshesAndCallsClaudeThroughTheTLSFrontDoor() throws {
        let deployment = try Deployment()
        defer { deployment.stop() }
        let device = try ManualDevice(clientID: deployment.clientID)
        let (status, first) = try deployment.register(device)
        #expect(status == 200 && first != nil)
        // The refresh: challenge, then an assertion for a new token.
        let challenge = try deployment.curl("/v1/oauth/app-attest/challenge", method: "POST",
                                            body: #"{"client_id":"\#(deployment.clientID)","key_id":"\#(device.keyIDBase64)"}"#)
        let bytes = try #require(Data(base64Encoded: deployment.json(challenge.body)["challenge"] as? String ?? ""))
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        let form = [("assertion", try device.assertion(challenge: Array(bytes))), ("client_id", deployment.clientID),
                    ("grant_type", "urn:anthropic:params:oauth:grant-type:app-attest"), ("key_id", device.keyIDBase64)]
            .map { "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: allowed)!)" }.joined(separator: "&")
        let refreshed = try deployment.curl("/v1/oauth/token", method: "POST", body: form, contentType: "application/x-www-form-urlencoded")
        #expect(refreshed.status == 200)
        let token = try #require(deployment.json(refreshed.body)["access_token"] as? String)
        #expect(token != first)

        // The Messages API as JSON, then as a stream, through nginx to the stub upstream.
        let auth = ["authorization": "Bearer \(token)", "anthropic-version": "2023-06-01"]
        let reply = try deployment.curl("/v1/messages", method: "POST", body: RelayTests.request(), headers: auth)
        #expect(reply.status == 200 && deployment.json(reply.body)["type"] as? String == "message")
        let stream = try deployment.curl("/v1/messages", method: "POST", body: RelayTests.request(stream: true), headers: auth)
        #expect(stream.status == 200 && stream.body.hasPrefix("event: message_start") && stream.body.contains("event: message_stop"))
        #expect(deployment.stub.requests.last?.header("x-api-key") == Self.key)
        // No redirect anywhere: nginx adds none (a directory slash, http to https) on any path.
        for path in ["/v1", "/v1/", "/v1/messages/", "/v1/oauth", "/", "/console", "/console/"] {
            let status = try deployment.curl(path).status
            #expect(status >= 400 && status < 500, "\(path): \(status)")
        }
        // The admin listener's routes are not there.
        #expect(try deployment.curl("/metrics").status == 404)
    }

    @Test func theFirstStreamedEventReachesTheDeviceBeforeTheUpstreamHasSentItsLast() throws {
        let deployment = try Deployment()
        defer { deployment.stop() }
        let (_, token) = try deployment.register(try ManualDevice(clientID: deployment.clientID))
        let body = RelayTests.request(model: "stub-slow-stream-20", stream: true)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        process.arguments = ["-sSN", "--http2", "--cacert", deployment.certificates.caPath, "--interface", "127.0.0.2", "-X", "POST",
                             "-H", "authorization: Bearer \(token ?? "")", "-H", "content-type: application/json", "--data-binary", body,
                             "https://127.0.0.1:\(deployment.port)/v1/messages"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        defer { if process.isRunning { process.terminate() }; process.waitUntilExit() }
        var received = Data()
        while !String(decoding: received, as: UTF8.self).contains("event: content_block_delta") {
            let chunk = output.fileHandleForReading.availableData
            guard !chunk.isEmpty else { break }
            received.append(chunk)
        }
        #expect(String(decoding: received, as: UTF8.self).contains("event: content_block_delta"))
        // The upstream is still streaming: nothing between it and the device held the events back.
        #expect(deployment.stub.openStreams == 1)
        #expect(deployment.stub.requests.last?.outcome == .inProgress)
    }

    @Test func attestdSeesAndLimitsTheDevicesOwnAddressWhateverTheClientWrites() throws {
        let deployment = try Deployment()
        defer { deployment.stop() }
        let spoof = ["x-forwarded-for": "203.0.113.9", "forwarded": "for=203.0.113.10"]
        // Two registrations from 127.0.0.2 use its allowance (2 an hour), whatever the client claims.
        for _ in 0..<2 {
            let device = try ManualDevice(clientID: deployment.clientID)
            let challenge = try deployment.curl("/v1/oauth/app-attest/challenge", method: "POST",
                                                body: #"{"client_id":"\#(deployment.clientID)","key_id":"\#(device.keyIDBase64)"}"#, headers: spoof)
            #expect(challenge.status == 200)
            #expect(try deployment.register(device).status == 200)
        }
        #expect(try deployment.register(try ManualDevice(clientID: deployment.clientID)).status == 429)
        // Another device address is counted apart: nginx's own address (127.0.0.1) is not the key.
        #expect(try deployment.register(try ManualDevice(clientID: deployment.clientID), from: "127.0.0.3").status == 200)
        let log = deployment.server.log
        #expect(log.contains(#""remote":"127.0.0.2""#) && log.contains(#""remote":"127.0.0.3""#))
        #expect(!log.contains("203.0.113."))
        #expect(!log.contains(#""remote":"127.0.0.1""#))
    }
}
