/// Encodes in the shortest form (RFC 8949 §4.2.1 preferred serialization), map entries in the
/// order given. Used by the test authority and the tools; the service itself only decodes.
public enum CBOREncoder {
    public static func encode(_ value: CBORValue) -> [UInt8] {
        var out: [UInt8] = []
        append(value, to: &out)
        return out
    }

    static func head(_ major: UInt8, _ argument: UInt64, to out: inout [UInt8]) {
        let m = major << 5
        switch argument {
        case 0..<24: out.append(m | UInt8(argument))
        case 24...0xff: out.append(m | 24); out.append(UInt8(argument))
        case 0x100...0xffff: out.append(m | 25); appendBigEndian(argument, bytes: 2, to: &out)
        case 0x1_0000...0xffff_ffff: out.append(m | 26); appendBigEndian(argument, bytes: 4, to: &out)
        default: out.append(m | 27); appendBigEndian(argument, bytes: 8, to: &out)
        }
    }

    static func appendBigEndian(_ value: UInt64, bytes: Int, to out: inout [UInt8]) {
        for i in stride(from: bytes - 1, through: 0, by: -1) { out.append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(i)))) }
    }

    static func append(_ value: CBORValue, to out: inout [UInt8]) {
        switch value {
        case .unsigned(let n): head(0, n, to: &out)
        case .negative(let n): head(1, n, to: &out)
        case .bytes(let b): head(2, UInt64(b.count), to: &out); out.append(contentsOf: b)
        case .text(let t): head(3, UInt64(t.utf8.count), to: &out); out.append(contentsOf: t.utf8)
        case .array(let a):
            head(4, UInt64(a.count), to: &out)
            for element in a { append(element, to: &out) }
        case .map(let entries):
            head(5, UInt64(entries.count), to: &out)
            for entry in entries { append(entry.key, to: &out); append(entry.value, to: &out) }
        case .tagged(let tag, let inner): head(6, tag, to: &out); append(inner, to: &out)
        case .bool(let b): out.append(b ? 0xf5 : 0xf4)
        case .null: out.append(0xf6)
        case .undefined: out.append(0xf7)
        case .simple(let s): if s < 24 { out.append(0xe0 | s) } else { out.append(0xf8); out.append(s) }
        case .float(let d): out.append(0xfb); appendBigEndian(d.bitPattern, bytes: 8, to: &out)
        }
    }
}
