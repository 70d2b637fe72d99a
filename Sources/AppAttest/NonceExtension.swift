import AttestCrypto

/// Apple's nonce extension (OID 1.2.840.113635.100.8.2) on the credential certificate:
/// `SEQUENCE { [1] EXPLICIT OCTET STRING nonce }`. Parsed strictly: every length is checked
/// against what remains, and nothing may follow the structure.
enum NonceExtension {
    static let oid = "1.2.840.113635.100.8.2"

    static func nonce(fromExtensionValue der: [UInt8]) -> [UInt8]? {
        var reader = DER(der[...])
        guard let sequence = reader.read(0x30), reader.isAtEnd else { return nil }
        var inner = DER(sequence)
        guard let explicit = inner.read(0xa1), inner.isAtEnd else { return nil }
        var octets = DER(explicit)
        guard let nonce = octets.read(0x04), octets.isAtEnd else { return nil }
        return Array(nonce)
    }
}
