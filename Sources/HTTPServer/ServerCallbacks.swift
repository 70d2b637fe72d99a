import CMicroHTTPD
import EventLoops
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// What libmicrohttpd's C callbacks reach (`ServerCore`, passed as their `cls`), and the callbacks.

// MARK: - State shared with the C callbacks

/// Everything the C callbacks need; passed to libmicrohttpd as the `cls` pointer. Kept alive by
/// the server while the daemon runs and by every request context (writer) after that.
final class ServerCore: Sendable {
    let configuration: HTTPServerConfiguration
    let handler: @Sendable (HTTPRequest, HTTPResponseWriter) -> HTTPHandlerResult
    let counters: ServerCounters
    let totals: ServerTotals
    let registry: ConnectionRegistry
    let monitor: ConnectionMonitor
    /// 0 = no deadline.
    let bodyDeadlineNanoseconds: UInt64
    /// libmicrohttpd log lines while the daemon starts (nil otherwise: runtime messages such as
    /// "connection limit reached" are routine under load and dropped).
    let startupLog = Mutex<[String]?>(nil)
    /// Resumes decided under a writer's lock and not yet made (`HTTPResponseWriter.perform`);
    /// the server's stop waits for none before it stops the daemons, which free the connections.
    let resumesInFlight = Atomic<Int>(0)
    /// The daemon on each loop, by loop index (set before the daemon accepts anything).
    private let drivers = Mutex<[Int: DaemonDriver]>([:])

    func setDriver(_ driver: DaemonDriver, forLoop index: Int) {
        drivers.withLock { $0[index] = driver }
    }

    /// The daemon whose callback is running on this thread.
    func currentDriver() -> DaemonDriver? {
        guard let loop = EventLoop.current else { return nil }
        return drivers.withLock { $0[loop.index] }
    }

    init(configuration: HTTPServerConfiguration,
         handler: @escaping @Sendable (HTTPRequest, HTTPResponseWriter) -> HTTPHandlerResult,
         counters: ServerCounters, totals: ServerTotals, registry: ConnectionRegistry, monitor: ConnectionMonitor) {
        self.configuration = configuration
        self.handler = handler
        self.counters = counters
        self.totals = totals
        self.registry = registry
        self.monitor = monitor
        self.bodyDeadlineNanoseconds = UInt64(max(0, configuration.bodyDeadlineSeconds) * 1e9)
    }

    /// Reserves `bytes` of the global request-body budget; false (and nothing reserved) if that
    /// would exceed `maxBufferedBodyBytes`.
    func reserveBodyBytes(_ bytes: Int) -> Bool {
        let total = counters.bufferedBodyBytes.wrappingAdd(bytes, ordering: .relaxed).newValue
        if total > configuration.maxBufferedBodyBytes {
            counters.bufferedBodyBytes.wrappingSubtract(bytes, ordering: .relaxed)
            return false
        }
        return true
    }

    func releaseBodyBytes(_ bytes: Int) {
        counters.bufferedBodyBytes.wrappingSubtract(bytes, ordering: .relaxed)
    }

    func bodyLimit(method: String, path: String) -> Int {
        configuration.bodyLimit?(method, path) ?? configuration.maxBodyBytes
    }

    /// The configured refusal for `status` on `path`, counted (413 as too large, the rest as
    /// malformed).
    func refusal(_ status: Int, path: String) -> HTTPResponse {
        if status == 413 { totals.tooLarge.add(1, ordering: .relaxed) } else { totals.malformed.add(1, ordering: .relaxed) }
        return configuration.refusalResponse(status, path)
    }
}

// MARK: - C callbacks (no captures: they are plain C function pointers)

typealias UriLogCallback = @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<CChar>?, OpaquePointer?)
    -> UnsafeMutableRawPointer?

func logCallback(_ cls: UnsafeMutableRawPointer?, _ format: UnsafePointer<CChar>?, _ arguments: CVaListPointer?) {
    guard let cls, let format, let arguments else { return }
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    var buffer = [CChar](repeating: 0, count: 512)
    _ = attest_mhd_format_log(&buffer, buffer.count, format, arguments)
    let line = trimmed(buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) })
    // "Too large value of 'Content-Length' header." / "Failed to parse `Content-Length' header.":
    // libmicrohttpd is about to answer with two status lines; answer once ourselves instead.
    if line.utf8.count > 14, line.contains("Content-Length") {
        core.registry.answerMalformedContentLength(worker: pthread_self())
    }
    core.startupLog.withLock { lines in
        guard lines != nil, lines!.count < 32 else { return }
        lines!.append(line)
    }
}

/// Connection accepted (STARTED) or about to be closed (CLOSED); the socket context holds our
/// record in between.
func connectionCallback(_ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
                                _ socketContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
                                _ code: MHD_ConnectionNotificationCode) {
    guard let cls, let connection, let socketContext else { return }
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    if code == .CONNECTION_NOTIFY_STARTED {
        let record = ConnectionRecord(connection: ConnectionHandle(pointer: connection),
                                      fd: attest_mhd_connection_fd(connection), worker: pthread_self(),
                                      address: attest_mhd_client_address(connection).flatMap(IPAddress.init),
                                      driver: core.currentDriver(), now: monotonicNanoseconds())
        socketContext.pointee = Unmanaged.passRetained(record).toOpaque()
        if core.registry.opened(record) { core.monitor.wake() }
    } else if let raw = socketContext.pointee {
        socketContext.pointee = nil
        let record = Unmanaged<ConnectionRecord>.fromOpaque(raw).takeRetainedValue()
        core.registry.closed(record)
        record.driver?.connectionClosed()
    }
}

/// Before libmicrohttpd takes a new connection: refused (closed at once) when its address
/// already holds `maxConnectionsPerIP` connections across every daemon of the server.
func acceptPolicy(_ cls: UnsafeMutableRawPointer?, _ address: UnsafePointer<sockaddr>?, _ length: socklen_t) -> MHD_Result {
    guard let cls, let address, let peer = IPAddress(address) else { return .YES }
    return Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue().registry.admits(peer) ? .YES : .NO
}

/// Our record for a connection (nil only if the notification callback did not run).
func record(of connection: OpaquePointer) -> ConnectionRecord? {
    attest_mhd_socket_context(connection).map { Unmanaged<ConnectionRecord>.fromOpaque($0).takeUnretainedValue() }
}

/// Called once per request, right after the request line, before any access-handler call.
/// Its return value becomes `*req_cls`; it also gives us the raw (undecoded) target.
func uriCallback(_ cls: UnsafeMutableRawPointer?, _ uri: UnsafePointer<CChar>?,
                         _ connection: OpaquePointer?) -> UnsafeMutableRawPointer? {
    guard let cls, let connection else { return nil }
    let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
    let connectionRecord = record(of: connection)
    let writer = HTTPResponseWriter(core: core, connection: ConnectionHandle(pointer: connection),
                                    record: connectionRecord, target: uri.map { String(cString: $0) } ?? "/")
    connectionRecord?.beginRequest(writer)
    return Unmanaged.passRetained(writer).toOpaque()
}

func completedCallback(_ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
                               _ reqCls: UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
                               _ code: MHD_RequestTerminationCode) {
    guard let reqCls, let raw = reqCls.pointee else { return }
    reqCls.pointee = nil
    let writer = Unmanaged<HTTPResponseWriter>.fromOpaque(raw).takeRetainedValue()
    writer.completed()
}

/// Called after the headers (upload size 0), for each body chunk, and once more when the
/// request is complete (upload size 0 again; again after each resume while no response is queued).
func accessHandler(_ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
                           _ url: UnsafePointer<CChar>?, _ method: UnsafePointer<CChar>?,
                           _ version: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
                           _ uploadSize: UnsafeMutablePointer<Int>?,
                           _ reqCls: UnsafeMutablePointer<UnsafeMutableRawPointer?>?) -> MHD_Result {
    guard let cls, let connection, let uploadSize, let reqCls else { return .NO }
    let writer: HTTPResponseWriter
    if let raw = reqCls.pointee {
        writer = Unmanaged<HTTPResponseWriter>.fromOpaque(raw).takeUnretainedValue()
    } else {
        // Not expected (the URI callback always runs first), but stay correct if it did not.
        let core = Unmanaged<ServerCore>.fromOpaque(cls).takeUnretainedValue()
        writer = HTTPResponseWriter(core: core, connection: ConnectionHandle(pointer: connection),
                                    record: record(of: connection), target: url.map { String(cString: $0) } ?? "/")
        reqCls.pointee = Unmanaged.passRetained(writer).toOpaque()
    }
    return writer.access(connection: connection, method: method, version: version, uploadData: uploadData,
                         uploadSize: uploadSize)
}

func contentReader(_ cls: UnsafeMutableRawPointer?, _ position: UInt64,
                           _ buffer: UnsafeMutablePointer<CChar>?, _ max: Int) -> Int {
    guard let cls, let buffer else { return contentReaderEndWithError }
    return Unmanaged<HTTPResponseWriter>.fromOpaque(cls).takeUnretainedValue().readChunk(into: buffer, max: max)
}

func contentReaderFree(_ cls: UnsafeMutableRawPointer?) {
    guard let cls else { return }
    Unmanaged<HTTPResponseWriter>.fromOpaque(cls).release()
}
