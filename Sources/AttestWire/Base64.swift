/// Base64 as the protocol needs it: decodes the standard and the URL-safe alphabet, padded or not
/// (PROTOCOL.md: accept all four spellings), and encodes either. Foundation's decoder is as fast
/// but knows only the standard alphabet and accepts stray bits in the last character; this one is
/// strict (every byte string has exactly one spelling per alphabet) and works on the UTF-8 bytes
/// through a lookup table, a block of four characters at a time.
public enum Base64 {
    private static let standardAlphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let urlSafeAlphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Value of each byte, or 0xff outside both alphabets; `+`/`-` and `/`/`_` map to the same values.
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xff, count: 256)
        for (index, character) in standardAlphabet.enumerated() { table[Int(character)] = UInt8(index) }
        table[Int(UInt8(ascii: "-"))] = 62
        table[Int(UInt8(ascii: "_"))] = 63
        return table
    }()

    public static func encode(_ bytes: [UInt8], urlSafe: Bool = false, padded: Bool = true) -> String {
        bytes.withUnsafeBytes { encode($0, urlSafe: urlSafe, padded: padded) }
    }

    /// `prefix` (ASCII) then the base64 of `bytes`, built as one string: a request ID is made
    /// this way on every request.
    public static func encode(_ bytes: UnsafeRawBufferPointer, urlSafe: Bool = false, padded: Bool = true,
                              after prefix: StaticString = "") -> String {
        let alphabet = urlSafe ? urlSafeAlphabet : standardAlphabet
        let fullBlocks = bytes.count / 3
        let rest = bytes.count - fullBlocks * 3
        let start = prefix.withUTF8Buffer { $0.count }  // utf8CodeUnitCount traps on a one-scalar literal
        let length = start + fullBlocks * 4 + (rest == 0 ? 0 : (padded ? 4 : rest + 1))
        return String(unsafeUninitializedCapacity: length) { out in
            prefix.withUTF8Buffer { for (index, byte) in $0.enumerated() { out[index] = byte } }
            return alphabet.withUnsafeBufferPointer { table in
                var i = 0, o = start
                while i + 3 <= bytes.count {
                    let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
                    out[o] = table[Int(n >> 18)]
                    out[o + 1] = table[Int(n >> 12 & 63)]
                    out[o + 2] = table[Int(n >> 6 & 63)]
                    out[o + 3] = table[Int(n & 63)]
                    i += 3
                    o += 4
                }
                if rest > 0 {
                    let n = UInt32(bytes[i]) << 16 | (rest == 2 ? UInt32(bytes[i + 1]) << 8 : 0)
                    out[o] = table[Int(n >> 18)]
                    out[o + 1] = table[Int(n >> 12 & 63)]
                    o += 2
                    if rest == 2 { out[o] = table[Int(n >> 6 & 63)]; o += 1 }
                    if padded {
                        while o < length { out[o] = UInt8(ascii: "="); o += 1 }
                    }
                }
                return o
            }
        }
    }

    /// Nil unless `text` is base64 in either alphabet, with correct padding or none, and no stray
    /// bits in the last character ("AB==" and "AA==" must not both decode to [0x00]).
    public static func decode(_ text: String) -> [UInt8]? {
        var text = text
        return text.withUTF8 { decode(bytes: $0) }
    }

    /// `decode` on UTF-8 bytes (a form field or JSON string that is still bytes).
    public static func decode(bytes input: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        var count = input.count
        if count > 0, input[count - 1] == UInt8(ascii: "=") {
            // Padded: the padded length is a multiple of four, with at most two '='.
            guard count % 4 == 0 else { return nil }
            count -= 1
            if input[count - 1] == UInt8(ascii: "=") { count -= 1 }
        }
        let tail = count % 4
        guard tail != 1 else { return nil }
        let fullBlocks = count / 4
        let outputLength = fullBlocks * 3 + (tail == 0 ? 0 : tail - 1)
        return values.withUnsafeBufferPointer { table -> [UInt8]? in
            var valid = true
            let out = [UInt8](unsafeUninitializedCapacity: outputLength) { buffer, written in
                var i = 0, o = 0
                var bad: UInt8 = 0
                while i + 4 <= count {
                    let a = table[Int(input[i])], b = table[Int(input[i + 1])]
                    let c = table[Int(input[i + 2])], d = table[Int(input[i + 3])]
                    bad |= a | b | c | d   // 0xff has the high bits set; real values never do
                    let n = UInt32(a) << 18 | UInt32(b) << 12 | UInt32(c) << 6 | UInt32(d)
                    buffer[o] = UInt8(truncatingIfNeeded: n >> 16)
                    buffer[o + 1] = UInt8(truncatingIfNeeded: n >> 8)
                    buffer[o + 2] = UInt8(truncatingIfNeeded: n)
                    i += 4
                    o += 3
                }
                if tail > 0 {
                    let a = table[Int(input[i])], b = table[Int(input[i + 1])]
                    let c = tail == 3 ? table[Int(input[i + 2])] : 0
                    bad |= a | b | c
                    let n = UInt32(a) << 18 | UInt32(b) << 12 | UInt32(c) << 6
                    buffer[o] = UInt8(truncatingIfNeeded: n >> 16)
                    o += 1
                    if tail == 3 {
                        buffer[o] = UInt8(truncatingIfNeeded: n >> 8)
                        o += 1
                        if c & 0x03 != 0 { valid = false }   // stray bits after the second byte
                    } else if b & 0x0f != 0 {
                        valid = false                          // stray bits after the first byte
                    }
                }
                if bad & 0xc0 != 0 { valid = false }
                written = o
            }
            return valid ? out : nil
        }
    }
}
