import CCurl
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP client for the upstream Messages API on libcurl's multi interface.
///
/// One event thread, owned by the client, drives every transfer through curl's socket
/// interface on epoll: an open stream costs a socket, a curl easy handle and a few hundred
/// bytes of state, never a thread. Connections are pooled per client (one curl multi handle
/// is one connection cache), and HTTP/2 is negotiated over TLS when the upstream offers it.
///
/// curl handles are touched only on the event thread. `start`, `cancel` and `resume` from
/// other threads queue a command behind a mutex and wake the thread through an eventfd.
public final class UpstreamClient: Sendable {
    public let configuration: UpstreamConfiguration
    private let shared: EventLoopShared
    private let thread: pthread_t
    private let joined = Mutex(false)

    public init(_ configuration: UpstreamConfiguration) throws {
        try CurlGlobal.ensureInitialized()
        let settings = try LoopSettings(configuration)
        self.configuration = configuration

        let epollFD = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epollFD >= 0 else { throw UpstreamClientError("epoll_create1 failed: errno \(errno)") }
        let wakeFD = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        guard wakeFD >= 0 else {
            close(epollFD)
            throw UpstreamClientError("eventfd failed: errno \(errno)")
        }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.fd = wakeFD
        guard epoll_ctl(epollFD, EPOLL_CTL_ADD, wakeFD, &event) == 0, let multi = curl_multi_init() else {
            close(epollFD)
            close(wakeFD)
            throw UpstreamClientError("could not set up the event loop")
        }
        let shared = EventLoopShared(wakeFD: wakeFD)
        self.shared = shared
        let handover = MultiHandover(multi: multi, epollFD: epollFD)
        do {
            thread = try spawnThread(stackSize: 1 << 20) {
                EventLoop(shared: shared, multi: handover.multi, epollFD: handover.epollFD, settings: settings).run()
            }
        } catch {
            curl_multi_cleanup(multi)
            close(epollFD)
            throw error
        }
    }

    deinit { shutdown() }

    /// Starts a transfer. The delegate is retained until its `upstreamDidFinish`. After
    /// `shutdown()`, the transfer ends at once with `.cancelled`, on the calling thread.
    @discardableResult
    public func start(_ request: UpstreamRequest, delegate: any UpstreamDelegate) -> UpstreamTransfer {
        let transfer = UpstreamTransfer(id: shared.nextID.add(1, ordering: .relaxed).newValue, loop: shared)
        shared.active.add(1, ordering: .relaxed)
        if !shared.submit(.start(transfer, request, delegate)) {
            shared.active.subtract(1, ordering: .relaxed)
            delegate.upstreamDidFinish(UpstreamError(kind: .cancelled, detail: "the upstream client is shut down"))
        }
        return transfer
    }

    /// Cancels every transfer (each delegate gets `.cancelled`), closes every connection and
    /// joins the event thread. Idempotent. Called from a delegate callback, it stops the loop
    /// but cannot join the thread it runs on.
    public func shutdown() {
        shared.close()
        let mustJoin = joined.withLock { done -> Bool in
            if done { return false }
            done = true
            return true
        }
        guard mustJoin else { return }
        if pthread_equal(pthread_self(), thread) != 0 {
            pthread_detach(thread)
        } else {
            pthread_join(thread, nil)
        }
    }

    /// Transfers started and not yet finished.
    public var activeTransfers: Int { shared.active.load(ordering: .relaxed) }
}

/// A handle on one transfer. Thread-safe: `cancel` and `resume` may be called from any thread,
/// any number of times, before or after the transfer ends.
public final class UpstreamTransfer: Sendable {
    public let id: UInt64
    private let loop: EventLoopShared
    let cancelRequested = Atomic(false)

    init(id: UInt64, loop: EventLoopShared) {
        self.id = id
        self.loop = loop
    }

    /// Ends the transfer: once this returns, no further chunk delivery starts, and the delegate
    /// gets `upstreamDidFinish(.cancelled)` unless it had already finished. The easy handle is
    /// removed at once; an HTTP/1.1 connection is closed (never returned to the pool
    /// mid-response), an HTTP/2 stream is reset.
    public func cancel() {
        if !cancelRequested.exchange(true, ordering: .acquiringAndReleasing) {
            _ = loop.submit(.cancel(id))
        }
    }

    /// Lets a transfer paused by its delegate (`upstreamDidReceive` returned `false`) deliver
    /// again. A resume that finds the transfer not paused does nothing.
    public func resume() {
        _ = loop.submit(.resume(id))
    }
}

/// curl_global_init, once per process, before any other curl call.
enum CurlGlobal {
    private static let result: CURLcode = curl_global_init(attest_CURL_GLOBAL_DEFAULT)

    static func ensureInitialized() throws {
        guard result == CURLE_OK else {
            throw UpstreamClientError("curl_global_init failed: \(String(cString: curl_easy_strerror(result)))")
        }
    }
}

/// The multi handle and epoll descriptor, created in `init` (so that failures throw there) and
/// handed to the event thread.
private struct MultiHandover: @unchecked Sendable {
    // Safe: after the handover the event thread is the only user of these.
    let multi: UnsafeMutableRawPointer
    let epollFD: Int32
}
