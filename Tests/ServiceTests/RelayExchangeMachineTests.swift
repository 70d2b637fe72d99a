import Foundation
import Testing
import TokenService
import UpstreamClient
@testable import RelayRoutes

/// The relay's state machine on its own: every path from the upstream's head to its end, the
/// client leaving and the server stopping, without curl or libmicrohttpd.
@Suite struct RelayExchangeMachineTests {
    typealias M = RelayExchangeMachine
    static let json = [("content-type", "application/json")]
    static let sse = [("content-type", "text/event-stream")]
    static let reply = #"{"id":"msg_1","usage":{"input_tokens":12,"output_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}"#

    static func feed(_ machine: inout M, _ text: String) -> M.ChunkAction {
        Array(text.utf8).withUnsafeBytes { machine.chunk($0, at: 1) }
    }

    @Test func aJSONReplyIsHeldAndAnsweredWholeWithItsUsage() {
        var machine = M(readsAbandonedReply: true, requestStreams: false)
        let step1 = machine.head(status: 200, headers: Self.json, isEventStream: false)
        #expect(step1 == .none)
        let step2 = Self.feed(&machine, String(Self.reply.prefix(20)))
        #expect(step2 == .keep)
        let step3 = Self.feed(&machine, String(Self.reply.dropFirst(20)))
        #expect(step3 == .keep)
        let (action, result) = machine.finish(nil)
        #expect(action == .respondHeld(status: 200, body: Array(Self.reply.utf8)))
        #expect(result.usage == TokenUsage(inputTokens: 12, outputTokens: 3) && !result.incomplete && result.status == 200)
        #expect(result.bytes == Self.reply.utf8.count)
    }

    @Test func aJSONReplyPastTheHoldLimitIsForwardedAndItsUsageReadFromItsTail() {
        var machine = M(readsAbandonedReply: false, requestStreams: false)
        _ = machine.head(status: 200, headers: Self.json, isEventStream: false)
        let big = String(repeating: " ", count: M.maxHeldReply)
        guard case .forward(true, let before, 0, false) = Self.feed(&machine, "{\"text\":\"" + big) else { Issue.record("not forwarded"); return }
        #expect(before.count == M.maxHeldReply + 9)
        #expect(machine.phase == .passing)
        let rest = "\",\"usage\":{\"input_tokens\":5,\"output_tokens\":7}}"
        guard case .forward(false, [], rest.utf8.count, true) = Self.feed(&machine, rest) else { Issue.record("not passed through"); return }
        Array(rest.utf8).withUnsafeBytes { machine.keepTail($0) }
        let (action, result) = machine.finish(nil)
        #expect(action == .finishStream(remainder: []))
        #expect(result.usage == TokenUsage(inputTokens: 5, outputTokens: 7))
    }

    @Test func aStreamGoesOutInWholeEventsAndIsCountedAsItPasses() {
        var machine = M(readsAbandonedReply: true, requestStreams: true)
        let step4 = machine.head(status: 200, headers: Self.sse, isEventStream: true)
        #expect(step4 == .startStream)
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\n"
        // Half an event waits for its end.
        let step5 = Self.feed(&machine, String(start.prefix(30)))
        #expect(step5 == .keep)
        let step6 = Self.feed(&machine, String(start.dropFirst(30)))
        #expect(step6 == .forward(startStream: false, before: Array(start.prefix(30).utf8),
                                                                             chunkPrefix: start.count - 30, keepTail: false))
        let delta = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n"
        let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        let step7 = Self.feed(&machine, delta + stop)
        #expect(step7 == .forward(startStream: false, before: [], chunkPrefix: (delta + stop).count, keepTail: false))
        let (action, result) = machine.finish(nil)
        #expect(action == .finishStream(remainder: []))
        #expect(result.usage == TokenUsage(inputTokens: 4, outputTokens: 9) && !result.incomplete)
    }

    @Test func aClientThatLeavesAJSONReplyLeavesItReadToItsEndForItsUsage() {
        var machine = M(readsAbandonedReply: true, requestStreams: false)
        let step8 = machine.clientLeft()
        #expect(!step8, "a JSON reply not begun is read, not cancelled")
        let step9 = machine.head(status: 200, headers: Self.json, isEventStream: false)
        #expect(step9 == .none)
        let step10 = Self.feed(&machine, Self.reply)
        #expect(step10 == .keep)
        let (action, result) = machine.finish(nil)
        #expect(action == .none)
        #expect(result.abandoned && !result.incomplete && result.usage == TokenUsage(inputTokens: 12, outputTokens: 3))
        // Left while held: what was held counts.
        var held = M(readsAbandonedReply: true, requestStreams: false)
        _ = held.head(status: 200, headers: Self.json, isEventStream: false)
        _ = Self.feed(&held, String(Self.reply.prefix(40)))
        let step11 = held.clientLeft()
        #expect(!step11)
        _ = Self.feed(&held, String(Self.reply.dropFirst(40)))
        let step12 = held.finish(nil)
        #expect(step12.1.usage == TokenUsage(inputTokens: 12, outputTokens: 3))
    }

    @Test func anAbandonedReplyThatIsAStreamOrTooLongIsCancelledAndCountedCutShort() {
        var stream = M(readsAbandonedReply: true, requestStreams: false)
        let step13 = stream.clientLeft()
        #expect(!step13)
        let step14 = stream.head(status: 200, headers: Self.sse, isEventStream: true)
        #expect(step14 == .cancelTransfer)
        let cut = stream.finish(UpstreamError(kind: .cancelled, detail: "cancelled"))
        #expect(cut.0 == .none && cut.1.incomplete && cut.1.abandoned)
        var long = M(readsAbandonedReply: true, requestStreams: false)
        _ = long.head(status: 200, headers: Self.json, isEventStream: false)
        let step15 = long.clientLeft()
        #expect(!step15)
        let megabyte = [UInt8](repeating: 0x20, count: 1 << 20)
        var actions: [M.ChunkAction] = []
        for _ in 0..<33 { actions.append(megabyte.withUnsafeBytes { long.chunk($0, at: 1) }) }
        #expect(actions.prefix(32).allSatisfy { $0 == .keep } && actions.last == .cancelTransfer)
    }

    @Test func aClientThatLeavesAStreamOrWithNoLedgerCancelsTheTransfer() {
        var stream = M(readsAbandonedReply: true, requestStreams: true)
        _ = stream.head(status: 200, headers: Self.sse, isEventStream: true)
        let step16 = stream.clientLeft()
        #expect(step16)
        var unrecorded = M(readsAbandonedReply: false, requestStreams: false)
        let step17 = unrecorded.clientLeft()
        #expect(step17)
        let (action, result) = unrecorded.finish(UpstreamError(kind: .cancelled, detail: "client left"))
        #expect(action == .none && result.status == 499 && result.incomplete)
    }

    @Test func aShutdownEndsStreamsCleanlyAndLeavesJSONRepliesToFinish() {
        var going = M(readsAbandonedReply: true, requestStreams: true)
        _ = going.head(status: 200, headers: Self.sse, isEventStream: true)
        let step18 = going.shutdown()
        #expect(step18 == .endStreamWithEvent)
        let step19 = Self.feed(&going, "event: ping\n\n")
        #expect(step19 == .stop)
        let step20 = going.shutdown()
        #expect(step20 == .leave, "once")
        var notBegun = M(readsAbandonedReply: true, requestStreams: true)
        let step21 = notBegun.shutdown()
        #expect(step21 == .refuse)
        var json = M(readsAbandonedReply: true, requestStreams: false)
        let step22 = json.shutdown()
        #expect(step22 == .leave)
        _ = json.head(status: 200, headers: Self.json, isEventStream: false)
        let step23 = json.shutdown()
        #expect(step23 == .leave)
        let step24 = Self.feed(&json, Self.reply)
        #expect(step24 == .keep)
        let step25 = json.finish(nil)
        #expect(step25.0 == .respondHeld(status: 200, body: Array(Self.reply.utf8)))
    }

    @Test func upstreamFailuresAreAnsweredInTheAPIsShapeOrEndTheStreamWithAnError() {
        var before = M(readsAbandonedReply: true, requestStreams: false)
        let step26 = before.finish(UpstreamError(kind: .timeout, detail: "connect timed out"))
        #expect(step26.0 == .respondUpstreamError(status: 504, timedOut: true))
        var unreachable = M(readsAbandonedReply: true, requestStreams: false)
        let (action, result) = unreachable.finish(UpstreamError(kind: .other, detail: "refused"))
        #expect(action == .respondUpstreamError(status: 502, timedOut: false) && result.status == 502)
        var midway = M(readsAbandonedReply: true, requestStreams: true)
        _ = midway.head(status: 200, headers: Self.sse, isEventStream: true)
        _ = Self.feed(&midway, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":2,\"output_tokens\":1}}}\n\n")
        let ended = midway.finish(UpstreamError(kind: .other, detail: "reset"))
        #expect(ended.0 == .endStreamWithError && ended.1.incomplete && ended.1.usage.inputTokens == 2)
    }
}
