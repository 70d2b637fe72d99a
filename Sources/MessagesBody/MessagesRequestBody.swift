/// What the policy needs from a Messages request's body: `model`, `max_tokens`, `fallbacks`,
/// `tools`, `stream` and `anthropic_beta`, read with the bounded scan (the relay's
/// `MessagesRequestFields` adds the betas and user profile from its headers). The body itself goes
/// upstream byte for byte.
public enum MessagesRequestBody {
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

    /// The policy's input as far as the body gives it, and whether the request asks for a stream,
    /// from one scan. A body that cannot be scanned counts as a stream, as in `asksForStream`.
    public static func read(_ body: [UInt8], spendsTokens: Bool) -> (input: PolicyInput, streams: Bool) {
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
