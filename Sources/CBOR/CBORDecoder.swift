/// Why a byte string is not an acceptable CBOR item. Every case is a clean rejection:
/// the decoder never reads past its input and never allocates more than the input can back.
public enum CBORError: Error, Equatable, Sendable, CustomStringConvertible {
    case truncated(offset: Int)
    case trailingBytes(offset: Int)
    case tooDeep(limit: Int)
    case tooManyItems(limit: Int)
    case lengthExceedsInput(offset: Int)
    case indefiniteLengthNotSupported(offset: Int)
    case reservedAdditionalInformation(offset: Int)
    case invalidUTF8(offset: Int)
    case duplicateMapKey(offset: Int)
    case invalidSimpleValue(offset: Int)
    case unexpectedBreak(offset: Int)

    public var description: String {
        switch self {
        case .truncated(let o): return "input ends inside an item at byte \(o)"
        case .trailingBytes(let o): return "trailing bytes after the item, from byte \(o)"
        case .tooDeep(let l): return "nesting deeper than \(l)"
        case .tooManyItems(let l): return "more than \(l) items"
        case .lengthExceedsInput(let o): return "length at byte \(o) exceeds the remaining input"
        case .indefiniteLengthNotSupported(let o): return "indefinite length at byte \(o) (refused: App Attest never uses it)"
        case .reservedAdditionalInformation(let o): return "reserved additional information at byte \(o)"
        case .invalidUTF8(let o): return "text string at byte \(o) is not valid UTF-8"
        case .duplicateMapKey(let o): return "duplicate map key at byte \(o)"
        case .invalidSimpleValue(let o): return "two-byte simple value below 32 at byte \(o)"
        case .unexpectedBreak(let o): return "break code outside an indefinite-length item at byte \(o)"
        }
    }
}

/// Limits that bound the work and memory of one decode. The defaults are far above what
/// App Attest produces (an attestation object is 3 levels deep and has about 10 items).
public struct CBORLimits: Sendable {
    public var maxDepth: Int
    public var maxItems: Int
    public init(maxDepth: Int = 16, maxItems: Int = 1024) {
        self.maxDepth = maxDepth
        self.maxItems = maxItems
    }
}

/// A strict RFC 8949 decoder: one complete item, definite lengths only, no duplicate map keys,
/// valid UTF-8 text, no trailing bytes. Non-shortest integer encodings are accepted (they are
/// well-formed); indefinite lengths are refused on purpose.
public struct CBORDecoder {
    public static func decode(_ bytes: [UInt8], limits: CBORLimits = CBORLimits()) throws -> CBORValue {
        try bytes.withUnsafeBufferPointer { buffer in
            var reader = Reader(buffer: buffer, limits: limits)
            let value = try reader.item(depth: 1)
            if reader.offset != buffer.count { throw CBORError.trailingBytes(offset: reader.offset) }
            return value
        }
    }

    /// The one item at the start of `bytes`, and how many bytes it took: for formats that put a
    /// CBOR item in the middle of other data (WebAuthn's credential public key, say), where what
    /// follows is the caller's to frame. The same strictness as `decode`, less the trailing check.
    public static func decodePrefix(_ bytes: ArraySlice<UInt8>, limits: CBORLimits = CBORLimits()) throws -> (value: CBORValue, length: Int) {
        try bytes.withUnsafeBufferPointer { buffer in
            var reader = Reader(buffer: buffer, limits: limits)
            let value = try reader.item(depth: 1)
            return (value, reader.offset)
        }
    }

    struct Reader {
        let buffer: UnsafeBufferPointer<UInt8>
        let limits: CBORLimits
        var offset = 0
        var items = 0

        init(buffer: UnsafeBufferPointer<UInt8>, limits: CBORLimits) {
            self.buffer = buffer
            self.limits = limits
        }

        var remaining: Int { buffer.count - offset }

        mutating func byte() throws -> UInt8 {
            guard offset < buffer.count else { throw CBORError.truncated(offset: offset) }
            defer { offset += 1 }
            return buffer[offset]
        }

        mutating func bigEndian(_ count: Int) throws -> UInt64 {
            guard remaining >= count else { throw CBORError.truncated(offset: offset) }
            var value: UInt64 = 0
            for i in 0..<count { value = value << 8 | UInt64(buffer[offset + i]) }
            offset += count
            return value
        }

        /// The argument of the head: the value itself or the following 1/2/4/8 bytes.
        mutating func argument(_ info: UInt8, headOffset: Int) throws -> UInt64 {
            switch info {
            case 0..<24: return UInt64(info)
            case 24: return try bigEndian(1)
            case 25: return try bigEndian(2)
            case 26: return try bigEndian(4)
            case 27: return try bigEndian(8)
            case 31: throw CBORError.indefiniteLengthNotSupported(offset: headOffset)
            default: throw CBORError.reservedAdditionalInformation(offset: headOffset)
            }
        }

        /// A length that must be backed by at least `minBytesPerElement` bytes each of remaining input,
        /// so no allocation is ever sized by an unchecked number.
        mutating func length(_ info: UInt8, headOffset: Int, minBytesPerElement: Int) throws -> Int {
            let raw = try argument(info, headOffset: headOffset)
            guard raw <= UInt64(remaining / max(minBytesPerElement, 1)) else {
                throw CBORError.lengthExceedsInput(offset: headOffset)
            }
            return Int(raw)
        }

        mutating func item(depth: Int) throws -> CBORValue {
            guard depth <= limits.maxDepth else { throw CBORError.tooDeep(limit: limits.maxDepth) }
            items += 1
            guard items <= limits.maxItems else { throw CBORError.tooManyItems(limit: limits.maxItems) }
            let headOffset = offset
            let head = try byte()
            let major = head >> 5
            let info = head & 0x1f
            switch major {
            case 0:
                return .unsigned(try argument(info, headOffset: headOffset))
            case 1:
                return .negative(try argument(info, headOffset: headOffset))
            case 2:
                let n = try length(info, headOffset: headOffset, minBytesPerElement: 1)
                defer { offset += n }
                return .bytes(Array(buffer[offset..<offset + n]))
            case 3:
                let n = try length(info, headOffset: headOffset, minBytesPerElement: 1)
                let slice = UnsafeBufferPointer(rebasing: buffer[offset..<offset + n])
                // Decoding repairs invalid UTF-8 with U+FFFD, so a changed byte count means it was invalid.
                let text = String(decoding: slice, as: UTF8.self)
                guard text.utf8.count == n, text.utf8.elementsEqual(slice) else {
                    throw CBORError.invalidUTF8(offset: headOffset)
                }
                offset += n
                return .text(text)
            case 4:
                let n = try length(info, headOffset: headOffset, minBytesPerElement: 1)
                var elements: [CBORValue] = []
                elements.reserveCapacity(n)
                for _ in 0..<n { elements.append(try item(depth: depth + 1)) }
                return .array(elements)
            case 5:
                let n = try length(info, headOffset: headOffset, minBytesPerElement: 2)
                var entries: [CBORMapEntry] = []
                entries.reserveCapacity(n)
                // Keys are compared as values (RFC 8949 §5.6), by their preferred encoding: 0x00 and
                // 0x1a00000000 are the same key; NaNs compare by their bits rather than never.
                var seen = Set<[UInt8]>(minimumCapacity: n)
                for _ in 0..<n {
                    let keyOffset = offset
                    let key = try item(depth: depth + 1)
                    guard seen.insert(CBOREncoder.encode(key)).inserted else {
                        throw CBORError.duplicateMapKey(offset: keyOffset)
                    }
                    entries.append(CBORMapEntry(key, try item(depth: depth + 1)))
                }
                return .map(entries)
            case 6:
                let tag = try argument(info, headOffset: headOffset)
                return .tagged(tag, try item(depth: depth + 1))
            default:
                return try simpleOrFloat(info, headOffset: headOffset)
            }
        }

        mutating func simpleOrFloat(_ info: UInt8, headOffset: Int) throws -> CBORValue {
            switch info {
            case 20: return .bool(false)
            case 21: return .bool(true)
            case 22: return .null
            case 23: return .undefined
            case 0..<20: return .simple(info)
            case 24:
                let value = try byte()
                guard value >= 32 else { throw CBORError.invalidSimpleValue(offset: headOffset) }
                return .simple(value)
            case 25: return .float(Double(Float16Bits.decode(UInt16(try bigEndian(2)))))
            case 26: return .float(Double(Float(bitPattern: UInt32(try bigEndian(4)))))
            case 27: return .float(Double(bitPattern: try bigEndian(8)))
            case 31: throw CBORError.unexpectedBreak(offset: headOffset)
            default: throw CBORError.reservedAdditionalInformation(offset: headOffset)
            }
        }
    }
}

/// IEEE 754 half precision, decoded by hand: `Float16` is unavailable on some platforms.
enum Float16Bits {
    static func decode(_ bits: UInt16) -> Float {
        let sign: Float = bits & 0x8000 != 0 ? -1 : 1
        let exponent = Int((bits >> 10) & 0x1f)
        let fraction = Float(bits & 0x3ff)
        switch exponent {
        case 0: return sign * fraction * powf2(-24)
        case 31: return fraction == 0 ? sign * .infinity : .nan
        default: return sign * (1 + fraction / 1024) * powf2(exponent - 15)
        }
    }

    private static func powf2(_ e: Int) -> Float { Float(sign: .plus, exponent: e, significand: 1) }
}
