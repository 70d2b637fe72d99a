// No imports: the event-stream fuzzer compiles this file with the Bedrock translator.

/// Picks top-level members out of a JSON object without building it: the relay reads one or two
/// members of each Bedrock chunk and passes the rest on byte for byte. Not a validator: it finds
/// member boundaries and decodes strings, no more.
enum JSONScan {
    /// Calls `body` with each top-level member's decoded key and the byte range of its value, in
    /// order. False if `json` is not one object whose members can be delimited.
    @discardableResult
    static func forEachMember(of json: UnsafeRawBufferPointer, _ body: (_ key: [UInt8], _ value: Range<Int>) -> Void) -> Bool {
        var index = skipWhitespace(json, 0)
        guard index < json.count, json[index] == UInt8(ascii: "{") else { return false }
        index = skipWhitespace(json, index + 1)
        if index < json.count, json[index] == UInt8(ascii: "}") {
            return skipWhitespace(json, index + 1) == json.count
        }
        while true {
            guard let keyEnd = skipString(json, index), let key = string(json, index..<keyEnd) else { return false }
            index = skipWhitespace(json, keyEnd)
            guard index < json.count, json[index] == UInt8(ascii: ":") else { return false }
            let valueStart = skipWhitespace(json, index + 1)
            guard let valueEnd = skipValue(json, valueStart) else { return false }
            body(key, valueStart..<valueEnd)
            index = skipWhitespace(json, valueEnd)
            guard index < json.count else { return false }
            switch json[index] {
            case UInt8(ascii: ","): index = skipWhitespace(json, index + 1)
            case UInt8(ascii: "}"): return skipWhitespace(json, index + 1) == json.count
            default: return false
            }
        }
    }

    /// The value of a top-level member, decoded if it is a string; the last one wins when a name
    /// repeats, as in the parsers that will read the same document.
    static func stringMember(_ name: String, of json: UnsafeRawBufferPointer) -> [UInt8]? {
        var found: [UInt8]?
        let wanted = Array(name.utf8)
        forEachMember(of: json) { key, value in
            if key == wanted { found = string(json, value) }
        }
        return found
    }

    static func stringMember(_ name: String, of json: [UInt8]) -> [UInt8]? {
        json.withUnsafeBytes { stringMember(name, of: $0) }
    }

    /// The decoded bytes of the JSON string that spans exactly `range`, or nil.
    static func string(_ json: UnsafeRawBufferPointer, _ range: Range<Int>) -> [UInt8]? {
        guard !range.isEmpty, range.upperBound <= json.count, skipString(json, range.lowerBound) == range.upperBound else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(range.count - 2)
        var index = range.lowerBound + 1
        let end = range.upperBound - 1
        while index < end {
            let byte = json[index]
            guard byte == UInt8(ascii: "\\") else {
                out.append(byte)
                index += 1
                continue
            }
            let escape = json[index + 1]  // skipString saw a character after every backslash
            index += 2
            switch escape {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escape)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0c)
            case UInt8(ascii: "n"): out.append(0x0a)
            case UInt8(ascii: "r"): out.append(0x0d)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                guard let high = hex4(json, index, end) else { return nil }
                index += 4
                var scalar = high
                if (0xD800..<0xDC00).contains(high) {
                    // A high surrogate must be followed by an escaped low one.
                    guard index + 1 < end, json[index] == UInt8(ascii: "\\"), json[index + 1] == UInt8(ascii: "u"),
                          let low = hex4(json, index + 2, end), (0xDC00..<0xE000).contains(low) else { return nil }
                    index += 6
                    scalar = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00..<0xE000).contains(high) {
                    return nil
                }
                guard let unicode = Unicode.Scalar(scalar) else { return nil }
                out.append(contentsOf: UTF8.encode(unicode)!)
            default:
                return nil
            }
        }
        return out
    }

    /// A non-negative or negative integer spanning exactly `range`, or nil (fractions and exponents too).
    static func integer(_ json: UnsafeRawBufferPointer, _ range: Range<Int>) -> Int? {
        guard range.upperBound <= json.count else { return nil }
        var digits = range
        let negative = !digits.isEmpty && json[digits.lowerBound] == UInt8(ascii: "-")
        if negative { digits = digits.dropFirst() }
        guard !digits.isEmpty, digits.count <= 18 else { return nil }
        var value = 0
        for index in digits {
            let digit = json[index] &- UInt8(ascii: "0")
            guard digit < 10 else { return nil }
            value = value * 10 + Int(digit)
        }
        return negative ? -value : value
    }

    /// Appends `bytes` as the inside of a JSON string: quotes, backslashes and control characters escaped.
    static func appendEscaped(_ bytes: some Sequence<UInt8>, to out: inout [UInt8]) {
        let hexDigits = Array("0123456789abcdef".utf8)
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"): out += [UInt8(ascii: "\\"), byte]
            case 0x0a: out += [UInt8(ascii: "\\"), UInt8(ascii: "n")]
            case 0x0d: out += [UInt8(ascii: "\\"), UInt8(ascii: "r")]
            case 0x09: out += [UInt8(ascii: "\\"), UInt8(ascii: "t")]
            case 0..<0x20: out += Array("\\u00".utf8) + [hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0xf)]]
            default: out.append(byte)
            }
        }
    }

    // MARK: - Delimiting

    private static func skipWhitespace(_ json: UnsafeRawBufferPointer, _ start: Int) -> Int {
        var index = start
        while index < json.count, isWhitespace(json[index]) { index += 1 }
        return index
    }

    private static func isWhitespace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x09 || byte == 0x0a || byte == 0x0d
    }

    /// The index after the string that starts at `start`, or nil.
    private static func skipString(_ json: UnsafeRawBufferPointer, _ start: Int) -> Int? {
        guard start < json.count, json[start] == UInt8(ascii: "\"") else { return nil }
        var index = start + 1
        while index < json.count {
            switch json[index] {
            case UInt8(ascii: "\""): return index + 1
            case UInt8(ascii: "\\"): index += 2
            case 0..<0x20: return nil
            default: index += 1
            }
        }
        return nil
    }

    /// The index after the value that starts at `start`, or nil. Nested containers are matched by
    /// depth only (strings skipped), which is all that delimiting needs.
    private static func skipValue(_ json: UnsafeRawBufferPointer, _ start: Int) -> Int? {
        guard start < json.count else { return nil }
        switch json[start] {
        case UInt8(ascii: "\""):
            return skipString(json, start)
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            var depth = 0
            var index = start
            while index < json.count {
                switch json[index] {
                case UInt8(ascii: "\""):
                    guard let end = skipString(json, index) else { return nil }
                    index = end
                    continue
                case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"):
                    depth -= 1
                    if depth == 0 { return index + 1 }
                default: break
                }
                index += 1
            }
            return nil
        case UInt8(ascii: ","), UInt8(ascii: ":"), UInt8(ascii: "}"), UInt8(ascii: "]"):
            return nil
        default:
            // A number or literal: up to the next delimiter.
            var index = start
            while index < json.count, !isWhitespace(json[index]),
                  json[index] != UInt8(ascii: ","), json[index] != UInt8(ascii: "}"), json[index] != UInt8(ascii: "]") {
                index += 1
            }
            return index
        }
    }

    private static func hex4(_ json: UnsafeRawBufferPointer, _ start: Int, _ end: Int) -> UInt32? {
        guard end - start >= 4 else { return nil }
        var value: UInt32 = 0
        for index in start..<start + 4 {
            let byte = json[index]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: return nil
            }
            value = value << 4 | UInt32(digit)
        }
        return value
    }
}
