// Microsoft Entra ID's client credentials with a certificate: instead of a secret, the client
// sends a JWT it signed with the certificate's private key (RFC 7523 client authentication),
// and Entra checks it against the certificate registered for the application by its thumbprint.
import AttestCrypto
import AttestWire
import COpenSSL

/// An application's certificate and its private key, from one PEM file (the certificate and an
/// unencrypted private key, in either order). Error texts and `description` never carry the key.
public struct EntraClientCertificate: Sendable, CustomStringConvertible {
    /// The certificate's DER bytes.
    public let certificateDER: [UInt8]
    private let key: RSASigningKey

    public struct Failure: Error, CustomStringConvertible, Equatable {
        public let description: String
    }

    public init(pem: [UInt8]) throws(Failure) {
        let der: [UInt8]? = pem.withUnsafeBytes { bytes in
            guard let bio = BIO_new_mem_buf(bytes.baseAddress, Int32(bytes.count)) else { return nil }
            defer { BIO_free(bio) }
            guard let x509 = PEM_read_bio_X509(bio, nil, nil, nil) else { return nil }
            defer { X509_free(x509) }
            let length = i2d_X509(x509, nil)
            guard length > 0 else { return nil }
            var out = [UInt8](repeating: 0, count: Int(length))
            let written = out.withUnsafeMutableBufferPointer { buffer -> Int32 in
                var cursor = buffer.baseAddress
                return i2d_X509(x509, &cursor)
            }
            return written == length ? out : nil
        }
        ERR_clear_error()
        guard let der else { throw Failure(description: "the file holds no PEM certificate (BEGIN CERTIFICATE)") }
        certificateDER = der
        do {
            key = try RSASigningKey(pem: pem)
        } catch {
            throw Failure(description: "the file's private key: \(error)")
        }
        guard Self.keyMatches(certificate: der, key: pem) else {
            throw Failure(description: "the private key is not the certificate's")
        }
    }

    /// Whether the PEM's private key belongs to the certificate (OpenSSL's X509_check_private_key).
    private static func keyMatches(certificate der: [UInt8], key pem: [UInt8]) -> Bool {
        let result: Bool = der.withUnsafeBufferPointer { derBytes in
            var cursor = derBytes.baseAddress
            guard let x509 = d2i_X509(nil, &cursor, derBytes.count) else { return false }
            defer { X509_free(x509) }
            return pem.withUnsafeBytes { bytes in
                guard let bio = BIO_new_mem_buf(bytes.baseAddress, Int32(bytes.count)) else { return false }
                defer { BIO_free(bio) }
                guard let pkey = PEM_read_bio_PrivateKey(bio, nil, { _, _, _, _ in 0 }, nil) else { return false }
                defer { EVP_PKEY_free(pkey) }
                return X509_check_private_key(x509, pkey) == 1
            }
        }
        ERR_clear_error()
        return result
    }

    public var description: String { "EntraClientCertificate(x5t#S256 \(thumbprintSHA256))" }

    /// `x5t#S256`: the certificate's SHA-256 thumbprint, base64url.
    public var thumbprintSHA256: String { Base64.encode(sha256(certificateDER), urlSafe: true, padded: false) }

    /// `x5t`: the certificate's SHA-1 thumbprint, base64url (what Entra matched before SHA-256).
    public var thumbprintSHA1: String {
        var digest = [UInt8](repeating: 0, count: 20)
        certificateDER.withUnsafeBufferPointer { input in
            digest.withUnsafeMutableBufferPointer { output in
                _ = EVP_Digest(input.baseAddress, input.count, output.baseAddress, nil, EVP_sha1(), nil)
            }
        }
        return Base64.encode(digest, urlSafe: true, padded: false)
    }

    /// The client assertion: RS256, headers `x5t#S256` and `x5t`; claims `aud` the token endpoint,
    /// `iss` and `sub` the application (client) ID, a random `jti`, `nbf`/`iat` now, `exp` ten
    /// minutes on (Entra refuses assertions that live long).
    public func assertion(clientID: String, audience: String, issuedAt: Int, lifetime: Int = 600) throws(Failure) -> String {
        let header = #"{"alg":"RS256","typ":"JWT","x5t":"# + JSONText.string(thumbprintSHA1) + #","x5t#S256":"# + JSONText.string(thumbprintSHA256) + "}"
        let jti = hexString(secureRandomBytes(16))
        let claims = #"{"aud":"# + JSONText.string(audience) + #","iss":"# + JSONText.string(clientID) + #","sub":"# + JSONText.string(clientID)
            + #","jti":"# + JSONText.string(jti) + #","nbf":\#(issuedAt),"iat":\#(issuedAt),"exp":\#(issuedAt + lifetime)}"#
        let input = Base64.encode(Array(header.utf8), urlSafe: true, padded: false) + "." + Base64.encode(Array(claims.utf8), urlSafe: true, padded: false)
        do {
            return input + "." + Base64.encode(try key.signSHA256(Array(input.utf8)), urlSafe: true, padded: false)
        } catch {
            throw Failure(description: "signing the client assertion failed: \(error)")
        }
    }
}
