import COpenSSL
import Foundation

public struct CryptoError: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ description: String) { self.description = description }
    static func openSSL(_ what: String) -> CryptoError { CryptoError("\(what): \(openSSLErrorText())") }
}

/// An EC public key, parsed once and reused: device keys are kept in this form so that
/// verifying an assertion does not rebuild the key.
// Safe: the EVP_PKEY is never mutated after init, and OpenSSL 3 allows concurrent verifications with one key.
public final class ECPublicKey: @unchecked Sendable {
    let pkey: OpaquePointer
    /// The uncompressed X9.62 point (0x04 ‖ X ‖ Y).
    public let x962: [UInt8]

    /// Takes ownership of `pkey`.
    init(owning pkey: OpaquePointer) throws {
        self.pkey = pkey
        var point: UnsafeMutablePointer<UInt8>?
        let length = EVP_PKEY_get1_encoded_public_key(pkey, &point)
        guard length > 0, let point else {
            EVP_PKEY_free(pkey)
            throw CryptoError.openSSL("cannot encode EC public key")
        }
        x962 = Array(UnsafeBufferPointer(start: point, count: length))
        attest_openssl_free(point)
    }

    /// A P-256 key from its uncompressed X9.62 point; rejects points not on the curve.
    public convenience init(p256Point point: [UInt8]) throws {
        guard point.count == 65, point.first == 0x04 else {
            throw CryptoError("a P-256 public key is a 65-byte uncompressed point, got \(point.count) bytes")
        }
        let pkey = point.withUnsafeBufferPointer { attest_ec_public_key_from_point("P-256", $0.baseAddress, $0.count) }
        guard let pkey else { throw CryptoError.openSSL("not a valid P-256 point") }
        try self.init(owning: pkey)
    }

    /// From a PEM `PUBLIC KEY` (SubjectPublicKeyInfo).
    public convenience init(pem: String) throws {
        let bio = try MemoryBIO(pem)
        guard let pkey = PEM_read_bio_PUBKEY(bio.bio, nil, nil, nil) else { throw CryptoError.openSSL("cannot read PEM public key") }
        try self.init(owning: pkey)
    }

    deinit { EVP_PKEY_free(pkey) }

    /// The curve's name as OpenSSL knows it ("prime256v1", "secp384r1"), or nil for non-EC keys.
    public var curveName: String? {
        guard EVP_PKEY_get_base_id(pkey) == EVP_PKEY_EC else { return nil }
        var name = [CChar](repeating: 0, count: 64)
        var length = 0
        guard EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME, &name, name.count, &length) == 1 else { return nil }
        return String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    public var isP256: Bool { curveName == "prime256v1" }

    /// Verifies a DER-encoded ECDSA signature over a precomputed digest.
    public func isValidSignature(_ derSignature: [UInt8], digest: [UInt8]) -> Bool {
        guard let ctx = EVP_PKEY_CTX_new(pkey, nil) else { return false }
        defer { EVP_PKEY_CTX_free(ctx) }
        guard EVP_PKEY_verify_init(ctx) == 1 else { return false }
        let result = derSignature.withUnsafeBufferPointer { sig in
            digest.withUnsafeBufferPointer { dig in
                EVP_PKEY_verify(ctx, sig.baseAddress, sig.count, dig.baseAddress, dig.count)
            }
        }
        ERR_clear_error()
        return result == 1
    }

    /// Verifies an ECDSA-SHA256 signature over `message`.
    public func isValidSignature(_ derSignature: [UInt8], sha256Of message: [UInt8]) -> Bool {
        isValidSignature(derSignature, digest: sha256(message))
    }

    /// SubjectPublicKeyInfo PEM, for operators and the CLI.
    public var pem: String {
        guard let bio = BIO_new(BIO_s_mem()) else { return "" }
        defer { BIO_free(bio) }
        guard PEM_write_bio_PUBKEY(bio, pkey) == 1 else { return "" }
        return MemoryBIO.string(from: bio)
    }
}

/// An EC private key (P-256 device keys and the test authority's P-384 CA keys).
// Safe: the EVP_PKEY is never mutated after init; a signing context is used by one thread at a
// time (taken from `idleSigners` under `signersLock`, given back after the signature).
public final class ECPrivateKey: @unchecked Sendable {
    let pkey: OpaquePointer
    /// Signing contexts initialised once and reused: OpenSSL allows EVP_PKEY_sign again on a
    /// context with the same parameters, and a fresh one (algorithm fetch, init) cost the load
    /// generator a fifth of each signature.
    private var idleSigners: [OpaquePointer] = []
    private let signersLock = NSLock()

    init(owning pkey: OpaquePointer) { self.pkey = pkey }
    deinit {
        idleSigners.forEach { EVP_PKEY_CTX_free($0) }
        EVP_PKEY_free(pkey)
    }

    /// A fresh key on "P-256" or "P-384".
    public static func generate(curve: String = "P-256") throws -> ECPrivateKey {
        guard let ctx = EVP_PKEY_CTX_new_from_name(nil, "EC", nil) else { throw CryptoError.openSSL("EVP_PKEY_CTX_new_from_name") }
        defer { EVP_PKEY_CTX_free(ctx) }
        var pkey: OpaquePointer?
        guard EVP_PKEY_keygen_init(ctx) == 1, EVP_PKEY_CTX_set_group_name(ctx, curve) == 1,
              EVP_PKEY_generate(ctx, &pkey) == 1, let pkey else { throw CryptoError.openSSL("EC key generation") }
        return ECPrivateKey(owning: pkey)
    }

    public convenience init(pem: String) throws {
        let bio = try MemoryBIO(pem)
        guard let pkey = PEM_read_bio_PrivateKey(bio.bio, nil, nil, nil) else { throw CryptoError.openSSL("cannot read PEM private key") }
        self.init(owning: pkey)
    }

    /// PKCS#8 PEM, unencrypted (test authority and simulated devices only).
    public var pem: String {
        guard let bio = BIO_new(BIO_s_mem()) else { return "" }
        defer { BIO_free(bio) }
        guard PEM_write_bio_PrivateKey(bio, pkey, nil, nil, 0, nil, nil) == 1 else { return "" }
        return MemoryBIO.string(from: bio)
    }

    public func publicKey() throws -> ECPublicKey {
        guard EVP_PKEY_up_ref(pkey) == 1 else { throw CryptoError.openSSL("EVP_PKEY_up_ref") }
        return try ECPublicKey(owning: pkey)
    }

    /// DER ECDSA signature of SHA-256(message).
    public func signSHA256(_ message: [UInt8]) throws -> [UInt8] {
        try sign(digest: sha256(message))
    }

    /// DER ECDSA signature of a precomputed digest.
    public func sign(digest: [UInt8]) throws -> [UInt8] {
        let ctx = try signersLock.withLock { idleSigners.popLast() } ?? newSigner()
        var length = 0
        let signature = digest.withUnsafeBufferPointer { dig -> [UInt8]? in
            guard EVP_PKEY_sign(ctx, nil, &length, dig.baseAddress, dig.count) == 1 else { return nil }
            var signature = [UInt8](repeating: 0, count: length)
            guard EVP_PKEY_sign(ctx, &signature, &length, dig.baseAddress, dig.count) == 1 else { return nil }
            return Array(signature.prefix(length))
        }
        guard let signature else {
            // A context that failed is not given back: its state is unknown.
            EVP_PKEY_CTX_free(ctx)
            throw CryptoError.openSSL("EVP_PKEY_sign")
        }
        signersLock.withLock { idleSigners.append(ctx) }
        return signature
    }

    private func newSigner() throws -> OpaquePointer {
        guard let ctx = EVP_PKEY_CTX_new(pkey, nil) else { throw CryptoError.openSSL("EVP_PKEY_CTX_new") }
        guard EVP_PKEY_sign_init(ctx) == 1 else {
            EVP_PKEY_CTX_free(ctx)
            throw CryptoError.openSSL("EVP_PKEY_sign_init")
        }
        return ctx
    }
}

/// A read-only memory BIO over a private copy of some bytes, freed with the object.
final class MemoryBIO {
    let bio: OpaquePointer
    private let storage: UnsafeMutableRawBufferPointer

    convenience init(_ text: String) throws { try self.init(Array(text.utf8)) }

    init(_ bytes: [UInt8]) throws {
        // BIO_new_mem_buf does not copy: keep the bytes at a stable address for the BIO's life.
        storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(bytes.count, 1), alignment: 1)
        storage.copyBytes(from: bytes)
        guard let bio = BIO_new_mem_buf(storage.baseAddress, Int32(bytes.count)) else {
            storage.deallocate()
            throw CryptoError.openSSL("BIO_new_mem_buf")
        }
        self.bio = bio
    }

    deinit {
        BIO_free(bio)
        storage.deallocate()
    }

    static func string(from bio: OpaquePointer) -> String {
        var pointer: UnsafeMutablePointer<CChar>?
        let length = attest_BIO_get_mem_data(bio, &pointer)
        guard length > 0, let pointer else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: length), as: UTF8.self)
    }
}
