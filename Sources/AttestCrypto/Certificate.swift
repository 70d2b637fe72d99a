import COpenSSL
import Foundation

/// An X.509 certificate parsed by OpenSSL, with the facts verification needs read out once.
// Safe: we never mutate the X509 after init; OpenSSL 3 fills its extension cache under its own
// lock, so concurrent reads and verifications of one X509 are allowed.
public final class Certificate: @unchecked Sendable {
    let x509: OpaquePointer
    public let der: [UInt8]
    public let notBefore: Date
    public let notAfter: Date

    public init(der: [UInt8]) throws {
        var consumed = 0
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor = buffer.baseAddress
            let x = d2i_X509(nil, &cursor, buffer.count)
            if let cursor, let start = buffer.baseAddress { consumed = cursor - start }
            return x
        }
        guard let parsed else { throw CryptoError.openSSL("not a DER X.509 certificate") }
        // d2i_X509 stops after one certificate: bytes after it mean the input was not one certificate.
        guard consumed == der.count else {
            X509_free(parsed)
            throw CryptoError("\(der.count - consumed) trailing bytes after the certificate")
        }
        guard let nb = Certificate.date(X509_get0_notBefore(parsed)), let na = Certificate.date(X509_get0_notAfter(parsed)) else {
            X509_free(parsed)
            throw CryptoError("certificate validity times cannot be read")
        }
        x509 = parsed
        self.der = der
        notBefore = nb
        notAfter = na
    }

    /// A copy of an OpenSSL certificate (re-parsed from its DER, so this object owns its own).
    convenience init(copying x509: OpaquePointer) throws {
        var out: UnsafeMutablePointer<UInt8>?
        let length = i2d_X509(x509, &out)
        guard length > 0, let out else { throw CryptoError.openSSL("i2d_X509") }
        defer { attest_openssl_free(out) }
        try self.init(der: Array(UnsafeBufferPointer(start: out, count: Int(length))))
    }

    /// All certificates in a PEM text, in order.
    public static func all(pem: String) throws -> [Certificate] {
        let bio = try MemoryBIO(pem)
        var result: [Certificate] = []
        while let x = PEM_read_bio_X509(bio.bio, nil, nil, nil) {
            defer { X509_free(x) }
            result.append(try Certificate(copying: x))
        }
        ERR_clear_error()  // the loop ends on "no start line"
        guard !result.isEmpty else { throw CryptoError("no certificate in PEM text") }
        return result
    }

    public convenience init(pem: String) throws {
        let first = try Certificate.all(pem: pem)[0]
        try self.init(der: first.der)
    }

    deinit { X509_free(x509) }

    private static func date(_ time: UnsafePointer<ASN1_TIME>?) -> Date? {
        guard let time else { return nil }
        var tm = tm()
        guard ASN1_TIME_to_tm(time, &tm) == 1 else { return nil }
        return Date(timeIntervalSince1970: TimeInterval(timegm(&tm)))
    }

    public func isValid(at time: Date) -> Bool { notBefore <= time && time <= notAfter }

    /// SHA-256 of the DER encoding: the fingerprint operators compare.
    public var sha256Fingerprint: [UInt8] { sha256(der) }

    public var subjectName: String { Certificate.oneLine(X509_get_subject_name(x509)) }

    /// The subject Name as DER, to compare with a child's issuer byte for byte.
    public var subjectDER: [UInt8] {
        var out: UnsafeMutablePointer<UInt8>?
        let length = i2d_X509_NAME(X509_get_subject_name(x509), &out)
        guard length > 0, let out else { return [] }
        defer { attest_openssl_free(out) }
        return Array(UnsafeBufferPointer(start: out, count: Int(length)))
    }

    /// Whether OpenSSL's re-encoding equals the bytes it was parsed from (BER leniencies refused).
    public var isCanonicallyEncoded: Bool {
        var out: UnsafeMutablePointer<UInt8>?
        let length = i2d_X509(x509, &out)
        guard length > 0, let out else { return false }
        defer { attest_openssl_free(out) }
        return der.elementsEqual(UnsafeBufferPointer(start: out, count: Int(length)))
    }

    /// Name constraints, policy constraints or a policy-mapping extension present.
    public var hasNameOrPolicyConstraints: Bool {
        [NID_name_constraints, NID_policy_constraints, NID_policy_mappings, NID_inhibit_any_policy]
            .contains { X509_get_ext_by_NID(x509, $0, -1) >= 0 }
    }

    /// Whether the key usage allows signing certificates (no keyUsage extension allows everything).
    public var mayIssueCertificates: Bool { X509_get_key_usage(x509) & UInt32(KU_KEY_CERT_SIGN) != 0 }

    /// Whether a keyUsage extension is present and names digitalSignature (its absence does not count).
    public var declaresDigitalSignature: Bool {
        X509_get_ext_by_NID(x509, NID_key_usage, -1) >= 0 && X509_get_key_usage(x509) & UInt32(KU_DIGITAL_SIGNATURE) != 0
    }

    /// `spkiSHA256` in lowercase hex, as pins are written.
    public var spkiSHA256Hex: String { spkiSHA256.map { String(format: "%02x", $0) }.joined() }

    /// SHA-256 of the DER SubjectPublicKeyInfo: what a pin names (it survives re-issuing the certificate).
    public var spkiSHA256: [UInt8] {
        guard let spki = X509_get_X509_PUBKEY(x509) else { return [] }
        var out: UnsafeMutablePointer<UInt8>?
        let length = i2d_X509_PUBKEY(spki, &out)
        guard length > 0, let out else { return [] }
        defer { attest_openssl_free(out) }
        return sha256(Array(UnsafeBufferPointer(start: out, count: Int(length))))
    }

    private static func oneLine(_ name: OpaquePointer?) -> String {
        guard let name, let text = X509_NAME_oneline(name, nil, 0) else { return "?" }
        defer { attest_openssl_free(text) }
        return String(cString: text)
    }

    /// The subject public key.
    public func publicKey() throws -> ECPublicKey {
        guard let pkey = X509_get_pubkey(x509) else { throw CryptoError.openSSL("certificate public key") }
        guard EVP_PKEY_get_base_id(pkey) == EVP_PKEY_EC else {
            EVP_PKEY_free(pkey)
            throw CryptoError("certificate key is not an EC key")
        }
        return try ECPublicKey(owning: pkey)
    }

    /// The raw value (contents of the extnValue OCTET STRING) of the extension with this dotted OID.
    public func extensionValue(oid: String) -> [UInt8]? {
        guard let object = OBJ_txt2obj(oid, 1) else { return nil }
        defer { ASN1_OBJECT_free(object) }
        let index = X509_get_ext_by_OBJ(x509, object, -1)
        guard index >= 0, let ext = X509_get_ext(x509, index), let data = X509_EXTENSION_get_data(ext) else { return nil }
        guard let bytes = ASN1_STRING_get0_data(data) else { return [] }
        return Array(UnsafeBufferPointer(start: bytes, count: Int(ASN1_STRING_length(data))))
    }

    public var isCA: Bool { X509_check_ca(x509) != 0 }

    /// Issued by itself: its issuer is its subject and its own key verifies its signature.
    public var isSelfSigned: Bool { X509_check_issued(x509, x509) == X509_V_OK }

    /// Verifies this certificate's signature with the issuer's key.
    public func isSignatureValid(issuerKey: ECPublicKey) -> Bool {
        let ok = X509_verify(x509, issuerKey.pkey) == 1
        ERR_clear_error()
        return ok
    }
}
