import COpenSSL
import Foundation
import Synchronization

/// Why a CMS SignedData was refused.
public enum SignedDataError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Not a SignedData OpenSSL can read, or not the shape expected (one signer, content inside).
    case malformed(String)
    /// The signature over the content does not verify with the signer's certificate.
    case signature(String)
    /// The signer's certificate does not chain to a trust anchor, or is not valid at the time.
    case chain(String)
    /// The chain reaches an anchor but not through the pinned intermediate, or the signer is not
    /// one of the kind the pin names (key usage, marker extension).
    case pin(String)

    public var description: String {
        switch self {
        case .malformed(let d): "malformed: \(d)"
        case .signature(let d): "signature: \(d)"
        case .chain(let d): "chain: \(d)"
        case .pin(let d): "pin: \(d)"
        }
    }
}

/// The verified content of a SignedData.
public struct SignedContent: Sendable {
    public let content: [UInt8]
}

/// CMS SignedData (RFC 5652) verification as Apple signs App Attest receipts: BER with
/// indefinite lengths, the content inside, one signer, no signed attributes (the signature
/// covers the content directly; signed attributes are checked when present), and the chain in
/// the certificate set, of which only the pinned anchors are trusted, never a root the sender
/// embedded.
///
/// Apple signs every receipt with the same few certificates. So the envelope is read once by
/// `CMSSignedData` (no certificate parsed), and the signer's validated path and public key are
/// remembered, keyed by a digest of the signer's identifier and the set's exact bytes. A receipt
/// then costs its read, one digest, one ECDSA verification with the remembered key and the
/// validity periods of that path at the receipt's time. A signer that is not ECDSA goes through
/// OpenSSL's CMS instead, with the same checks.
public final class SignedDataVerifier: Sendable {
    public let anchors: [Certificate]
    /// What the path must look like beyond reaching an anchor (nil: any path to an anchor).
    public let pin: SignerPin?
    /// Receipts are about 4 KiB.
    public static let maxBytes = 32 * 1024
    /// A signer whose path verified: the path (signer first) and the signer's key.
    struct VerifiedSigner: Sendable {
        let path: [Certificate]
        let key: ECPublicKey
    }
    private let verifiedSigners = Mutex<[[UInt8]: VerifiedSigner]>([:])
    private let verifiedPaths = Mutex<[[UInt8]: [Certificate]]>([:])
    private static let maxCachedPaths = 32

    public init(anchors: [Certificate], pin: SignerPin? = nil) {
        self.anchors = anchors
        self.pin = pin
    }

    public func verify(_ der: [UInt8], at time: Date) throws(SignedDataError) -> SignedContent {
        guard !der.isEmpty, der.count <= Self.maxBytes else { throw .malformed("\(der.count) bytes; expected 1 to \(Self.maxBytes)") }
        let signedData: CMSSignedData
        do { signedData = try CMSSignedData(der) } catch { throw .malformed(error.description) }
        guard signedData.isECDSA else { return try verifyWithOpenSSLCMS(der, at: time) }
        let digest: [UInt8]
        do { digest = try signedData.signedDigest() } catch { throw .signature(error.description) }
        let signer = try verifiedSigner(signedData) { key throws(SignedDataError) in
            guard key.isValidSignature(signedData.signature, digest: digest) else {
                throw .signature("the signature does not verify with the signer's key")
            }
        }
        try checkValidity(signer.path, at: time)
        return SignedContent(content: signedData.content)
    }

    /// The signer's remembered path and key, or (first time) its path built and validated;
    /// `signature` is checked with the key either way, first: a forgery costs no path validation.
    private func verifiedSigner(_ signedData: CMSSignedData,
                                signature: (ECPublicKey) throws(SignedDataError) -> Void) throws(SignedDataError) -> VerifiedSigner {
        var identity: [UInt8] = []
        for part in [signedData.signerID] + signedData.certificates { Self.appendLengthPrefixed(part, to: &identity) }
        let key = sha256(identity)
        if let known = verifiedSigners.withLock({ $0[key] }) {
            try signature(known.key)
            return known
        }
        let certificates: [Certificate]
        do { certificates = try signedData.certificates.map { try Certificate(der: Array($0)) } } catch {
            throw .malformed("a certificate of the set does not parse: \(error)")
        }
        let signers = certificates.filter { Self.isIdentified(by: signedData.signerID, $0) }
        guard signers.count == 1, let signerCertificate = signers.first else {
            throw .malformed(signers.isEmpty ? "no certificate of the set is the signer's" : "several certificates match the signer's identifier")
        }
        let signerKey: ECPublicKey
        do { signerKey = try signerCertificate.publicKey() } catch { throw .signature("the signer's key is not an EC key: \(error)") }
        try signature(signerKey)
        guard let untrusted = attest_sk_X509_new_null() else { throw .chain("sk_X509_new_null failed") }
        defer { attest_sk_X509_free(untrusted) }
        for certificate in certificates { _ = attest_sk_X509_push(untrusted, certificate.x509) }
        let path = try verifyPath(signer: signerCertificate.x509, untrusted: untrusted)
        let verified = VerifiedSigner(path: path, key: signerKey)
        verifiedSigners.withLock { Self.remember(verified, at: key, in: &$0) }
        return verified
    }

    /// `bytes` after their length in four bytes, so that joined parts cannot be taken for others.
    private static func appendLengthPrefixed(_ bytes: some Collection<UInt8>, to key: inout [UInt8]) {
        let count = bytes.count
        key += [UInt8(count >> 24 & 0xff), UInt8(count >> 16 & 0xff), UInt8(count >> 8 & 0xff), UInt8(count & 0xff)]
        key += bytes
    }

    /// Keeps `value` under `key`. When full, one entry goes, not all: a flood of other signers
    /// must not keep evicting Apple's.
    private static func remember<Value>(_ value: Value, at key: [UInt8], in cache: inout [[UInt8]: Value]) {
        if cache.count >= maxCachedPaths, let victim = cache.keys.first { cache[victim] = nil }
        cache[key] = value
    }

    /// Whether `identifier` (a SignerIdentifier, whole) names `certificate`: its issuer and serial
    /// number, byte for byte, or its subject key identifier.
    static func isIdentified(by identifier: ArraySlice<UInt8>, _ certificate: Certificate) -> Bool {
        var reader = BER(identifier)
        guard let sid = try? reader.next() else { return false }
        if sid.tag == 0x80 {
            // [0] SubjectKeyIdentifier: the extension's value is an OCTET STRING of the same bytes.
            guard let value = certificate.extensionValue(oid: "2.5.29.14") else { return false }
            return value.elementsEqual(sid.contents) || value.elementsEqual([0x04, UInt8(sid.contents.count)] + sid.contents)
        }
        var sidFields = BER(sid.contents)
        guard sid.tag == 0x30, let sidIssuer = try? sidFields.read(0x30, "issuer"), let sidSerial = try? sidFields.read(0x02, "serialNumber"),
              sidFields.isAtEnd, let sidIssuerDER = try? BER.definite(sidIssuer) else { return false }
        var certificateReader = BER(certificate.der[...])
        guard let outer = try? certificateReader.read(0x30, "certificate") else { return false }
        var fields = BER(outer.contents)
        guard let tbs = try? fields.read(0x30, "tbsCertificate") else { return false }
        var tbsFields = BER(tbs.contents)
        _ = try? tbsFields.optional(0xa0)
        guard let serial = try? tbsFields.read(0x02, "serialNumber"), (try? tbsFields.read(0x30, "signature")) != nil,
              let issuer = try? tbsFields.read(0x30, "issuer") else { return false }
        return sidIssuerDER.elementsEqual(issuer.tlv) && sidSerial.tlv.elementsEqual(serial.tlv)
    }

    private func checkValidity(_ path: [Certificate], at time: Date) throws(SignedDataError) {
        for certificate in path where !certificate.isValid(at: time) {
            throw .chain("\(certificate.subjectName) is valid from \(certificate.notBefore) to \(certificate.notAfter), not at \(time)")
        }
    }

    /// OpenSSL's CMS, for a signer that is not ECDSA: the same checks, at the cost of a full parse.
    private func verifyWithOpenSSLCMS(_ der: [UInt8], at time: Date) throws(SignedDataError) -> SignedContent {
        defer { ERR_clear_error() }
        let (parsed, consumed): (OpaquePointer?, Int) = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            let cms = d2i_CMS_ContentInfo(nil, &cursor, buffer.count)
            return (cms, cursor.map { $0 - buffer.baseAddress! } ?? 0)
        }
        guard let cms = parsed else { throw .malformed("not a CMS ContentInfo: \(openSSLErrorText())") }
        defer { CMS_ContentInfo_free(cms) }
        guard consumed == der.count else { throw .malformed("\(der.count - consumed) bytes after the ContentInfo") }
        guard OBJ_obj2nid(CMS_get0_type(cms)) == NID_pkcs7_signed else { throw .malformed("not SignedData") }
        guard let infos = CMS_get0_SignerInfos(cms), attest_sk_CMS_SignerInfo_num(infos) == 1 else {
            throw .malformed("SignedData must have exactly one signer")
        }
        guard let out = BIO_new(BIO_s_mem()) else { throw .malformed("BIO_new failed") }
        defer { BIO_free(out) }
        // The signature with the signer found in the certificate set; the chain is checked below,
        // against the pinned anchors only.
        guard CMS_verify(cms, nil, nil, nil, out, UInt32(CMS_NO_SIGNER_CERT_VERIFY | CMS_BINARY)) == 1 else {
            throw .signature(openSSLErrorText())
        }
        guard let signers = CMS_get0_signers(cms) else { throw .malformed("no signer certificate") }
        defer { attest_sk_X509_free(signers) }
        guard attest_sk_X509_num(signers) == 1, let signerX509 = attest_sk_X509_value(signers, 0) else {
            throw .malformed("expected one signer certificate")
        }
        try verifyChain(cms: cms, signer: signerX509, at: time)

        var pointer: UnsafeMutablePointer<CChar>?
        let length = attest_BIO_get_mem_data(out, &pointer)
        guard length >= 0 else { throw .malformed("no content") }
        let content = pointer.map { Array(UnsafeRawBufferPointer(start: $0, count: length).bindMemory(to: UInt8.self)) } ?? []
        guard !content.isEmpty else { throw .malformed("empty content") }
        return SignedContent(content: content)
    }

    /// The signer's chain through the SignedData's own certificates (untrusted) to a pinned
    /// anchor, every certificate valid at `time`.
    private func verifyChain(cms: OpaquePointer, signer: OpaquePointer, at time: Date) throws(SignedDataError) {
        let untrusted = CMS_get1_certs(cms)
        defer { if let untrusted { attest_sk_X509_pop_free(untrusted) } }
        // Length-prefixed DER of the signer, then of every certificate of the set, in order.
        var key: [UInt8] = []
        func append(_ x509: OpaquePointer) throws(SignedDataError) {
            var out: UnsafeMutablePointer<UInt8>?
            let length = Int(i2d_X509(x509, &out))
            guard length > 0, let out else { throw .malformed("a certificate of the set does not encode") }
            defer { attest_openssl_free(out) }
            Self.appendLengthPrefixed(UnsafeBufferPointer(start: out, count: length), to: &key)
        }
        try append(signer)
        for index in 0..<(untrusted.map { attest_sk_X509_num($0) } ?? 0) {
            guard let x509 = attest_sk_X509_value(untrusted, index) else { throw .malformed("certificate set is incomplete") }
            try append(x509)
        }
        let path: [Certificate]
        if let cached = verifiedPaths.withLock({ $0[key] }) {
            path = cached
        } else {
            path = try verifyPath(signer: signer, untrusted: untrusted)
            verifiedPaths.withLock { Self.remember(path, at: key, in: &$0) }
        }
        try checkValidity(path, at: time)
    }

    /// Full OpenSSL path validation to a pinned anchor (time ignored here: checked per call);
    /// the path built, signer first. Only paths that verify are remembered.
    private func verifyPath(signer: OpaquePointer, untrusted: OpaquePointer?) throws(SignedDataError) -> [Certificate] {
        guard let store = X509_STORE_new() else { throw .chain("X509_STORE_new failed") }
        defer { X509_STORE_free(store) }
        for anchor in anchors { X509_STORE_add_cert(store, anchor.x509) }
        guard let ctx = X509_STORE_CTX_new() else { throw .chain("X509_STORE_CTX_new failed") }
        defer { X509_STORE_CTX_free(ctx) }
        guard X509_STORE_CTX_init(ctx, store, signer, untrusted) == 1 else { throw .chain("X509_STORE_CTX_init: \(openSSLErrorText())") }
        X509_STORE_CTX_set_flags(ctx, UInt(X509_V_FLAG_NO_CHECK_TIME | X509_V_FLAG_X509_STRICT))
        guard X509_verify_cert(ctx) == 1 else {
            let code = X509_STORE_CTX_get_error(ctx)
            let reason = String(cString: X509_verify_cert_error_string(Int(code)))
            throw .chain("signer does not verify to a pinned root: \(reason)")
        }
        guard let built = X509_STORE_CTX_get0_chain(ctx), let top = attest_sk_X509_value(built, attest_sk_X509_num(built) - 1),
              anchors.contains(where: { X509_cmp($0.x509, top) == 0 }) else {
            throw .chain("chain did not end at a pinned root")
        }
        var path: [Certificate] = []
        for index in 0..<attest_sk_X509_num(built) {
            guard let x509 = attest_sk_X509_value(built, index), let certificate = try? Certificate(copying: x509) else {
                throw .chain("built chain is incomplete")
            }
            path.append(certificate)
        }
        if let pin { try pin.check(path) }
        return path
    }
}

/// A signer's path pinned beyond its root: exactly signer → one of the pinned intermediates (by
/// SPKI hash) → anchor, and a signer whose key usage names digitalSignature and that carries the
/// marker extension. A root with other intermediates under it (some of which issue certificates
/// whose keys their customers hold) then vouches for nothing else.
public struct SignerPin: Sendable {
    /// SHA-256 of each allowed intermediate's SubjectPublicKeyInfo, lowercase hex.
    public let intermediateSPKISHA256: [String]
    /// A dotted OID the signer must carry (Apple's receipt signers: 1.2.840.113635.100.12.15).
    public let signerMarkerOID: String?

    public init(intermediateSPKISHA256: [String], signerMarkerOID: String?) {
        self.intermediateSPKISHA256 = intermediateSPKISHA256
        self.signerMarkerOID = signerMarkerOID
    }

    /// `path` is signer first, anchor last.
    func check(_ path: [Certificate]) throws(SignedDataError) {
        guard path.count == 3 else {
            throw .pin("the signer's path has \(path.count) certificates; a receipt's is signer, pinned intermediate, root")
        }
        let intermediate = path[1], signer = path[0]
        let spki = intermediate.spkiSHA256Hex
        guard intermediateSPKISHA256.contains(spki) else {
            throw .pin("intermediate \(intermediate.subjectName) is not the pinned receipt intermediate (SPKI SHA-256 \(spki))")
        }
        guard signer.declaresDigitalSignature else { throw .pin("signer \(signer.subjectName) has no digitalSignature key usage") }
        if let oid = signerMarkerOID, signer.extensionValue(oid: oid) == nil {
            throw .pin("signer \(signer.subjectName) lacks the receipt signer's marker extension \(oid)")
        }
    }
}

/// Signs content as Apple signs receipts (one signer, no signed attributes, the chain in the
/// certificate set): for the test receipt authority and the stub of Apple's data service only.
public enum SignedDataSigner {
    /// - Parameter signedAttributes: sign the content's digest inside signed attributes (content
    ///   type, signing time, message digest), as most CMS signers do, instead of the content itself.
    public static func sign(_ content: [UInt8], signer: Certificate, key: ECPrivateKey, chain: [Certificate],
                            signedAttributes: Bool = false) throws -> [UInt8] {
        defer { ERR_clear_error() }
        guard let bio = BIO_new(BIO_s_mem()) else { throw CryptoError.openSSL("BIO_new") }
        defer { BIO_free(bio) }
        let written = content.withUnsafeBufferPointer { BIO_write(bio, $0.baseAddress, Int32($0.count)) }
        guard written == Int32(content.count) else { throw CryptoError.openSSL("BIO_write") }
        guard let extra = attest_sk_X509_new_null() else { throw CryptoError.openSSL("sk_X509_new_null") }
        defer { attest_sk_X509_free(extra) }
        for certificate in chain { _ = attest_sk_X509_push(extra, certificate.x509) }
        let flags = UInt32(CMS_BINARY | CMS_NOSMIMECAP | (signedAttributes ? 0 : CMS_NOATTR))
        guard let cms = CMS_sign(signer.x509, key.pkey, extra, bio, flags) else { throw CryptoError.openSSL("CMS_sign: \(openSSLErrorText())") }
        defer { CMS_ContentInfo_free(cms) }
        var out: UnsafeMutablePointer<UInt8>?
        let length = i2d_CMS_ContentInfo(cms, &out)
        guard length > 0, let out else { throw CryptoError.openSSL("i2d_CMS_ContentInfo") }
        defer { attest_openssl_free(out) }
        return Array(UnsafeBufferPointer(start: out, count: Int(length)))
    }
}
