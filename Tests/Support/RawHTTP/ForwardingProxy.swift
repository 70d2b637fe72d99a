import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A forwarding HTTP/1.1 proxy for tests, such as a TLS terminator in front of attestd would
/// be: it listens on its own loopback address (127.0.0.2, say) and connects to the upstream from
/// that address too, as a proxy on another host would. It reads one request per client
/// connection (head and Content-Length body), appends `X-Forwarded-For: <the client's address>`
/// after whatever the client sent, forwards it on a new connection to the upstream with
/// `Connection: close`, and relays the answer back until the upstream closes.
///
/// Nothing in it can hang a test: every socket operation has `timeout`, the accept loop polls
/// so that `stop()` ends it, and `stop()` waits for the connections in flight only as long as
/// their timeouts allow.
public final class ForwardingProxy: @unchecked Sendable {
    public let host: String
    public let port: UInt16
    let upstreamHost: String
    let upstreamPort: UInt16
    let timeout: Double
    private let listener: Int32
    private let lock = NSLock()
    private var stopping = false
    private var active = 0
    private var forwardedCount = 0
    private let acceptLoopEnded = DispatchSemaphore(value: 0)

    /// Listens on `host` (port 0: any free one) and forwards to `upstreamHost`:`upstreamPort`.
    public init(host: String, upstreamHost: String = "127.0.0.1", upstreamPort: UInt16, timeout: Double = 3) throws {
        self.host = host
        self.upstreamHost = upstreamHost
        self.upstreamPort = upstreamPort
        self.timeout = timeout
        (listener, port) = try listeningSocket(host)
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "forwarding-proxy"
        thread.start()
    }

    deinit { stop() }

    /// Requests forwarded to the upstream so far.
    public var forwarded: Int { lock.withLock { forwardedCount } }

    /// Stops accepting, waits for the requests in flight (each bounded by the timeouts), closes
    /// the listener. Idempotent.
    public func stop() {
        let first = lock.withLock { () -> Bool in
            defer { stopping = true }
            return !stopping
        }
        guard first else { return }
        _ = acceptLoopEnded.wait(timeout: .now() + 2)
        let deadline = Date() + 4 * timeout
        while lock.withLock({ active }) > 0, Date() < deadline { usleep(10_000) }
        close(listener)
    }

    private func acceptLoop() {
        defer { acceptLoopEnded.signal() }
        while !lock.withLock({ stopping }) {
            var poller = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 100) > 0 else { continue }
            var peer = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let client = withUnsafeMutablePointer(to: &peer) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { accept(listener, $0, &length) } }
            guard client >= 0 else { continue }
            setSocketTimeout(client, timeout)
            lock.withLock { active += 1 }
            let address = peerAddress(peer).host
            Thread.detachNewThread { [self] in
                defer {
                    close(client)
                    lock.withLock { active -= 1 }
                }
                forward(client, from: address)
            }
        }
    }

    /// One request from `client` to the upstream and its answer back.
    private func forward(_ client: Int32, from address: String) {
        guard let (head, body) = readRequest(client) else { return }
        // Hop-by-hop: the client's Connection header is for this hop only.
        var lines = head.components(separatedBy: "\r\n").filter { !$0.lowercased().hasPrefix("connection:") }
        lines.append("X-Forwarded-For: \(address)")
        lines.append("Connection: close")
        let request = Array((lines.joined(separator: "\r\n") + "\r\n\r\n").utf8) + body
        // From the proxy's own address, as from a proxy on another host (else the kernel picks 127.0.0.1).
        guard let upstream = try? connectedSocket(host: upstreamHost, port: upstreamPort, source: host, timeout: timeout) else { return }
        defer { close(upstream) }
        guard sendAll(upstream, request) else { return }
        lock.withLock { forwardedCount += 1 }
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(upstream, $0.baseAddress, $0.count, 0) }
            guard count > 0, sendAll(client, Array(chunk[0..<count])) else { return }
        }
    }

    /// The request head (without its final empty line) and its Content-Length body; nil if the
    /// client sent no complete request within the timeout.
    private func readRequest(_ client: Int32) -> (head: String, body: [UInt8])? {
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let separator = Array("\r\n\r\n".utf8)
        var headEnd: Int?
        while headEnd == nil {
            let count = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            guard count > 0, buffer.count + count <= 1 << 20 else { return nil }
            buffer += chunk[0..<count]
            headEnd = buffer.indices.dropLast(3).first { buffer[$0..<($0 + 4)].elementsEqual(separator) }
        }
        let head = String(decoding: buffer[..<headEnd!], as: UTF8.self)
        var body = Array(buffer[(headEnd! + 4)...])
        let length = head.components(separatedBy: "\r\n").compactMap { line -> Int? in
            guard line.lowercased().hasPrefix("content-length:") else { return nil }
            return Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
        }.first ?? 0
        while body.count < length {
            let count = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { return nil }
            body += chunk[0..<count]
        }
        return (head, body)
    }

    private func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, noSignal) }
            guard sent > 0 else { return false }
            offset += sent
        }
        return true
    }
}

/// A socket listening on `host` at a free port, and that port.
func listeningSocket(_ host: String) throws -> (Int32, UInt16) {
    let address = try SocketAddress(host, port: 0)
    let fd = socket(address.family, streamSocketType, 0)
    guard fd >= 0 else { throw SocketError("socket: \(String(cString: strerror(errno)))") }
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    guard address.withSockaddr({ bind(fd, $0, $1) }) == 0, listen(fd, 128) == 0 else {
        let problem = String(cString: strerror(errno))
        close(fd)
        throw SocketError("listen on \(host): \(problem)")
    }
    var bound = sockaddr_storage()
    var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
    _ = withUnsafeMutablePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
    return (fd, peerAddress(bound).port)
}

/// The address and port of an IPv4 or IPv6 socket address.
func peerAddress(_ storage: sockaddr_storage) -> (host: String, port: UInt16) {
    var storage = storage
    let family = Int32(storage.ss_family)
    var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
    return withUnsafePointer(to: &storage) { pointer in
        if family == AF_INET6 {
            return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { v6 in
                var address = v6.pointee.sin6_addr
                inet_ntop(AF_INET6, &address, &text, socklen_t(text.count))
                return (text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }, UInt16(bigEndian: v6.pointee.sin6_port))
            }
        }
        return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { v4 in
            var address = v4.pointee.sin_addr
            inet_ntop(AF_INET, &address, &text, socklen_t(text.count))
            return (text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }, UInt16(bigEndian: v4.pointee.sin_port))
        }
    }
}
