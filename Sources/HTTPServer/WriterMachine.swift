// The state of one request's answer, as a value: every transition is a mutating method that
// returns what the writer must do next. `HTTPResponseWriter` runs each transition under its lock
// and the returned actions (libmicrohttpd calls, the monitor's epoll, the producer's callbacks)
// after releasing it, so no C call and no foreign code ever runs with the lock held.

/// How the request is being answered.
enum Answer {
    case none
    case complete(HTTPResponse)
    /// `finished`: the producer called `finish()`; nothing more will be written.
    case stream(status: Int, headers: [(name: String, value: String)], finished: Bool)
}

/// A callback the producer registers, which runs at most once.
enum OnceCallback {
    case empty
    case registered(@Sendable () -> Void)
    /// It ran (or was due with nothing registered, and runs at registration).
    case reported

    var hasRun: Bool { if case .reported = self { true } else { false } }
}

/// Why the request ended before its answer was complete.
enum Ending: Equatable {
    /// The client hung up, a deadline expired, or the stream could not start.
    case clientLeft
    /// The server stops with the request open: it is answered 503 with `Connection: close`.
    case serverStopping
}

/// After a transition: whether the suspended connection must be woken.
enum Wake: Equatable {
    case none
    /// Call MHD_resume_connection (after taking the socket out of the hang-up watch, when
    /// `unwatchFD` is set) and kick the loop's driver.
    case resume(unwatchFD: Int32?)
}

struct WriterMachine {
    /// Where the request is in its life on the connection.
    enum Phase: Equatable {
        /// The head has not been processed yet.
        case head
        /// The head was accepted; the body (if any) is arriving.
        case body
        /// The whole request is there but waits until the client reads earlier answers.
        case held
        /// The whole request is there but it was pipelined and this turn's budget for pipelined
        /// requests is spent: it waits, suspended, for a later turn (`DaemonDriver`).
        case waitingTurn
        /// The handler is running on the connection's thread.
        case handling
        /// The producer owes the answer (the handler deferred, or used the writer); none queued.
        case producing
        /// An answer is queued with libmicrohttpd; `byProducer` when it came through the writer.
        case queued(byProducer: Bool)
        /// libmicrohttpd finished with the request.
        case closed
    }

    /// Whether libmicrohttpd is running the connection or has it parked.
    enum Suspension: Equatable {
        case running
        /// Decided under the lock; MHD_suspend_connection is not called yet. `wake`: something
        /// arrived meanwhile, so the connection thread resumes it right after suspending.
        case suspending(wake: Bool)
        /// `watched`: its socket is in the monitor's hang-up watch.
        case suspended(since: UInt64, watched: Bool)
    }

    /// The request as it arrives (the connection's own thread only).
    struct Receiving {
        var method = ""
        var path = ""
        var query: String?
        var headers: [(name: String, value: String)] = []
        var body: [UInt8] = []
        var bodyLimit = 0
        var reservedBodyBytes = 0
        /// Chosen while the body was arriving (413, overload); sent once it has ended.
        var refusal: HTTPResponse?
        var discardedBytes = 0
    }

    private(set) var phase: Phase = .head
    private(set) var suspension: Suspension = .running
    private(set) var answer: Answer = .none
    private(set) var ending: Ending?
    var receiving = Receiving()

    /// Stream bytes not yet handed to libmicrohttpd start at `sentOffset`.
    private(set) var pending: [UInt8] = []
    private(set) var sentOffset = 0
    /// A `write` returned false; `onWritable` runs once the backlog drains to the low water mark.
    private(set) var wantsWritable = false

    private(set) var onCancel: OnceCallback = .empty
    private(set) var onShutdown: OnceCallback = .empty
    private(set) var onWritable: (@Sendable () -> Void)?
    /// False: never put in the hang-up watch (`skipHangUpWatch`).
    private(set) var hangUpWatch = true
    /// The connection's socket, read at the first suspension.
    var fd: Int32 = -1

    // MARK: Derived

    var isClosed: Bool { phase == .closed }
    var isSuspended: Bool { if case .suspended = suspension { true } else { false } }
    var isWatched: Bool { if case .suspended(_, true) = suspension { true } else { false } }
    /// `respond` or `finish` was called: nothing more will come from the producer.
    var producerDone: Bool {
        switch answer {
        case .none: false
        case .complete: true
        case .stream(_, _, let finished): finished
        }
    }
    var unsentBytes: Int { pending.count - sentOffset }

    // MARK: The producer (any thread)

    /// `respond(_:)`: the first answer wins.
    mutating func respond(_ response: HTTPResponse) -> Wake {
        guard case .none = answer, phase != .closed else { return .none }
        answer = .complete(response)
        return wake()
    }

    mutating func startStream(status: Int, headers: [(name: String, value: String)]) -> Wake {
        guard case .none = answer, phase != .closed else { return .none }
        answer = .stream(status: status, headers: headers, finished: false)
        return wake()
    }

    /// What `write` returns to the producer, and whether the bytes are the first to wait.
    struct WriteOutcome: Equatable {
        var accepted: Bool
        var startedWaiting: Bool
        var wake: Wake
    }

    /// Appends stream bytes. Refused when no stream is open; `accepted` is false too (the bytes
    /// are kept) once more than `highWater` bytes wait: the producer pauses until `onWritable`.
    mutating func write(_ bytes: UnsafeRawBufferPointer, highWater: Int) -> WriteOutcome {
        guard case .stream(_, _, false) = answer, phase != .closed, ending == nil else {
            return WriteOutcome(accepted: false, startedWaiting: false, wake: .none)
        }
        let startedWaiting = unsentBytes == 0 && !bytes.isEmpty
        pending.append(contentsOf: bytes)
        let wake = wake()
        if unsentBytes > highWater {
            wantsWritable = true
            return WriteOutcome(accepted: false, startedWaiting: startedWaiting, wake: wake)
        }
        return WriteOutcome(accepted: true, startedWaiting: startedWaiting, wake: wake)
    }

    mutating func finish() -> Wake {
        guard case .stream(let status, let headers, false) = answer, phase != .closed else { return .none }
        answer = .stream(status: status, headers: headers, finished: true)
        return wake()
    }

    /// Registers the cancel callback; true when the request already ended unanswered, and the
    /// caller must run `body` now.
    mutating func registerCancel(_ body: @escaping @Sendable () -> Void) -> Bool {
        if ending != nil {
            guard !producerDone, !onCancel.hasRun else { return false }
            onCancel = .reported
            return true
        }
        if phase == .closed { return false }
        if !onCancel.hasRun { onCancel = .registered(body) }
        return false
    }

    /// Registers the shutdown callback; true when a graceful shutdown already began
    /// (`draining`) with the answer incomplete, and the caller must run `body` now.
    mutating func registerShutdown(_ body: @escaping @Sendable () -> Void, draining: Bool) -> Bool {
        guard phase != .closed, !producerDone, !onShutdown.hasRun else { return false }
        if draining {
            onShutdown = .reported
            return true
        }
        onShutdown = .registered(body)
        return false
    }

    mutating func registerWritable(_ body: @escaping @Sendable () -> Void) {
        if phase != .closed { onWritable = body }
    }

    mutating func skipHangUpWatch() { hangUpWatch = false }

    // MARK: The server

    /// The connection is gone or must go (peer closed while suspended, server stopping). Returns
    /// the wake-up and the cancel callback to run, if the producer still owed its answer.
    mutating func abort(serverStopping: Bool) -> (Wake, (@Sendable () -> Void)?) {
        guard phase != .closed, ending == nil else { return (.none, nil) }
        ending = serverStopping ? .serverStopping : .clientLeft
        let wake = wake()
        return (wake, producerDone ? nil : takeCancelCallback())
    }

    /// The client read enough of its earlier answers: a held request goes on.
    mutating func releaseHold() -> Wake {
        guard phase == .held else { return .none }
        return wake()
    }

    /// Its turn came: a request waiting for a later turn of the loop goes on.
    mutating func releaseTurn() -> Wake {
        guard phase == .waitingTurn else { return .none }
        return wake()
    }

    /// A graceful shutdown began: the shutdown callback to run, if the answer is incomplete.
    mutating func beginShutdown() -> (@Sendable () -> Void)? {
        guard phase != .closed, !producerDone, case .registered(let callback) = onShutdown else { return nil }
        onShutdown = .reported
        return callback
    }

    /// What the completion callback must do once the lock is released.
    struct Completion {
        var cancel: (@Sendable () -> Void)?
        var reservedBodyBytes: Int
        /// The answer was cut short (counted as cancelled).
        var cut: Bool
        /// A whole request whose connection closed with no answer queued.
        var unanswered: Bool
    }

    /// libmicrohttpd finished with the request. Drops the producer's closures (they may hold
    /// the writer) and the buffers.
    mutating func complete() -> Completion {
        let unanswered = phase == .handling || phase == .producing
        let producerOwns = phase == .producing || phase == .queued(byProducer: true)
        let cut = (producerOwns || ending != nil) && !producerDone
        var cancel: (@Sendable () -> Void)?
        if producerOwns, !producerDone {
            if ending == nil { ending = .clientLeft }
            cancel = takeCancelCallback()
        }
        phase = .closed
        // A cancel callback registered later still runs at once when the answer was cut
        // (`ending` is set); one registered now is dropped with the other closures.
        if case .registered = onCancel { onCancel = .empty }
        if case .registered = onShutdown { onShutdown = .empty }
        onWritable = nil
        pending = []
        sentOffset = 0
        let reserved = receiving.reservedBodyBytes
        receiving = Receiving()
        return Completion(cancel: cancel, reservedBodyBytes: reserved, cut: cut, unanswered: unanswered)
    }

    // MARK: Suspension (the connection's own thread, except `watch`)

    /// Asks to park the connection. False when the server is stopping (no new suspensions); the
    /// caller must then end the request. True: call MHD_suspend_connection, then `suspended`.
    mutating func suspend(serverStopping: Bool) -> Bool {
        guard !serverStopping else { return false }
        suspension = .suspending(wake: false)
        return true
    }

    /// MHD_suspend_connection returned. A wake-up that arrived in between is due now.
    mutating func suspended(at now: UInt64) -> Wake {
        guard case .suspending(let wake) = suspension else { return .none }
        if wake {
            suspension = .running
            return .resume(unwatchFD: nil)
        }
        suspension = .suspended(since: now, watched: false)
        return .none
    }

    /// Whether to put the socket in the hang-up watch: suspended since `cutoff` or earlier,
    /// without a resume in between. Marks it watched; the caller adds it to the monitor.
    mutating func watch(ifSuspendedSince cutoff: UInt64) -> Bool {
        guard hangUpWatch, case .suspended(let since, false) = suspension, since <= cutoff else { return false }
        suspension = .suspended(since: since, watched: true)
        return true
    }

    /// Something the connection waits for happened: resume it if it is parked.
    private mutating func wake() -> Wake {
        switch suspension {
        case .running:
            return .none
        case .suspending:
            suspension = .suspending(wake: true)
            return .none
        case .suspended(_, let watched):
            suspension = .running
            return .resume(unwatchFD: watched ? fd : nil)
        }
    }

    /// The cancel callback, at most once over the writer's life.
    /// (If none is registered yet, `registerCancel` reports the one registered later at once.)
    private mutating func takeCancelCallback() -> (@Sendable () -> Void)? {
        guard case .registered(let callback) = onCancel else { return nil }
        onCancel = .reported
        return callback
    }

    // MARK: Receiving (the connection's own thread)

    /// The head was accepted.
    mutating func headAccepted(method: String, path: String, query: String?, headers: [(name: String, value: String)],
                               bodyLimit: Int, reservedBodyBytes: Int) {
        guard phase == .head else { return }
        phase = .body
        receiving.method = method
        receiving.path = path
        receiving.query = query
        receiving.headers = headers
        receiving.bodyLimit = bodyLimit
        receiving.reservedBodyBytes = reservedBodyBytes
        if reservedBodyBytes > 0 { receiving.body.reserveCapacity(reservedBodyBytes) }
    }

    var headSeen: Bool { phase != .head }
    /// The whole request may still be held: its handler has not been called.
    var awaitsHandler: Bool { phase == .body || phase == .held || phase == .waitingTurn }

    /// What the access callback does once the body has ended.
    enum Next {
        case refuse(HTTPResponse)
        case callHandler(HTTPRequestParts)
        case deliver
        case hold
        /// Wait for a later turn of the loop (suspended; the driver resumes it).
        case waitTurn
        case close
    }

    /// The body ended (or a held or waiting request was woken). `holdForUnread`: the client has
    /// more unread answers on this connection than allowed. `waitForTurn`: it was pipelined and
    /// this turn of the loop has no room for another pipelined request.
    mutating func requestComplete(holdForUnread: Bool, waitForTurn: Bool = false, serverStopping: Bool) -> Next {
        if let refusal = receiving.refusal {
            receiving.refusal = nil
            phase = .queued(byProducer: false)
            return .refuse(refusal)
        }
        switch phase {
        case .handling, .producing, .queued: return .deliver
        case .closed: return .close
        case .head, .body, .held, .waitingTurn: break
        }
        if ending != nil { return .close }   // held or waiting, and the client hung up
        if holdForUnread, suspend(serverStopping: serverStopping) {
            phase = .held
            return .hold
        }
        if waitForTurn, suspend(serverStopping: serverStopping) {
            phase = .waitingTurn
            return .waitTurn
        }
        phase = .handling
        let parts = HTTPRequestParts(method: receiving.method, path: receiving.path, query: receiving.query,
                                     headers: receiving.headers, body: receiving.body)
        receiving.body = []  // the handler owns the bytes now
        receiving.headers = []
        return .callHandler(parts)
    }

    /// The handler returned a response at once. True when the writer was used meanwhile (its
    /// answer wins, and goes out as a deferred one); false: send the returned response.
    mutating func handlerAnswered() -> Bool {
        if case .none = answer {
            phase = .queued(byProducer: false)
            return false
        }
        phase = .producing
        return true
    }

    /// The handler returned `.deferred`.
    mutating func handlerDeferred() {
        if phase == .handling { phase = .producing }
    }

    /// What `deliverAnswer` does.
    enum Delivery {
        case alreadyQueued
        case close
        /// Suspend the connection until the producer acts (MHD_suspend_connection, `suspended`).
        case wait
        case complete(HTTPResponse)
        case stream(Int, [(name: String, value: String)])
        /// Answer 503: the server stops; run the cancel callback first.
        case stopping((@Sendable () -> Void)?)
    }

    /// Queues the producer's answer if there is one, or parks the connection until there is.
    mutating func deliver(serverStopping: Bool) -> Delivery {
        if case .queued = phase { return .alreadyQueued }
        if let ending {
            guard ending == .serverStopping else { return .close }   // the client is gone
            phase = .queued(byProducer: true)
            return .stopping(nil)
        }
        switch answer {
        case .complete(let response):
            phase = .queued(byProducer: true)
            return .complete(response)
        case .stream(let status, let headers, _):
            phase = .queued(byProducer: true)
            return .stream(status, headers)
        case .none:
            if suspend(serverStopping: serverStopping) { return .wait }
            ending = .serverStopping
            phase = .queued(byProducer: true)
            return .stopping(takeCancelCallback())
        }
    }

    /// The stream could not start (bad status or header): the cancel callback to run.
    mutating func streamFailed() -> (@Sendable () -> Void)? {
        if ending == nil { ending = .clientLeft }
        return takeCancelCallback()
    }

    // MARK: The content reader (the connection's own thread)

    enum ChunkResult {
        /// `count` bytes copied; `left` still wait; run `writable` if set.
        case bytes(count: Int, left: Int, writable: (@Sendable () -> Void)?)
        case endOfStream
        /// End the stream as failed; run `cancel` if set.
        case endWithError(cancel: (@Sendable () -> Void)?)
        /// Nothing to send yet: suspend (MHD_suspend_connection, then `suspended`), return 0.
        case suspend
    }

    /// Copies up to `max` waiting bytes into `buffer`, or ends the stream, or asks to suspend.
    mutating func readChunk(into buffer: UnsafeMutableRawPointer, max: Int, lowWater: Int,
                            serverStopping: Bool) -> ChunkResult {
        if ending != nil { return .endWithError(cancel: nil) }
        let available = unsentBytes
        if available > 0 {
            let count = min(available, max)
            pending.withUnsafeBytes { bytes in
                buffer.copyMemory(from: bytes.baseAddress! + sentOffset, byteCount: count)
            }
            sentOffset += count
            let left = available - count
            if left == 0 {
                pending.removeAll(keepingCapacity: pending.capacity <= 1 << 16)
                sentOffset = 0
            } else if sentOffset >= 1 << 16, sentOffset >= left {
                pending.removeFirst(sentOffset)
                sentOffset = 0
            }
            var writable: (@Sendable () -> Void)?
            if wantsWritable, left <= lowWater {
                wantsWritable = false
                writable = onWritable
            }
            return .bytes(count: count, left: left, writable: writable)
        }
        if producerDone { return .endOfStream }
        if suspend(serverStopping: serverStopping) { return .suspend }
        // The server is stopping: no new suspensions; end the stream as failed.
        ending = .serverStopping
        return .endWithError(cancel: takeCancelCallback())
    }
}
