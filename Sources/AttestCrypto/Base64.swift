/// Base64 without Foundation on the hot path, shared by the service, the client and the tools: decodes the standard and URL-safe alphabets,
/// padded or not (PROTOCOL.md: accept all four), and encodes either. Foundation's version goes
/// through NSString and ICU, which profiling showed costing more than the ECDSA verification.
public enum Base64 {
    private static let standard = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let urlSafe = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// 0xff for bytes outside both alphabets; `+`/`-` and `/`/`_` map to the same values.
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xff, count: 256)
        for (i, c) in standard.enumerated() { table[Int(c)] = UInt8(i) }
        table[Int(UInt8(ascii: "-"))] = 62
        table[Int(UInt8(ascii: "_"))] = 63
        return table
    }()

    public static func encode(_ bytes: [UInt8], urlSafe: Bool = false, padded: Bool = true) -> String {
        let alphabet = urlSafe ? Self.urlSafe : standard
        var out = [UInt8]()
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i + 3 <= bytes.count {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            out += [alphabet[Int(n >> 18)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
            i += 3
        }
        let rest = bytes.count - i
        if rest > 0 {
            let n = UInt32(bytes[i]) << 16 | (rest == 2 ? UInt32(bytes[i + 1]) << 8 : 0)
            out.append(alphabet[Int(n >> 18)])
            out.append(alphabet[Int(n >> 12 & 63)])
            if rest == 2 { out.append(alphabet[Int(n >> 6 & 63)]) }
            if padded { out += rest == 2 ? [UInt8(ascii: "=")] : [UInt8(ascii: "="), UInt8(ascii: "=")] }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Nil unless `text` is base64 in either alphabet, with correct padding or none, and no
    /// stray bits in the last character (so each byte string has exactly one spelling per alphabet).
    public static func decode(_ text: String) -> [UInt8]? {
        var utf8 = Array(text.utf8)
        if utf8.last == UInt8(ascii: "=") {
            // Padded: the padded length is a multiple of four and there are at most two '='.
            guard utf8.count % 4 == 0 else { return nil }
            utf8.removeLast()
            if utf8.last == UInt8(ascii: "=") { utf8.removeLast() }
        }
        guard utf8.count % 4 != 1 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity(utf8.count * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        for c in utf8 {
            let v = values[Int(c)]
            guard v != 0xff else { return nil }
            accumulator = accumulator << 6 | UInt32(v)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
            }
        }
        // Leftover bits must be zero: "AB==" and "AC==" must not both decode to [0x00].
        guard accumulator & ((1 << UInt32(bits)) - 1) == 0 else { return nil }
        return out
    }
}
