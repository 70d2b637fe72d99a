import Synchronization
import Testing
@testable import HTTPServer

/// The response writer's state machine on its own: each transition and the action it returns,
/// without libmicrohttpd. The server-level behaviour is in StreamingTests and LaterAnswerTests.
@Suite struct WriterMachineTests {
    typealias M = WriterMachine
    static let ok = HTTPResponse(status: 200, body: Array("ok".utf8))

    /// A machine whose request has arrived whole and whose handler was called.
    static func handling() -> M {
        var m = M()
        m.headAccepted(method: "POST", path: "/v1/x", query: nil, headers: [("host", "h")], bodyLimit: 100, reservedBodyBytes: 0)
        guard case .callHandler = m.requestComplete(holdForUnread: false, serverStopping: false) else {
            Issue.record("handler not called")
            return m
        }
        return m
    }

    /// A handler that deferred, with the connection parked waiting for the producer.
    static func parked(at time: UInt64 = 10) -> M {
        var m = handling()
        m.handlerDeferred()
        guard case .wait = m.deliver(serverStopping: false) else {
            Issue.record("did not wait")
            return m
        }
        #expect(m.suspended(at: time) == .none)
        m.fd = 7
        return m
    }

    /// A stream already queued with libmicrohttpd, its connection running.
    static func streaming() -> M {
        var m = parked()
        #expect(m.startStream(status: 200, headers: []) == .resume(unwatchFD: nil))
        guard case .stream(200, _) = m.deliver(serverStopping: false) else {
            Issue.record("stream not queued")
            return m
        }
        return m
    }

    static func write(_ m: inout M, _ text: String, highWater: Int = 1 << 20) -> M.WriteOutcome {
        Array(text.utf8).withUnsafeBytes { m.write($0, highWater: highWater) }
    }

    static func read(_ m: inout M, max: Int = 64, lowWater: Int = 0, stopping: Bool = false) -> (M.ChunkResult, String) {
        var buffer = [UInt8](repeating: 0, count: max)
        let result = buffer.withUnsafeMutableBytes {
            m.readChunk(into: $0.baseAddress!, max: max, lowWater: lowWater, serverStopping: stopping)
        }
        if case .bytes(let count, _, _) = result { return (result, String(decoding: buffer.prefix(count), as: UTF8.self)) }
        return (result, "")
    }

    /// Counts how often a callback ran.
    final class Runs: Sendable {
        let count = Atomic<Int>(0)
        var callback: @Sendable () -> Void { { self.count.add(1, ordering: .relaxed) } }
        var value: Int { count.load(ordering: .relaxed) }
    }

    // MARK: Receiving

    @Test func aHeadMovesToBodyAndTheWholeRequestCallsTheHandlerOnce() {
        var m = M()
        #expect(!m.headSeen && m.phase == .head)
        m.headAccepted(method: "GET", path: "/p", query: "a=1", headers: [("host", "h")], bodyLimit: 10, reservedBodyBytes: 4)
        #expect(m.phase == .body && m.awaitsHandler && m.receiving.reservedBodyBytes == 4)
        m.receiving.body = Array("body".utf8)
        guard case .callHandler(let parts) = m.requestComplete(holdForUnread: false, serverStopping: false) else {
            Issue.record("handler not called"); return
        }
        #expect(parts.method == "GET" && parts.path == "/p" && parts.query == "a=1" && parts.body == Array("body".utf8))
        #expect(m.phase == .handling && m.receiving.body.isEmpty && m.receiving.headers.isEmpty)
        // libmicrohttpd calls the access handler again for the same request: deliver, not a second call.
        guard case .deliver = m.requestComplete(holdForUnread: false, serverStopping: false) else {
            Issue.record("handler called twice"); return
        }
    }

    @Test func aRefusalChosenDuringTheBodyIsSentOnceItEnds() {
        var m = M()
        m.headAccepted(method: "POST", path: "/p", query: nil, headers: [], bodyLimit: 1, reservedBodyBytes: 0)
        m.receiving.refusal = HTTPResponse(status: 413)
        guard case .refuse(let response) = m.requestComplete(holdForUnread: false, serverStopping: false) else {
            Issue.record("not refused"); return
        }
        #expect(response.status == 413 && m.phase == .queued(byProducer: false))
        let done = m.complete()
        #expect(!done.unanswered && !done.cut)
    }

    @Test func aRequestBehindUnreadAnswersIsHeldThenReleased() {
        var m = M()
        m.headAccepted(method: "GET", path: "/p", query: nil, headers: [], bodyLimit: 0, reservedBodyBytes: 0)
        guard case .hold = m.requestComplete(holdForUnread: true, serverStopping: false) else { Issue.record("not held"); return }
        #expect(m.phase == .held && m.suspension == .suspending(wake: false))
        #expect(m.suspended(at: 5) == .none && m.isSuspended)
        // A producer cannot act yet, but the reaper's release wakes it.
        #expect(m.releaseHold() == .resume(unwatchFD: nil))
        #expect(m.suspension == .running)
        guard case .callHandler = m.requestComplete(holdForUnread: false, serverStopping: false) else {
            Issue.record("handler not called after release"); return
        }
        #expect(m.releaseHold() == .none)
    }

    @Test func aHeldRequestWhoseClientLeftIsClosedWithoutItsHandler() {
        var m = M()
        m.headAccepted(method: "GET", path: "/p", query: nil, headers: [], bodyLimit: 0, reservedBodyBytes: 0)
        _ = m.requestComplete(holdForUnread: true, serverStopping: false)
        _ = m.suspended(at: 5)
        let (wake, cancel) = m.abort(serverStopping: false)
        #expect(wake == .resume(unwatchFD: nil) && cancel == nil)
        guard case .close = m.requestComplete(holdForUnread: false, serverStopping: false) else { Issue.record("not closed"); return }
    }

    @Test func aPipelinedRequestWaitsForItsTurnThenIsHandledOrHeld() {
        var m = M()
        m.headAccepted(method: "GET", path: "/p", query: nil, headers: [], bodyLimit: 0, reservedBodyBytes: 0)
        guard case .waitTurn = m.requestComplete(holdForUnread: false, waitForTurn: true, serverStopping: false) else {
            Issue.record("did not wait for a turn"); return
        }
        #expect(m.phase == .waitingTurn && m.awaitsHandler)
        #expect(m.suspended(at: 5) == .none && m.isSuspended)
        // Only the driver's turn wakes it (a held request's release does not).
        #expect(m.releaseHold() == .none)
        #expect(m.releaseTurn() == .resume(unwatchFD: nil))
        #expect(m.releaseTurn() == .none)
        // Woken, it may still find its connection's answers unread: then it is held instead.
        guard case .hold = m.requestComplete(holdForUnread: true, serverStopping: false) else { Issue.record("not held"); return }
        _ = m.suspended(at: 6)
        #expect(m.releaseTurn() == .none)
        #expect(m.releaseHold() == .resume(unwatchFD: nil))
        guard case .callHandler = m.requestComplete(holdForUnread: false, serverStopping: false) else {
            Issue.record("handler not called"); return
        }
    }

    @Test func aWaitingRequestWhoseClientLeftIsClosedAndNoneWaitsOnceTheServerStops() {
        var m = M()
        m.headAccepted(method: "GET", path: "/p", query: nil, headers: [], bodyLimit: 0, reservedBodyBytes: 0)
        _ = m.requestComplete(holdForUnread: false, waitForTurn: true, serverStopping: false)
        _ = m.suspended(at: 5)
        #expect(m.abort(serverStopping: false).0 == .resume(unwatchFD: nil))
        guard case .close = m.requestComplete(holdForUnread: false, serverStopping: false) else { Issue.record("not closed"); return }
        var stopping = M()
        stopping.headAccepted(method: "GET", path: "/p", query: nil, headers: [], bodyLimit: 0, reservedBodyBytes: 0)
        guard case .callHandler = stopping.requestComplete(holdForUnread: false, waitForTurn: true, serverStopping: true) else {
            Issue.record("waited while stopping"); return
        }
    }

    @Test func noHoldOnceTheServerStops() {
        var m = M()
        m.headAccepted(method: "GET", path: "/p", query: nil, headers: [], bodyLimit: 0, reservedBodyBytes: 0)
        guard case .callHandler = m.requestComplete(holdForUnread: true, serverStopping: true) else {
            Issue.record("held while stopping"); return
        }
        #expect(m.suspension == .running)
    }

    // MARK: Answers

    @Test func aResponseReturnedAtOnceIsSentDirectly() {
        var m = Self.handling()
        #expect(m.handlerAnswered() == false)
        #expect(m.phase == .queued(byProducer: false))
        let done = m.complete()
        #expect(!done.unanswered && !done.cut && done.cancel == nil && m.isClosed)
    }

    @Test func aWriterUsedDuringTheHandlerWinsOverItsReturnValue() {
        var m = Self.handling()
        #expect(m.respond(Self.ok) == .none)   // running: nothing to wake
        #expect(m.handlerAnswered() == true && m.phase == .producing)
        guard case .complete(let response) = m.deliver(serverStopping: false) else { Issue.record("not delivered"); return }
        #expect(response.status == 200 && m.phase == .queued(byProducer: true))
        guard case .alreadyQueued = m.deliver(serverStopping: false) else { Issue.record("queued twice"); return }
    }

    @Test func aDeferredAnswerWakesTheParkedConnectionOnceAndTheFirstAnswerWins() {
        var m = Self.parked()
        #expect(m.isSuspended)
        #expect(m.respond(Self.ok) == .resume(unwatchFD: nil))
        #expect(m.suspension == .running)
        #expect(m.respond(HTTPResponse(status: 500)) == .none)
        #expect(m.startStream(status: 200, headers: []) == .none)
        guard case .complete(let response) = m.deliver(serverStopping: false) else { Issue.record("not delivered"); return }
        #expect(response.status == 200)
        let done = m.complete()
        #expect(!done.cut && !done.unanswered)
    }

    @Test func aWatchedConnectionIsUnwatchedByItsResume() {
        var m = Self.parked(at: 10)
        #expect(m.watch(ifSuspendedSince: 9) == false)    // not yet old enough
        #expect(m.watch(ifSuspendedSince: 10) == true && m.isWatched)
        #expect(m.watch(ifSuspendedSince: 10) == false)   // once
        #expect(m.respond(Self.ok) == .resume(unwatchFD: 7))
        #expect(!m.isWatched)
    }

    @Test func skipHangUpWatchKeepsItOutOfTheWatch() {
        var m = Self.parked(at: 10)
        m.skipHangUpWatch()
        #expect(m.watch(ifSuspendedSince: 100) == false)
    }

    @Test func aWakeWhileSuspendingIsMadeByTheConnectionThreadAfterItSuspends() {
        var m = Self.handling()
        m.handlerDeferred()
        guard case .wait = m.deliver(serverStopping: false) else { Issue.record("did not wait"); return }
        #expect(m.suspension == .suspending(wake: false))
        // The producer answers between the decision and MHD_suspend_connection: no C call from it…
        #expect(m.respond(Self.ok) == .none)
        #expect(m.suspension == .suspending(wake: true))
        // …the connection thread resumes right after suspending.
        #expect(m.suspended(at: 3) == .resume(unwatchFD: nil))
        #expect(m.suspension == .running)
        #expect(m.suspended(at: 4) == .none)   // nothing to finish twice
    }

    @Test func noSuspensionOnceTheServerStopsAndTheProducerIsCancelled() {
        var m = Self.handling()
        m.handlerDeferred()
        let runs = Runs()
        #expect(m.registerCancel(runs.callback) == false)
        guard case .stopping(let cancel) = m.deliver(serverStopping: true) else { Issue.record("suspended while stopping"); return }
        cancel?()
        #expect(runs.value == 1 && m.ending == .serverStopping && m.suspension == .running)
    }

    // MARK: Streams

    @Test func streamBytesAreHandedOutInOrderAndTheStreamEnds() {
        var m = Self.streaming()
        let first = Self.write(&m, "hello ")
        #expect(first == M.WriteOutcome(accepted: true, startedWaiting: true, wake: .none))
        #expect(Self.write(&m, "world").startedWaiting == false)
        let (r1, text1) = Self.read(&m, max: 8)
        guard case .bytes(8, 3, nil) = r1 else { Issue.record("\(r1)"); return }
        #expect(text1 == "hello wo")
        let (_, text2) = Self.read(&m, max: 8)
        #expect(text2 == "rld" && m.unsentBytes == 0)
        guard case .suspend = Self.read(&m).0 else { Issue.record("did not suspend"); return }
        #expect(m.suspended(at: 20) == .none)
        #expect(Self.write(&m, "!").wake == .resume(unwatchFD: nil))
        #expect(m.finish() == .none)
        #expect(Self.read(&m).1 == "!")
        guard case .endOfStream = Self.read(&m).0 else { Issue.record("no end"); return }
        #expect(Self.write(&m, "late").accepted == false)
        let done = m.complete()
        #expect(!done.cut && done.cancel == nil)
    }

    @Test func aFinishWakesTheParkedStream() {
        var m = Self.streaming()
        guard case .suspend = Self.read(&m).0 else { Issue.record("did not suspend"); return }
        _ = m.suspended(at: 1)
        #expect(m.finish() == .resume(unwatchFD: nil))
        #expect(m.finish() == .none)
        guard case .endOfStream = Self.read(&m).0 else { Issue.record("no end"); return }
    }

    @Test func pastTheHighWaterMarkWritesPauseUntilTheLowWaterMark() {
        var m = Self.streaming()
        let runs = Runs()
        m.registerWritable(runs.callback)
        #expect(Self.write(&m, "0123456789", highWater: 8).accepted == false)   // taken, but pause
        #expect(m.unsentBytes == 10)
        guard case .bytes(4, 6, nil) = Self.read(&m, max: 4, lowWater: 4).0 else { Issue.record("writable too early"); return }
        guard case .bytes(4, 2, let writable?) = Self.read(&m, max: 4, lowWater: 4).0 else { Issue.record("no writable"); return }
        writable()
        #expect(runs.value == 1)
        guard case .bytes(2, 0, nil) = Self.read(&m, max: 4, lowWater: 4).0 else { Issue.record("writable twice"); return }
    }

    @Test func writesBeforeAStreamOrAfterAnAbortAreRefused() {
        var m = Self.parked()
        #expect(Self.write(&m, "x").accepted == false)
        #expect(m.finish() == .none)   // no stream: ignored
        var s = Self.streaming()
        _ = s.abort(serverStopping: false)
        #expect(Self.write(&s, "x").accepted == false)
        guard case .endWithError(nil) = Self.read(&s).0 else { Issue.record("stream not ended"); return }
    }

    @Test func aStreamWithNothingToSendWhileTheServerStopsEndsAsFailedAndCancelsItsProducer() {
        var m = Self.streaming()
        let runs = Runs()
        _ = m.registerCancel(runs.callback)
        guard case .endWithError(let cancel?) = Self.read(&m, stopping: true).0 else { Issue.record("not ended"); return }
        cancel()
        #expect(runs.value == 1 && m.ending == .serverStopping)
    }

    // MARK: Cancellation and shutdown

    @Test func anAbortWakesTheParkedConnectionAndCancelsTheProducerOnce() {
        var m = Self.parked()
        let runs = Runs()
        #expect(m.registerCancel(runs.callback) == false)
        let (wake, cancel) = m.abort(serverStopping: false)
        #expect(wake == .resume(unwatchFD: nil))
        cancel?()
        #expect(runs.value == 1 && m.ending == .clientLeft)
        let (again, second) = m.abort(serverStopping: true)
        #expect(again == .none && second == nil && m.ending == .clientLeft)
        guard case .close = m.deliver(serverStopping: false) else { Issue.record("not closed"); return }
        let done = m.complete()
        #expect(done.cut && done.cancel == nil)   // already reported
        #expect(runs.value == 1)
    }

    @Test func aCancelCallbackRegisteredAfterTheAbortRunsAtOnceAndOnlyOnce() {
        var m = Self.parked()
        _ = m.abort(serverStopping: false)
        let runs = Runs()
        #expect(m.registerCancel(runs.callback) == true)
        #expect(m.registerCancel(runs.callback) == false)
    }

    @Test func anAbortAfterTheAnswerWasGivenCancelsNothing() {
        var m = Self.parked()
        let runs = Runs()
        _ = m.registerCancel(runs.callback)
        _ = m.respond(Self.ok)
        let (_, cancel) = m.abort(serverStopping: false)
        #expect(cancel == nil)
        #expect(m.registerCancel(runs.callback) == false)
    }

    @Test func theServerStoppingAnswersAParkedRequest503() {
        var m = Self.parked()
        let (wake, _) = m.abort(serverStopping: true)
        #expect(wake == .resume(unwatchFD: nil))
        guard case .stopping(nil) = m.deliver(serverStopping: true) else { Issue.record("no 503"); return }
        #expect(m.phase == .queued(byProducer: true))
    }

    @Test func aConnectionClosedUnderAnOpenStreamCancelsItsProducer() {
        var m = Self.streaming()
        let runs = Runs()
        _ = m.registerCancel(runs.callback)
        let done = m.complete()
        #expect(done.cut && !done.unanswered)
        done.cancel?()
        #expect(runs.value == 1 && m.isClosed)
        #expect(m.registerCancel(runs.callback) == false)   // once
        #expect(m.startStream(status: 200, headers: []) == .none && m.respond(Self.ok) == .none)
        // A producer that registers only after the close still learns at once.
        var late = Self.streaming()
        _ = late.complete()
        #expect(late.registerCancel(runs.callback) == true)
    }

    @Test func aDeferredRequestClosedUnansweredIsCountedAndCancelled() {
        var m = Self.handling()
        m.handlerDeferred()
        let runs = Runs()
        _ = m.registerCancel(runs.callback)
        let done = m.complete()
        #expect(done.unanswered && done.cut)
        done.cancel?()
        #expect(runs.value == 1)
    }

    @Test func completionReturnsTheReservedBodyBytesAndDropsTheClosures() {
        var m = M()
        m.headAccepted(method: "POST", path: "/p", query: nil, headers: [], bodyLimit: 100, reservedBodyBytes: 40)
        m.registerWritable({})
        _ = m.registerShutdown({}, draining: false)
        let done = m.complete()
        #expect(done.reservedBodyBytes == 40 && m.receiving.reservedBodyBytes == 0)
        #expect(m.onWritable == nil)
        if case .registered = m.onShutdown { Issue.record("shutdown callback kept") }
    }

    @Test func theShutdownCallbackRunsOnceForAnIncompleteAnswer() {
        var m = Self.streaming()
        let runs = Runs()
        #expect(m.registerShutdown(runs.callback, draining: false) == false)
        m.beginShutdown()?()
        #expect(m.beginShutdown() == nil)
        #expect(runs.value == 1)
        // Registered once the shutdown began: runs at once.
        var late = Self.streaming()
        #expect(late.registerShutdown(runs.callback, draining: true) == true)
        #expect(late.registerShutdown(runs.callback, draining: true) == false)
        // A finished answer has nothing to end.
        var done = Self.streaming()
        _ = done.finish()
        #expect(done.registerShutdown(runs.callback, draining: true) == false)
        #expect(done.beginShutdown() == nil)
    }

    @Test func aStreamThatCannotStartCancelsItsProducer() {
        var m = Self.parked()
        let runs = Runs()
        _ = m.registerCancel(runs.callback)
        _ = m.startStream(status: 42, headers: [])
        _ = m.deliver(serverStopping: false)
        m.streamFailed()?()
        #expect(runs.value == 1 && m.ending == .clientLeft)
        #expect(m.streamFailed() == nil)
    }
}
