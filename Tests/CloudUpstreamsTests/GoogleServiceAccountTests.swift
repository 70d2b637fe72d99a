import AttestWire
@testable import CloudUpstreams
import COpenSSL
import Foundation
import Testing

/// Keys made once per run with OpenSSL (an RSA key takes a moment to generate).
private enum TestKeys {
    static let rsa = generatedPEM(algorithm: "RSA") { EVP_PKEY_CTX_set_rsa_keygen_bits($0, 2048) == 1 }
    static let ec = generatedPEM(algorithm: "EC") { EVP_PKEY_CTX_set_group_name($0, "P-256") == 1 }

    /// (PKCS#8 private key PEM, SubjectPublicKeyInfo PEM)
    static func generatedPEM(algorithm: String, _ configure: (OpaquePointer) -> Bool) -> (privateKey: String, publicKey: String) {
        let context = EVP_PKEY_CTX_new_from_name(nil, algorithm, nil)!
        defer { EVP_PKEY_CTX_free(context) }
        var pkey: OpaquePointer?
        precondition(EVP_PKEY_keygen_init(context) == 1 && configure(context) && EVP_PKEY_generate(context, &pkey) == 1)
        defer { EVP_PKEY_free(pkey) }
        return (pem { PEM_write_bio_PrivateKey($0, pkey, nil, nil, 0, nil, nil) }, pem { PEM_write_bio_PUBKEY($0, pkey) })
    }

    static func pem(_ write: (OpaquePointer) -> Int32) -> String {
        let bio = BIO_new(BIO_s_mem())!
        defer { BIO_free(bio) }
        precondition(write(bio) == 1)
        var pointer: UnsafeMutablePointer<CChar>?
        let length = attest_BIO_get_mem_data(bio, &pointer)
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: length), as: UTF8.self)
    }
}

private func keyFile(_ fields: [String: Any]) -> [UInt8] {
    Array(try! JSONSerialization.data(withJSONObject: fields))
}

private func standardFields(privateKey: String = TestKeys.rsa.privateKey) -> [String: Any] {
    [
        "type": "service_account", "project_id": "relay-test", "private_key_id": "0123456789abcdef0123456789abcdef01234567",
        "private_key": privateKey, "client_email": "relay@relay-test.iam.gserviceaccount.com", "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token", "universe_domain": "googleapis.com",
    ]
}

@Suite struct GoogleServiceAccountTests {
    @Test func readsTheKeyFile() throws {
        let account = try GoogleServiceAccount(keyFile: keyFile(standardFields()))
        #expect(account.clientEmail == "relay@relay-test.iam.gserviceaccount.com")
        #expect(account.privateKeyID == "0123456789abcdef0123456789abcdef01234567")
        #expect(account.tokenURI == "https://oauth2.googleapis.com/token")
        #expect(account.projectID == "relay-test")
        #expect(!"\(account)".contains("PRIVATE"))
    }

    @Test func theAssertionIsAnRS256JWTThatVerifiesWithThePublicKey() throws {
        let account = try GoogleServiceAccount(keyFile: keyFile(standardFields()))
        let jwt = try account.assertion(scope: "https://www.googleapis.com/auth/cloud-platform", audience: account.tokenURI,
                                        issuedAt: 1_700_000_000, lifetime: 1800)
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        #expect(parts.count == 3)
        #expect(!jwt.contains("=") && !jwt.contains("+") && !jwt.contains("/"))
        #expect(String(decoding: base64URLDecode(parts[0]), as: UTF8.self)
            == #"{"alg":"RS256","typ":"JWT","kid":"0123456789abcdef0123456789abcdef01234567"}"#)
        let claims = try #require(try JSONSerialization.jsonObject(with: Data(base64URLDecode(parts[1]))) as? [String: Any])
        #expect(claims["iss"] as? String == "relay@relay-test.iam.gserviceaccount.com")
        #expect(claims["scope"] as? String == "https://www.googleapis.com/auth/cloud-platform")
        #expect(claims["aud"] as? String == "https://oauth2.googleapis.com/token")
        #expect(claims["iat"] as? Int == 1_700_000_000)
        #expect(claims["exp"] as? Int == 1_700_001_800)
        #expect(claims.count == 5)
        let signature = base64URLDecode(parts[2])
        #expect(signature.count == 256)
        let signingInput = Array("\(parts[0]).\(parts[1])".utf8)
        #expect(verifyRS256(publicKeyPEM: TestKeys.rsa.publicKey, message: signingInput, signature: signature))
        // The verifier is not a rubber stamp.
        #expect(!verifyRS256(publicKeyPEM: TestKeys.rsa.publicKey, message: signingInput + [0x20], signature: signature))
        // PKCS#1 v1.5 is deterministic: the same claims give the same token.
        #expect(try account.assertion(scope: "https://www.googleapis.com/auth/cloud-platform", audience: account.tokenURI,
                                      issuedAt: 1_700_000_000, lifetime: 1800) == jwt)
    }

    @Test func claimsAreJSONEscapedAndLifetimeBounded() throws {
        var fields = standardFields()
        fields["client_email"] = "odd\"name\\@x"
        let account = try GoogleServiceAccount(keyFile: keyFile(fields))
        let jwt = try account.assertion(scope: "a b", audience: "aud", issuedAt: 10)
        let claims = String(decoding: base64URLDecode(String(jwt.split(separator: ".")[1])), as: UTF8.self)
        #expect(claims == #"{"iss":"odd\"name\\@x","scope":"a b","aud":"aud","iat":10,"exp":3610}"#)
        #expect(throws: GoogleServiceAccountError.invalidLifetime(3601)) { try account.assertion(scope: "s", audience: "a", issuedAt: 0, lifetime: 3601) }
        #expect(throws: GoogleServiceAccountError.invalidLifetime(0)) { try account.assertion(scope: "s", audience: "a", issuedAt: 0, lifetime: 0) }
    }

    @Test func theTokenRequestIsAFormWithTheGrantType() throws {
        let account = try GoogleServiceAccount(keyFile: keyFile(standardFields()))
        #expect(String(decoding: account.tokenRequestBody(assertion: "aaa.bbb.c-_c"), as: UTF8.self)
            == "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=aaa.bbb.c-_c")
        #expect(String(decoding: account.tokenRequestBody(assertion: "a+b/c="), as: UTF8.self).hasSuffix("&assertion=a%2Bb%2Fc%3D"))
    }

    @Test func tokenResponsesAreReadOrRefused() throws {
        let account = try GoogleServiceAccount(keyFile: keyFile(standardFields()))
        let ok = try account.parseTokenResponse(Array(#"{"access_token":"ya29.c.b0Aa\/x","expires_in":3599,"token_type":"Bearer"}"#.utf8))
        #expect(ok.accessToken == "ya29.c.b0Aa/x")
        #expect(ok.expiresIn == 3599)
        #expect(throws: GoogleServiceAccountError.tokenRefused(error: "invalid_grant", description: "Invalid JWT Signature.")) {
            try account.parseTokenResponse(Array(#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#.utf8))
        }
        #expect(throws: GoogleServiceAccountError.malformedTokenResponse("no access_token string")) {
            try account.parseTokenResponse(Array(#"{"expires_in":3599}"#.utf8))
        }
        #expect(throws: GoogleServiceAccountError.malformedTokenResponse("no positive integer expires_in")) {
            try account.parseTokenResponse(Array(#"{"access_token":"t","expires_in":"3599"}"#.utf8))
        }
        #expect(throws: GoogleServiceAccountError.malformedTokenResponse("not a JSON object")) {
            try account.parseTokenResponse(Array("<html>".utf8))
        }
    }

    @Test(arguments: ["type", "client_email", "private_key", "token_uri"])
    func aMissingFieldIsNamed(_ name: String) {
        var fields = standardFields()
        fields.removeValue(forKey: name)
        #expect(throws: GoogleServiceAccountError.missingField(name)) { try GoogleServiceAccount(keyFile: keyFile(fields)) }
        fields[name] = 7  // present, but not a string
        #expect(throws: GoogleServiceAccountError.missingField(name)) { try GoogleServiceAccount(keyFile: keyFile(fields)) }
    }

    @Test func aKeyWithoutItsIDSignsWithoutAKid() throws {
        var fields = standardFields()
        fields.removeValue(forKey: "private_key_id")
        let account = try GoogleServiceAccount(keyFile: keyFile(fields))
        #expect(account.privateKeyID == nil)
        let jwt = try account.assertion(scope: "s", audience: "https://example.com/token", issuedAt: 1_800_000_000)
        #expect(jwt.split(separator: ".").first.map(String.init) == Base64.encode(Array(#"{"alg":"RS256","typ":"JWT"}"#.utf8), urlSafe: true, padded: false))
    }

    @Test func otherKeyFilesAreRefused() {
        var fields = standardFields()
        fields["type"] = "authorized_user"
        #expect(throws: GoogleServiceAccountError.wrongType("authorized_user")) { try GoogleServiceAccount(keyFile: keyFile(fields)) }
        #expect(throws: GoogleServiceAccountError.notRSAKey("EC")) {
            try GoogleServiceAccount(keyFile: keyFile(standardFields(privateKey: TestKeys.ec.privateKey)))
        }
        #expect(throws: GoogleServiceAccountError.notJSONObject) { try GoogleServiceAccount(keyFile: Array("[1]".utf8)) }
        #expect(throws: GoogleServiceAccountError.notJSONObject) { try GoogleServiceAccount(keyFile: []) }
    }

    @Test func errorsNeverCarryTheKey() {
        // A damaged key: the base64 body is cut in the middle.
        let lines = TestKeys.rsa.privateKey.split(separator: "\n")
        let damaged = (lines.prefix(8) + lines.suffix(1)).joined(separator: "\n")
        var caught: GoogleServiceAccountError?
        do { _ = try GoogleServiceAccount(keyFile: keyFile(standardFields(privateKey: damaged))) } catch { caught = error }
        #expect(caught == .unreadablePrivateKey)
        let text = "\(caught.map { "\($0)" } ?? "")"
        #expect(!text.contains(String(lines[1].prefix(16))))
        #expect(text == "the key file's private_key is not an unencrypted PEM private key")
        // An encrypted key would need a passphrase: refused, not prompted for on the terminal.
        let encrypted = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIBvTBXBgkqhkiG9w0BBQ0wSjApBgkqhkiG9w0BBQwwHAQI\n-----END ENCRYPTED PRIVATE KEY-----\n"
        #expect(throws: GoogleServiceAccountError.unreadablePrivateKey) {
            try GoogleServiceAccount(keyFile: keyFile(standardFields(privateKey: encrypted)))
        }
    }
}

private func base64URLDecode(_ text: String) -> [UInt8] {
    var standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    standard += String(repeating: "=", count: (4 - standard.count % 4) % 4)
    return Array(Data(base64Encoded: standard) ?? Data())
}

/// RSASSA-PKCS1-v1_5 with SHA-256, checked by OpenSSL against the public key alone.
private func verifyRS256(publicKeyPEM: String, message: [UInt8], signature: [UInt8]) -> Bool {
    let pem = Array(publicKeyPEM.utf8)
    let key: OpaquePointer? = pem.withUnsafeBytes { bytes in
        let bio = BIO_new_mem_buf(bytes.baseAddress, Int32(bytes.count))
        defer { BIO_free(bio) }
        return PEM_read_bio_PUBKEY(bio, nil, nil, nil)
    }
    guard let key, let context = EVP_MD_CTX_new() else { return false }
    defer {
        EVP_MD_CTX_free(context)
        EVP_PKEY_free(key)
    }
    guard EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, key) == 1 else { return false }
    let result = EVP_DigestVerify(context, signature, signature.count, message, message.count)
    ERR_clear_error()
    return result == 1
}
