import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A TCP proxy in front of the test cluster that, when armed, lets the next `COMMIT` through to
/// the server, waits for the server's answer, and then drops the answer and the connection: the
/// transaction committed, and the client never hears of it. That is how a commit whose reply is
/// lost (a network cut, a timed-out read) looks from the client.
public final class CommitReplyDropper: @unchecked Sendable {
    // @unchecked: the listening descriptor is set once in init; the rest is behind `state`.
    public let port: Int
    private let listener: Int32
    private let upstreamPort: Int
    private struct State {
        var armed = false
        var dropped = 0
        var stopped = false
        var sockets: Set<Int32> = []
    }
    private let state = Mutex(State())

    /// The simple-protocol query message libpq sends for `PQsendQuery(conn, "COMMIT")`.
    static let commitMessage: [UInt8] = [UInt8(ascii: "Q"), 0, 0, 0, 11] + Array("COMMIT".utf8) + [0]

    public init(forwardingTo upstreamPort: Int) throws {
        self.upstreamPort = upstreamPort
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard fd >= 0, bound == 0, listen(fd, 64) == 0 else { throw ClusterError("proxy: cannot listen: errno \(errno)") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        listener = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        Thread { [self] in acceptLoop() }.start()
    }

    /// The next COMMIT's answer is dropped, with its connection.
    public func arm() { state.withLock { $0.armed = true } }

    /// Answers dropped so far.
    public var dropped: Int { state.withLock { $0.dropped } }

    public func stop() {
        let sockets = state.withLock { s -> Set<Int32> in
            s.stopped = true
            return s.sockets
        }
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        for fd in sockets { shutdown(fd, Int32(SHUT_RDWR)) }
    }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            guard client >= 0 else { return }
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = UInt16(upstreamPort).bigEndian
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard connected == 0, state.withLock({ s -> Bool in
                guard !s.stopped else { return false }
                s.sockets.formUnion([client, server])
                return true
            }) else {
                close(client)
                close(server)
                continue
            }
            Thread { [self] in relay(client: client, server: server) }.start()
        }
    }

    /// Copies both ways; after an armed COMMIT has gone to the server, its answer is read and
    /// thrown away, and both sides are cut.
    private func relay(client: Int32, server: Int32) {
        var fds = [pollfd(fd: client, events: Int16(POLLIN), revents: 0), pollfd(fd: server, events: Int16(POLLIN), revents: 0)]
        var buffer = [UInt8](repeating: 0, count: 65_536)
        var fromClient: [UInt8] = []   // the last few bytes, to find a COMMIT split across reads
        var dropNextAnswer = false
        loop: while true {
            guard poll(&fds, 2, -1) > 0 else { break }
            for index in 0..<2 where fds[index].revents != 0 {
                let from = fds[index].fd, to = index == 0 ? server : client
                let count = read(from, &buffer, buffer.count)
                guard count > 0 else { break loop }
                let bytes = Array(buffer[..<count])
                if index == 1 && dropNextAnswer {
                    // The server has answered the COMMIT: it is durable. The client never learns.
                    state.withLock { $0.dropped += 1 }
                    break loop
                }
                if index == 0 {
                    // Only a COMMIT that ends in these bytes (it may begin in the last read).
                    let window = fromClient + bytes
                    fromClient = Array(window.suffix(Self.commitMessage.count - 1))
                    if state.withLock({ s -> Bool in
                        guard s.armed, Self.contains(window, Self.commitMessage) else { return false }
                        s.armed = false
                        return true
                    }) {
                        dropNextAnswer = true
                    }
                }
                var offset = 0
                while offset < bytes.count {
                    let sent = bytes[offset...].withUnsafeBytes { send(to, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    guard sent > 0 else { break loop }
                    offset += sent
                }
            }
        }
        state.withLock { $0.sockets.subtract([client, server]) }
        // A reset, as a dead network would leave it: the client sees the connection fail.
        var linger = linger(l_onoff: 1, l_linger: 0)
        setsockopt(client, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<linger>.size))
        close(client)
        close(server)
    }

    private static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard haystack.count >= needle.count else { return false }
        for start in 0...(haystack.count - needle.count) where haystack[start..<start + needle.count].elementsEqual(needle) { return true }
        return false
    }
}
