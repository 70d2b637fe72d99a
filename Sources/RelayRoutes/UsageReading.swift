import HTTPRouting
import TokenService

/// What the policy needs from a Messages request: `model` and `max_tokens`, read with the bounded
/// scan. The body itself goes upstream byte for byte.
public enum MessagesRequestFields {
    static let policyMembers = JSONMemberScan.Names("model", "max_tokens")

    public static func policyInput(_ body: [UInt8], spendsTokens: Bool) -> PolicyInput {
        var input = PolicyInput(spendsTokens: spendsTokens)
        body.withUnsafeBytes { bytes in
            do throws(JSONMemberScan.Failure) {
                let found = try JSONMemberScan.members(of: policyMembers, in: bytes)
                if let range = found[0] {
                    if let model = JSONMemberScan.plainString(bytes, range) { input.model = model } else { input.problem = "model is not a plain string" }
                }
                if let range = found[1] {
                    if let maxTokens = JSONMemberScan.integer(bytes, range) { input.maxTokens = maxTokens } else { input.problem = "max_tokens is not an integer" }
                }
            } catch {
                input.problem = switch error {
                case .notAnObject: "the body is not a JSON object"
                case .malformed(let at): "the body is not valid JSON (at byte \(at))"
                case .duplicate(let name): "\(name) appears more than once"
                case .escapedName: "a member name is written with escapes"
                }
            }
        }
        return input
    }

    static let streamMember = JSONMemberScan.Names("stream")

    /// Whether the request asks for an SSE stream (`"stream": true`); true as well when that
    /// cannot be read, so such a request is treated as a stream.
    public static func asksForStream(_ body: [UInt8]) -> Bool {
        body.withUnsafeBytes { bytes in
            guard let found = try? JSONMemberScan.members(of: streamMember, in: bytes) else { return true }
            guard let range = found[0] else { return false }
            return !bytes[range].elementsEqual("false".utf8)
        }
    }
}

/// The upstream's own `usage` object, as the ledger records it.
enum UsageObject {
    static let fields = JSONMemberScan.Names("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    static let usage = JSONMemberScan.Names("usage")

    /// The counts in the object at `bytes[range]`; absent or null fields count 0.
    static func read(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> TokenUsage? {
        guard let found = try? JSONMemberScan.members(of: fields, in: bytes, within: range) else { return nil }
        func count(_ slot: Int) -> Int64 { found[slot].flatMap { JSONMemberScan.integer(bytes, $0) }.map { Int64(max(0, $0)) } ?? 0 }
        return TokenUsage(inputTokens: count(0), outputTokens: count(1), cacheCreationInputTokens: count(2), cacheReadInputTokens: count(3))
    }

    /// The top-level `usage` of a whole JSON reply.
    static func ofReply(_ body: [UInt8]) -> TokenUsage? {
        body.withUnsafeBytes { bytes in
            guard let found = try? JSONMemberScan.members(of: UsageObject.usage, in: bytes), let range = found[0] else { return nil }
            return read(bytes, range)
        }
    }

    /// The last `"usage": {…}` in the tail of a reply too large to hold (the API puts `usage` last).
    static func ofTail(_ tail: [UInt8]) -> TokenUsage? {
        let marker = Array(#""usage""#.utf8)
        guard tail.count > marker.count else { return nil }
        var start = tail.count - marker.count
        while start >= 0 {
            if tail[start] == marker[0], tail[start..<(start + marker.count)].elementsEqual(marker) {
                var index = start + marker.count
                while index < tail.count, tail[index] == 0x20 || tail[index] == 0x0a || tail[index] == 0x0d || tail[index] == 0x09 || tail[index] == 0x3a { index += 1 }
                guard index < tail.count, tail[index] == 0x7b else { return nil }
                return tail.withUnsafeBytes { bytes in
                    var scanner = JSONMemberScan.Scanner(bytes: bytes.bindMemory(to: UInt8.self))
                    scanner.index = index
                    guard (try? scanner.skipValue()) != nil else { return nil }
                    return read(bytes, index..<scanner.index)
                }
            }
            start -= 1
        }
        return nil
    }
}

/// Reads usage from a Messages SSE stream as its bytes pass through, never holding the stream
/// back: input and cache counts from `message_start.message.usage`, output from the last
/// `message_delta` (a running total, not an increment). Only the data of those events is kept
/// (bounded); text deltas are skipped as they go by.
struct StreamUsageReader {
    static let maxEventBytes = 1 << 20
    static let eventMembers = JSONMemberScan.Names("type", "message", "usage")
    static let outputTokens = JSONMemberScan.Names("output_tokens")

    private(set) var usage = TokenUsage()
    private(set) var sawStart = false
    /// `message_stop` arrived: the stream is complete.
    private(set) var sawStop = false
    /// `content_block_delta` events seen: each carries at least one output token, so a stream cut
    /// before its closing `message_delta` is charged at least this many.
    private(set) var deltaEvents: Int64 = 0

    private var line: [UInt8] = []
    /// The current line is data of an event we don't need: skip to its end without keeping it.
    private var skippingLine = false
    private var lineStarted = false
    private var event: [UInt8]?
    private var data: [UInt8] = []

    private static let wanted: [[UInt8]] = ["message_start", "message_delta", "message_stop"].map { Array($0.utf8) }

    /// Reads `chunk`; returns the offset just past the last event it completed (its blank line),
    /// or nil when it completed none: the relay forwards whole events only.
    @discardableResult
    mutating func feed(_ chunk: UnsafeRawBufferPointer) -> Int? {
        var offset = 0
        var boundary: Int?
        while offset < chunk.count {
            let rest = UnsafeRawBufferPointer(rebasing: chunk[offset...])
            let newline = rest.firstIndex(of: 0x0a)
            let segment = UnsafeRawBufferPointer(rebasing: rest[..<(newline ?? rest.count)])
            if !lineStarted, let first = segment.first {
                lineStarted = true
                // A data line of an event named otherwise (content_block_delta, ping) is not kept;
                // `event:` lines and the blank line that ends the event always are.
                skippingLine = first == UInt8(ascii: "d") && (event.map { name in !Self.wanted.contains { $0 == name } } ?? false)
            }
            if !skippingLine && line.count + segment.count <= Self.maxEventBytes { line.append(contentsOf: segment) }
            guard let newline else { return boundary }
            let endedEvent = endLine()
            offset += newline + 1
            if endedEvent { boundary = offset }
        }
        return boundary
    }

    /// Ends the current line; true when it was the blank line that ends an event.
    private mutating func endLine() -> Bool {
        defer {
            line.removeAll(keepingCapacity: true)
            lineStarted = false
        }
        if skippingLine {
            skippingLine = false
            return false
        }
        if line.last == 0x0d { line.removeLast() }
        if line.isEmpty {
            dispatch()
            return true
        }
        if line.starts(with: "event:".utf8) {
            event = Array(line.dropFirst(6).drop { $0 == 0x20 })
        } else if line.starts(with: "data:".utf8) {
            var value = line.dropFirst(5)
            if value.first == 0x20 { value = value.dropFirst() }
            if !data.isEmpty { data.append(0x0a) }
            if data.count + value.count <= Self.maxEventBytes { data.append(contentsOf: value) }
        }
        return false
    }

    /// A blank line ends an event: read the usage of the ones that carry it.
    private mutating func dispatch() {
        defer {
            event = nil
            data.removeAll(keepingCapacity: true)
        }
        if let event, event.elementsEqual("content_block_delta".utf8) { deltaEvents += 1 }
        guard !data.isEmpty else { return }
        data.withUnsafeBytes { bytes in
            guard let found = try? JSONMemberScan.members(of: Self.eventMembers, in: bytes),
                  let typeRange = found[0], let type = JSONMemberScan.plainString(bytes, typeRange) else { return }
            switch type {
            case "message_start":
                guard let message = found[1],
                      let inner = try? JSONMemberScan.members(of: UsageObject.usage, in: bytes, within: message), let usageRange = inner[0],
                      let start = UsageObject.read(bytes, usageRange) else { return }
                usage.inputTokens = start.inputTokens
                usage.cacheCreationInputTokens = start.cacheCreationInputTokens
                usage.cacheReadInputTokens = start.cacheReadInputTokens
                usage.outputTokens = start.outputTokens
                sawStart = true
            case "message_delta":
                guard let usageRange = found[2],
                      let fields = try? JSONMemberScan.members(of: Self.outputTokens, in: bytes, within: usageRange),
                      let output = fields[0].flatMap({ JSONMemberScan.integer(bytes, $0) }) else { return }
                usage.outputTokens = Int64(max(0, output))
            case "message_stop":
                sawStop = true
            case "content_block_delta" where event == nil:
                deltaEvents += 1  // a data-only delta (a named one was counted by its name above)
            default:
                break
            }
        }
    }
}
