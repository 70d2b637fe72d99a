import Foundation
import RawHTTP
import UpstreamStub

/// The shipped attestd with the stub upstream, a fresh database initialised by the shipped
/// attestctl, and what the console's tests need around it: sign-in links, raw requests to the
/// admin listener, and the session cookie of a signed-in member.
final class ConsoleFixture: @unchecked Sendable {
    static let owner = "owner@example.com"
    let directory: URL
    let db: String
    let stub: UpstreamStubServer
    let server: ServerProcess

    init(extraArguments: [String] = []) throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-console-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        db = directory.appendingPathComponent("attestd.sqlite").path
        stub = try UpstreamStubServer(UpstreamStubConfiguration(apiKeys: [RelayTests.keyA]))
        server = try ServerProcess(db: db, extraArguments: ["--upstream-url", stub.baseURL, "--usage-flush-interval", "1"] + extraArguments)
        _ = try ctl(["init", "--owner", Self.owner])
    }

    func stop() {
        server.stop()
        stub.stop()
        try? FileManager.default.removeItem(at: directory)
    }

    var adminBase: String { "http://127.0.0.1:\(server.adminPort)" }
    var origin: String { adminBase }

    @discardableResult
    func ctl(_ arguments: [String]) throws -> String {
        let (status, output) = try ServerProcess.attestctl(arguments + ["--db", db])
        guard status == 0 else { throw HTTPTestError("attestctl \(arguments.joined(separator: " ")) exited \(status): \(output)") }
        return output
    }

    /// What `attestctl console-login` prints: the link alone.
    func signInLink(_ actor: String = owner) throws -> String {
        try ctl(["console-login", "--actor", actor, "--base-url", adminBase]).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func createIntegration(name: String = "App") throws -> String {
        let created = try ctl(["integrations", "create", "--actor", Self.owner, "--name", name, "--team-id", "ABCDE12345",
                               "--bundle-id", "com.example.app", "--json"])
        guard let id = (try JSONSerialization.jsonObject(with: Data(created.utf8)) as? [String: Any])?["client_id"] as? String else {
            throw HTTPTestError("no client_id in \(created)")
        }
        return id
    }

    // MARK: Raw requests to the admin listener

    /// One request on its own connection; every byte as given (no redirects followed, no cookies kept).
    func request(_ method: String, _ path: String, headers: [(String, String)] = [], form: [(String, String)]? = nil) throws -> RawResponse {
        let connection = try RawConnection(port: server.adminPort, timeout: 10)
        defer { connection.disconnect() }
        var text = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(server.adminPort)\r\nConnection: close\r\n"
        for (name, value) in headers { text += "\(name): \(value)\r\n" }
        var body = ""
        if let form {
            var allowed = CharacterSet.alphanumerics
            allowed.insert(charactersIn: "-._~")
            body = form.map { "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: allowed)!)" }.joined(separator: "&")
            text += "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: \(body.utf8.count)\r\n"
        }
        guard connection.sendAll(text + "\r\n" + body), let response = connection.readFramedResponse() else {
            throw HTTPTestError("no answer to \(method) \(path)")
        }
        return response
    }

    /// Opens a sign-in link and presses its button; returns the session cookie it set.
    func signIn(_ actor: String = owner) throws -> String {
        let link = try signInLink(actor)
        let response = try redeem(String(link.dropFirst(adminBase.count)))
        guard response.status == 200, let cookie = Self.sessionCookie(response) else {
            throw HTTPTestError("sign-in answered \(response.status): \(response.text.prefix(300))")
        }
        return cookie
    }

    /// What a browser does with a sign-in link: GET its page (which spends nothing), then POST its
    /// one form, from that page (our Origin). `headers` go with both.
    func redeem(_ path: String, headers: [(String, String)] = [], origin: String? = nil) throws -> RawResponse {
        let page = try request("GET", path, headers: headers)
        guard page.status == 200, let range = page.text.range(of: #"name="token" value=""#) else { return page }
        let token = String(page.text[range.upperBound...].prefix { $0 != "\"" })
        return try request("POST", "/console/sign-in", headers: headers + [("Origin", origin ?? self.origin)], form: [("token", token)])
    }

    static func sessionCookie(_ response: RawResponse) -> String? {
        guard let header = response.headers["set-cookie"] else { return nil }
        for name in ["attestd_console=", "__Host-attestd_console="] where header.hasPrefix(name) {
            guard let value = header.dropFirst(name.count).split(separator: ";").first, !value.isEmpty else { return nil }
            return String(value)
        }
        return nil
    }

    /// The CSRF token of the first form on `path`, as the page renders it for this session.
    func csrf(_ cookie: String, on path: String = "/console/") throws -> String {
        let page = try request("GET", path, headers: [("Cookie", "attestd_console=\(cookie)")])
        guard let range = page.text.range(of: #"name="csrf" value=""#) else { throw HTTPTestError("no CSRF field on \(path): \(page.status)") }
        return String(page.text[range.upperBound...].prefix { $0 != "\"" })
    }

    /// A form posted as the console's own page would: the session, our Origin, the CSRF token.
    func post(_ path: String, cookie: String, _ fields: [(String, String)], csrf: String? = nil, origin: String? = nil) throws -> RawResponse {
        let token = try csrf ?? self.csrf(cookie)
        return try request("POST", path, headers: [("Cookie", "attestd_console=\(cookie)"), ("Origin", origin ?? self.origin)],
                           form: [("csrf", token)] + fields)
    }

    func integrations() throws -> [[String: Any]] {
        let object = try JSONSerialization.jsonObject(with: Data(try ctl(["integrations", "list", "--json"]).utf8)) as? [String: Any]
        return object?["integrations"] as? [[String: Any]] ?? []
    }
}
