/// ECDSA signatures in the two encodings in use: DER (`SEQUENCE { INTEGER r, INTEGER s }`, what
/// OpenSSL makes and checks) and raw `r || s`, each half the curve's size (what JOSE, and so
/// Apple's ES256 JWTs, carry).
public enum ECDSASignature {
    /// DER to raw, each integer left-padded to `size` bytes (32 for P-256); nil when the DER is
    /// not exactly one such SEQUENCE or an integer does not fit.
    public static func raw(fromDER der: [UInt8], size: Int = 32) -> [UInt8]? {
        var reader = Reader(der)
        guard let sequence = reader.element(tag: 0x30), reader.atEnd else { return nil }
        var inner = Reader(sequence)
        guard let r = inner.element(tag: 0x02), let s = inner.element(tag: 0x02), inner.atEnd,
              let rFixed = fixed(r, size), let sFixed = fixed(s, size) else { return nil }
        return rFixed + sFixed
    }

    /// Raw `r || s` to DER; nil unless the input has an even length of 2 to 264 bytes.
    public static func der(fromRaw raw: [UInt8]) -> [UInt8]? {
        guard !raw.isEmpty, raw.count % 2 == 0, raw.count <= 264 else { return nil }
        let half = raw.count / 2
        let body = integer(Array(raw[..<half])) + integer(Array(raw[half...]))
        return [0x30] + length(body.count) + body
    }

    /// A DER INTEGER's content as an unsigned big-endian number of exactly `size` bytes.
    static func fixed(_ content: [UInt8], _ size: Int) -> [UInt8]? {
        guard !content.isEmpty, content[0] & 0x80 == 0 else { return nil }   // negative: not a signature half
        let trimmed = Array(content.drop { $0 == 0 })
        guard trimmed.count <= size else { return nil }
        return [UInt8](repeating: 0, count: size - trimmed.count) + trimmed
    }

    static func integer(_ unsigned: [UInt8]) -> [UInt8] {
        var content = Array(unsigned.drop { $0 == 0 })
        if content.isEmpty || content[0] & 0x80 != 0 { content.insert(0, at: 0) }
        return [0x02] + length(content.count) + content
    }

    static func length(_ n: Int) -> [UInt8] { n < 0x80 ? [UInt8(n)] : [0x81, UInt8(n)] }

    /// Definite short and one-byte long lengths only: nothing in a signature is longer.
    struct Reader {
        let bytes: [UInt8]
        var offset = 0
        init(_ bytes: [UInt8]) { self.bytes = bytes }
        var atEnd: Bool { offset == bytes.count }

        mutating func element(tag: UInt8) -> [UInt8]? {
            guard offset + 2 <= bytes.count, bytes[offset] == tag else { return nil }
            var length = Int(bytes[offset + 1])
            var start = offset + 2
            if length == 0x81 {
                guard start < bytes.count, bytes[start] >= 0x80 else { return nil }
                length = Int(bytes[start])
                start += 1
            } else if length >= 0x80 {
                return nil
            }
            guard length <= bytes.count - start else { return nil }
            offset = start + length
            return Array(bytes[start..<offset])
        }
    }
}
