// Google's OAuth 2.0 grant for service accounts (RFC 7523): an RS256 JWT signed with the key
// file's private key, exchanged at the token URI for an access token (Vertex AI).
import AttestWire
import COpenSSL

/// A service account from its JSON key file. Error texts and `description` never carry the key.
public struct GoogleServiceAccount: Sendable, CustomStringConvertible {
    public let clientEmail: String
    /// The key's ID, sent as the JWT's `kid` when the file has one.
    public let privateKeyID: String?
    public let tokenURI: String
    public let projectID: String?
    private let key: RSASigningKey

    public init(keyFile json: [UInt8]) throws(GoogleServiceAccountError) {
        var strings: [String: [UInt8]] = [:]
        let isObject = json.withUnsafeBytes { bytes in
            JSONScan.forEachMember(of: bytes) { name, value in
                if let string = JSONScan.string(bytes, value) { strings[String(decoding: name, as: UTF8.self)] = string }
            }
        }
        guard isObject else { throw .notJSONObject }
        func field(_ name: String) throws(GoogleServiceAccountError) -> [UInt8] {
            guard let value = strings[name], !value.isEmpty else { throw .missingField(name) }
            return value
        }
        let type = String(decoding: try field("type"), as: UTF8.self)
        guard type == "service_account" else { throw .wrongType(String(type.prefix(40))) }
        clientEmail = String(decoding: try field("client_email"), as: UTF8.self)
        privateKeyID = strings["private_key_id"].flatMap { $0.isEmpty ? nil : String(decoding: $0, as: UTF8.self) }
        tokenURI = String(decoding: try field("token_uri"), as: UTF8.self)
        projectID = strings["project_id"].map { String(decoding: $0, as: UTF8.self) }
        key = try RSASigningKey(pem: try field("private_key"))
    }

    public var description: String { "GoogleServiceAccount(\(clientEmail), key \(privateKeyID ?? "without an ID"))" }

    /// The signed JWT for the token request: RS256, `kid` the key's ID, claims `iss`, `scope`,
    /// `aud`, `iat` and `exp` = `iat` + `lifetime` (Google accepts at most an hour).
    public func assertion(scope: String, audience: String, issuedAt: Int, lifetime: Int = 3600) throws(GoogleServiceAccountError) -> String {
        guard (1...3600).contains(lifetime) else { throw .invalidLifetime(lifetime) }
        let header = #"{"alg":"RS256","typ":"JWT""# + (privateKeyID.map { #","kid":"# + JSONText.string($0) } ?? "") + "}"
        let claims = #"{"iss":"# + JSONText.string(clientEmail) + #","scope":"# + JSONText.string(scope) + #","aud":"#
            + JSONText.string(audience) + #","iat":\#(issuedAt),"exp":\#(issuedAt + lifetime)}"#
        let signingInput = Base64.encode(Array(header.utf8), urlSafe: true, padded: false) + "." + Base64.encode(Array(claims.utf8), urlSafe: true, padded: false)
        let signature = try key.signSHA256(Array(signingInput.utf8))
        return signingInput + "." + Base64.encode(signature, urlSafe: true, padded: false)
    }

    /// The form body that POSTs the assertion to `tokenURI`.
    public func tokenRequestBody(assertion: String) -> [UInt8] {
        var body = Array("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=".utf8)
        let hexDigits = Array("0123456789ABCDEF".utf8)
        for byte in assertion.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"):
                body.append(byte)
            default:
                body += [UInt8(ascii: "%"), hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0xf)]]
            }
        }
        return body
    }

    /// The access token and its lifetime in seconds from the token endpoint's JSON answer
    /// (`GoogleTokenResponse.parse`, which needs no key).
    public func parseTokenResponse(_ body: [UInt8]) throws(GoogleServiceAccountError) -> (accessToken: String, expiresIn: Int) {
        try GoogleTokenResponse.parse(body)
    }
}

/// An RSA private key that signs RS256 (RSASSA-PKCS1-v1_5 with SHA-256).
// @unchecked: the EVP_PKEY is never changed after loading, and each signature has its own context.
final class RSASigningKey: @unchecked Sendable {
    private let pkey: OpaquePointer

    init(pem: [UInt8]) throws(GoogleServiceAccountError) {
        let loaded: OpaquePointer? = pem.withUnsafeBytes { bytes in
            guard let bio = BIO_new_mem_buf(bytes.baseAddress, Int32(bytes.count)) else { return nil }
            defer { BIO_free(bio) }
            // A callback that gives no passphrase: OpenSSL's default would prompt on the terminal.
            return PEM_read_bio_PrivateKey(bio, nil, { _, _, _, _ in 0 }, nil)
        }
        // The queue may name what was wrong with the key's encoding: nothing of it is reported.
        ERR_clear_error()
        guard let loaded else { throw .unreadablePrivateKey }
        guard EVP_PKEY_is_a(loaded, "RSA") == 1 else {
            let type = EVP_PKEY_get0_type_name(loaded).map { String(cString: $0) } ?? "non-RSA"
            EVP_PKEY_free(loaded)
            throw .notRSAKey(type)
        }
        pkey = loaded
    }

    deinit { EVP_PKEY_free(pkey) }

    func signSHA256(_ message: [UInt8]) throws(GoogleServiceAccountError) -> [UInt8] {
        guard let context = EVP_MD_CTX_new() else { throw .signingFailed("EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, pkey) == 1 else { throw .signingFailed(openSSLError("EVP_DigestSignInit")) }
        var length = 0
        let signature = message.withUnsafeBufferPointer { message -> [UInt8]? in
            guard EVP_DigestSign(context, nil, &length, message.baseAddress, message.count) == 1 else { return nil }
            var signature = [UInt8](repeating: 0, count: length)
            guard EVP_DigestSign(context, &signature, &length, message.baseAddress, message.count) == 1 else { return nil }
            return Array(signature.prefix(length))
        }
        guard let signature else { throw .signingFailed(openSSLError("EVP_DigestSign")) }
        return signature
    }
}

/// The oldest queued OpenSSL error after `what`, the queue then cleared.
private func openSSLError(_ what: String) -> String {
    let code = ERR_get_error()
    ERR_clear_error()
    guard code != 0 else { return what }
    var buffer = [CChar](repeating: 0, count: 256)
    ERR_error_string_n(code, &buffer, buffer.count)
    return what + ": " + String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
