/// Reads the protocol's flat JSON objects (the challenge and token responses): the top-level
/// members, whose values are strings, numbers, booleans or null; a nested object or array is
/// checked and skipped. Foundation's JSONDecoder was 15% of the load generator's CPU per
/// exchange (two decodes per refresh), CPU the server under test then did not get.
/// Strict where JSON is: one object and only whitespace around it, no duplicate names, no bare
/// control characters or lone surrogates in strings, RFC 8259 numbers, at most 64 levels deep.
/// Names are compared as Swift strings, so two canonically equivalent spellings ("\u00e9" and
/// "e\u0301") count as one name and the object is refused: the protocol's names are ASCII.
public enum JSONObjectReader {
    public enum Value: Equatable, Sendable {
        case string(String)
        case number(Double)
        case bool(Bool)
        case null
        /// An object or an array, well-formed and not read.
        case nested
    }

    static let maxDepth = 64

    /// The object's members by name, or nil when `bytes` is not exactly one well-formed JSON object.
    public static func members(_ bytes: [UInt8]) -> [String: Value]? {
        bytes.withUnsafeBufferPointer { buffer in
            var parser = Parser(bytes: buffer)
            parser.skipSpace()
            guard let members = parser.object() else { return nil }
            parser.skipSpace()
            return parser.index == buffer.count ? members : nil
        }
    }

    private struct Parser {
        let bytes: UnsafeBufferPointer<UInt8>
        var index = 0

        init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

        var current: UInt8? { index < bytes.count ? bytes[index] : nil }

        mutating func skipSpace() {
            while let byte = current, byte == 0x20 || byte == 0x0a || byte == 0x0d || byte == 0x09 { index += 1 }
        }

        mutating func consume(_ byte: UInt8) -> Bool {
            guard current == byte else { return false }
            index += 1
            return true
        }

        /// The members of the object at `index` (which must be `{`).
        mutating func object() -> [String: Value]? {
            guard consume(UInt8(ascii: "{")) else { return nil }
            var members: [String: Value] = [:]
            members.reserveCapacity(8)
            skipSpace()
            if consume(UInt8(ascii: "}")) { return members }
            while true {
                skipSpace()
                guard let name = string() else { return nil }
                skipSpace()
                guard consume(UInt8(ascii: ":")) else { return nil }
                skipSpace()
                guard let value = value(depth: 1), members.updateValue(value, forKey: name) == nil else { return nil }
                skipSpace()
                if consume(UInt8(ascii: ",")) { continue }
                return consume(UInt8(ascii: "}")) ? members : nil
            }
        }

        mutating func value(depth: Int) -> Value? {
            switch current {
            case UInt8(ascii: "\""): return string().map(Value.string)
            case UInt8(ascii: "{"), UInt8(ascii: "["): return skipNested(depth: depth + 1) ? .nested : nil
            case UInt8(ascii: "t"): return literal("true") ? .bool(true) : nil
            case UInt8(ascii: "f"): return literal("false") ? .bool(false) : nil
            case UInt8(ascii: "n"): return literal("null") ? .null : nil
            default: return number().map(Value.number)
            }
        }

        mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard bytes.count - index >= count else { return false }
            for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] { return false }
            index += count
            return true
        }

        /// An object or array checked to its end, its values read and dropped.
        mutating func skipNested(depth: Int) -> Bool {
            guard depth <= JSONObjectReader.maxDepth else { return false }
            let isObject = current == UInt8(ascii: "{")
            let close = isObject ? UInt8(ascii: "}") : UInt8(ascii: "]")
            index += 1
            skipSpace()
            if consume(close) { return true }
            while true {
                skipSpace()
                if isObject {
                    guard string() != nil else { return false }
                    skipSpace()
                    guard consume(UInt8(ascii: ":")) else { return false }
                    skipSpace()
                }
                guard value(depth: depth) != nil else { return false }
                skipSpace()
                if consume(UInt8(ascii: ",")) { continue }
                return consume(close)
            }
        }

        /// RFC 8259: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
        mutating func number() -> Double? {
            let start = index
            func digits(_ parser: inout Parser) -> Int {
                let from = parser.index
                while let byte = parser.current, byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") { parser.index += 1 }
                return parser.index - from
            }
            _ = consume(UInt8(ascii: "-"))
            if consume(UInt8(ascii: "0")) {
                if let byte = current, byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") { return nil }   // no leading zeros
            } else if digits(&self) == 0 {
                return nil
            }
            if consume(UInt8(ascii: ".")), digits(&self) == 0 { return nil }
            if consume(UInt8(ascii: "e")) || consume(UInt8(ascii: "E")) {
                if !consume(UInt8(ascii: "+")) { _ = consume(UInt8(ascii: "-")) }
                if digits(&self) == 0 { return nil }
            }
            return Double(String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self))
        }

        /// A string literal at `index`, unescaped; nil for bad escapes, control characters, lone
        /// surrogates or bytes that are not UTF-8.
        mutating func string() -> String? {
            guard consume(UInt8(ascii: "\"")) else { return nil }
            // Nearly every string has no escape: read it straight from the buffer.
            let start = index
            while let byte = current, byte != UInt8(ascii: "\""), byte != UInt8(ascii: "\\"), byte >= 0x20 { index += 1 }
            let plain = UnsafeBufferPointer(rebasing: bytes[start..<index])
            if current == UInt8(ascii: "\"") {
                index += 1
                let text = String(decoding: plain, as: UTF8.self)
                return text.utf8.elementsEqual(plain) ? text : nil
            }
            var out = Array(plain)
            while let byte = current {
                index += 1
                switch byte {
                case UInt8(ascii: "\""):
                    let text = String(decoding: out, as: UTF8.self)
                    return text.utf8.elementsEqual(out) ? text : nil
                case UInt8(ascii: "\\"):
                    guard let escaped = current else { return nil }
                    index += 1
                    switch escaped {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escaped)
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0c)
                    case UInt8(ascii: "n"): out.append(0x0a)
                    case UInt8(ascii: "r"): out.append(0x0d)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "u"):
                        guard var scalar = hex4() else { return nil }
                        if (0xd800..<0xdc00).contains(scalar) {
                            guard consume(UInt8(ascii: "\\")), consume(UInt8(ascii: "u")), let low = hex4(),
                                  (0xdc00..<0xe000).contains(low) else { return nil }
                            scalar = 0x10000 + ((scalar - 0xd800) << 10) + (low - 0xdc00)
                        } else if (0xdc00..<0xe000).contains(scalar) {
                            return nil
                        }
                        guard let unicode = Unicode.Scalar(scalar) else { return nil }
                        out.append(contentsOf: String(Character(unicode)).utf8)
                    default: return nil
                    }
                case 0x00..<0x20: return nil
                default: out.append(byte)
                }
            }
            return nil
        }

        mutating func hex4() -> UInt32? {
            guard bytes.count - index >= 4 else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = bytes[index]
                let digit: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
                default: return nil
                }
                value = value << 4 | UInt32(digit)
                index += 1
            }
            return value
        }
    }
}
