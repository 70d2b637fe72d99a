/// What a cloud does with each top-level member of a Messages request, as data: pass it, take it
/// out (the relay sends it another way, or it is a hint the cloud does not take), move a
/// top-level `cache_control` onto the last cacheable block (the same breakpoint, in the form
/// the cloud takes), read `output_config` (its `format` changes the answer, so a cloud that
/// cannot take it refuses; its `effort` is a hint), or refuse the request with a 400 naming the
/// member before anything is sent.
public enum MemberRule: Sendable, Equatable {
    case pass
    case remove
    case moveCacheControl
    case outputConfigHintOnly
    case refuse
}

/// A body shaped for a cloud, or why it cannot be.
public enum ShapedBody: Sendable, Equatable {
    case shaped([UInt8])
    /// The member (or `output_config.format`) this cloud cannot take.
    case refused(String)
}

extension CloudRequestBody {
    /// The most breakpoints the API allows in one request.
    public static let maxCacheBreakpoints = 4
    static let outputConfigMembers = JSONMemberScan.Names("format")
    static let blockMembers = JSONMemberScan.Names("type", "cache_control")
    static let contentMember = JSONMemberScan.Names("content")
    static let cacheControlWord = Array(#""cache_control""#.utf8)
    /// Blocks a breakpoint cannot sit on.
    static let uncacheableBlocks: Set<String> = ["thinking", "redacted_thinking"]

    /// `body` shaped by `rule` (each top-level member's fate), with `added` (name, raw JSON
    /// value) first. The same single walk as `edit`: kept members are copied byte for byte with
    /// separators written anew; a name written with escapes or given twice is refused.
    public static func shape(_ body: [UInt8], rule: (String) -> MemberRule, adding added: [(String, String)]) throws -> ShapedBody {
        try body.withUnsafeBytes { raw throws -> ShapedBody in
            let bytes = raw.bindMemory(to: UInt8.self)
            var scanner = JSONMemberScan.Scanner(bytes: bytes)
            var kept: [(name: String, member: Range<Int>, value: Range<Int>)] = []
            var seen = Set<String>()
            var refused: String?
            var cacheControl: Range<Int>?
            try scanner.eachMember { nameBytes, quote, value throws(JSONMemberScan.Failure) in
                if nameBytes.contains(0x5c) { throw .escapedName(at: quote) }
                let name = String(decoding: nameBytes, as: UTF8.self)
                guard seen.insert(name).inserted else { throw .duplicate(name) }
                switch rule(name) {
                case .pass: kept.append((name, quote..<value.upperBound, value))
                case .remove: break
                case .refuse: refused = refused ?? name
                case .moveCacheControl: if !isNull(raw, value) { cacheControl = value }
                case .outputConfigHintOnly:
                    guard !isNull(raw, value) else { break }
                    let format = try JSONMemberScan.members(of: outputConfigMembers, in: raw, within: value)[0]
                    if let format, !isNull(raw, format) { refused = refused ?? "output_config.format" }
                }
            }
            scanner.skipWhitespace()
            guard scanner.index == bytes.count else { throw JSONMemberScan.Failure.malformed(at: scanner.index) }
            if let refused { return .refused(refused) }
            // Where the breakpoint goes: one splice inside `messages`, when there is room for it.
            var splice: (at: Range<Int>, bytes: [UInt8])?
            if let cacheControl, let messages = kept.first(where: { $0.name == "messages" })?.value,
               breakpoints(in: raw) - 1 < maxCacheBreakpoints {
                splice = try breakpointSplice(raw, messages: messages, cacheControl: Array(raw[cacheControl]))
            }
            var out: [UInt8] = [UInt8(ascii: "{")]
            out.reserveCapacity(body.count + 128)
            var first = true
            for (name, value) in added {
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                out.append(contentsOf: "\"\(name)\":\(value)".utf8)
            }
            for member in kept {
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                if let splice, member.member.contains(splice.at.lowerBound) {
                    out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[member.member.lowerBound..<splice.at.lowerBound]))
                    out.append(contentsOf: splice.bytes)
                    out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[splice.at.upperBound..<member.member.upperBound]))
                } else {
                    out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[member.member]))
                }
            }
            out.append(UInt8(ascii: "}"))
            return .shaped(out)
        }
    }

    static func isNull(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Bool { bytes[range].elementsEqual("null".utf8) }

    /// How many `"cache_control"` names the body holds (an upper bound on its breakpoints: the
    /// word inside a string counts too, which errs towards adding none).
    static func breakpoints(in bytes: UnsafeRawBufferPointer) -> Int {
        var count = 0
        var index = 0
        let word = cacheControlWord
        guard bytes.count >= word.count else { return 0 }
        while index <= bytes.count - word.count {
            if bytes[index] == word[0], bytes[index..<(index + word.count)].elementsEqual(word) {
                count += 1
                index += word.count
            } else {
                index += 1
            }
        }
        return count
    }

    /// The splice that puts `cacheControl` on the last cacheable block of the last message: a
    /// string content becomes one text block that carries it; in an array, the last block that
    /// is not thinking gets it, unless it has one already. Nil: nowhere to put it.
    static func breakpointSplice(_ raw: UnsafeRawBufferPointer, messages: Range<Int>, cacheControl: [UInt8]) throws -> (at: Range<Int>, bytes: [UInt8])? {
        guard let all = try JSONMemberScan.elements(in: raw, messages, limit: 1 << 20), let last = all.last,
              raw[last.lowerBound] == UInt8(ascii: "{"),
              let content = try JSONMemberScan.members(of: contentMember, in: raw, within: last)[0] else { return nil }
        if raw[content.lowerBound] == UInt8(ascii: "\"") {
            let text = Array(raw[content])
            return (content, Array(#"[{"type":"text","text":"#.utf8) + text + Array(#","cache_control":"#.utf8) + cacheControl + Array("}]".utf8))
        }
        guard let blocks = try JSONMemberScan.elements(in: raw, content, limit: 1 << 20) else { return nil }
        for block in blocks.reversed() where raw[block.lowerBound] == UInt8(ascii: "{") {
            let found = try JSONMemberScan.members(of: blockMembers, in: raw, within: block)
            if let type = found[0].flatMap({ JSONMemberScan.plainString(raw, $0) }), uncacheableBlocks.contains(type) { continue }
            if found[1] != nil { return nil }   // the last cacheable block has its own breakpoint already
            // Before the block's closing brace; `{}` takes no comma.
            let close = block.upperBound - 1
            var before = close - 1
            while before > block.lowerBound, [0x20, 0x0a, 0x0d, 0x09].contains(raw[before]) { before -= 1 }
            let empty = before == block.lowerBound
            return (close..<close, Array((empty ? "" : ",").utf8) + Array(#""cache_control":"#.utf8) + cacheControl)
        }
        return nil
    }
}
