import Foundation
import Synchronization
import UpstreamClient
import UpstreamStub
#if canImport(Glibc)
import Glibc
#endif

/// A delegate that records everything, with optional flow control.
final class Recorder: UpstreamDelegate {
    struct Chunk: Sendable {
        let bytes: [UInt8]
        let at: ContinuousClock.Instant
    }

    struct State: Sendable {
        var status: Int?
        var headers: [(name: String, value: String)] = []
        var chunks: [Chunk] = []
        var error: UpstreamError?
        var finishedAt: ContinuousClock.Instant?
        var heads = 0
        var finishes = 0
        /// Calls in arrival order: "head", "chunk", "finish".
        var calls: [String] = []
    }

    let state = Mutex(State())
    /// Decides, per chunk (with the chunks so far, this one included), whether to keep delivering.
    private let keepGoing: @Sendable ([Chunk]) -> Bool

    init(keepGoing: @escaping @Sendable ([Chunk]) -> Bool = { _ in true }) {
        self.keepGoing = keepGoing
    }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        state.withLock {
            $0.status = status
            $0.headers = headers
            $0.heads += 1
            $0.calls.append("head")
        }
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        let chunks = state.withLock { state -> [Chunk] in
            state.chunks.append(Chunk(bytes: Array(chunk), at: .now))
            state.calls.append("chunk")
            return state.chunks
        }
        return keepGoing(chunks)
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        state.withLock {
            $0.error = error
            $0.finishes += 1
            $0.finishedAt = .now
            $0.calls.append("finish")
        }
    }

    var snapshot: State { state.withLock { $0 } }
    var body: [UInt8] { state.withLock { $0.chunks.flatMap(\.bytes) } }
    var text: String { String(decoding: body, as: UTF8.self) }
    var finished: Bool { state.withLock { $0.finishes > 0 } }

    func header(_ name: String) -> String? { state.withLock { s in s.headers.first { $0.name == name }?.value } }

    /// Waits for `upstreamDidFinish`; false if it did not come in time.
    func waitForFinish(timeout: Duration = .seconds(5)) async -> Bool {
        await waitFor(timeout: timeout) { self.finished }
    }
}

/// Polls a condition every 2 ms until it holds or the time is up.
func waitFor(timeout: Duration, _ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while !condition() {
        if ContinuousClock.now >= deadline { return false }
        try? await Task.sleep(for: .milliseconds(2))
    }
    return true
}

/// A Messages request the stub accepts.
func messagesRequest(model: String = "claude-test", stream: Bool = false, maxTokens: Int = 100, prompt: String = "Hello",
                     apiKey: String = "sk-test-workspace", extraHeaders: [(name: String, value: String)] = []) -> UpstreamRequest {
    let body = "{\"model\":\"\(model)\",\"max_tokens\":\(maxTokens),\"stream\":\(stream),"
        + "\"messages\":[{\"role\":\"user\",\"content\":\"\(prompt)\"}]}"
    return UpstreamRequest(method: "POST", path: "/v1/messages",
                           headers: [("content-type", "application/json"), ("anthropic-version", "2023-06-01"),
                                     ("x-api-key", apiKey)] + extraHeaders,
                           body: Array(body.utf8))
}

/// SSE events of a body: (event name, data line).
func events(in text: String) -> [(event: String, data: String)] {
    text.components(separatedBy: "\n\n").compactMap { block in
        var name: String?
        var data: String?
        for line in block.split(separator: "\n") {
            if line.hasPrefix("event: ") { name = String(line.dropFirst(7)) }
            if line.hasPrefix("data: ") { data = String(line.dropFirst(6)) }
        }
        guard let name, let data else { return nil }
        return (name, data)
    }
}

func jsonObject(_ text: String) -> [String: Any]? {
    (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any]
}

/// Threads of this process with a given name (from /proc).
func threadCount(named name: String) -> Int {
    guard let tasks = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task") else { return -1 }
    return tasks.filter { task in
        let comm = (try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8)) ?? ""
        return comm.trimmingCharacters(in: .whitespacesAndNewlines) == name
    }.count
}

/// A loopback TCP socket, closed on `close()`.
struct LoopbackSocket {
    let fd: Int32
    let port: UInt16

    /// Bound to a free port on 127.0.0.1; listening with `backlog` when given.
    static func bound(listenBacklog backlog: Int32? = nil) -> LoopbackSocket? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else { Glibc.close(fd); return nil }
        if let backlog, listen(fd, backlog) != 0 { Glibc.close(fd); return nil }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return LoopbackSocket(fd: fd, port: UInt16(bigEndian: actual.sin_port))
    }

    /// A non-blocking connect to `port` that is left pending or queued.
    static func connecting(to port: UInt16) -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return fd
    }

    func close() { Glibc.close(fd) }
}

/// Sends raw bytes to the stub and reads one response (until the connection closes or the
/// head and `content-length` bytes arrived).
func rawExchange(port: UInt16, _ request: [UInt8]) -> String {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { Glibc.close(fd) }
    var timeout = timeval(tv_sec: 5, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else { return "" }
    var offset = 0
    while offset < request.count {
        let n = request[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard n > 0 else { return "" }
        offset += n
    }
    var received: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = recv(fd, &buffer, buffer.count, 0)
        if n <= 0 { break }
        received += buffer[0..<n]
        let text = String(decoding: received, as: UTF8.self)
        if let headEnd = text.range(of: "\r\n\r\n") {
            let head = text[..<headEnd.lowerBound].lowercased()
            if let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }),
               let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)),
               text.utf8.count - text.utf8.distance(from: text.startIndex, to: headEnd.upperBound) >= length {
                return text
            }
        }
    }
    return String(decoding: received, as: UTF8.self)
}
