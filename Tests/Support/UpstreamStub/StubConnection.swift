import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A parsed HTTP/1.1 request.
struct StubHTTPRequest {
    var method: String
    var path: String
    var version: String
    var headers: [(name: String, value: String)]
    var body: [UInt8]

    func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }

    var wantsKeepAlive: Bool {
        let connection = header("connection")?.lowercased() ?? ""
        return version == "HTTP/1.0" ? connection.contains("keep-alive") : !connection.contains("close")
    }
}

/// What became of a connection after one exchange.
enum Disposition {
    case keepAlive
    case close(byClient: Bool)
}

/// One accepted connection, on its own thread: reads requests, answers them, until either
/// side closes.
final class StubConnection {
    let server: UpstreamStubServer
    let id: Int
    let io: StubIO
    private var inbound: [UInt8] = []
    private var start = 0
    private let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: 16 << 10, alignment: 1)

    init(server: UpstreamStubServer, id: Int, io: StubIO) {
        self.server = server
        self.id = id
        self.io = io
    }

    deinit { scratch.deallocate() }

    /// The thread's body: handshake, exchanges, close.
    static func serve(server: UpstreamStubServer, id: Int, fd: Int32, tls: TLSContext?) {
        // A client that stops reading or writing for a minute in the middle of a request or
        // response is dropped rather than holding the thread forever.
        var limit = timeval(tv_sec: 60, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        let io: StubIO
        if let tls {
            guard let secured = TLSIO(fd: fd, context: tls) else {
                server.connectionEnded(id: id, fd: fd, byClient: true)
                return
            }
            io = secured
        } else {
            io = PlainIO(fd: fd)
        }
        let connection = StubConnection(server: server, id: id, io: io)
        let byClient = connection.run()
        io.finish()
        server.connectionEnded(id: id, fd: fd, byClient: byClient && !server.isStopping)
    }

    /// Serves until the connection ends; true when the client ended it.
    private func run() -> Bool {
        while true {
            switch readRequest() {
            case .closed(let byClient):
                return byClient
            case .invalid(let status, let message):
                _ = sendError(status: status, type: MessagesAPI.errorType(for: status), message: message,
                              requestID: server.nextRequestID(), keepAlive: false)
                return false
            case .request(let request):
                if let handler = server.configuration.handler,
                   let answer = handler(StubRequest(method: request.method, path: request.path, headers: request.headers, body: request.body)) {
                    var head = "HTTP/1.1 \(answer.status) Stub\r\ncontent-length: \(answer.body.count)\r\n"
                    for (name, value) in answer.headers { head += "\(name): \(value)\r\n" }
                    head += request.wantsKeepAlive ? "\r\n" : "connection: close\r\n\r\n"
                    guard send(Array(head.utf8) + answer.body), request.wantsKeepAlive else { return false }
                    continue
                }
                switch MessagesAPI(connection: self).respond(to: request) {
                case .keepAlive: continue
                case .close(let byClient): return byClient
                }
            }
        }
    }

    // MARK: Reading

    private enum ReadResult {
        case request(StubHTTPRequest)
        case closed(byClient: Bool)
        case invalid(Int, String)
    }

    private enum Fill { case data, eof, failed, idle }

    /// Reads more bytes into `inbound`, waiting at most `timeoutMilliseconds` for the first.
    private func fill(timeoutMilliseconds: Int32) -> Fill {
        if !io.hasBufferedInput {
            var descriptor = pollfd(fd: io.fd, events: Int16(POLLIN), revents: 0)
            var ready: Int32
            repeat { ready = poll(&descriptor, 1, timeoutMilliseconds) } while ready < 0 && errno == EINTR
            if ready == 0 { return .idle }
            if ready < 0 { return .failed }
        }
        let n = io.read(into: scratch)
        if n == 0 { return .eof }
        if n < 0 { return .failed }
        inbound.append(contentsOf: UnsafeRawBufferPointer(rebasing: scratch[0..<n]))
        return .data
    }

    /// Ensures `count` bytes after `start`.
    private func need(_ count: Int) -> Fill {
        while inbound.count - start < count {
            let result = fill(timeoutMilliseconds: 60_000)
            if case .data = result { continue }
            return result
        }
        return .data
    }

    private func readRequest() -> ReadResult {
        if start > 0 {
            inbound.removeSubrange(0..<start)
            start = 0
        }
        let keepAliveMilliseconds = Int32(clamping: max(1, server.configuration.keepAliveTimeout.components.seconds * 1000
                                                         + server.configuration.keepAliveTimeout.components.attoseconds / 1_000_000_000_000_000))
        // The head.
        var headEnd: Int?
        var scanned = 0
        while headEnd == nil {
            headEnd = find([13, 10, 13, 10], from: max(0, scanned - 3))
            if headEnd != nil { break }
            scanned = inbound.count
            if inbound.count > 64 << 10 { return .invalid(431, "request head larger than 64 KiB") }
            switch fill(timeoutMilliseconds: inbound.isEmpty ? keepAliveMilliseconds : 60_000) {
            case .data: continue
            case .eof, .failed: return .closed(byClient: true)
            case .idle: return inbound.isEmpty ? .closed(byClient: false) : .invalid(408, "request head timed out")
            }
        }
        let head = String(decoding: inbound[0..<headEnd!], as: UTF8.self)
        start = headEnd! + 4
        var lines = head.components(separatedBy: "\r\n")
        let requestLine = lines.removeFirst().split(separator: " ", omittingEmptySubsequences: false)
        guard requestLine.count == 3, requestLine[2].hasPrefix("HTTP/1.") else { return .invalid(400, "malformed request line") }
        var headers: [(name: String, value: String)] = []
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { return .invalid(400, "malformed header line") }
            headers.append((name: line[..<colon].trimmingCharacters(in: .whitespaces).lowercased(),
                            value: line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
        var request = StubHTTPRequest(method: String(requestLine[0]), path: String(requestLine[1]),
                                      version: String(requestLine[2]), headers: headers, body: [])
        let limit = server.configuration.maxBodyBytes
        let chunked = request.header("transfer-encoding")?.lowercased().contains("chunked") ?? false
        let length = request.header("content-length").flatMap { Int($0) }
        if !chunked, let length, length > limit {
            return .invalid(413, "request body of \(length) bytes exceeds the stub's limit of \(limit)")
        }
        if request.header("expect")?.lowercased() == "100-continue" {
            guard send(Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)) else { return .closed(byClient: true) }
        }

        if chunked {
            var body: [UInt8] = []
            while true {
                guard let lineEnd = waitForLine() else { return .closed(byClient: true) }
                let sizeText = String(decoding: inbound[start..<lineEnd], as: UTF8.self)
                    .split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
                guard let size = Int(sizeText, radix: 16), size >= 0 else { return .invalid(400, "malformed chunk size") }
                start = lineEnd + 2
                if size == 0 {
                    // Trailers, up to the empty line.
                    while true {
                        guard let end = waitForLine() else { return .closed(byClient: true) }
                        let empty = end == start
                        start = end + 2
                        if empty { break }
                    }
                    break
                }
                guard body.count + size <= limit else { return .invalid(413, "chunked request body exceeds the stub's limit of \(limit)") }
                guard case .data = need(size + 2) else { return .closed(byClient: true) }
                body.append(contentsOf: inbound[start..<(start + size)])
                start += size + 2
                if start > 1 << 20 {
                    inbound.removeSubrange(0..<start)
                    start = 0
                }
            }
            request.body = body
        } else if let length, length > 0 {
            inbound.reserveCapacity(start + length)
            guard case .data = need(length) else { return .closed(byClient: true) }
            request.body = Array(inbound[start..<(start + length)])
            start += length
        } else if request.header("content-length") != nil && length == nil {
            return .invalid(400, "malformed content-length")
        }
        return .request(request)
    }

    private func waitForLine() -> Int? {
        while true {
            if let end = find([13, 10], from: start) { return end }
            guard case .data = fill(timeoutMilliseconds: 60_000) else { return nil }
        }
    }

    private func find(_ pattern: [UInt8], from offset: Int) -> Int? {
        guard inbound.count >= pattern.count else { return nil }
        var index = max(offset, start)
        let last = inbound.count - pattern.count
        while index <= last {
            if inbound[index] == pattern[0] {
                var match = true
                for k in 1..<pattern.count where inbound[index + k] != pattern[k] { match = false; break }
                if match { return index }
            }
            index += 1
        }
        return nil
    }

    // MARK: Writing

    func send(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { io.writeAll($0) }
    }

    func send(_ text: String) -> Bool { send(Array(text.utf8)) }

    /// Sends one HTTP/1.1 chunk (one write, so one event per TCP segment with TCP_NODELAY).
    func sendChunk(_ payload: String) -> Bool {
        let bytes = Array(payload.utf8)
        var framed = Array(String(bytes.count, radix: 16).utf8)
        framed += [13, 10]
        framed += bytes
        framed += [13, 10]
        return send(framed)
    }

    /// Waits `duration`; false as soon as the client closes or resets the connection.
    func pause(_ duration: Duration) -> Bool {
        let deadline = ContinuousClock.now + duration
        while true {
            let remaining = ContinuousClock.now.duration(to: deadline)
            if remaining <= .zero { return true }
            let (seconds, attoseconds) = remaining.components
            let milliseconds = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
            var descriptor = pollfd(fd: io.fd, events: pollReadHangUp, revents: 0)
            let ready = poll(&descriptor, 1, milliseconds)
            if ready < 0 && errno == EINTR { continue }
            if ready > 0 && descriptor.revents & (pollReadHangUp | Int16(POLLHUP | POLLERR)) != 0 { return false }
        }
    }

    /// A complete response with a body.
    func sendResponse(status: Int, headers: [(String, String)], body: String, keepAlive: Bool) -> Bool {
        let bytes = Array(body.utf8)
        var head = "HTTP/1.1 \(status) \(MessagesAPI.reason(status))\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        head += "content-length: \(bytes.count)\r\nconnection: \(keepAlive ? "keep-alive" : "close")\r\n\r\n"
        return send(Array(head.utf8) + bytes)
    }

    func sendError(status: Int, type: String, message: String, requestID: String, keepAlive: Bool,
                   extraHeaders: [(String, String)] = []) -> Bool {
        let body = "{\"type\":\"error\",\"error\":{\"type\":\"\(type)\",\"message\":\(jsonString(message))},\"request_id\":\"\(requestID)\"}"
        return sendResponse(status: status, headers: MessagesAPI.commonHeaders(requestID: requestID, contentType: "application/json") + extraHeaders,
                            body: body, keepAlive: keepAlive)
    }
}

extension UpstreamStubServer {
    var isStopping: Bool { state.withLock { $0.stopping } }

    func nextRequestID() -> String {
        let n = state.withLock { state -> Int in state.requestCounter += 1; return state.requestCounter }
        return MessagesAPI.identifier("req", n)
    }
}

/// Linux's POLLRDHUP (the peer shut down its side), which Glibc's module leaves out: it
/// is defined only under _GNU_SOURCE.
private let pollReadHangUp: Int16 = 0x2000

/// A JSON string literal.
func jsonString(_ text: String) -> String {
    var out = "\""
    out.reserveCapacity(text.utf8.count + 2)
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case _ where scalar.value < 0x20:
            out += "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count) + String(scalar.value, radix: 16)
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out + "\""
}
