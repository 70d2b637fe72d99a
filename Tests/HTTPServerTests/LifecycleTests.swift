import Foundation
#if canImport(Glibc)
import Glibc
#endif
import RawHTTP
import Testing
@testable import HTTPServer

@Suite struct LifecycleTests {
    /// `/metrics` reads the server's stats from a loop thread. stop() waits for every loop, so it
    /// must not hold what stats() needs meanwhile: that hung the process on SIGTERM.
    @Test func stopWhileAHandlerReadsTheServersStatsReturns() throws {
        let server = Shared<HTTPServer?>(nil)
        let entered = DispatchSemaphore(value: 0)
        let started = try startServer { _ in
            entered.signal()
            usleep(300_000)  // stop() begins meanwhile, on another thread
            let open = server.get?.stats().openConnections ?? -1
            return HTTPResponse(status: 200, body: Array("\(open)".utf8))
        }
        server.set(started)
        let client = try RawConnection(port: started.port)
        #expect(client.sendAll("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(entered.wait(timeout: .now() + 5) == .success)
        let stopped = DispatchSemaphore(value: 0)
        Thread { started.stop(); stopped.signal() }.start()
        #expect(stopped.wait(timeout: .now() + 10) == .success, "stop() did not return: deadlocked with the handler")
        server.set(nil)
    }
}
