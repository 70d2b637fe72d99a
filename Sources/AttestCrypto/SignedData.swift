import COpenSSL
import Foundation

/// Why a CMS SignedData was refused.
public enum SignedDataError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Not a SignedData OpenSSL can read, or not the shape expected (one signer, content inside).
    case malformed(String)
    /// The signature over the content does not verify with the signer's certificate.
    case signature(String)
    /// The signer's certificate does not chain to a trust anchor, or is not valid at the time.
    case chain(String)

    public var description: String {
        switch self {
        case .malformed(let d): "malformed: \(d)"
        case .signature(let d): "signature: \(d)"
        case .chain(let d): "chain: \(d)"
        }
    }
}

/// The verified content of a SignedData, and who signed it.
public struct SignedContent: Sendable {
    public let content: [UInt8]
    public let signer: Certificate
}

/// CMS SignedData (RFC 5652) verification on OpenSSL's CMS API, as Apple signs App Attest
/// receipts: BER with indefinite lengths, the content inside, one signer, no signed attributes
/// (the signature covers the content directly), and the chain in the certificate set — of which
/// only the pinned anchors are trusted, never a root the sender embedded.
public final class SignedDataVerifier: Sendable {
    public let anchors: [Certificate]
    /// Receipts are about 4 KiB.
    public static let maxBytes = 32 * 1024

    public init(anchors: [Certificate]) { self.anchors = anchors }

    public func verify(_ der: [UInt8], at time: Date) throws(SignedDataError) -> SignedContent {
        guard !der.isEmpty, der.count <= Self.maxBytes else { throw .malformed("\(der.count) bytes; expected 1 to \(Self.maxBytes)") }
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
        let signer: Certificate
        do { signer = try Certificate(copying: signerX509) } catch { throw .malformed("signer certificate: \(error)") }
        try verifyChain(cms: cms, signer: signerX509, at: time)

        var pointer: UnsafeMutablePointer<CChar>?
        let length = attest_BIO_get_mem_data(out, &pointer)
        guard length >= 0 else { throw .malformed("no content") }
        let content = pointer.map { Array(UnsafeRawBufferPointer(start: $0, count: length).bindMemory(to: UInt8.self)) } ?? []
        guard !content.isEmpty else { throw .malformed("empty content") }
        return SignedContent(content: content, signer: signer)
    }

    /// The signer's chain through the SignedData's own certificates (untrusted) to a pinned
    /// anchor, every certificate valid at `time`.
    private func verifyChain(cms: OpaquePointer, signer: OpaquePointer, at time: Date) throws(SignedDataError) {
        guard let store = X509_STORE_new() else { throw .chain("X509_STORE_new failed") }
        defer { X509_STORE_free(store) }
        for anchor in anchors { X509_STORE_add_cert(store, anchor.x509) }
        let untrusted = CMS_get1_certs(cms)
        defer { if let untrusted { attest_sk_X509_pop_free(untrusted) } }
        guard let ctx = X509_STORE_CTX_new() else { throw .chain("X509_STORE_CTX_new failed") }
        defer { X509_STORE_CTX_free(ctx) }
        guard X509_STORE_CTX_init(ctx, store, signer, untrusted) == 1 else { throw .chain("X509_STORE_CTX_init: \(openSSLErrorText())") }
        X509_STORE_CTX_set_time(ctx, 0, time_t(time.timeIntervalSince1970.rounded(.down)))
        X509_STORE_CTX_set_flags(ctx, UInt(X509_V_FLAG_X509_STRICT))
        guard X509_verify_cert(ctx) == 1 else {
            let code = X509_STORE_CTX_get_error(ctx)
            let reason = String(cString: X509_verify_cert_error_string(Int(code)))
            throw .chain("signer does not verify to a pinned root at \(time): \(reason)")
        }
        guard let built = X509_STORE_CTX_get0_chain(ctx), let top = attest_sk_X509_value(built, attest_sk_X509_num(built) - 1),
              anchors.contains(where: { X509_cmp($0.x509, top) == 0 }) else {
            throw .chain("chain did not end at a pinned root")
        }
    }
}

/// Signs content as Apple signs receipts (one signer, no signed attributes, the chain in the
/// certificate set): for the test receipt authority and the stub of Apple's data service only.
public enum SignedDataSigner {
    public static func sign(_ content: [UInt8], signer: Certificate, key: ECPrivateKey, chain: [Certificate]) throws -> [UInt8] {
        defer { ERR_clear_error() }
        guard let bio = BIO_new(BIO_s_mem()) else { throw CryptoError.openSSL("BIO_new") }
        defer { BIO_free(bio) }
        let written = content.withUnsafeBufferPointer { BIO_write(bio, $0.baseAddress, Int32($0.count)) }
        guard written == Int32(content.count) else { throw CryptoError.openSSL("BIO_write") }
        guard let extra = attest_sk_X509_new_null() else { throw CryptoError.openSSL("sk_X509_new_null") }
        defer { attest_sk_X509_free(extra) }
        for certificate in chain { _ = attest_sk_X509_push(extra, certificate.x509) }
        let flags = UInt32(CMS_BINARY | CMS_NOATTR | CMS_NOSMIMECAP)
        guard let cms = CMS_sign(signer.x509, key.pkey, extra, bio, flags) else { throw CryptoError.openSSL("CMS_sign: \(openSSLErrorText())") }
        defer { CMS_ContentInfo_free(cms) }
        var out: UnsafeMutablePointer<UInt8>?
        let length = i2d_CMS_ContentInfo(cms, &out)
        guard length > 0, let out else { throw CryptoError.openSSL("i2d_CMS_ContentInfo") }
        defer { attest_openssl_free(out) }
        return Array(UnsafeBufferPointer(start: out, count: Int(length)))
    }
}
