/// Apple's nonce extension (OID 1.2.840.113635.100.8.2) on the credential certificate:
/// `SEQUENCE { [1] EXPLICIT OCTET STRING nonce }`. Parsed strictly: every length is checked
/// against what remains, and nothing may follow the structure.
enum NonceExtension {
    static let oid = "1.2.840.113635.100.8.2"

    static func nonce(fromExtensionValue der: [UInt8]) -> [UInt8]? {
        var reader = DERReader(der[...])
        guard let sequence = reader.read(tag: 0x30), reader.isAtEnd else { return nil }
        var inner = DERReader(sequence)
        guard let explicit = inner.read(tag: 0xa1), inner.isAtEnd else { return nil }
        var octets = DERReader(explicit)
        guard let nonce = octets.read(tag: 0x04), octets.isAtEnd else { return nil }
        return Array(nonce)
    }
}

/// Just enough DER to walk a few definite-length TLVs without trusting any length.
struct DERReader {
    private var bytes: ArraySlice<UInt8>

    init(_ bytes: ArraySlice<UInt8>) { self.bytes = bytes }

    var isAtEnd: Bool { bytes.isEmpty }

    /// The contents of the next element if its tag is `tag`; nil on any malformation.
    mutating func read(tag: UInt8) -> ArraySlice<UInt8>? {
        var cursor = bytes.startIndex
        guard cursor < bytes.endIndex, bytes[cursor] == tag else { return nil }
        cursor += 1
        guard cursor < bytes.endIndex else { return nil }
        let first = bytes[cursor]
        cursor += 1
        var length = 0
        if first < 0x80 {
            length = Int(first)
        } else {
            let count = Int(first & 0x7f)
            // DER: long form only for lengths >= 128, at most 4 length bytes here, no leading zero.
            guard count >= 1, count <= 4, bytes.endIndex - cursor >= count, bytes[cursor] != 0 else { return nil }
            for _ in 0..<count { length = length << 8 | Int(bytes[cursor]); cursor += 1 }
            guard length >= 0x80 else { return nil }
        }
        guard bytes.endIndex - cursor >= length else { return nil }
        let contents = bytes[cursor..<cursor + length]
        bytes = bytes[(cursor + length)...]
        return contents
    }
}
