/// WebAuthn-style authenticator data as App Attest produces it:
/// rpIdHash(32) ‖ flags(1) ‖ signCount(4, big-endian) ‖ [aaguid(16) ‖ credIdLen(2) ‖ credId ‖ COSE key].
struct AuthenticatorData {
    let rpIDHash: ArraySlice<UInt8>
    let flags: UInt8
    let counter: UInt32
    /// Present in attestations (attested credential data); absent in assertions.
    let aaguid: ArraySlice<UInt8>?
    let credentialID: ArraySlice<UInt8>?

    static let minimumLength = 37

    /// Parses the fixed header, and the attested credential data when `attested` is set.
    init(_ bytes: [UInt8], attested: Bool) throws {
        guard bytes.count >= Self.minimumLength else {
            throw VerificationError(.malformed, "authenticator data is \(bytes.count) bytes, shorter than \(Self.minimumLength)")
        }
        rpIDHash = bytes[0..<32]
        flags = bytes[32]
        counter = UInt32(bytes[33]) << 24 | UInt32(bytes[34]) << 16 | UInt32(bytes[35]) << 8 | UInt32(bytes[36])
        guard attested else {
            aaguid = nil
            credentialID = nil
            return
        }
        guard bytes.count >= 55 else {
            throw VerificationError(.malformed, "authenticator data has no attested credential data")
        }
        aaguid = bytes[37..<53]
        let idLength = Int(bytes[53]) << 8 | Int(bytes[54])
        guard bytes.count >= 55 + idLength else {
            throw VerificationError(.malformed, "credential ID length \(idLength) exceeds the authenticator data")
        }
        credentialID = bytes[55..<55 + idLength]
    }
}

/// The 16-byte AAGUIDs Apple uses, and the environment each one means.
enum AppAttestAAGUID {
    static let development = Array("appattestdevelop".utf8)
    static let production = Array("appattest".utf8) + [UInt8](repeating: 0, count: 7)

    static func environment(_ aaguid: ArraySlice<UInt8>) -> AttestationEnvironment? {
        if aaguid.elementsEqual(development) { return .development }
        if aaguid.elementsEqual(production) { return .production }
        return nil
    }
}
