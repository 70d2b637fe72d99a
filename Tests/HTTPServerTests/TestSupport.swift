import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization
import Testing
@testable import HTTPServer

// MARK: - Servers

let echoHandler: @Sendable (HTTPRequest) -> HTTPResponse = { request in
    let text = "\(request.method)|\(request.path)|\(request.query ?? "-")|\(request.header("x-test") ?? "-")|"
        + "\(request.remoteAddress)|"
    return HTTPResponse(status: 200, headers: [(name: "Content-Type", value: "text/plain")],
                        body: Array(text.utf8) + request.body)
}

func loopbackConfig() -> HTTPServerConfiguration {
    var config = HTTPServerConfiguration()
    config.host = "127.0.0.1"
    config.port = 0
    config.threads = 4
    return config
}

func startServer(_ config: HTTPServerConfiguration = loopbackConfig(),
                 handler: @escaping @Sendable (HTTPRequest) -> HTTPResponse) throws -> HTTPServer {
    let server = HTTPServer(configuration: config, handler: handler)
    try server.start()
    return server
}

func startServer(_ config: HTTPServerConfiguration = loopbackConfig(),
                 writerHandler: @escaping @Sendable (HTTPRequest, HTTPResponseWriter) -> HTTPHandlerResult) throws -> HTTPServer {
    let server = HTTPServer(configuration: config, handler: writerHandler)
    try server.start()
    return server
}

func post(bodySize: Int, path: String = "/upload") -> String {
    "POST \(path) HTTP/1.1\r\nHost: a\r\nContent-Length: \(bodySize)\r\n\r\n" + String(repeating: "a", count: bodySize)
}

/// Request contexts are released when requests complete (possibly just after the reply).
func expectNoLeaks(_ server: HTTPServer, sourceLocation: SourceLocation = #_sourceLocation) {
    waitUntil(timeout: 2) { server.liveRequestContexts == 0 && server.bufferedBodyBytes == 0 }
    #expect(server.liveRequestContexts == 0, "live request contexts", sourceLocation: sourceLocation)
    #expect(server.bufferedBodyBytes == 0, "reserved body bytes", sourceLocation: sourceLocation)
}

/// Polls `condition` every 5 ms until it holds or `timeout` seconds pass; returns whether it held.
@discardableResult
func waitUntil(timeout: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while !condition() {
        if Date() > deadline { return false }
        usleep(5_000)
    }
    return true
}

/// A value shared between the test, the handler and producer threads.
final class Shared<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ initial: Value) { value = Mutex(initial) }
    var get: Value { value.withLock { $0 } }
    func set(_ new: Value) { value.withLock { $0 = new } }
    @discardableResult
    func update<R: Sendable>(_ body: (inout Value) -> R) -> R { value.withLock { body(&$0) } }
}

final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    func next() -> Int { value.wrappingAdd(1, ordering: .relaxed).newValue }
    var current: Int { value.load(ordering: .relaxed) }
}

/// Runs `body` on a new thread (a producer, like the relay's libcurl thread).
func onAnotherThread(after delay: Double = 0, _ body: @escaping @Sendable () -> Void) {
    Thread.detachNewThread {
        if delay > 0 { Thread.sleep(forTimeInterval: delay) }
        body()
    }
}

/// User + system CPU time of this process so far.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    func seconds(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1e6 }
    return seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Resident set size of this process (Linux /proc/self/statm).
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    return fields.count > 1 ? (Int(fields[1]) ?? 0) * Int(sysconf(Int32(_SC_PAGESIZE))) : 0
}

/// Threads in this process (Linux /proc/self/task).
func threadCount() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? 0
}

// MARK: - A raw HTTP/1.1 client

#if os(Linux)
private let streamSocketType = Int32(SOCK_STREAM.rawValue)
private let noSignal = Int32(MSG_NOSIGNAL)
#else
private let streamSocketType = SOCK_STREAM
private let noSignal: Int32 = 0  // Darwin would need SO_NOSIGPIPE instead
#endif

struct RawResponse {
    let status: Int
    let headers: [String: String]
    let body: [UInt8]
    var text: String { String(decoding: body, as: UTF8.self) }
}

struct RawHead {
    let status: Int
    let headers: [String: String]
    /// Number of status lines seen in the head ("HTTP/1.x NNN" lines).
    let statusLines: Int
}

struct SocketError: Error, CustomStringConvertible {
    let description: String
}

/// A blocking loopback TCP client speaking just enough HTTP/1.1 for the tests.
final class RawConnection {
    enum Outcome: Equatable { case open, closed, timedOut }

    private var fd: Int32
    private var buffer: [UInt8] = []
    private(set) var lastOutcome: Outcome = .open

    /// `receiveBuffer` > 0 shrinks SO_RCVBUF before connecting (for back-pressure tests).
    init(port: UInt16, timeout: Double = 5, ipv6: Bool = false, receiveBuffer: Int32 = 0) throws {
        fd = socket(ipv6 ? AF_INET6 : AF_INET, streamSocketType, 0)
        guard fd >= 0 else { throw SocketError(description: "socket: \(errno)") }
        setTimeout(timeout)
        if receiveBuffer > 0 {
            var size = receiveBuffer
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        let result: Int32
        if ipv6 {
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = port.bigEndian
            address.sin6_addr = in6addr_loopback
            result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size))
                }
            }
        } else {
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        }
        guard result == 0 else {
            let code = errno
            close(fd)
            throw SocketError(description: "connect: \(String(cString: strerror(code)))")
        }
    }

    deinit { disconnect() }

    func setTimeout(_ timeout: Double) {
        var tv = timeval(tv_sec: Int(timeout), tv_usec: Int((timeout - Double(Int(timeout))) * 1_000_000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    func disconnect() {
        if fd >= 0 { close(fd); fd = -1 }
    }

    /// Sends everything; false if the peer stopped accepting data (no SIGPIPE).
    func sendAll(_ text: String) -> Bool { sendAll(Array(text.utf8)) }

    func sendAll(_ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, noSignal) }
            if sent <= 0 { return false }
            offset += sent
        }
        return true
    }

    /// Reads one response (status line, headers, content-length body); nil on close/timeout.
    func readResponse() -> RawResponse? {
        guard let head = readHead() else { return nil }
        let length = Int(head.headers["content-length"] ?? "0") ?? 0
        guard let body = readExactly(length) else { return nil }
        return RawResponse(status: head.status, headers: head.headers, body: body)
    }

    /// Reads a status line and headers; the body stays buffered.
    func readHead() -> RawHead? {
        let separator: [UInt8] = [13, 10, 13, 10]
        var headerEnd: Int?
        while true {
            if let end = find(separator, in: buffer) { headerEnd = end; break }
            guard fill() else { return nil }
        }
        guard let end = headerEnd else { return nil }
        let head = String(decoding: buffer[..<end], as: UTF8.self)
        buffer.removeFirst(end + separator.count)
        var lines = head.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else { return nil }
        var headers: [String: String] = [:]
        var statusLines = 1
        for line in lines {
            if line.hasPrefix("HTTP/1.") { statusLines += 1 }
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return RawHead(status: status, headers: headers, statusLines: statusLines)
    }

    /// Reads one chunk of a chunked body: its bytes, [] for the last chunk, nil on close/timeout
    /// or bad framing.
    func readChunk() -> [UInt8]? {
        guard let sizeLine = readLine(), let size = Int(sizeLine.split(separator: ";").first ?? "", radix: 16) else {
            return nil
        }
        if size == 0 {
            // Trailers (none expected) end with an empty line.
            while let line = readLine(), !line.isEmpty {}
            return []
        }
        guard let data = readExactly(size), readLine() == "" else { return nil }
        return data
    }

    /// Reads a whole chunked body.
    func readChunkedBody() -> [UInt8]? {
        var body: [UInt8] = []
        while true {
            guard let chunk = readChunk() else { return nil }
            if chunk.isEmpty { return body }
            body += chunk
        }
    }

    /// Everything received until the peer closes (or the timeout).
    func readToEnd() -> [UInt8] {
        while fill() {}
        defer { buffer = [] }
        return buffer
    }

    /// Waits until the server closes the connection (EOF or reset) without sending data.
    func waitForClose() -> Outcome {
        while fill() {}
        return lastOutcome
    }

    func readExactly(_ count: Int) -> [UInt8]? {
        while buffer.count < count {
            guard fill() else { return nil }
        }
        let bytes = Array(buffer[..<count])
        buffer.removeFirst(count)
        return bytes
    }

    private func readLine() -> String? {
        while true {
            if let end = find([13, 10], in: buffer) {
                let line = String(decoding: buffer[..<end], as: UTF8.self)
                buffer.removeFirst(end + 2)
                return line
            }
            guard fill() else { return nil }
        }
    }

    /// Appends received bytes to the buffer; false once the connection closed or timed out.
    private func fill() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let received = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if received > 0 {
            buffer.append(contentsOf: chunk[..<received])
            return true
        }
        if received < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
            lastOutcome = .timedOut
        } else {
            lastOutcome = .closed  // orderly EOF or ECONNRESET
        }
        return false
    }

    private func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for index in 0...(haystack.count - needle.count) where haystack[index..<(index + needle.count)].elementsEqual(needle) {
            return index
        }
        return nil
    }
}
