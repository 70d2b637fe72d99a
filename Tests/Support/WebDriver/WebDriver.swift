import Foundation
import RawHTTP

/// A small W3C WebDriver client for Debian's `chromedriver` driving a headless `chromium`: the
/// commands the console's tests use (navigate, find, click, type, read, run a script, screenshot).
/// It starts and stops the driver itself; when the browser cannot start it throws, loudly.
public final class Browser: @unchecked Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        public init(_ description: String) { self.description = description }
    }

    /// A page element, by the driver's reference.
    public struct Element: Sendable {
        let id: String
    }

    static let elementKey = "element-6066-11e4-a52e-4f735466cecf"
    public static let driverPath = "/usr/bin/chromedriver"
    public static let chromiumPath = "/usr/bin/chromium"

    let driver = Process()
    let base: URL
    let session: String
    private let output = Pipe()

    /// Starts chromedriver on a free port and a headless Chromium session of `width` × `height`.
    public init(width: Int = 1280, height: Int = 900) async throws {
        guard FileManager.default.isExecutableFile(atPath: Self.driverPath), FileManager.default.isExecutableFile(atPath: Self.chromiumPath) else {
            throw Failure("the console's browser tests need Debian's chromium and chromium-driver (\(Self.chromiumPath), \(Self.driverPath)): run make deps")
        }
        driver.executableURL = URL(fileURLWithPath: Self.driverPath)
        driver.arguments = ["--port=0"]
        driver.standardOutput = output
        driver.standardError = FileHandle.nullDevice
        try driver.run()
        // "ChromeDriver was started successfully on port N."
        var text = ""
        let reader = output.fileHandleForReading
        var port: Int?
        while port == nil {
            let data = reader.availableData
            guard !data.isEmpty else { break }
            text += String(decoding: data, as: UTF8.self)
            if let range = text.range(of: "successfully on port ") {
                let digits = text[range.upperBound...].prefix { $0.isNumber }
                if text[range.upperBound...].dropFirst(digits.count).first == "." { port = Int(digits) }
            }
        }
        guard let port else {
            Self.stop(driver)
            throw Failure("chromedriver did not start: \(text)")
        }
        base = URL(string: "http://127.0.0.1:\(port)")!
        let capabilities: [String: Any] = ["capabilities": ["alwaysMatch": [
            "browserName": "chrome",
            "goog:chromeOptions": [
                "binary": Self.chromiumPath,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                         "--window-size=\(width),\(height)", "--lang=en-US"],
            ] as [String: Any],
        ] as [String: Any]]]
        do {
            let reply = try Self.call(base, "POST", "/session", capabilities)
            guard let value = reply as? [String: Any], let id = value["sessionId"] as? String else { throw Failure("no session in \(reply)") }
            session = id
        } catch {
            Self.stop(driver)
            throw Failure("chromium did not start under chromedriver: \(error)")
        }
    }

    deinit { stopDriver() }

    /// Ends the session (Chromium closes) and the driver.
    public func quit() async {
        _ = try? await command("DELETE", "")
        stopDriver()
    }

    /// SIGKILL: chromedriver does not always exit on SIGTERM, and Foundation's
    /// waitUntilExit would spin on it.
    func stopDriver() { Self.stop(driver) }

    static func stop(_ driver: Process) {
        guard driver.isRunning else { return }
        kill(driver.processIdentifier, SIGKILL)
        var status: Int32 = 0
        waitpid(driver.processIdentifier, &status, 0)
    }

    // MARK: Commands

    /// One command on its own loopback connection. (Foundation's URLSession cannot read
    /// chromedriver's answers: their headers have no space after the colon.)
    static func call(_ base: URL, _ method: String, _ path: String, _ body: [String: Any]?) throws -> Any {
        let connection = try RawConnection(port: UInt16(base.port!), timeout: 60)
        defer { connection.disconnect() }
        let payload = try body.map { try JSONSerialization.data(withJSONObject: $0) } ?? Data()
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(base.port!)\r\nConnection: close\r\n"
        if body != nil { head += "Content-Type: application/json; charset=utf-8\r\nContent-Length: \(payload.count)\r\n" }
        guard connection.sendAll(Array((head + "\r\n").utf8) + Array(payload)), let response = connection.readFramedResponse() else {
            throw Failure("WebDriver \(method) \(path): no answer from chromedriver")
        }
        let object = (try? JSONSerialization.jsonObject(with: Data(response.body), options: [.fragmentsAllowed])) as? [String: Any]
        let value = object?["value"] ?? NSNull()
        guard response.status == 200 else {
            let error = (value as? [String: Any]).map { "\($0["error"] ?? ""): \($0["message"] ?? "")" } ?? response.text
            throw Failure("WebDriver \(method) \(path): \(error.prefix(600))")
        }
        return value
    }

    @discardableResult
    func command(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> Any {
        try Self.call(base, method, "/session/\(session)" + path, method == "POST" ? (body ?? [:]) : nil)
    }

    public func open(_ url: String) async throws { try await command("POST", "/url", ["url": url]) }
    public func url() async throws -> String { try await command("GET", "/url") as? String ?? "" }
    public func title() async throws -> String { try await command("GET", "/title") as? String ?? "" }
    public func source() async throws -> String { try await command("GET", "/source") as? String ?? "" }
    public func resize(width: Int, height: Int) async throws { try await command("POST", "/window/rect", ["width": width, "height": height]) }

    public func find(_ css: String) async throws -> Element {
        let value = try await command("POST", "/element", ["using": "css selector", "value": css])
        guard let id = (value as? [String: Any])?[Self.elementKey] as? String else { throw Failure("no element \(css)") }
        return Element(id: id)
    }

    public func findAll(_ css: String) async throws -> [Element] {
        let value = try await command("POST", "/elements", ["using": "css selector", "value": css])
        return (value as? [[String: Any]] ?? []).compactMap { ($0[Self.elementKey] as? String).map(Element.init) }
    }

    /// The element whose visible text is exactly `text` among those `css` selects.
    public func find(_ css: String, text: String) async throws -> Element {
        for element in try await findAll(css) where try await self.text(element) == text { return element }
        throw Failure("no \(css) reading \"\(text)\"")
    }

    public func exists(_ css: String) async throws -> Bool { !(try await findAll(css)).isEmpty }
    public func click(_ element: Element) async throws { try await command("POST", "/element/\(element.id)/click") }
    public func clear(_ element: Element) async throws { try await command("POST", "/element/\(element.id)/clear") }
    public func type(_ element: Element, _ text: String) async throws { try await command("POST", "/element/\(element.id)/value", ["text": text]) }
    public func text(_ element: Element) async throws -> String { try await command("GET", "/element/\(element.id)/text") as? String ?? "" }
    public func text(_ css: String) async throws -> String { try await text(try find(css)) }
    public func property(_ element: Element, _ name: String) async throws -> Any { try await command("GET", "/element/\(element.id)/property/\(name)") }
    public func attribute(_ element: Element, _ name: String) async throws -> String? {
        try await command("GET", "/element/\(element.id)/attribute/\(name)") as? String
    }

    /// Runs `script` in the page (a function body; `arguments` holds `args`).
    public func run(_ script: String, _ args: [Any] = []) async throws -> Any {
        try await command("POST", "/execute/sync", ["script": script, "args": args])
    }

    public func screenshot() async throws -> Data {
        guard let text = try await command("GET", "/screenshot") as? String, let data = Data(base64Encoded: text) else { throw Failure("no screenshot") }
        return data
    }

    public func cookies() async throws -> [[String: Any]] { try await command("GET", "/cookie") as? [[String: Any]] ?? [] }

    // MARK: Waiting for events

    /// Waits until `condition` holds (checked as events arrive, up to `timeout`); throws with
    /// `what` when it never does.
    public func wait(_ what: String, timeout: TimeInterval = 60, _ condition: () async throws -> Bool) async throws {
        let deadline = Date() + timeout
        var lastError: (any Error)?
        while Date() < deadline {
            do { if try await condition() { return } } catch { lastError = error }
            try await Task.sleep(nanoseconds: 50_000_000)
        }
        throw Failure("timed out waiting for \(what)" + (lastError.map { " (last error: \($0))" } ?? ""))
    }

    /// The path of a URL as written (Foundation's `URL.path` drops a trailing slash), without query or fragment.
    public static func path(of url: String) -> String {
        var rest = Substring(url)
        if let scheme = rest.range(of: "://") {
            rest = rest[scheme.upperBound...]
            rest = rest.firstIndex(of: "/").map { rest[$0...] } ?? "/"
        }
        return String(rest.prefix { $0 != "?" && $0 != "#" })
    }

    /// Waits for a loaded page at a path that `matches`.
    public func waitForPage(_ what: String, _ matches: @escaping (String) -> Bool) async throws {
        try await wait("the page \(what)") {
            let url = try await self.url()
            guard matches(Self.path(of: url)) else { return false }
            return try await self.run("return document.readyState") as? String == "complete"
        }
    }
}
