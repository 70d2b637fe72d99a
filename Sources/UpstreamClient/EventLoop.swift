import CCurl
#if canImport(Glibc)
import Glibc
#endif

/// The event thread's state: the curl multi handle, epoll, and the transfers in progress.
/// Created on the event thread and never touched by any other (curl's callbacks reach it
/// through an unretained pointer, on this thread, from inside curl calls made here).
final class EventLoop {
    private let shared: EventLoopShared
    private let multi: UnsafeMutableRawPointer
    private let epollFD: Int32
    let settings: LoopSettings

    private var transfers: [UInt64: TransferState] = [:]
    private var byEasy: [UnsafeMutableRawPointer: TransferState] = [:]
    /// Sockets curl asked us to watch, and for what.
    private var watched: [Int32: UInt32] = [:]
    /// When curl wants `socket_action(CURL_SOCKET_TIMEOUT)`, in monotonic nanoseconds.
    private var timerDeadline: UInt64?
    private var nextIdleCheck: UInt64 = 0
    private let idleCheckInterval: UInt64

    init(shared: EventLoopShared, multi: UnsafeMutableRawPointer, epollFD: Int32, settings: LoopSettings) {
        self.shared = shared
        self.multi = multi
        self.epollFD = epollFD
        self.settings = settings
        // Idle time-outs are checked by a scan; a tenth of the time-out keeps the error small
        // (at most 10% late) without scanning more than a few times a second in production.
        idleCheckInterval = min(max(settings.idleTimeoutNanoseconds / 10, 5_000_000), 1_000_000_000)
    }

    func run() {
        // Named, so that a thread listing shows one event thread per client.
        attest_set_thread_name("upstream-curl")
        let me = Unmanaged.passUnretained(self).toOpaque()
        attest_curl_multi_setopt_socket_function(multi, socketCallback)
        attest_curl_multi_setopt_pointer(multi, CURLMOPT_SOCKETDATA, me)
        attest_curl_multi_setopt_timer_function(multi, timerCallback)
        attest_curl_multi_setopt_pointer(multi, CURLMOPT_TIMERDATA, me)
        attest_curl_multi_setopt_long(multi, CURLMOPT_PIPELINING, attest_CURLPIPE_MULTIPLEX)
        if settings.maxIdleConnections > 0 {
            attest_curl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, settings.maxIdleConnections)
        }

        let capacity = 512
        let events = UnsafeMutablePointer<epoll_event>.allocate(capacity: capacity)
        defer { events.deallocate() }
        var stopping = false
        while !stopping {
            let count = epoll_wait(epollFD, events, Int32(capacity), pollTimeoutMilliseconds())
            if count < 0 && errno != EINTR {
                // Nothing sensible is left to do with a broken epoll descriptor but stop.
                break
            }
            for index in 0..<Int(max(count, 0)) {
                let event = events[index]
                let fd = event.data.fd
                if fd == shared.wakeFD {
                    var counter: UInt64 = 0
                    _ = read(fd, &counter, 8)
                    continue
                }
                var mask: Int32 = 0
                if event.events & EPOLLIN.rawValue != 0 { mask |= CURL_CSELECT_IN }
                if event.events & EPOLLOUT.rawValue != 0 { mask |= CURL_CSELECT_OUT }
                if event.events & (EPOLLERR.rawValue | EPOLLHUP.rawValue) != 0 { mask |= CURL_CSELECT_ERR }
                socketAction(fd, mask)
            }
            if let deadline = timerDeadline, monotonicNanoseconds() >= deadline {
                timerDeadline = nil
                socketAction(attest_CURL_SOCKET_TIMEOUT, 0)
            }
            collectCompleted()
            let (commands, closed) = shared.take()
            for command in commands { execute(command) }
            if !commands.isEmpty { collectCompleted() }
            checkIdle()
            stopping = closed
        }

        // Shut down: everything still queued or running ends as cancelled.
        let shutdown = UpstreamError(kind: .cancelled, detail: "the upstream client is shut down")
        for case let .start(_, _, delegate) in shared.take().commands {
            shared.active.subtract(1, ordering: .relaxed)
            delegate.upstreamDidFinish(shutdown)
        }
        for state in Array(transfers.values) { finish(state, shutdown, closeConnection: true) }
        curl_multi_cleanup(multi)
        close(epollFD)
    }

    // MARK: Commands

    private func execute(_ command: Command) {
        switch command {
        case let .start(handle, request, delegate):
            if handle.cancelRequested.load(ordering: .acquiring) {
                shared.active.subtract(1, ordering: .relaxed)
                delegate.upstreamDidFinish(UpstreamError(kind: .cancelled, detail: "cancelled before it started"))
                return
            }
            guard let easy = curl_easy_init() else {
                shared.active.subtract(1, ordering: .relaxed)
                delegate.upstreamDidFinish(UpstreamError(kind: .other, detail: "curl_easy_init failed"))
                return
            }
            let state = TransferState(handle: handle, request: request, delegate: delegate, easy: easy)
            if let problem = state.configure(settings) {
                state.release()
                shared.active.subtract(1, ordering: .relaxed)
                delegate.upstreamDidFinish(UpstreamError(kind: .other, detail: problem))
                return
            }
            transfers[handle.id] = state
            byEasy[easy] = state
            let added = curl_multi_add_handle(multi, easy)
            if added != CURLM_OK {
                finish(state, UpstreamError(kind: .other, detail: "curl_multi_add_handle: \(String(cString: curl_multi_strerror(added)))"),
                       closeConnection: false)
            }
        case let .cancel(id):
            if let state = transfers[id] {
                finish(state, UpstreamError(kind: .cancelled, detail: "cancelled"), closeConnection: true)
            }
        case let .resume(id):
            if let state = transfers[id], state.paused {
                state.paused = false
                state.lastActivity = monotonicNanoseconds()
                // May deliver buffered data (and so call the delegate) before it returns.
                curl_easy_pause(state.easy, attest_CURLPAUSE_CONT)
            }
        }
    }

    // MARK: curl

    private func socketAction(_ fd: Int32, _ mask: Int32) {
        var running: Int32 = 0
        _ = curl_multi_socket_action(multi, fd, mask, &running)
    }

    fileprivate func watch(_ fd: Int32, _ what: Int32) {
        if what == CURL_POLL_REMOVE {
            if watched.removeValue(forKey: fd) != nil {
                epoll_ctl(epollFD, EPOLL_CTL_DEL, fd, nil)
            }
            return
        }
        var events: UInt32 = 0
        if what & CURL_POLL_IN != 0 { events |= EPOLLIN.rawValue }
        if what & CURL_POLL_OUT != 0 { events |= EPOLLOUT.rawValue }
        var event = epoll_event()
        event.events = events
        event.data.fd = fd
        // A socket curl closed without a REMOVE leaves epoll by itself, and its number may come
        // back: fall back from MOD to ADD and from ADD to MOD.
        if watched[fd] != nil {
            if epoll_ctl(epollFD, EPOLL_CTL_MOD, fd, &event) != 0 && errno == ENOENT {
                epoll_ctl(epollFD, EPOLL_CTL_ADD, fd, &event)
            }
        } else if epoll_ctl(epollFD, EPOLL_CTL_ADD, fd, &event) != 0 && errno == EEXIST {
            epoll_ctl(epollFD, EPOLL_CTL_MOD, fd, &event)
        }
        watched[fd] = events
    }

    fileprivate func setTimer(_ milliseconds: Int) {
        timerDeadline = milliseconds < 0 ? nil : monotonicNanoseconds() + UInt64(milliseconds) * 1_000_000
    }

    private func pollTimeoutMilliseconds() -> Int32 {
        let now = monotonicNanoseconds()
        var deadline = now + 1_000_000_000
        if let timer = timerDeadline { deadline = min(deadline, timer) }
        if !transfers.isEmpty { deadline = min(deadline, max(nextIdleCheck, now)) }
        guard deadline > now else { return 0 }
        // Round up, so that the loop does not spin in the last millisecond before a deadline.
        return Int32((deadline - now + 999_999) / 1_000_000)
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
        state.release()
        shared.active.subtract(1, ordering: .relaxed)
        // A transfer the caller cancelled reports that, even if curl finished it meanwhile.
        let cancelled = state.handle.cancelRequested.load(ordering: .acquiring) && error?.kind != .cancelled
        delegate.upstreamDidFinish(cancelled ? UpstreamError(kind: .cancelled, detail: "cancelled") : error)
    }
}

private let socketCallback: curl_socket_callback = { _, fd, what, context, _ in
    Unmanaged<EventLoop>.fromOpaque(context!).takeUnretainedValue().watch(fd, what)
    return 0
}

private let timerCallback: curl_multi_timer_callback = { _, milliseconds, context in
    Unmanaged<EventLoop>.fromOpaque(context!).takeUnretainedValue().setTimer(milliseconds)
    return 0
}
