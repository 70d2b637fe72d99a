import CBOR

/// WebAuthn-style authenticator data as App Attest produces it:
/// rpIdHash(32) ‖ flags(1) ‖ signCount(4, big-endian) ‖ [aaguid(16) ‖ credIdLen(2) ‖ credId ‖ COSE key] ‖ [extension map].
///
/// Framed by position, never by the flags: shipping devices set AT on assertions that carry no
/// credential data and clear ED on data that carries a map. An attestation has the credential
/// data; then, in both, either nothing follows or exactly one CBOR map (iOS 27, macOS 27).
struct AuthenticatorData {
    let rpIDHash: ArraySlice<UInt8>
    let flags: UInt8
    let counter: UInt32
    /// Present in attestations (attested credential data); absent in assertions.
    let aaguid: ArraySlice<UInt8>?
    let credentialID: ArraySlice<UInt8>?
    /// Nil when the device wrote no map (iOS 26 and earlier).
    let extensions: AuthenticatorExtensions?

    static let minimumLength = 37
    static let coseKeyLimits = CBORLimits(maxDepth: 2, maxItems: 16)

    /// Parses the fixed header, the attested credential data when `attested` is set, and the
    /// extension map if one follows.
    init(_ bytes: [UInt8], attested: Bool) throws {
        guard bytes.count >= Self.minimumLength else {
            throw VerificationError(.malformed, "authenticator data is \(bytes.count) bytes, shorter than \(Self.minimumLength)")
        }
        rpIDHash = bytes[0..<32]
        flags = bytes[32]
        counter = UInt32(bytes[33]) << 24 | UInt32(bytes[34]) << 16 | UInt32(bytes[35]) << 8 | UInt32(bytes[36])
        var offset = Self.minimumLength
        if attested {
            guard bytes.count >= 55 else {
                throw VerificationError(.malformed, "authenticator data has no attested credential data")
            }
            aaguid = bytes[37..<53]
            let idLength = Int(bytes[53]) << 8 | Int(bytes[54])
            guard bytes.count >= 55 + idLength else {
                throw VerificationError(.malformed, "credential ID length \(idLength) exceeds the authenticator data")
            }
            credentialID = bytes[55..<55 + idLength]
            offset = 55 + idLength
            guard offset < bytes.count else {
                throw VerificationError(.malformed, "authenticator data ends after the credential ID, without the credential public key")
            }
            let key: (value: CBORValue, length: Int)
            do { key = try CBORDecoder.decodePrefix(bytes[offset...], limits: Self.coseKeyLimits) } catch {
                throw VerificationError(.malformed, "credential public key is not one CBOR item: \(error)")
            }
            guard case .map = key.value else {
                throw VerificationError(.malformed, "credential public key is \(AuthenticatorExtensions.kind(key.value)), not a COSE key map")
            }
            offset += key.length
        } else {
            aaguid = nil
            credentialID = nil
        }
        extensions = offset == bytes.count ? nil
            : try AuthenticatorExtensions(decoding: bytes[offset...], where: attested ? "after the credential public key" : "after the 37-byte header")
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
