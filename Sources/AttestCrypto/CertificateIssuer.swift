import COpenSSL
import Foundation

/// Issues X.509 certificates. Only the project's test authority uses this (to mint credential
/// certificates shaped like Apple's); nothing on the verification path does.
public struct CertificateIssuer: Sendable {
    public let certificate: Certificate
    public let key: ECPrivateKey

    public init(certificate: Certificate, key: ECPrivateKey) {
        self.certificate = certificate
        self.key = key
    }

    /// A custom extension: dotted OID, criticality and the DER that goes inside extnValue.
    public struct Extension {
        public var oid: String
        public var critical: Bool
        public var value: [UInt8]
        public init(oid: String, critical: Bool = false, value: [UInt8]) {
            self.oid = oid
            self.critical = critical
            self.value = value
        }
    }

    /// An end-entity certificate for `subjectKey`, signed with ECDSA-SHA256 (as Apple signs
    /// credential certificates), with critical basic constraints CA:FALSE and Apple's key usage.
    public func issueLeaf(subjectCommonName: String, subjectKey: ECPublicKey, notBefore: Date, notAfter: Date,
                          extensions: [Extension]) throws -> Certificate {
        guard let x = X509_new() else { throw CryptoError.openSSL("X509_new") }
        defer { X509_free(x) }
        guard X509_set_version(x, 2) == 1 else { throw CryptoError.openSSL("X509_set_version") }
        let serial = secureRandomBytes(8)
        guard let bn = BN_bin2bn(serial, Int32(serial.count), nil) else { throw CryptoError.openSSL("BN_bin2bn") }
        defer { BN_free(bn) }
        BN_set_bit(bn, 62)  // positive and full length
        BN_clear_bit(bn, 63)
        guard BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != nil else { throw CryptoError.openSSL("serial") }
        guard X509_set_issuer_name(x, X509_get_subject_name(certificate.x509)) == 1 else { throw CryptoError.openSSL("issuer name") }

        guard let name = X509_NAME_new() else { throw CryptoError.openSSL("X509_NAME_new") }
        defer { X509_NAME_free(name) }
        for (field, value) in [("CN", subjectCommonName), ("OU", "AAA Certification"), ("O", "App Attest Test Authority"), ("ST", "California")] {
            guard X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8, value, -1, -1, 0) == 1 else { throw CryptoError.openSSL("name \(field)") }
        }
        guard X509_set_subject_name(x, name) == 1 else { throw CryptoError.openSSL("subject name") }
        guard ASN1_TIME_set(X509_getm_notBefore(x), time_t(notBefore.timeIntervalSince1970)) != nil,
              ASN1_TIME_set(X509_getm_notAfter(x), time_t(notAfter.timeIntervalSince1970)) != nil else { throw CryptoError.openSSL("validity") }
        guard X509_set_pubkey(x, subjectKey.pkey) == 1 else { throw CryptoError.openSSL("X509_set_pubkey") }

        try addStandardExtension(x, NID_basic_constraints, "critical,CA:FALSE")
        try addStandardExtension(x, NID_key_usage, "critical,digitalSignature,nonRepudiation,keyEncipherment,dataEncipherment")
        for ext in extensions { try addCustomExtension(x, ext) }

        guard X509_sign(x, key.pkey, EVP_sha256()) > 0 else { throw CryptoError.openSSL("X509_sign") }
        var out: UnsafeMutablePointer<UInt8>?
        let length = i2d_X509(x, &out)
        guard length > 0, let out else { throw CryptoError.openSSL("i2d_X509") }
        defer { attest_openssl_free(out) }
        return try Certificate(der: Array(UnsafeBufferPointer(start: out, count: Int(length))))
    }

    private func addStandardExtension(_ x: OpaquePointer, _ nid: Int32, _ value: String) throws {
        guard let ext = X509V3_EXT_conf_nid(nil, nil, nid, value) else { throw CryptoError.openSSL("extension \(value)") }
        defer { X509_EXTENSION_free(ext) }
        guard X509_add_ext(x, ext, -1) == 1 else { throw CryptoError.openSSL("X509_add_ext") }
    }

    private func addCustomExtension(_ x: OpaquePointer, _ spec: Extension) throws {
        guard let object = OBJ_txt2obj(spec.oid, 1) else { throw CryptoError.openSSL("OID \(spec.oid)") }
        defer { ASN1_OBJECT_free(object) }
        guard let octets = ASN1_OCTET_STRING_new() else { throw CryptoError.openSSL("ASN1_OCTET_STRING_new") }
        defer { ASN1_OCTET_STRING_free(octets) }
        guard ASN1_OCTET_STRING_set(octets, spec.value, Int32(spec.value.count)) == 1 else { throw CryptoError.openSSL("octet string") }
        guard let ext = X509_EXTENSION_create_by_OBJ(nil, object, spec.critical ? 1 : 0, octets) else { throw CryptoError.openSSL("extension \(spec.oid)") }
        defer { X509_EXTENSION_free(ext) }
        guard X509_add_ext(x, ext, -1) == 1 else { throw CryptoError.openSSL("X509_add_ext") }
    }
}
