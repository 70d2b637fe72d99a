import Foundation
import HTTPClient
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The load generator's HTTP/1.1 client against a scripted server on loopback that writes exactly
/// the bytes each test wants: framing, keep-alive and closed connections.
@Suite(.serialized) struct HTTPConnectionTests {
    @Test func contentLengthBodiesAndKeepAlive() throws {
        let server = try ScriptedServer { _ in .reply("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Thing: a b \r\n\r\nhello") }
        let connection = HTTPConnection(target: try HTTPTarget(server.url), timeout: 2)
        for _ in 0..<3 {
            let response = try connection.post("/echo", contentType: "text/plain", body: Array("ping".utf8))
            #expect(response.status == 200)
            #expect(response.text == "hello")
            #expect(response.header("x-thing") == "a b")
        }
        defer { server.stop() }
        #expect(connection.connectionsOpened == 1, "keep-alive reuses one connection")
        #expect(server.requests.allSatisfy { $0.hasPrefix("POST /echo HTTP/1.1\r\n") && $0.contains("Content-Length: 4\r\n") && $0.hasSuffix("ping") })
    }

    @Test func chunkedBodiesWithExtensionsAndTrailers() throws {
        let server = try ScriptedServer { _ in
            .reply("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nWiki\r\n6\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\n")
        }
        defer { server.stop() }
        let connection = HTTPConnection(target: try HTTPTarget(server.url), timeout: 2)
        let response = try connection.send("GET", "/")
        #expect(response.text == "Wikipedia in \r\n\r\nchunks.")
        // The connection is still usable after the trailers.
        #expect(try connection.send("GET", "/").status == 200)
        #expect(connection.connectionsOpened == 1)
    }

    @Test func bodyDelimitedByCloseAndConnectionClose() throws {
        let server = try ScriptedServer { _ in .replyAndClose("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end") }
        defer { server.stop() }
        let connection = HTTPConnection(target: try HTTPTarget(server.url), timeout: 2)
        #expect(try connection.send("GET", "/").text == "until the end")
        #expect(!connection.isOpen)
        #expect(try connection.send("GET", "/").text == "until the end")
        #expect(connection.connectionsOpened == 2)
    }

    @Test func aKeepAliveConnectionTheServerClosedIsReplacedOnce() throws {
        // The first exchange is answered; then the server closes that connection without a word.
        let server = try ScriptedServer { index in
            index == 0 ? .replyThenHangUpBeforeNext("HTTP/1.1 204 No Content\r\n\r\n") : .reply("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        }
        defer { server.stop() }
        let connection = HTTPConnection(target: try HTTPTarget(server.url), timeout: 2)
        #expect(try connection.send("GET", "/").status == 204)
        Thread.sleep(forTimeInterval: 0.1)   // the close reaches us
        #expect(try connection.send("GET", "/").text == "ok")
        #expect(connection.connectionsOpened == 2)
    }

    @Test func malformedAndTruncatedResponsesAreErrors() throws {
        for bytes in ["HTTP/1.1 2x0 OK\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"] {
            let server = try ScriptedServer { _ in .replyAndClose(bytes) }
            let connection = HTTPConnection(target: try HTTPTarget(server.url), timeout: 2)
            #expect(throws: HTTPClientError.self, "\(bytes.debugDescription)") { try connection.send("GET", "/") }
            server.stop()
        }
    }

    @Test func aSilentServerTimesOut() throws {
        let server = try ScriptedServer { _ in .silence }
        defer { server.stop() }
        let connection = HTTPConnection(target: try HTTPTarget(server.url), timeout: 1)
        let start = Date()
        #expect(throws: HTTPClientError.self) { try connection.send("GET", "/") }
        #expect(Date().timeIntervalSince(start) < 3)
    }

    @Test func onlyHTTPURLs() {
        #expect(throws: HTTPClientError.self) { try HTTPTarget(URL(string: "https://127.0.0.1:1")!) }
    }
}

/// A loopback server that reads one request head (and its Content-Length body) at a time and
/// answers the n-th request of the run with `script(n)`.
final class ScriptedServer: Sendable {
    enum Answer: Sendable {
        case reply(String)
        case replyAndClose(String)
        case replyThenHangUpBeforeNext(String)
        case silence
    }

    let port: UInt16
    private let listener: Int32
    private let state = Mutex<(count: Int, requests: [String])>((0, []))
    var url: URL { URL(string: "http://127.0.0.1:\(port)")! }
    var requests: [String] { state.withLock { $0.requests } }

    init(_ script: @escaping @Sendable (Int) -> Answer) throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.listener = listener
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) == 0 && listen(listener, 16) == 0 && getsockname(listener, $0, &length) == 0 }
        }
        guard bound else { throw HTTPClientError("cannot listen") }
        port = UInt16(bigEndian: address.sin_port)
        Thread.detachNewThread { [self] in
            while true {
                let client = accept(listener, nil, nil)
                guard client >= 0 else { return }
                Thread.detachNewThread { self.serve(client, script) }
            }
        }
    }

    /// Stops accepting (connections already open are served to their end).
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    private func serve(_ client: Int32, _ script: @Sendable (Int) -> Answer) {
        defer { close(client) }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            // One request: the head, then Content-Length bytes.
            var request: String?
            while request == nil {
                if let end = buffer.firstRange(of: Array("\r\n\r\n".utf8)) {
                    let head = String(decoding: buffer[..<end.upperBound], as: UTF8.self)
                    let length = head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
                        .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) } ?? 0
                    if buffer.count >= end.upperBound + length {
                        request = String(decoding: buffer[..<(end.upperBound + length)], as: UTF8.self)
                        buffer.removeFirst(end.upperBound + length)
                        break
                    }
                }
                let count = recv(client, &chunk, chunk.count, 0)
                if count <= 0 { return }
                buffer += chunk[0..<count]
            }
            let index = state.withLock { state in
                state.requests.append(request!)
                defer { state.count += 1 }
                return state.count
            }
            switch script(index) {
            case .reply(let text): _ = send(client, text, text.utf8.count, Int32(MSG_NOSIGNAL))
            case .replyAndClose(let text):
                _ = send(client, text, text.utf8.count, Int32(MSG_NOSIGNAL))
                return
            case .replyThenHangUpBeforeNext(let text):
                _ = send(client, text, text.utf8.count, Int32(MSG_NOSIGNAL))
                return
            case .silence:
                Thread.sleep(forTimeInterval: 3)
                return
            }
        }
    }
}
