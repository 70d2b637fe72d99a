import CMicroHTTPD
import EventLoops
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// A request's life on the loop that runs its connection's daemon: head, framing, body, answer.

// MARK: - Request processing (on the event loop that runs the connection's daemon)

extension HTTPResponseWriter {
    func access(connection: OpaquePointer, method: UnsafePointer<CChar>?, version: UnsafePointer<CChar>?,
                            uploadData: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>) -> MHD_Result {
        let headersSeen = state.withLock { $0.headSeen }
        if !headersSeen { return headersArrived(connection: connection, method: method, version: version) }

        let chunkSize = uploadSize.pointee
        if chunkSize > 0 {
            uploadSize.pointee = 0
            return bodyChunk(UnsafeRawBufferPointer(start: uploadData, count: chunkSize))
        }
        return requestComplete(connection: connection)
    }

    private func headersArrived(connection: OpaquePointer, method rawMethod: UnsafePointer<CChar>?,
                                version: UnsafePointer<CChar>?) -> MHD_Result {
        let method = rawMethod.map { String(cString: $0) } ?? ""
        let (path, query) = splitTarget(target)
        let headers = requestHeaders(connection)
        // Oversize heads first: answered by us, in the route's shape, rather than by
        // libmicrohttpd once its memory pool is full.
        let config = core.configuration
        if target.utf8.count > config.maxTargetBytes { return refuse(414, path: path, on: connection) }
        if headers.count > config.maxHeaderFields || attest_mhd_request_header_size(connection) > config.maxHeadBytes {
            return refuse(431, path: path, on: connection)
        }
        switch checkFraming(headers, http11: version.map { strcmp($0, "HTTP/1.1") == 0 } ?? false) {
        case .malformed: return refuse(400, path: path, on: connection)
        case .unsupportedTransferEncoding: return refuse(501, path: path, on: connection)
        case .ok: break
        }
        let limit = core.bodyLimit(method: method, path: path)
        var declared: UInt64?
        // Refuse a declared oversize body before reading any of it. libmicrohttpd then skips
        // the upload and closes the connection after the answer.
        if let value = headers.first(where: { $0.name == "content-length" })?.value {
            if !value.isEmpty, value.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) {
                declared = UInt64(value) ?? .max  // digits only: nil means overflow
            }
        }
        var reserved = 0
        if let declared {
            if declared > UInt64(limit) { return refuse(413, path: path, on: connection) }
            // Up to `bodyBytesReservedUpFront` now; the rest as it arrives (bodyChunk).
            let upFront = min(Int(declared), config.bodyBytesReservedUpFront)
            if upFront > 0 {
                guard core.reserveBodyBytes(upFront) else {
                    core.totals.overloaded.add(1, ordering: .relaxed)
                    return send(core.configuration.overloadedResponse(path), on: connection)
                }
                reserved = upFront
            }
        }
        let chunked = headers.contains { $0.name == "transfer-encoding" }
        state.withLock { m in
            m.headAccepted(method: method, path: path, query: query, headers: headers, bodyLimit: limit,
                           reservedBodyBytes: reserved)
        }
        record?.enter(.body)
        if chunked || (declared ?? 0) > 0 { record?.driver?.noteReceiving(self) }
        return .YES
    }

    private enum Framing { case ok, malformed, unsupportedTransferEncoding }

    /// What libmicrohttpd lets through but RFC 9112 does not (it answers malformed and
    /// overflowing Content-Length values itself; see `answerMalformedContentLength`).
    private func checkFraming(_ headers: [(name: String, value: String)], http11: Bool) -> Framing {
        var hosts = 0, contentLengths = 0
        var transferEncodings: [String] = []
        for (name, value) in headers {
            switch name {
            case "host": hosts += 1
            case "content-length": contentLengths += 1
            case "transfer-encoding": transferEncodings.append(value)
            default: if !name.utf8.allSatisfy(isTokenByte) { return .malformed }  // e.g. "bad name: x"
            }
        }
        // §3.2: exactly one Host in HTTP/1.1, at most one otherwise.
        if hosts > 1 || (http11 && hosts == 0) { return .malformed }
        if !transferEncodings.isEmpty {
            // Only "chunked" is implemented (libmicrohttpd would otherwise wait for the body
            // to end with the connection); with Content-Length as well it is a smuggling attempt.
            // Compared as libmicrohttpd compares it (it drops only the blanks before a value):
            // "chunked " passed a trimmed check, and libmicrohttpd took the chunks as a body.
            guard transferEncodings.count == 1, asciiCaseInsensitiveEquals(transferEncodings[0], "chunked") else {
                return .unsupportedTransferEncoding
            }
            if contentLengths > 0 { return .malformed }
        }
        // libmicrohttpd reads the first Content-Length and would take the rest for the next request.
        if contentLengths > 1 { return .malformed }
        return .ok
    }

    private func bodyChunk(_ chunk: UnsafeRawBufferPointer) -> MHD_Result {
        // The idle timeout resets on every byte; this bounds a body trickled in slowly on purpose.
        if core.bodyDeadlineNanoseconds > 0, monotonicNanoseconds() - started > core.bodyDeadlineNanoseconds {
            core.totals.countReap(.bodyDeadline)
            return .NO
        }
        // Bodies with a valid Content-Length never exceed it (libmicrohttpd stops there), so the
        // limits below only bite on chunked uploads. MHD does not accept a response while body
        // data is being delivered, so the excess is consumed and dropped and the refusal goes
        // out once the body ends; a client that keeps streaming far past the limit is
        // disconnected instead.
        var released = 0
        let keepGoing = state.withLock { m -> Bool in
            // Only this thread touches what is being received; the lock keeps the writer Sendable.
            if m.receiving.refusal != nil {
                m.receiving.discardedBytes += chunk.count
                return m.receiving.discardedBytes <= max(m.receiving.bodyLimit, 1 << 20)
            }
            let total = m.receiving.body.count + chunk.count
            var refusal: HTTPResponse?
            if total > m.receiving.bodyLimit {
                refusal = core.refusal(413, path: m.receiving.path)
            } else if total > m.receiving.reservedBodyBytes {
                let more = total - m.receiving.reservedBodyBytes
                if core.reserveBodyBytes(more) {
                    m.receiving.reservedBodyBytes += more
                } else {
                    refusal = core.configuration.overloadedResponse(m.receiving.path)
                    core.totals.overloaded.add(1, ordering: .relaxed)
                }
            }
            if let refusal {
                m.receiving.refusal = refusal
                m.receiving.discardedBytes = total
                m.receiving.body = []
                released = m.receiving.reservedBodyBytes
                m.receiving.reservedBodyBytes = 0
                return true
            }
            m.receiving.body.append(contentsOf: chunk)
            return true
        }
        record?.addBodyBytes(chunk.count)
        if released > 0 { core.releaseBodyBytes(released) }
        if keepGoing { record?.driver?.noteReceiving(self) }
        return keepGoing ? .YES : .NO
    }

    private func requestComplete(connection: OpaquePointer) -> MHD_Result {
        let config = core.configuration
        var holdForUnread = false
        var waitForTurn = false
        if let record, state.withLock({ $0.awaitsHandler }) {
            // Only a request that follows another on its connection can find answers still
            // unread. (The ioctl runs before the lock: no C call under it.)
            if config.maxUnreadResponseBytes > 0, record.hasServedRequests {
                holdForUnread = unreadBytes(record.fd) > config.maxUnreadResponseBytes
            }
            // A pipelined request (its predecessor's answer went out in this very turn) is
            // handled within the turn's budget for them, else waits for a later turn.
            if !holdForUnread, config.pipelinedRequestsPerTurn > 0, let driver = record.driver,
               record.previousEnded(inTurn: driver.turn) {
                waitForTurn = !driver.takePipelinedSlot()
            }
        }
        let stopping = core.monitor.isStopping
        let next = state.withLock {
            $0.requestComplete(holdForUnread: holdForUnread, waitForTurn: waitForTurn, serverStopping: stopping)
        }
        switch next {
        case .refuse(let response):
            return send(response, on: connection, close: true)
        case .deliver:
            return deliverAnswer(connection: connection)
        case .hold:
            // Pipelined behind answers the client has not read: no work for it until it reads.
            core.totals.held.add(1, ordering: .relaxed)
            record?.enter(.held)
            parkConnection()
            return .YES
        case .waitTurn:
            // Out of the daemon's run until its driver resumes it, in a later turn. Not in the
            // hang-up watch: its wait is short, and a client gone meanwhile is seen on resume.
            core.totals.turnWaits.add(1, ordering: .relaxed)
            record?.enter(.waitingTurn)
            parkConnection(watchHangUp: false)
            record?.driver?.waitForTurn(self)
            return .YES
        case .close:
            return .NO
        case .callHandler(let parts):
            record?.enter(.handling)
            let request = HTTPRequest(method: parts.method, path: parts.path, query: parts.query,
                                      lowercasedHeaders: parts.headers, body: parts.body,
                                      remoteAddress: clientAddress(connection))
            switch core.handler(request, self) {
            case .response(let response):
                // The common case: one lock to note that the writer was not used.
                let writerUsed = state.withLock { $0.handlerAnswered() }
                return writerUsed ? deliverAnswer(connection: connection) : send(response, on: connection)
            case .deferred:
                state.withLock { $0.handlerDeferred() }
                return deliverAnswer(connection: connection)
            }
        }
    }

    /// Queues the producer's answer if there is one, or suspends the connection until there is.
    private func deliverAnswer(connection: OpaquePointer) -> MHD_Result {
        let stopping = core.monitor.isStopping
        switch state.withLock({ $0.deliver(serverStopping: stopping) }) {
        case .alreadyQueued: return .YES
        case .wait:
            parkConnection()
            return .YES
        case .close: return .NO  // libmicrohttpd closes the connection; completion follows
        case .complete(let response): return send(response, on: connection)
        case .stream(let status, let headers): return queueStream(status: status, headers: headers, on: connection)
        case .stopping(let callback):
            callback?()
            return send(serviceUnavailable, on: connection)
        }
    }

    /// Queues a complete response (with `Connection: close` if asked, or once a graceful
    /// shutdown began).
    private func send(_ response: HTTPResponse, on connection: OpaquePointer, close: Bool = false) -> MHD_Result {
        record?.enter(.responding)
        return queue(response, on: connection, close: close || core.registry.isDraining)
    }

    /// Refuses the request with the configured refusal for `status`, and closes the connection.
    private func refuse(_ status: Int, path: String, on connection: OpaquePointer) -> MHD_Result {
        send(core.refusal(status, path: path), on: connection, close: true)
    }

    /// Queues a chunked response whose body comes from `readChunk`.
    private func queueStream(status: Int, headers: [(name: String, value: String)],
                             on connection: OpaquePointer) -> MHD_Result {
        guard (100...999).contains(status) else { return failStream(on: connection) }
        let context = Unmanaged.passRetained(self).toOpaque()
        // The block size is only used for HTTP/1.0 clients (no chunked encoding); chunks for
        // HTTP/1.1 are built in the connection's own write buffer.
        guard let response = MHD_create_response_from_callback(UInt64.max, 4096, contentReader, context,
                                                                contentReaderFree) else {
            Unmanaged<HTTPResponseWriter>.fromOpaque(context).release()
            return failStream(on: connection)
        }
        defer { MHD_destroy_response(response) }  // MHD keeps its own reference once queued
        let draining = core.registry.isDraining
        for (name, value) in headers {
            if asciiCaseInsensitiveEquals(name, "content-length") || asciiCaseInsensitiveEquals(name, "transfer-encoding") {
                continue
            }
            if draining, asciiCaseInsensitiveEquals(name, "connection") { continue }
            guard isValidHeader(name: name, value: value),
                  MHD_add_response_header(response, name, value) == .YES else { return failStream(on: connection) }
        }
        if draining { _ = MHD_add_response_header(response, "Connection", "close") }
        record?.enter(.streaming)
        guard MHD_queue_response(connection, UInt32(status), response) == .YES else { return failStream(on: connection) }
        return .YES
    }

    /// The producer's stream cannot start (bad status or header): 500, and the producer is told.
    private func failStream(on connection: OpaquePointer) -> MHD_Result {
        state.withLock { $0.streamFailed() }?()
        return send(internalError, on: connection)
    }
}

/// What the handler's `HTTPRequest` is built from, taken out of the writer's state.
struct HTTPRequestParts {
    let method: String
    let path: String
    let query: String?
    let headers: [(name: String, value: String)]
    let body: [UInt8]
}
