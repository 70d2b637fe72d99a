// The API's own error bodies, worded as the published client reads them. No imports: the relay
// fuzzer (`make fuzz-relay`) compiles this target's files alone.

/// The published client (`ClaudeForFoundationModels`' `ErrorMapper`) turns an error into
/// `LanguageModelError.contextSizeExceeded` when its type is `request_too_large`, or
/// `invalid_request_error` with a message that, lowercased, contains "context". The API words a
/// context overflow "prompt is too long: 208310 tokens > 200000 maximum", which does not, so the
/// relay adds a clause that does; every other byte of the body stays as it was.
public enum ErrorWording {
    /// Added to the message of an overflow that does not say "context".
    public static let contextClause = "; the input is longer than the model's context window"
    static let envelope = JSONMemberScan.Names("type", "error")
    static let error = JSONMemberScan.Names("type", "message")
    static let overflowWords = Array("prompt is too long".utf8)
    static let contextWord = Array("context".utf8)

    /// `body` with `contextClause` at the end of its message when it is the API's
    /// `invalid_request_error` saying the prompt is too long without saying "context"; nil for any
    /// other body (already worded for the client, another error, not the API's error shape).
    public static func contextOverflowWorded(_ body: [UInt8]) -> [UInt8]? {
        let end: Int? = body.withUnsafeBytes { bytes in
            guard let outer = try? JSONMemberScan.members(of: envelope, in: bytes), let type = outer[0],
                  JSONMemberScan.plainString(bytes, type) == "error", let object = outer[1],
                  let inner = try? JSONMemberScan.members(of: error, in: bytes, within: object), let kind = inner[0],
                  JSONMemberScan.plainString(bytes, kind) == "invalid_request_error", let message = inner[1],
                  message.count >= 2, bytes[message.lowerBound] == UInt8(ascii: "\""), bytes[message.upperBound - 1] == UInt8(ascii: "\"")
            else { return nil }
            let text = bytes[(message.lowerBound + 1)..<(message.upperBound - 1)]
            guard contains(text, overflowWords), !contains(text, contextWord) else { return nil }
            return message.upperBound - 1
        }
        guard let end else { return nil }
        return Array(body[..<end]) + Array(contextClause.utf8) + Array(body[end...])
    }

    /// Whether `text` contains `word` (lowercase ASCII), ignoring ASCII case.
    static func contains(_ text: Slice<UnsafeRawBufferPointer>, _ word: [UInt8]) -> Bool {
        guard let first = word.first, text.count >= word.count else { return false }
        var index = text.startIndex
        let last = text.endIndex - word.count
        while index <= last {
            if lowered(text[index]) == first {
                var matched = 1
                while matched < word.count, lowered(text[index + matched]) == word[matched] { matched += 1 }
                if matched == word.count { return true }
            }
            index += 1
        }
        return false
    }

    static func lowered(_ byte: UInt8) -> UInt8 { byte >= 0x41 && byte <= 0x5a ? byte + 0x20 : byte }
}
