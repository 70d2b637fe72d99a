import Foundation
import HTTPRouting
import HTTPServer
import TokenService

/// What the policy needs from a Messages request: `model`, `max_tokens`, `fallbacks` and `tools`,
/// read with the bounded scan, and the betas and user profile from its headers. The body itself
/// goes upstream byte for byte.
public enum MessagesRequestFields {
    static let policyMembers = JSONMemberScan.Names("model", "max_tokens", "fallbacks", "tools", "stream", "anthropic_beta")
    /// Far more betas than a request names; past it the body's `anthropic_beta` is refused.
    static let maxBodyBetas = 64
    static let toolMembers = JSONMemberScan.Names("type", "max_uses")
    /// The API takes at most three fallbacks; a longer list is refused before it is read further.
    static let maxFallbacks = 3
    /// Far more tools than any request carries; past it the request is refused, not scanned on.
    static let maxTools = 1024
    /// Typed tools the app runs itself (no charge beyond tokens); any other typed tool is a server tool.
    static let clientToolPrefixes = ["bash_", "text_editor_", "computer_", "memory_"]
    public static let profileHeader = "anthropic-user-profile-id"

    /// The policy's input (from the body and the headers) and whether the request asks for a
    /// stream, from one scan of the body.
    public static func read(_ request: HTTPRequest, spendsTokens: Bool) -> (input: PolicyInput, streams: Bool) {
        var (input, streams) = read(request.body, spendsTokens: spendsTokens)
        var profiles = 0
        for header in request.headers {
            if header.name == "anthropic-beta" {
                input.betaHeaderValues.append(header.value)
            } else if header.name == profileHeader {
                profiles += 1
                input.profile = header.value
            }
        }
        if profiles > 1 {
            input.malformed = input.malformed ?? "\(profileHeader) appears more than once"
            input.profile = nil
        } else if let profile = input.profile, !IntegrationPolicy.isValidProfileID(profile) {
            input.malformed = input.malformed ?? "\(profileHeader) must be uprof_ followed by letters, digits, _ or -, at most 128 bytes"
            input.profile = nil
        }
        return (input, streams)
    }

    public static func policyInput(_ body: [UInt8], spendsTokens: Bool) -> PolicyInput {
        read(body, spendsTokens: spendsTokens).input
    }

    /// A body that cannot be scanned counts as a stream, as in `asksForStream`.
    static func read(_ body: [UInt8], spendsTokens: Bool) -> (input: PolicyInput, streams: Bool) {
        var input = PolicyInput(spendsTokens: spendsTokens)
        var streams = true
        body.withUnsafeBytes { bytes in
            do throws(JSONMemberScan.Failure) {
                let found = try JSONMemberScan.members(of: policyMembers, in: bytes)
                switch found[4].map({ streamValue(bytes, $0) }) {
                case nil, .some(false?): streams = false
                case .some(true?): streams = true
                case .some(nil):
                    streams = false
                    input.malformed = "stream: must be true or false"
                }
                if let range = found[0] {
                    if let model = JSONMemberScan.plainString(bytes, range) { input.model = model } else { input.problem = "model is not a plain string" }
                }
                if let range = found[1] {
                    if let maxTokens = JSONMemberScan.integer(bytes, range) { input.maxTokens = maxTokens } else { input.problem = "max_tokens is not an integer" }
                }
                if let range = found[2] { readFallbacks(bytes, range, into: &input) }
                if let range = found[3], input.malformed == nil { readTools(bytes, range, into: &input) }
                if let range = found[5], input.malformed == nil { readBodyBetas(bytes, range, into: &input) }
            } catch {
                input.problem = switch error {
                case .notAnObject: "the body is not a JSON object"
                case .malformed(let at): "the body is not valid JSON (at byte \(at))"
                case .duplicate(let name): "\(name) appears more than once"
                case .escapedName: "a member name is written with escapes"
                }
            }
        }
        return (input, streams)
    }

    static func isNull(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Bool { bytes[range].elementsEqual("null".utf8) }

    /// `stream`'s value: true or false for the JSON literals, nil for anything else (`null`, `0`,
    /// `"false"`), which is refused rather than guessed at.
    static func streamValue(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Bool? {
        if bytes[range].elementsEqual("true".utf8) { return true }
        if bytes[range].elementsEqual("false".utf8) { return false }
        return nil
    }

    /// The body's `anthropic_beta` (how Bedrock's InvokeModel takes betas): an array of plain
    /// strings, each checked by the policy like a header's beta, since a cloud reads it as one.
    static func readBodyBetas(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>, into input: inout PolicyInput) {
        if isNull(bytes, range) { return }
        guard let elements = try? JSONMemberScan.elements(in: bytes, range, limit: maxBodyBetas) else {
            input.malformed = bytes[range.lowerBound] == UInt8(ascii: "[") ? "anthropic_beta: at most \(maxBodyBetas) betas"
                : "anthropic_beta: must be an array of strings"
            return
        }
        for (index, element) in elements.enumerated() {
            guard let beta = JSONMemberScan.plainString(bytes, element), !beta.isEmpty, beta.utf8.count <= 256,
                  !beta.utf8.contains(where: { $0 == UInt8(ascii: ",") || $0 < 0x21 || $0 > 0x7e }) else {
                input.malformed = "anthropic_beta[\(index)]: must be a beta's name (printable ASCII, no commas or spaces)"
                return
            }
            input.bodyBetas.append(beta)
        }
    }

    /// `"default"`, or an array of at most three objects each naming a `model`.
    static func readFallbacks(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>, into input: inout PolicyInput) {
        if isNull(bytes, range) { return }
        if bytes[range.lowerBound] == UInt8(ascii: "\"") {
            if JSONMemberScan.plainString(bytes, range) == "default" { input.fallbacks = .serverDefault } else {
                input.malformed = "fallbacks: the only string it takes is \"default\""
            }
            return
        }
        guard let elements = try? JSONMemberScan.elements(in: bytes, range, limit: maxFallbacks) else {
            input.malformed = bytes[range.lowerBound] == UInt8(ascii: "[") ? "fallbacks: at most \(maxFallbacks) models"
                : "fallbacks: must be \"default\" or an array of objects naming a model"
            return
        }
        var models: [String] = []
        for (index, element) in elements.enumerated() {
            guard let found = try? JSONMemberScan.members(of: UsageObject.model, in: bytes, within: element), let modelRange = found[0],
                  let model = JSONMemberScan.plainString(bytes, modelRange) else {
                input.malformed = "fallbacks[\(index)]: must be an object whose model is a plain string"
                return
            }
            models.append(model)
        }
        if !models.isEmpty { input.fallbacks = .models(models) }
    }

    /// Every typed tool that is not one the app runs itself, with its `max_uses`.
    static func readTools(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>, into input: inout PolicyInput) {
        if isNull(bytes, range) { return }
        guard let elements = try? JSONMemberScan.elements(in: bytes, range, limit: maxTools) else {
            input.malformed = bytes[range.lowerBound] == UInt8(ascii: "[") ? "tools: more than \(maxTools)" : "tools: must be an array"
            return
        }
        for (index, element) in elements.enumerated() {
            guard let found = try? JSONMemberScan.members(of: toolMembers, in: bytes, within: element) else {
                input.malformed = "tools[\(index)]: must be an object with each member once"
                return
            }
            guard let typeRange = found[0] else { continue }  // a custom tool
            guard let type = JSONMemberScan.plainString(bytes, typeRange) else {
                input.malformed = "tools[\(index)].type: must be a plain string"
                return
            }
            var maxUses: Int?
            if let usesRange = found[1], !isNull(bytes, usesRange) {
                guard let uses = JSONMemberScan.integer(bytes, usesRange), uses >= 0 else {
                    input.malformed = "tools[\(index)].max_uses: must be a whole number"
                    return
                }
                maxUses = uses
            }
            if type == "custom" || clientToolPrefixes.contains(where: { type.utf8.starts(with: $0.utf8) }) { continue }
            input.serverTools.append(ServerToolInput(type: type, maxUses: maxUses))
        }
    }

    static let streamMember = JSONMemberScan.Names("stream")

    /// Whether the request asks for an SSE stream (`"stream": true`); true as well when the body
    /// cannot be read, so such a request is treated as a stream; nil when `stream` is there with
    /// any value but `true` or `false` (refused).
    public static func asksForStream(_ body: [UInt8]) -> Bool? {
        body.withUnsafeBytes { bytes in
            guard let found = try? JSONMemberScan.members(of: streamMember, in: bytes) else { return true }
            guard let range = found[0] else { return false }
            return streamValue(bytes, range)
        }
    }
}

/// The upstream's own `usage` object, as the ledger records it, and the model that served.
enum UsageObject {
    static let fields = JSONMemberScan.Names("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                                             "server_tool_use")
    static let usage = JSONMemberScan.Names("usage")
    static let reply = JSONMemberScan.Names("usage", "model", "content")
    static let block = JSONMemberScan.Names("type", "to")
    static let model = JSONMemberScan.Names("model")
    /// Server-tool counters kept from one reply (the API reports a handful).
    static let serverToolCountersPerReply = 16

    /// The counts in the object at `bytes[range]`; absent or null fields count 0.
    static func read(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> TokenUsage? {
        guard let found = try? JSONMemberScan.members(of: fields, in: bytes, within: range) else { return nil }
        func count(_ slot: Int) -> Int64 { found[slot].flatMap { JSONMemberScan.integer(bytes, $0) }.map(TokenUsage.bounded) ?? 0 }
        var usage = TokenUsage(inputTokens: count(0), outputTokens: count(1), cacheCreationInputTokens: count(2), cacheReadInputTokens: count(3))
        if let tools = found[4] { usage.serverToolUse = serverToolUse(bytes, tools) }
        return usage
    }

    /// Every counter of `usage.server_tool_use` under its own name (a snake-case name, a count).
    static func serverToolUse(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> [String: Int64] {
        var counters: [String: Int64] = [:]
        for (name, value) in JSONMemberScan.allMembers(in: bytes, within: range, limit: serverToolCountersPerReply) ?? []
        where name.utf8.count <= 64 && name.utf8.allSatisfy({ (0x61...0x7a).contains($0) || (0x30...0x39).contains($0) || $0 == 0x5f }) {
            if let count = JSONMemberScan.integer(bytes, value), count > 0 { counters[name] = TokenUsage.bounded(count) }
        }
        return counters
    }

    /// The top-level `usage` of a whole JSON reply.
    static func ofReply(_ body: [UInt8]) -> TokenUsage? { servedReply(body).usage }

    /// A whole JSON reply's usage and the model that served: the last `fallback` block's
    /// `to.model`, else the reply's own `model`.
    static func servedReply(_ body: [UInt8]) -> (usage: TokenUsage?, model: String?) {
        body.withUnsafeBytes { bytes in
            guard let found = try? JSONMemberScan.members(of: reply, in: bytes) else { return (nil, nil) }
            let usage = found[0].flatMap { read(bytes, $0) }
            var model = found[1].flatMap { JSONMemberScan.plainString(bytes, $0) }
            // Content is scanned block by block only when a fallback block can be in it.
            if let content = found[2], mentionsFallback(bytes, content),
               let blocks = try? JSONMemberScan.elements(in: bytes, content, limit: 100_000) {
                for block in blocks { if let to = fallbackTarget(bytes, block) { model = to } }
            }
            return (usage, model)
        }
    }

    /// `to.model` of a `fallback` content block at `bytes[range]`; nil for any other block.
    static func fallbackTarget(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> String? {
        guard let found = try? JSONMemberScan.members(of: block, in: bytes, within: range), let type = found[0],
              JSONMemberScan.plainString(bytes, type) == "fallback", let to = found[1],
              let inner = try? JSONMemberScan.members(of: model, in: bytes, within: to), let target = inner[0] else { return nil }
        return JSONMemberScan.plainString(bytes, target)
    }

    static let fallbackWord = Array(#""fallback""#.utf8)

    static func mentionsFallback(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Bool {
        guard range.count >= fallbackWord.count, let base = bytes.baseAddress else { return false }
        // memchr finds each `"f` candidate; the word is compared from there.
        var from = range.lowerBound
        let last = range.upperBound - fallbackWord.count
        while from <= last, let hit = memchr(base + from, 0x22, last - from + 1) {
            let at = base.distance(to: UnsafeRawPointer(hit))
            if bytes[at + 1] == fallbackWord[1], bytes[(at + 1)..<(at + fallbackWord.count)].elementsEqual(fallbackWord[1...]) { return true }
            from = at + 1
        }
        return false
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
    static let eventMembers = JSONMemberScan.Names("type", "message", "usage", "content_block")
    static let deltaUsage = JSONMemberScan.Names("output_tokens", "server_tool_use")
    static let startMessage = JSONMemberScan.Names("usage", "model")

    private(set) var usage = TokenUsage()
    /// The model that served: `message_start`'s, then the `to.model` of each `fallback` block.
    private(set) var servingModel: String?
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

    private static let wanted: [[UInt8]] = ["message_start", "message_delta", "message_stop", "content_block_start"].map { Array($0.utf8) }

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
                guard let message = found[1], let inner = try? JSONMemberScan.members(of: Self.startMessage, in: bytes, within: message) else { return }
                if let model = inner[1].flatMap({ JSONMemberScan.plainString(bytes, $0) }) { servingModel = model }
                guard let usageRange = inner[0], let start = UsageObject.read(bytes, usageRange) else { return }
                usage.inputTokens = start.inputTokens
                usage.cacheCreationInputTokens = start.cacheCreationInputTokens
                usage.cacheReadInputTokens = start.cacheReadInputTokens
                usage.outputTokens = start.outputTokens
                usage.serverToolUse = start.serverToolUse
                sawStart = true
            case "content_block_start":
                if let block = found[3], let to = UsageObject.fallbackTarget(bytes, block) { servingModel = to }
            case "message_delta":
                guard let usageRange = found[2],
                      let fields = try? JSONMemberScan.members(of: Self.deltaUsage, in: bytes, within: usageRange) else { return }
                // Both are running totals: the last one seen is the reply's.
                if let output = fields[0].flatMap({ JSONMemberScan.integer(bytes, $0) }) { usage.outputTokens = TokenUsage.bounded(output) }
                if let tools = fields[1] { usage.serverToolUse = UsageObject.serverToolUse(bytes, tools) }
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
