import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A stub of the upstream Messages API: a real HTTP/1.1 server on raw sockets (optionally
/// TLS), one small-stack thread per connection, keep-alive, Content-Length and chunked request
/// bodies. It answers `POST /v1/messages` and `POST /v1/messages/count_tokens` in the API's
/// shapes, and records every request and connection for tests.
public final class UpstreamStubServer: Sendable {
    public let configuration: UpstreamStubConfiguration
    /// The bound port.
    public let port: UInt16
    private let listenFD: Int32
    private let wakePipe: (read: Int32, write: Int32)
    private let tls: TLSContext?
    let state = Mutex(StubState())
    private let acceptThread: Mutex<pthread_t?>

    /// Binds and starts serving at once. Ignores SIGPIPE for the whole process (writes to a
    /// closed TLS socket would otherwise kill it).
    public init(_ configuration: UpstreamStubConfiguration = .init()) throws {
        signal(SIGPIPE, SIG_IGN)
        self.configuration = configuration
        tls = try configuration.tls.map(TLSContext.init)
        let (fd, port) = try Self.listen(host: configuration.host, port: configuration.port)
        listenFD = fd
        self.port = port
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else {
            Glibc.close(fd)
            throw StubError("pipe failed: errno \(errno)")
        }
        wakePipe = (fds[0], fds[1])
        acceptThread = Mutex(nil)
        let thread = try spawnStubThread(stackSize: 256 << 10) { [self] in acceptLoop() }
        acceptThread.withLock { $0 = thread }
    }

    deinit {
        Glibc.close(wakePipe.read)
        Glibc.close(wakePipe.write)
    }

    /// `http://127.0.0.1:PORT` or `https://…`.
    public var baseURL: String {
        let host = configuration.host.contains(":") ? "[\(configuration.host)]" : configuration.host
        return "\(tls == nil ? "http" : "https")://\(host):\(port)"
    }

    /// Stops accepting, closes every connection and waits (up to 5 s) for their threads.
    public func stop() {
        guard let thread = acceptThread.withLock({ t -> pthread_t? in defer { t = nil }; return t }) else { return }
        state.withLock { $0.stopping = true }
        var byte: UInt8 = 1
        _ = write(wakePipe.write, &byte, 1)
        pthread_join(thread, nil)
        Glibc.close(listenFD)
        state.withLock { state in
            for fd in state.connectionFDs.values { shutdown(fd, Int32(SHUT_RDWR)) }
        }
        let deadline = ContinuousClock.now + .seconds(5)
        while state.withLock({ !$0.connectionFDs.isEmpty }) && ContinuousClock.now < deadline {
            usleep(1000)
        }
    }

    // MARK: Scripting

    /// Behaviours for the next Messages requests, in order (before any header or model choice).
    public func enqueue(_ behaviors: StubBehavior...) {
        state.withLock { $0.script.append(contentsOf: behaviors) }
    }

    /// Behaviours still queued.
    public var nextResponses: [StubBehavior] {
        get { state.withLock { $0.script } }
        set { state.withLock { $0.script = newValue } }
    }

    // MARK: Records

    public var requests: [StubRequestRecord] { state.withLock { $0.requests } }
    public var connectionEvents: [StubConnectionEvent] { state.withLock { $0.events } }
    public var connectionsOpened: Int { state.withLock { $0.opened } }
    public var connectionsClosed: Int { state.withLock { $0.closed } }
    public var openConnections: Int { state.withLock { $0.connectionFDs.count } }
    /// Streams whose response is still being written.
    public var openStreams: Int { state.withLock { $0.openStreams } }

    /// Forgets every record (requests, connection events, counters); open connections stay.
    public func resetRecords() {
        state.withLock { state in
            state.requests = []
            state.events = []
            state.opened = 0
            state.closed = 0
        }
    }

    /// Polls `condition` every few milliseconds until it holds or `timeout` passes.
    public func waitUntil(timeout: Duration, _ condition: @Sendable (UpstreamStubServer) -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while true {
            if condition(self) { return true }
            if ContinuousClock.now >= deadline { return false }
            try? await Task.sleep(for: .milliseconds(2))
        }
    }

    /// Waits until a connection closes (a given one, or any after `connectionID: nil`) and
    /// returns its close event.
    public func waitForConnectionClose(_ connectionID: Int? = nil, timeout: Duration) async -> StubConnectionEvent? {
        @Sendable func find(_ server: UpstreamStubServer) -> StubConnectionEvent? {
            server.connectionEvents.first {
                if case .closed = $0.kind { return connectionID == nil || $0.connectionID == connectionID }
                return false
            }
        }
        _ = await waitUntil(timeout: timeout) { find($0) != nil }
        return find(self)
    }

    // MARK: Accepting

    private func acceptLoop() {
        var fds = [pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0),
                   pollfd(fd: wakePipe.read, events: Int16(POLLIN), revents: 0)]
        while true {
            fds[0].revents = 0
            fds[1].revents = 0
            let ready = poll(&fds, 2, -1)
            if ready < 0 { if errno == EINTR { continue } else { return } }
            if fds[1].revents != 0 { return }
            guard fds[0].revents != 0 else { continue }
            let fd = accept(listenFD, nil, nil)
            if fd < 0 { continue }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            let id: Int? = state.withLock { state in
                if state.stopping { return nil }
                state.nextConnectionID += 1
                let id = state.nextConnectionID
                state.connectionFDs[id] = fd
                state.opened += 1
                state.events.append(StubConnectionEvent(connectionID: id, kind: .opened, at: .now))
                return id
            }
            guard let id else { Glibc.close(fd); continue }
            do {
                let thread = try spawnStubThread(stackSize: configuration.threadStackBytes) { [self, tls] in
                    StubConnection.serve(server: self, id: id, fd: fd, tls: tls)
                }
                pthread_detach(thread)
            } catch {
                connectionEnded(id: id, fd: fd, byClient: false)
            }
        }
    }

    /// Called by a connection's thread as its last act.
    func connectionEnded(id: Int, fd: Int32, byClient: Bool) {
        state.withLock { state in
            state.connectionFDs.removeValue(forKey: id)
            state.closed += 1
            state.events.append(StubConnectionEvent(connectionID: id, kind: .closed(byClient: byClient), at: .now))
            // Closed under the lock, so that `stop` never shuts down a recycled descriptor.
            Glibc.close(fd)
        }
    }

    private static func listen(host: String, port: UInt16) throws -> (Int32, UInt16) {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        guard inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host, &address.sin_addr) == 1 else {
            throw StubError("the stub listens on an IPv4 address, not \(host)")
        }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw StubError("socket failed: errno \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, Glibc.listen(fd, 4096) == 0 else {
            let code = errno
            Glibc.close(fd)
            throw StubError("cannot listen on \(host):\(port): errno \(code)")
        }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return (fd, UInt16(bigEndian: actual.sin_port))
    }
}

/// Everything the stub records, behind one mutex.
struct StubState {
    var stopping = false
    var nextConnectionID = 0
    var connectionFDs: [Int: Int32] = [:]
    var opened = 0
    var closed = 0
    var events: [StubConnectionEvent] = []
    var requests: [StubRequestRecord] = []
    var script: [StubBehavior] = []
    var openStreams = 0
    var requestCounter = 0
}

public struct StubError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ description: String) { self.description = description }
}

private final class StubThreadBody {
    let body: @Sendable () -> Void
    init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}

func spawnStubThread(stackSize: Int, _ body: @escaping @Sendable () -> Void) throws -> pthread_t {
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    pthread_attr_setstacksize(&attributes, max(stackSize, Int(PTHREAD_STACK_MIN)))
    let context = Unmanaged.passRetained(StubThreadBody(body)).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(&thread, &attributes, { argument in
        Unmanaged<StubThreadBody>.fromOpaque(argument!).takeRetainedValue().body()
        return nil
    }, context)
    guard rc == 0 else {
        Unmanaged<StubThreadBody>.fromOpaque(context).release()
        throw StubError("pthread_create failed: \(rc)")
    }
    return thread
}
