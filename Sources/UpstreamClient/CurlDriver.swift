import CCurl
import EventLoops
#if canImport(Glibc)
import Glibc
#endif

/// One curl multi handle on one event loop: the transfers started there and the sockets curl
/// asked to watch. Created off the loop, then touched only on the loop's thread (curl's callbacks
/// reach it through an unretained pointer, on that thread, from inside curl calls made there).
final class CurlDriver: EventLoopParticipant, @unchecked Sendable {
    // @unchecked: all state is confined to `loop`'s thread; other threads only hold the reference
    // to queue tasks on the loop.
    let loop: EventLoop
    let counters: ClientCounters
    private let multi: UnsafeMutableRawPointer
    let settings: LoopSettings

    private var transfers: [UInt64: TransferState] = [:]
    /// The events each descriptor is registered for in the loop's epoll set (its size is
    /// mirrored in `counters.watchedSockets`).
    private var registered: [Int32: UInt32] = [:] {
        didSet { if registered.count != oldValue.count { counters.watchedSockets.add(registered.count - oldValue.count, ordering: .relaxed) } }
    }
    /// Descriptors curl wants watched now.
    private var wanted = Set<Int32>()
    /// Connection sockets curl opened and has not closed (`openSocket`, `closeSocket`). When curl
    /// stops watching one, its connection went back to the pool, and the next transfer on it will
    /// want the same events: it stays registered rather than costing an epoll_ctl to leave and
    /// another to come back on every request. Any other descriptor leaves at once.
    private var ownSockets = Set<Int32>()
    private var byEasy: [UnsafeMutableRawPointer: TransferState] = [:]
    /// When curl wants `socket_action(CURL_SOCKET_TIMEOUT)`, in monotonic nanoseconds.
    private var timerDeadline: UInt64?
    private var nextIdleCheck: UInt64 = 0
    private let idleCheckInterval: UInt64
    private var stopped = false
    /// Easy handles of finished transfers, kept for the next ones: creating and freeing one per
    /// request (several kilobytes, zeroed) was 4% of a relayed request's CPU, and its large
    /// allocations made glibc consolidate its free lists. `shared`: not reset after an inline
    /// POST, so the loop's common options are still set (a reset cost 4 mallocs per request and
    /// setting them again a dozen more calls into curl). Each keeps its error buffer and last
    /// header list (`EasyResources`).
    private var spareEasies: [(easy: UnsafeMutableRawPointer, shared: Bool, resources: EasyResources)] = []
    private static let maxSpareEasies = 64

    init(loop: EventLoop, counters: ClientCounters, settings: LoopSettings) throws {
        guard let multi = curl_multi_init() else { throw UpstreamClientError("curl_multi_init failed") }
        self.loop = loop
        self.counters = counters
        self.multi = multi
        self.settings = settings
        // Idle time-outs are checked by a scan; a tenth of the time-out keeps the error small
        // (at most 10% late) without scanning more than a few times a second in production.
        idleCheckInterval = min(max(settings.idleTimeoutNanoseconds / 10, 5_000_000), 1_000_000_000)
        let me = Unmanaged.passUnretained(self).toOpaque()
        attest_curl_multi_setopt_socket_function(multi, socketCallback)
        attest_curl_multi_setopt_pointer(multi, CURLMOPT_SOCKETDATA, me)
        attest_curl_multi_setopt_timer_function(multi, timerCallback)
        attest_curl_multi_setopt_pointer(multi, CURLMOPT_TIMERDATA, me)
        attest_curl_multi_setopt_long(multi, CURLMOPT_PIPELINING, attest_CURLPIPE_MULTIPLEX)
        if settings.maxIdleConnections > 0 {
            attest_curl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, settings.maxIdleConnections)
        }
    }

    // MARK: EventLoopParticipant

    func handleEvent(fd: Int32, events: UInt32) {
        guard wanted.contains(fd) else {
            // An idle pooled connection became readable or hung up: the upstream closed it or
            // sent what it should not. curl is not watching it and finds it dead when it next
            // looks; it leaves the epoll set now, so that it does not wake the loop again.
            counters.strayEvents.add(1, ordering: .relaxed)
            registered[fd] = nil
            loop.unwatch(fd: fd)
            return
        }
        var mask: Int32 = 0
        if events & EPOLLIN.rawValue != 0 { mask |= CURL_CSELECT_IN }
        if events & EPOLLOUT.rawValue != 0 { mask |= CURL_CSELECT_OUT }
        if events & (EPOLLERR.rawValue | EPOLLHUP.rawValue) != 0 { mask |= CURL_CSELECT_ERR }
        socketAction(fd, mask)
    }

    func poll(now: UInt64) -> UInt64? {
        if let deadline = timerDeadline, now >= deadline {
            timerDeadline = nil
            socketAction(attest_CURL_SOCKET_TIMEOUT, 0)
        }
        collectCompleted()
        checkIdle()
        var next = timerDeadline
        if !transfers.isEmpty { next = min(next ?? nextIdleCheck, nextIdleCheck) }
        return next
    }

    /// Ends every transfer as cancelled, frees the multi handle and leaves the loop. Idempotent.
    func shutdown() {
        guard !stopped else { return }
        stopped = true
        let shutdown = UpstreamError(kind: .cancelled, detail: "the upstream client is shut down")
        for state in Array(transfers.values) { finish(state, shutdown, closeConnection: true) }
        spareEasies.forEach { curl_easy_cleanup($0.easy); $0.resources.free() }
        spareEasies = []
        curl_multi_cleanup(multi)
        loop.remove(self)
    }

    // MARK: Commands

    func start(_ handle: UpstreamTransfer, _ request: UpstreamRequest, _ delegate: any UpstreamDelegate) {
        /// Ends a transfer that never reached curl.
        func refuse(_ kind: UpstreamError.Kind, _ detail: String) {
            counters.active.subtract(1, ordering: .relaxed)
            delegate.upstreamDidFinish(UpstreamError(kind: kind, detail: detail))
        }
        if stopped { return refuse(.cancelled, "the upstream client is shut down") }
        if handle.cancelRequested.load(ordering: .acquiring) { return refuse(.cancelled, "cancelled before it started") }
        guard let (easy, shared, resources) = spareEasies.popLast() ?? curl_easy_init().map({ ($0, false, EasyResources()) }) else {
            return refuse(.other, "curl_easy_init failed")
        }
        let state = TransferState(handle: handle, request: request, delegate: delegate, easy: easy, resources: resources)
        // A handle kept after an inline POST is reset first for any other kind of request.
        let keepsOptions = shared && state.isInlinePost
        if shared && !keepsOptions { curl_easy_reset(easy) }
        if let problem = state.configure(settings, shared: keepsOptions) {
            recycle(easy, state.release(), keepOptions: false)
            return refuse(.other, problem)
        }
        if !keepsOptions {
            let me = Unmanaged.passUnretained(self).toOpaque()
            attest_curl_easy_setopt_opensocket_function(easy, openSocketCallback)
            attest_curl_easy_setopt_pointer(easy, CURLOPT_OPENSOCKETDATA, me)
            attest_curl_easy_setopt_closesocket_function(easy, closeSocketCallback)
            attest_curl_easy_setopt_pointer(easy, CURLOPT_CLOSESOCKETDATA, me)
        }
        transfers[handle.id] = state
        byEasy[easy] = state
        let added = curl_multi_add_handle(multi, easy)
        if added != CURLM_OK {
            finish(state, UpstreamError(kind: .other, detail: "curl_multi_add_handle: \(String(cString: curl_multi_strerror(added)))"),
                   closeConnection: false)
        }
    }

    func cancel(_ id: UInt64) {
        if let state = transfers[id] {
            finish(state, UpstreamError(kind: .cancelled, detail: "cancelled"), closeConnection: true)
        }
    }

    func resume(_ id: UInt64) {
        if let state = transfers[id], state.paused {
            state.paused = false
            state.lastActivity = monotonicNanoseconds()
            // May deliver buffered data (and so call the delegate) before it returns.
            curl_easy_pause(state.easy, attest_CURLPAUSE_CONT)
        }
    }

    /// Keeps a finished transfer's easy handle (out of the multi handle) for the next transfer,
    /// reset to curl's defaults unless `keepOptions`; or frees it with what it keeps.
    private func recycle(_ easy: UnsafeMutableRawPointer, _ resources: EasyResources, keepOptions: Bool) {
        guard !stopped, spareEasies.count < Self.maxSpareEasies else {
            curl_easy_cleanup(easy)
            resources.free()
            return
        }
        if !keepOptions { curl_easy_reset(easy) }
        spareEasies.append((easy, keepOptions, resources))
    }

    // MARK: curl

    private func socketAction(_ fd: Int32, _ mask: Int32) {
        var running: Int32 = 0
        _ = curl_multi_socket_action(multi, fd, mask, &running)
    }

    fileprivate func watch(_ fd: Int32, _ what: Int32) {
        if what == CURL_POLL_REMOVE {
            wanted.remove(fd)
            if !ownSockets.contains(fd) {
                registered[fd] = nil
                loop.unwatch(fd: fd)
            }
            return
        }
        var events: UInt32 = 0
        if what & CURL_POLL_IN != 0 { events |= EPOLLIN.rawValue }
        if what & CURL_POLL_OUT != 0 { events |= EPOLLOUT.rawValue }
        wanted.insert(fd)
        guard registered[fd] != events else { return }
        registered[fd] = loop.watch(fd: fd, events: events, for: self) ? events : nil
    }

    /// curl's socket(2) for a connection (CURLOPT_OPENSOCKETFUNCTION).
    fileprivate func openSocket(_ address: UnsafeMutablePointer<curl_sockaddr>) -> curl_socket_t {
        let fd = socket(address.pointee.family, address.pointee.socktype | Int32(SOCK_CLOEXEC.rawValue), address.pointee.protocol)
        guard fd >= 0 else { return attest_CURL_SOCKET_BAD }
        if registered.removeValue(forKey: fd) != nil {
            // The number was registered for a descriptor closed behind curl's back (which left
            // the epoll set with it): forget that one, or the new socket would never be added.
            loop.unwatch(fd: fd)
        }
        wanted.remove(fd)
        ownSockets.insert(fd)
        return fd
    }

    /// curl's close(2) for a connection socket (CURLOPT_CLOSESOCKETFUNCTION).
    fileprivate func closeSocket(_ fd: curl_socket_t) -> Int32 {
        ownSockets.remove(fd)
        wanted.remove(fd)
        if registered.removeValue(forKey: fd) != nil { loop.unwatch(fd: fd) }
        return close(fd)
    }

    fileprivate func setTimer(_ milliseconds: Int) {
        timerDeadline = milliseconds < 0 ? nil : monotonicNanoseconds() + UInt64(milliseconds) * 1_000_000
    }

    private func collectCompleted() {
        var remaining: Int32 = 0
        while let message = curl_multi_info_read(multi, &remaining) {
            guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle,
                  let state = byEasy[easy] else { continue }
            let code = attest_curl_msg_result(message)
            if code == CURLE_OK {
                state.deliverHeadIfNeeded()
                finish(state, nil, closeConnection: false)
            } else {
                finish(state, state.error(for: code), closeConnection: false)
            }
        }
    }

    private func checkIdle() {
        guard !transfers.isEmpty else { return }
        let now = monotonicNanoseconds()
        guard now >= nextIdleCheck else { return }
        nextIdleCheck = now + idleCheckInterval
        let limit = settings.idleTimeoutNanoseconds
        let expired = transfers.values.filter { !$0.paused && now &- $0.lastActivity >= limit }
        for state in expired {
            let seconds = Double(now - state.lastActivity) / 1e9
            finish(state, UpstreamError(kind: .idleTimeout,
                                        detail: "no data for \((seconds * 1000).rounded() / 1000) s (idle timeout \(Double(limit) / 1e9) s)"),
                   closeConnection: true)
        }
    }

    /// Removes the transfer from curl and from the loop, then tells the delegate. A transfer
    /// ended early has its connection closed, not pooled.
    private func finish(_ state: TransferState, _ error: UpstreamError?, closeConnection: Bool) {
        guard transfers.removeValue(forKey: state.handle.id) != nil else { return }
        byEasy.removeValue(forKey: state.easy)
        if closeConnection {
            // Read in curl's "done" step: a connection in mid-response never goes back to the
            // pool. (An HTTP/2 connection still carrying other streams stays; this stream is reset.)
            attest_curl_easy_setopt_long(state.easy, CURLOPT_FORBID_REUSE, 1)
        }
        curl_multi_remove_handle(multi, state.easy)
        let delegate = state.delegate
        // FORBID_REUSE (a closed connection) is not an option the next transfer may inherit.
        recycle(state.easy, state.release(), keepOptions: state.isInlinePost && !closeConnection)
        counters.active.subtract(1, ordering: .relaxed)
        // A transfer the caller cancelled reports that, even if curl finished it meanwhile.
        let cancelled = state.handle.cancelRequested.load(ordering: .acquiring) && error?.kind != .cancelled
        delegate.upstreamDidFinish(cancelled ? UpstreamError(kind: .cancelled, detail: "cancelled") : error)
    }
}

private let socketCallback: curl_socket_callback = { _, fd, what, context, _ in
    Unmanaged<CurlDriver>.fromOpaque(context!).takeUnretainedValue().watch(fd, what)
    return 0
}

private let openSocketCallback: curl_opensocket_callback = { context, _, address in
    guard let context, let address else { return attest_CURL_SOCKET_BAD }
    return Unmanaged<CurlDriver>.fromOpaque(context).takeUnretainedValue().openSocket(address)
}

private let closeSocketCallback: curl_closesocket_callback = { context, fd in
    guard let context else { return close(fd) }
    return Unmanaged<CurlDriver>.fromOpaque(context).takeUnretainedValue().closeSocket(fd)
}

private let timerCallback: curl_multi_timer_callback = { _, milliseconds, context in
    Unmanaged<CurlDriver>.fromOpaque(context!).takeUnretainedValue().setTimer(milliseconds)
    return 0
}
