import COpenSSL
import Foundation
import Synchronization

/// Why a certificate chain was refused.
public enum ChainError: Error, Equatable, Sendable {
    /// The chain does not verify to a trust anchor: bad encoding, wrong issuer, bad signature, not a CA.
    case invalid(String)
    /// The chain verifies, but some certificate in it is not valid at the verification time.
    case notValidAtTime(String)
}

/// Verifies `leaf ← intermediates… ← anchor` chains at a given time.
///
/// Device chains share a handful of intermediates (Apple has one), so an intermediate path is
/// verified to its anchor by OpenSSL's `X509_verify_cert` once and remembered; after that each
/// device costs one certificate parse (our own strict DER reader: see `LeafCertificate`) and one
/// OpenSSL signature check. Validity periods are still checked
/// for every certificate of the path — leaf, intermediates and anchor — on every call, because
/// the verification time differs from call to call.
public final class CertificateChainVerifier: Sendable {
    public let anchors: [Certificate]
    private let verifiedPaths = Mutex<[[UInt8]: VerifiedPath]>([:])
    private static let maxCachedPaths = 32

    /// A verified intermediate path: its bottom certificate (the leaf's issuer), that certificate's
    /// key, and every certificate of the path up to and including the anchor, for time checks.
    struct VerifiedPath: Sendable {
        let issuer: Certificate
        let issuerKey: ECPublicKey
        /// The issuer's subject Name, DER: a leaf's issuer must equal it byte for byte.
        let issuerSubject: [UInt8]
        let certificates: [Certificate]
    }

    public init(anchors: [Certificate]) {
        self.anchors = anchors
    }

    /// Verifies the chain and returns the parsed leaf.
    /// - Parameter chain: DER certificates, leaf first (the order of App Attest's `x5c`).
    public func verify(chain: [[UInt8]], at time: Date) throws -> LeafCertificate {
        guard chain.count >= 2 else { throw ChainError.invalid("chain has \(chain.count) certificate(s); expected a leaf and its intermediate(s)") }
        let path = try verifiedPath(Array(chain.dropFirst()))
        // The signature first: the TBSCertificate is not even read until its issuer's key signed it.
        let envelope: LeafCertificate.SignedEnvelope
        do { envelope = try LeafCertificate.SignedEnvelope(der: chain[0]) } catch { throw ChainError.invalid("leaf certificate: \(error)") }
        guard envelope.isSigned(by: path.issuerKey) else {
            throw ChainError.invalid("leaf certificate signature does not verify with its issuer's key")
        }
        let leaf: LeafCertificate
        do { leaf = try LeafCertificate(der: chain[0], envelope: envelope) } catch { throw ChainError.invalid("leaf certificate: \(error)") }
        guard leaf.issuer.elementsEqual(path.issuerSubject) else {
            throw ChainError.invalid("leaf issuer does not name \(path.issuer.subjectName)")
        }
        do { try leaf.checkEndEntityExtensions() } catch { throw ChainError.invalid("leaf certificate: \(error)") }

        if !(leaf.notBefore <= time && time <= leaf.notAfter) {
            throw ChainError.notValidAtTime("credential certificate is valid from \(leaf.notBefore) to \(leaf.notAfter), not at \(time)")
        }
        for certificate in path.certificates where !certificate.isValid(at: time) {
            throw ChainError.notValidAtTime(
                "\(certificate.subjectName) is valid from \(certificate.notBefore) to \(certificate.notAfter), not at \(time)")
        }
        return leaf
    }

    private func verifiedPath(_ intermediates: [[UInt8]]) throws -> VerifiedPath {
        // Length-prefixed, so that [A, B] and [A‖B] can never share a key.
        var cacheKey: [UInt8] = []
        for der in intermediates {
            cacheKey += [UInt8(der.count >> 24 & 0xff), UInt8(der.count >> 16 & 0xff), UInt8(der.count >> 8 & 0xff), UInt8(der.count & 0xff)]
            cacheKey += der
        }
        if let cached = verifiedPaths.withLock({ $0[cacheKey] }) { return cached }

        let path = try verifyIntermediates(intermediates)
        verifiedPaths.withLock { paths in
            // Evict one entry, not all: a flood of other verified paths must not keep evicting Apple's.
            if paths.count >= Self.maxCachedPaths, let victim = paths.keys.first { paths[victim] = nil }
            paths[cacheKey] = path
        }
        return path
    }

    /// Full OpenSSL path validation of the intermediates to one of the anchors (time ignored here:
    /// it is checked per call). Only paths that verify are ever remembered.
    private func verifyIntermediates(_ ders: [[UInt8]]) throws -> VerifiedPath {
        let certificates: [Certificate]
        do { certificates = try ders.map { try Certificate(der: $0) } } catch {
            throw ChainError.invalid("intermediate certificate: \(error)")
        }
        for certificate in certificates where !certificate.isCA || !certificate.mayIssueCertificates {
            throw ChainError.invalid("intermediate \(certificate.subjectName) is not a CA certificate allowed to sign certificates")
        }
        // The cache is keyed by bytes: only the one DER encoding of each intermediate may enter it,
        // so that re-encodings of a real intermediate cannot churn it.
        for certificate in certificates where !certificate.isCanonicallyEncoded {
            throw ChainError.invalid("intermediate \(certificate.subjectName) is not in DER")
        }
        // Leaves are checked by our own code, which does not apply name or policy constraints:
        // refuse paths that would need them rather than ignore them.
        for certificate in certificates + anchors where certificate.hasNameOrPolicyConstraints {
            throw ChainError.invalid("\(certificate.subjectName) carries name or policy constraints, which this verifier does not apply")
        }
        guard let store = X509_STORE_new() else { throw ChainError.invalid("X509_STORE_new failed") }
        defer { X509_STORE_free(store) }
        for anchor in anchors { X509_STORE_add_cert(store, anchor.x509) }
        guard let untrusted = attest_sk_X509_new_null() else { throw ChainError.invalid("sk_X509_new_null failed") }
        defer { attest_sk_X509_free(untrusted) }
        for certificate in certificates.dropFirst() { _ = attest_sk_X509_push(untrusted, certificate.x509) }
        guard let ctx = X509_STORE_CTX_new() else { throw ChainError.invalid("X509_STORE_CTX_new failed") }
        defer { X509_STORE_CTX_free(ctx) }
        guard X509_STORE_CTX_init(ctx, store, certificates[0].x509, untrusted) == 1 else {
            throw ChainError.invalid("X509_STORE_CTX_init: \(openSSLErrorText())")
        }
        X509_STORE_CTX_set_flags(ctx, UInt(X509_V_FLAG_NO_CHECK_TIME | X509_V_FLAG_X509_STRICT))
        guard X509_verify_cert(ctx) == 1 else {
            let code = X509_STORE_CTX_get_error(ctx)
            let reason = String(cString: X509_verify_cert_error_string(Int(code)))
            ERR_clear_error()
            throw ChainError.invalid("intermediate \(certificates[0].subjectName) does not verify to a trust anchor: \(reason)")
        }
        // The path OpenSSL actually built (intermediate … anchor): each of these has its validity
        // period checked on every call.
        guard let built = X509_STORE_CTX_get0_chain(ctx) else { throw ChainError.invalid("no chain built") }
        let builtCount = attest_sk_X509_num(built)
        guard builtCount >= 2, let top = attest_sk_X509_value(built, builtCount - 1),
              anchors.contains(where: { X509_cmp($0.x509, top) == 0 }) else {
            throw ChainError.invalid("chain did not end at a configured trust anchor")
        }
        var path: [Certificate] = []
        for index in 0..<builtCount {
            guard let x509 = attest_sk_X509_value(built, index) else { throw ChainError.invalid("built chain is incomplete") }
            do { path.append(try Certificate(copying: x509)) } catch { throw ChainError.invalid("built chain: \(error)") }
        }
        let issuer = certificates[0]
        let issuerKey: ECPublicKey
        do { issuerKey = try issuer.publicKey() } catch { throw ChainError.invalid("intermediate key: \(error)") }
        return VerifiedPath(issuer: issuer, issuerKey: issuerKey, issuerSubject: issuer.subjectDER, certificates: path)
    }
}
