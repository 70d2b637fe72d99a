import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import RawHTTP
import Synchronization
import Testing
@testable import HTTPServer

// MARK: - Servers

let echoHandler: @Sendable (HTTPRequest) -> HTTPResponse = { request in
    let text = "\(request.method)|\(request.path)|\(request.query ?? "-")|\(request.header("x-test") ?? "-")|"
        + "\(request.remoteAddress)|"
    return HTTPResponse(status: 200, headers: [(name: "Content-Type", value: "text/plain")],
                        body: Array(text.utf8) + request.body)
}

func loopbackConfig() -> HTTPServerConfiguration {
    var config = HTTPServerConfiguration()
    config.host = "127.0.0.1"
    config.port = 0
    config.threads = 4
    return config
}

func startServer(_ config: HTTPServerConfiguration = loopbackConfig(),
                 handler: @escaping @Sendable (HTTPRequest) -> HTTPResponse) throws -> HTTPServer {
    let server = HTTPServer(configuration: config, handler: handler)
    try server.start()
    return server
}

func startServer(_ config: HTTPServerConfiguration = loopbackConfig(),
                 writerHandler: @escaping @Sendable (HTTPRequest, HTTPResponseWriter) -> HTTPHandlerResult) throws -> HTTPServer {
    let server = HTTPServer(configuration: config, handler: writerHandler)
    try server.start()
    return server
}

func post(bodySize: Int, path: String = "/upload") -> String {
    "POST \(path) HTTP/1.1\r\nHost: a\r\nContent-Length: \(bodySize)\r\n\r\n" + String(repeating: "a", count: bodySize)
}

/// Request contexts are released when requests complete (possibly just after the reply).
func expectNoLeaks(_ server: HTTPServer, sourceLocation: SourceLocation = #_sourceLocation) {
    waitUntil(timeout: 8) { server.liveRequestContexts == 0 && server.bufferedBodyBytes == 0 }
    #expect(server.liveRequestContexts == 0, "live request contexts", sourceLocation: sourceLocation)
    #expect(server.bufferedBodyBytes == 0, "reserved body bytes", sourceLocation: sourceLocation)
}

/// Polls `condition` every 5 ms until it holds or `timeout` seconds pass; returns whether it held.
/// Deadlines are generous (8 s: under the server's 10-s body and head deadlines, so a leak those
/// would clean up still fails): the event is waited for, and a loaded machine only waits longer.
@discardableResult
func waitUntil(timeout: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while !condition() {
        if Date() > deadline { return false }
        usleep(5_000)
    }
    return true
}

/// A value shared between the test, the handler and producer threads.
final class Shared<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ initial: Value) { value = Mutex(initial) }
    var get: Value { value.withLock { $0 } }
    func set(_ new: Value) { value.withLock { $0 = new } }
    @discardableResult
    func update<R: Sendable>(_ body: (inout Value) -> R) -> R { value.withLock { body(&$0) } }
}

final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    func next() -> Int { value.wrappingAdd(1, ordering: .relaxed).newValue }
    var current: Int { value.load(ordering: .relaxed) }
}

/// Runs `body` on a new thread (a producer answering from off the server's loops).
func onAnotherThread(after delay: Double = 0, _ body: @escaping @Sendable () -> Void) {
    Thread.detachNewThread {
        if delay > 0 { Thread.sleep(forTimeInterval: delay) }
        body()
    }
}

/// User + system CPU time of this process so far.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    func seconds(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1e6 }
    return seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Resident set size of this process (Linux /proc/self/statm).
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    return fields.count > 1 ? (Int(fields[1]) ?? 0) * Int(sysconf(Int32(_SC_PAGESIZE))) : 0
}

/// Threads in this process (Linux /proc/self/task).
func threadCount() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? 0
}
