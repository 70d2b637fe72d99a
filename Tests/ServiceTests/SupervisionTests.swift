import AttestDaemon
import Foundation
import HTTPRouting
import Lifecycle
import Synchronization
import Testing

/// The service group supervises: a service whose run ends on its own stops everything (in
/// reverse order, within the one grace) and is named in the outcome and the log; a stop shares
/// one deadline, which a stuck service cannot stretch.
@Suite struct SupervisionTests {
    /// A periodic task whose work throws once `armed` is signalled.
    static func failing(_ name: String, armed: DispatchSemaphore) -> PeriodicTask {
        PeriodicTask(name, every: 0.01) {
            guard armed.wait(timeout: .now()) == .success else { return }
            throw ServiceEndedError("the work threw on purpose")
        }
    }

    @Test func aServiceThatDiesStopsTheGroupAndIsNamed() throws {
        let armed = DispatchSemaphore(value: 0)
        let events = Mutex<[LifecycleEvent]>([])
        let group = ServiceGroup([BasicService("first", stop: { _ in }), Self.failing("dying", armed: armed), BasicService("last", stop: { _ in })],
                                 grace: .seconds(5), report: { event in events.withLock { $0.append(event) } })
        try group.start()
        armed.signal()
        let outcome = group.wait()
        guard case .failed(let service, let detail) = outcome else { Issue.record("outcome \(outcome)"); return }
        #expect(service == "dying" && detail.contains("threw on purpose"))
        #expect(outcome.exitStatus == 1)
        let order = events.withLock { $0 }.map(\.description)
        #expect(order.contains { $0.hasPrefix("dying failed: ") })
        // Everything stopped after it, last started first.
        #expect(order.suffix(6) == ["last stopping", "last stopped", "dying stopping", "dying stopped", "first stopping", "first stopped"], "\(order)")
    }

    @Test func aStopAskedForEndsCleanly() throws {
        let group = ServiceGroup([BasicService("a", stop: { _ in }), PeriodicTask("tick", every: 0.01) {}])
        try group.start()
        group.stop(grace: .seconds(5))
        #expect(group.wait() == .stopped)
        #expect(group.wait().exitStatus == 0)
    }

    @Test func aStuckServiceCannotStretchTheDeadline() throws {
        let entered = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let stuck = PeriodicTask("stuck", every: 0.01) {
            entered.signal()
            release.wait()
        }
        let group = ServiceGroup([stuck])
        try group.start()
        entered.wait()
        // The work is blocked until the test releases it; the stop returns at its deadline anyway.
        group.stop(grace: .milliseconds(200))
        #expect(group.events.map(\.description).suffix(2) == ["stuck stopping", "stuck stopped"])
        release.signal()
        #expect(group.wait() == .stopped)
    }

    /// The whole daemon: a service that dies takes the listeners down with it, and the outcome
    /// (attestd's exit status) and the log name it.
    @Test func theDaemonStopsWhenOneOfItsServicesDies() async throws {
        let (directory, db, _) = try DurabilityTests().makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let options = try ServeOptions(["--db", db, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                                        "--trust-anchor", ServerProcess.testAuthorityRoot, "--shutdown-grace", "5"])
        let logs = LogLines()
        let armed = DispatchSemaphore(value: 0)
        let daemon = try Daemon(options, logger: Logger(write: { line in logs.lines.withLock { $0.append(line) } }),
                                extraServices: [Self.failing("doomed-job", armed: armed)])
        try daemon.start()
        let http = TestHTTP(baseURL: URL(string: "http://127.0.0.1:\(daemon.port)")!)
        #expect(try await http.send("GET", "/healthz").status == 200)
        armed.signal()
        let outcome = daemon.wait()
        #expect(outcome == .failed(service: "doomed-job", detail: "doomed-job: the work threw on purpose"), "\(outcome)")
        #expect(outcome.exitStatus == 1)
        let lines = logs.lines.withLock { $0 }
        #expect(lines.contains { $0.contains(#""event":"service_failed""#) && $0.contains(#""service":"doomed-job""#) }, "\(lines.suffix(5))")
        #expect(lines.contains { $0.contains(#""event":"service_stopped""#) && $0.contains(#""service":"public-listener""#) })
        // The listener is closed.
        await #expect(throws: (any Error).self) { _ = try await http.send("GET", "/healthz") }
    }
}
