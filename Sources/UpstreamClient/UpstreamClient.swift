import CCurl
import EventLoops
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP client for the upstream Messages API on libcurl's multi interface.
///
/// Every event loop of its group drives its own curl multi handle through curl's socket
/// interface: an open stream costs a socket, a curl easy handle and a few hundred bytes of state,
/// never a thread. A transfer started on one of the group's loops (an HTTP request being
/// handled there) runs on that same loop, so the request and its upstream transfer never change
/// threads; from elsewhere the loops are taken in turn. Each multi handle is one connection
/// cache, and HTTP/2 is negotiated over TLS when the upstream offers it.
///
/// curl handles are touched only on their loop's thread. `start`, `cancel` and `resume` queue
/// a task on that loop (without a lock or a system call when already on it).
public final class UpstreamClient: Sendable {
    public let configuration: UpstreamConfiguration
    private let group: EventLoopGroup
    private let ownsGroup: Bool
    /// One per loop, by loop index.
    private let drivers: [CurlDriver]
    private let counters = ClientCounters()
    private let stopped = Atomic<Bool>(false)

    /// A client on `loops` (shared with the HTTP server that relays through it), or on one
    /// loop of its own.
    public init(_ configuration: UpstreamConfiguration, loops: EventLoopGroup? = nil) throws {
        try CurlGlobal.ensureInitialized()
        let settings = try LoopSettings(configuration)
        self.configuration = configuration
        if let loops {
            group = loops
            ownsGroup = false
        } else {
            group = try EventLoopGroup(loops: 1, name: "upstream-curl")
            ownsGroup = true
        }
        let counters = self.counters
        do {
            drivers = try group.loops.map { try CurlDriver(loop: $0, counters: counters, settings: settings) }
        } catch {
            if ownsGroup { group.shutdown() }
            throw error
        }
        for driver in drivers {
            let loop = driver.loop
            guard loop.execute({ loop.add(driver) }) else {
                throw UpstreamClientError("the event loops are stopped")
            }
        }
    }

    deinit { shutdown() }

    /// Starts a transfer. The delegate is retained until its `upstreamDidFinish`. After
    /// `shutdown()`, the transfer ends at once with `.cancelled`, on the calling thread.
    @discardableResult
    public func start(_ request: UpstreamRequest, delegate: any UpstreamDelegate) -> UpstreamTransfer {
        let loop = group.preferred()
        let driver = drivers[loop.index]
        let transfer = UpstreamTransfer(id: counters.nextID.add(1, ordering: .relaxed).newValue, driver: driver)
        counters.active.add(1, ordering: .relaxed)
        let accepted = !stopped.load(ordering: .acquiring) && loop.execute { driver.start(transfer, request, delegate) }
        if !accepted {
            counters.active.subtract(1, ordering: .relaxed)
            delegate.upstreamDidFinish(UpstreamError(kind: .cancelled, detail: "the upstream client is shut down"))
        }
        return transfer
    }

    /// Cancels every transfer (each delegate gets `.cancelled`) and closes every connection;
    /// stops the loop if the client owns it. Idempotent. Called on one of the loops (from a
    /// delegate callback), that loop's part happens just after the callback returns.
    public func shutdown() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        for driver in drivers {
            let loop = driver.loop
            if loop.inLoop {
                loop.execute { driver.shutdown() }
            } else {
                _ = loop.run(andWait: { driver.shutdown() })
            }
        }
        if ownsGroup { group.shutdown() }
    }

    /// Transfers started and not yet finished.
    public var activeTransfers: Int { counters.active.load(ordering: .relaxed) }

    /// Sockets in the loops' epoll sets: connections in use or kept in the pool.
    public var watchedSockets: Int { counters.watchedSockets.load(ordering: .relaxed) }

    /// How many times a socket curl was not watching woke a loop (each then leaves the set).
    public var strayWakeups: Int { counters.strayEvents.load(ordering: .relaxed) }
}

/// Counters shared by a client's drivers.
final class ClientCounters: Sendable {
    let active = Atomic<Int>(0)
    let nextID = Atomic<UInt64>(0)
    /// Descriptors the drivers have in their loops' epoll sets.
    let watchedSockets = Atomic<Int>(0)
    /// Events on descriptors curl was not watching (idle pooled connections that woke the loop).
    let strayEvents = Atomic<Int>(0)
}

/// A handle on one transfer. Thread-safe: `cancel` and `resume` may be called from any thread,
/// any number of times, before or after the transfer ends.
public final class UpstreamTransfer: Sendable {
    public let id: UInt64
    private let driver: CurlDriver
    let cancelRequested = Atomic(false)

    init(id: UInt64, driver: CurlDriver) {
        self.id = id
        self.driver = driver
    }

    /// Ends the transfer: once this returns, no further chunk delivery starts, and the delegate
    /// gets `upstreamDidFinish(.cancelled)` unless it had already finished. The easy handle is
    /// removed at once; an HTTP/1.1 connection is closed (never returned to the pool
    /// mid-response), an HTTP/2 stream is reset.
    public func cancel() {
        if !cancelRequested.exchange(true, ordering: .acquiringAndReleasing) {
            let driver = self.driver, id = self.id
            driver.loop.execute { driver.cancel(id) }
        }
    }

    /// Lets a transfer paused by its delegate (`upstreamDidReceive` returned `false`) deliver
    /// again. A resume that finds the transfer not paused does nothing.
    public func resume() {
        let driver = self.driver, id = self.id
        driver.loop.execute { driver.resume(id) }
    }
}

/// curl_global_init, once per process, before any other curl call (the Apple data client's too).
public enum CurlGlobal {
    private static let result: CURLcode = curl_global_init(attest_CURL_GLOBAL_DEFAULT)

    public static func ensureInitialized() throws {
        guard result == CURLE_OK else {
            throw UpstreamClientError("curl_global_init failed: \(String(cString: curl_easy_strerror(result)))")
        }
    }
}
