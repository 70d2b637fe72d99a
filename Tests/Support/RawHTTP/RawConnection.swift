import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// A raw HTTP/1.1 client on blocking loopback sockets, for tests that must see every byte the
// server frames (how many status lines, when it closes) and send bytes no HTTP library would.
// Every socket operation is bounded by the connection's timeout.

#if os(Linux)
let streamSocketType = Int32(SOCK_STREAM.rawValue)
let noSignal = Int32(MSG_NOSIGNAL)
#else
let streamSocketType = SOCK_STREAM
let noSignal: Int32 = 0  // Darwin would need SO_NOSIGPIPE instead
#endif

public struct RawResponse: Sendable {
    public let status: Int
    public let headers: [String: String]
    public let body: [UInt8]
    public var text: String { String(decoding: body, as: UTF8.self) }
    /// The body as a JSON object, or nil.
    public var json: [String: Any]? { try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] }
}

public struct RawHead: Sendable {
    public let status: Int
    public let headers: [String: String]
    /// Number of status lines seen in the head ("HTTP/1.x NNN" lines).
    public let statusLines: Int
}

public struct SocketError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Sets SO_RCVTIMEO and SO_SNDTIMEO (on Linux SO_SNDTIMEO also bounds connect).
func setSocketTimeout(_ fd: Int32, _ timeout: Double) {
    var tv = timeval(tv_sec: Int(timeout), tv_usec: Int((timeout - Double(Int(timeout))) * 1_000_000))
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
}

/// A socket address from an IPv4 or IPv6 literal ("127.0.0.3", "::1"; port 0: any).
struct SocketAddress {
    private var storage = sockaddr_storage()
    let family: Int32
    let length: socklen_t

    init(_ host: String, port: UInt16) throws {
        var v4 = sockaddr_in()
        var v6 = sockaddr_in6()
        if inet_pton(AF_INET, host, &v4.sin_addr) == 1 {
            v4.sin_family = sa_family_t(AF_INET)
            v4.sin_port = port.bigEndian
            family = AF_INET
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
            withUnsafeBytes(of: &v4) { source in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: source) } }
        } else if inet_pton(AF_INET6, host, &v6.sin6_addr) == 1 {
            v6.sin6_family = sa_family_t(AF_INET6)
            v6.sin6_port = port.bigEndian
            family = AF_INET6
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
            withUnsafeBytes(of: &v6) { source in withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: source) } }
        } else {
            throw SocketError("not an IP literal: \(host)")
        }
    }

    func withSockaddr<T>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
        var copy = storage
        return withUnsafePointer(to: &copy) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, length) } }
    }
}

/// A connected TCP socket with `timeout` on every operation, bound first to `source` (a
/// loopback address such as 127.0.0.3) when given, so that the server sees that peer address.
/// `receiveBuffer` > 0 shrinks SO_RCVBUF before connecting.
func connectedSocket(host: String, port: UInt16, source: String? = nil, timeout: Double, receiveBuffer: Int32 = 0) throws -> Int32 {
    let remote = try SocketAddress(host, port: port)
    let fd = socket(remote.family, streamSocketType, 0)
    guard fd >= 0 else { throw SocketError("socket: \(String(cString: strerror(errno)))") }
    setSocketTimeout(fd, timeout)
    if receiveBuffer > 0 {
        var size = receiveBuffer
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    }
    do {
        if let source {
            let local = try SocketAddress(source, port: 0)
            guard local.withSockaddr({ bind(fd, $0, $1) }) == 0 else {
                throw SocketError("bind \(source): \(String(cString: strerror(errno)))")
            }
        }
        guard remote.withSockaddr({ connect(fd, $0, $1) }) == 0 else {
            throw SocketError("connect \(host) port \(port): \(String(cString: strerror(errno)))")
        }
    } catch {
        close(fd)
        throw error
    }
    return fd
}

/// A blocking loopback TCP client speaking just enough HTTP/1.1 for the tests.
public final class RawConnection {
    public enum Outcome: Equatable, Sendable { case open, closed, timedOut }

    private var fd: Int32
    private var buffer: [UInt8] = []
    public private(set) var lastOutcome: Outcome = .open
    /// Every byte received on this connection, in order (parsed or not).
    public private(set) var transcript: [UInt8] = []

    /// `receiveBuffer` > 0 shrinks SO_RCVBUF before connecting (for back-pressure tests);
    /// `source` binds the client end to that local address first (IPv4 only); `ipv6` connects
    /// to ::1 instead of `host`.
    public init(host: String = "127.0.0.1", port: UInt16, timeout: Double = 5, ipv6: Bool = false, receiveBuffer: Int32 = 0,
                source: String? = nil) throws {
        fd = try connectedSocket(host: ipv6 ? "::1" : host, port: port, source: source, timeout: timeout, receiveBuffer: receiveBuffer)
    }

    deinit { disconnect() }

    public func setTimeout(_ timeout: Double) { setSocketTimeout(fd, timeout) }

    public func disconnect() {
        if fd >= 0 { close(fd); fd = -1 }
    }

    /// Sends everything; false if the peer stopped accepting data (no SIGPIPE).
    public func sendAll(_ text: String) -> Bool { sendAll(Array(text.utf8)) }

    public func sendAll(_ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, noSignal) }
            if sent <= 0 { return false }
            offset += sent
        }
        return true
    }

    /// Reads one response (status line, headers, content-length body); nil on close/timeout.
    public func readResponse() -> RawResponse? {
        guard let head = readHead() else { return nil }
        let length = Int(head.headers["content-length"] ?? "0") ?? 0
        guard let body = readExactly(length) else { return nil }
        return RawResponse(status: head.status, headers: head.headers, body: body)
    }

    /// Reads one response whatever its framing: Content-Length, chunked, or until the server
    /// closes. nil on close/timeout before a complete response.
    public func readFramedResponse() -> RawResponse? {
        guard let head = readHead() else { return nil }
        let body: [UInt8]?
        if head.headers["transfer-encoding"]?.lowercased().contains("chunked") == true {
            body = readChunkedBody()
        } else if let length = head.headers["content-length"].flatMap({ Int($0) }) {
            body = readExactly(length)
        } else {
            body = readToEnd()
        }
        return body.map { RawResponse(status: head.status, headers: head.headers, body: $0) }
    }

    /// Reads a status line and headers; the body stays buffered.
    public func readHead() -> RawHead? {
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
    public func readChunk() -> [UInt8]? {
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
    public func readChunkedBody() -> [UInt8]? {
        var body: [UInt8] = []
        while true {
            guard let chunk = readChunk() else { return nil }
            if chunk.isEmpty { return body }
            body += chunk
        }
    }

    /// Everything received until the peer closes (or the timeout).
    public func readToEnd() -> [UInt8] {
        while fill() {}
        defer { buffer = [] }
        return buffer
    }

    /// Waits until the server closes the connection (EOF or reset) without sending data.
    public func waitForClose() -> Outcome {
        while fill() {}
        return lastOutcome
    }

    public func readExactly(_ count: Int) -> [UInt8]? {
        while buffer.count < count {
            guard fill() else { return nil }
        }
        let bytes = Array(buffer[..<count])
        buffer.removeFirst(count)
        return bytes
    }

    /// Status lines ("HTTP/1.x NNN ") anywhere in everything received so far: an answer glued
    /// to the end of another one's body counts too.
    public var statusLinesReceived: Int {
        let prefix = Array("HTTP/1.".utf8)
        func isDigit(_ byte: UInt8) -> Bool { byte >= 48 && byte <= 57 }
        var count = 0
        var index = 0
        while index + 13 <= transcript.count {
            if transcript[index..<(index + 7)].elementsEqual(prefix), isDigit(transcript[index + 7]), transcript[index + 8] == 32,
               transcript[(index + 9)..<(index + 12)].allSatisfy(isDigit), transcript[index + 12] == 32 {
                count += 1
                index += 13
            } else {
                index += 1
            }
        }
        return count
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
            transcript.append(contentsOf: chunk[..<received])
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
