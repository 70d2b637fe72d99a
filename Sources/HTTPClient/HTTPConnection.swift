import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

// A small HTTP/1.1 client on POSIX sockets for the load generator and the tests: one keep-alive
// connection per object, blocking calls with a timeout, no TLS. It exists so that a load run's
// own CPU stays small and measurable (URLSession costs far more per request), and so that tests
// can see the bytes the server framed.

public struct HTTPClientError: Error, CustomStringConvertible, Sendable {
    public let description: String
    /// The connection ended before any byte of the response: a reused keep-alive connection
    /// the server had already closed, so the request may be sent again on a new one.
    var closedBeforeResponse = false
    public init(_ description: String, closedBeforeResponse: Bool = false) {
        self.description = description
        self.closedBeforeResponse = closedBeforeResponse
    }
}

/// The resolved address of the base URL's host, and what requests carry for it.
public struct HTTPTarget: Sendable {
    let address: [UInt8]
    let family: Int32
    public let hostHeader: String
    /// The base URL's path without a trailing slash ("" for the root).
    public let basePath: String

    /// Resolves the URL's host now (http URLs only: this client speaks no TLS).
    public init(_ url: URL) throws {
        guard url.scheme?.lowercased() == "http" else { throw HTTPClientError("\(url.absoluteString): only http URLs are supported") }
        guard let host = url.host else { throw HTTPClientError("\(url.absoluteString) has no host") }
        let port = url.port ?? 80
        var path = url.path
        while path.hasSuffix("/") { path.removeLast() }
        basePath = path
        let bareHost = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        let literalHost = bareHost.contains(":") ? "[\(bareHost)]" : bareHost
        hostHeader = url.port == nil ? literalHost : "\(literalHost):\(port)"

        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        #if os(Linux)
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        #else
        hints.ai_socktype = SOCK_STREAM
        #endif
        var result: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(bareHost, String(port), &hints, &result)
        guard status == 0, let first = result, let address = first.pointee.ai_addr else {
            throw HTTPClientError("cannot resolve \(bareHost): \(String(cString: gai_strerror(status)))")
        }
        defer { freeaddrinfo(result) }
        family = first.pointee.ai_family
        self.address = Array(UnsafeRawBufferPointer(start: address, count: Int(first.pointee.ai_addrlen)))
    }
}

/// One keep-alive HTTP/1.1 connection, used by one thread at a time (it is not Sendable: give each
/// thread its own). Requests carry a Content-Length; responses may be Content-Length framed,
/// chunked, or delimited by the end of the connection. A request on a reused connection that the
/// server had closed meanwhile is sent once more on a new one.
public final class HTTPConnection {
    public struct Response: Sendable {
        public let status: Int
        /// Header names lowercased, in arrival order.
        public let headers: [(name: String, value: String)]
        public let body: [UInt8]

        public func header(_ name: String) -> String? {
            let wanted = name.lowercased()
            return headers.first { $0.name == wanted }?.value
        }

        public var text: String { String(decoding: body, as: UTF8.self) }
    }

    static let maxHeaderBytes = 64 * 1024
    public static let maxBodyBytes = 64 * 1024 * 1024

    public let target: HTTPTarget
    public let timeout: TimeInterval
    /// How many TCP connections this object has opened (tests check keep-alive with it).
    public private(set) var connectionsOpened = 0
    private var fd: Int32 = -1
    /// Received bytes not consumed yet.
    private var inbox: [UInt8] = []
    private var chunk = [UInt8](repeating: 0, count: 64 * 1024)

    public init(target: HTTPTarget, timeout: TimeInterval = 10) {
        self.target = target
        self.timeout = timeout
    }

    deinit { close() }

    public var isOpen: Bool { fd >= 0 }

    public func close() {
        if fd >= 0 {
            _ = systemClose(fd)
            fd = -1
        }
        inbox.removeAll(keepingCapacity: true)
    }

    public func post(_ path: String, contentType: String, body: [UInt8], headers: [(String, String)] = []) throws -> Response {
        try send("POST", path, headers: [("Content-Type", contentType), ("Accept", "application/json")] + headers, body: body)
    }

    /// Sends one request (`path` is appended to the target's base path) and reads its response.
    public func send(_ method: String, _ path: String, headers: [(String, String)] = [], body: [UInt8] = []) throws -> Response {
        var text = "\(method) \(target.basePath)\(path) HTTP/1.1\r\nHost: \(target.hostHeader)\r\n"
        for (name, value) in headers { text += "\(name): \(value)\r\n" }
        if !body.isEmpty || method == "POST" || method == "PUT" { text += "Content-Length: \(body.count)\r\n" }
        text += "\r\n"
        var request = Array(text.utf8)
        request += body
        let reused = fd >= 0
        do {
            return try exchange(request)
        } catch let error as HTTPClientError where reused && error.closedBeforeResponse {
            close()
            do { return try exchange(request) } catch { close(); throw error }
        } catch {
            close()
            throw error
        }
    }

    private func exchange(_ request: [UInt8]) throws -> Response {
        if fd < 0 { try connect() }
        try sendAll(request)
        return try readResponse()
    }

    // MARK: Socket

    private func connect() throws {
        #if os(Linux)
        let socketType = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        #else
        let socketType = SOCK_STREAM
        #endif
        let socket = systemSocket(target.family, socketType, 0)
        guard socket >= 0 else { throw posixError("socket") }
        var one: Int32 = 1
        _ = setsockopt(socket, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        #if canImport(Darwin)
        _ = setsockopt(socket, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
        #endif
        // Bounds connect (on Linux), send and every recv.
        var time = timeval(tv_sec: Int(timeout), tv_usec: 0)
        _ = setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        _ = setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        let status = target.address.withUnsafeBytes { raw in
            systemConnect(socket, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))
        }
        guard status == 0 else {
            let error = posixError("connect to \(target.hostHeader)")
            _ = systemClose(socket)
            throw error
        }
        fd = socket
        connectionsOpened += 1
        inbox.removeAll(keepingCapacity: true)
    }

    private func sendAll(_ bytes: [UInt8]) throws {
        #if os(Linux)
        let flags = Int32(MSG_NOSIGNAL)
        #else
        let flags: Int32 = 0
        #endif
        try bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let sent = systemSend(fd, buffer.baseAddress! + offset, buffer.count - offset, flags)
                if sent < 0 {
                    if errno == EINTR { continue }
                    let closed = errno == EPIPE || errno == ECONNRESET
                    throw HTTPClientError(posixError("send").description, closedBeforeResponse: closed && offset == 0)
                }
                offset += sent
            }
        }
    }

    /// Appends what the socket has to `inbox`; returns false at end of stream.
    private func receive() throws -> Bool {
        while true {
            let count = chunk.withUnsafeMutableBytes { systemRecv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                inbox.append(contentsOf: chunk[0..<count])
                return true
            }
            if count == 0 { return false }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK {
                throw HTTPClientError("no response within \(Int(timeout)) s")
            }
            throw HTTPClientError(posixError("recv").description, closedBeforeResponse: errno == ECONNRESET && inbox.isEmpty)
        }
    }

    /// Reads until `inbox` holds at least `count` bytes.
    private func fill(_ count: Int) throws {
        while inbox.count < count {
            guard try receive() else { throw HTTPClientError("connection closed in the middle of a response") }
        }
    }

    /// Index of the first `needle` in `inbox` at or after `start`, reading more as needed.
    private func find(_ needle: [UInt8], from start: Int, limit: Int) throws -> Int {
        var from = start
        while true {
            let found: Int? = inbox.withUnsafeBytes { haystack -> Int? in
                // memchr for the first byte, then compare the rest (needles are 2 or 4 bytes).
                var offset = from
                while haystack.count - offset >= needle.count {
                    guard let hit = memchr(haystack.baseAddress! + offset, Int32(needle[0]), haystack.count - offset - needle.count + 1) else {
                        return nil
                    }
                    let index = haystack.baseAddress!.distance(to: UnsafeRawPointer(hit))
                    if memcmp(hit, needle, needle.count) == 0 { return index }
                    offset = index + 1
                }
                return nil
            }
            if let found { return found }
            from = max(start, inbox.count - needle.count + 1)
            guard inbox.count - start < limit else { throw HTTPClientError("response header or chunk line too long") }
            guard try receive() else {
                throw HTTPClientError("connection closed before a complete response", closedBeforeResponse: inbox.isEmpty)
            }
        }
    }

    private static let crlf: [UInt8] = [13, 10]
    private static let headerEnd: [UInt8] = [13, 10, 13, 10]

    private func readResponse() throws -> Response {
        let end = try find(Self.headerEnd, from: 0, limit: Self.maxHeaderBytes)
        let head = try inbox.withUnsafeBufferPointer { try Self.parseHead(UnsafeBufferPointer(rebasing: $0[0..<end])) }
        let status = head.status
        let chunked = head.chunked
        let contentLength = head.contentLength
        var keepAlive = head.keepAlive
        var position = end + 4
        var body: [UInt8] = []
        if status < 200 || status == 204 || status == 304 {
            // No body.
        } else if chunked {
            while true {
                let lineEnd = try find(Self.crlf, from: position, limit: 1024)
                let sizeText = String(decoding: inbox[position..<lineEnd], as: UTF8.self).split(separator: ";").first ?? ""
                guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16), size >= 0,
                      body.count + size <= Self.maxBodyBytes else { throw HTTPClientError("bad chunk size") }
                position = lineEnd + 2
                if size == 0 {
                    // Trailers, up to an empty line.
                    while true {
                        let trailerEnd = try find(Self.crlf, from: position, limit: Self.maxHeaderBytes)
                        defer { position = trailerEnd + 2 }
                        if trailerEnd == position { break }
                    }
                    break
                }
                try fill(position + size + 2)
                body += inbox[position..<(position + size)]
                position += size + 2
            }
        } else if let contentLength {
            try fill(position + contentLength)
            body = Array(inbox[position..<(position + contentLength)])
            position += contentLength
        } else {
            // Delimited by the end of the connection.
            while try receive() {
                guard inbox.count - position <= Self.maxBodyBytes else { throw HTTPClientError("response body too large") }
            }
            body = Array(inbox[position...])
            position = inbox.count
            keepAlive = false
        }
        if keepAlive {
            inbox.removeFirst(position)
        } else {
            close()
        }
        return Response(status: status, headers: head.headers, body: body)
    }

    private struct Head {
        var status = 0
        var contentLength: Int?
        var chunked = false
        var keepAlive = true
        var headers: [(name: String, value: String)] = []
    }

    /// The status line and the framing headers, parsed from the bytes (no String work per response).
    private static func parseHead(_ bytes: UnsafeBufferPointer<UInt8>) throws -> Head {
        func lower(_ byte: UInt8) -> UInt8 { byte >= 65 && byte <= 90 ? byte + 32 : byte }
        func equals(_ range: Range<Int>, _ literal: StaticString) -> Bool {
            guard range.count == literal.utf8CodeUnitCount else { return false }
            let pointer = literal.utf8Start
            for (offset, index) in range.enumerated() where lower(bytes[index]) != pointer[offset] { return false }
            return true
        }
        func contains(_ range: Range<Int>, _ literal: StaticString) -> Bool {
            let length = literal.utf8CodeUnitCount
            guard range.count >= length else { return false }
            for start in range.lowerBound...(range.upperBound - length) where equals(start..<(start + length), literal) { return true }
            return false
        }
        // "HTTP/1.x SSS reason"
        guard bytes.count >= 12, equals(0..<7, "http/1."), bytes[8] == 32,
              (bytes[9...11]).allSatisfy({ $0 >= 48 && $0 <= 57 }), bytes.count == 12 || bytes[12] == 32 || bytes[12] == 13 else {
            throw HTTPClientError("malformed status line: \(String(decoding: bytes.prefix(80), as: UTF8.self))")
        }
        var head = Head()
        head.status = Int(bytes[9] - 48) * 100 + Int(bytes[10] - 48) * 10 + Int(bytes[11] - 48)
        head.keepAlive = bytes[7] != UInt8(ascii: "0")
        // Headers start after the status line's CRLF.
        var lineStart = 12
        while lineStart < bytes.count && bytes[lineStart] != 13 { lineStart += 1 }
        lineStart += 2
        while lineStart < bytes.count {
            var lineEnd = lineStart
            while lineEnd < bytes.count && bytes[lineEnd] != 13 { lineEnd += 1 }
            defer { lineStart = lineEnd + 2 }
            var colon = lineStart
            while colon < lineEnd && bytes[colon] != UInt8(ascii: ":") { colon += 1 }
            guard colon < lineEnd else { continue }
            var valueStart = colon + 1, valueEnd = lineEnd
            while valueStart < valueEnd && (bytes[valueStart] == 32 || bytes[valueStart] == 9) { valueStart += 1 }
            while valueEnd > valueStart && (bytes[valueEnd - 1] == 32 || bytes[valueEnd - 1] == 9) { valueEnd -= 1 }
            let name = lineStart..<colon, value = valueStart..<valueEnd
            head.headers.append((name: String(decoding: UnsafeBufferPointer(rebasing: bytes[name]), as: UTF8.self).lowercased(),
                                 value: String(decoding: UnsafeBufferPointer(rebasing: bytes[value]), as: UTF8.self)))
            if equals(name, "content-length") {
                var length = 0
                for index in value {
                    let digit = bytes[index]
                    guard digit >= 48 && digit <= 57, length <= maxBodyBytes else { throw HTTPClientError("bad Content-Length") }
                    length = length * 10 + Int(digit - 48)
                }
                guard !value.isEmpty, length <= maxBodyBytes else { throw HTTPClientError("bad Content-Length") }
                head.contentLength = length
            } else if equals(name, "transfer-encoding") {
                head.chunked = contains(value, "chunked")
            } else if equals(name, "connection") {
                if contains(value, "close") { head.keepAlive = false } else if contains(value, "keep-alive") { head.keepAlive = true }
            }
        }
        return head
    }

    private func posixError(_ operation: String) -> HTTPClientError {
        HTTPClientError("\(operation): \(String(cString: strerror(errno)))")
    }
}

// Module-qualified system calls: the class has methods of the same names.
#if canImport(Glibc)
private let systemSocket = Glibc.socket
private let systemConnect = Glibc.connect
private let systemSend = Glibc.send
private let systemRecv = Glibc.recv
private let systemClose = Glibc.close
#elseif canImport(Musl)
private let systemSocket = Musl.socket
private let systemConnect = Musl.connect
private let systemSend = Musl.send
private let systemRecv = Musl.recv
private let systemClose = Musl.close
#elseif canImport(Darwin)
private let systemSocket = Darwin.socket
private let systemConnect = Darwin.connect
private let systemSend = Darwin.send
private let systemRecv = Darwin.recv
private let systemClose = Darwin.close
#endif
