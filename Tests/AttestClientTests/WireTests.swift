import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing
@testable import AttestClient
import AttestWire

@Suite struct WireTests {
    @Test func registrationClientDataHashMatchesGoldenVector() {
        let challenge = [UInt8](repeating: 0x01, count: 32)
        #expect(hexString(Wire.registrationClientDataHash(challenge: challenge))
            == "72cd6e8422c407fb6d098690f1130b7ded7ec2f7f5e1d30bd9d521f015363793")
    }

    @Test func tokenClientDataHashMatchesGoldenVector() {
        let hash = Wire.tokenClientDataHash(challenge: [UInt8](repeating: 0x01, count: 32), clientID: "clid_test",
                                            rawKeyID: [UInt8](repeating: 0x07, count: 32))
        #expect(hexString(hash) == "cdc917d0f99d66de670d66db7cfdc90b8f34be288cabe3f1bb63c1e19b2a0b23")
    }

    @Test(arguments: ["+/8=", "+/8", "-_8=", "-_8"])
    func base64AcceptsBothAlphabetsPaddedOrNot(_ text: String) {
        #expect(Base64.decode(text) == [0xFB, 0xFF])
    }

    @Test(arguments: ["a", "ab!c", "+/8 ", "abcde"])
    func base64RejectsGarbage(_ text: String) {
        #expect(Base64.decode(text) == nil)
    }

    @Test func formBodyIsSortedAndEscaped() {
        let body = FormEncoding.encode(["key_id": "a+b/c=", "grant_type": WireProtocol.grantType, "client_id": "clid_x", "assertion": "z~.-_"])
        #expect(body == "assertion=z~.-_&client_id=clid_x"
            + "&grant_type=urn%3Aanthropic%3Aparams%3Aoauth%3Agrant-type%3Aapp-attest&key_id=a%2Bb%2Fc%3D")
    }

    @Test func tokenRequestIsAFormPost() throws {
        let assertion = Data([0xFB, 0xFF, 0x01])
        let request = Wire.tokenRequest(baseURL: URL(string: "https://h.test/base/")!, clientID: "clid_test",
                                        keyID: FakeAttester.keyID(number: 1), assertion: assertion)
        #expect(request.url?.absoluteString == "https://h.test/base/v1/oauth/token")
        #expect(request.httpMethod == "POST")
        #expect(request.value(forHTTPHeaderField: "Content-Type") == "application/x-www-form-urlencoded")
        let body = String(decoding: try #require(request.httpBody), as: UTF8.self)
        #expect(!body.contains("+") && !body.contains("/"))
        #expect(body.split(separator: "&").map { $0.split(separator: "=")[0] } == ["assertion", "client_id", "grant_type", "key_id"])
        let fields = try #require(FakeServer.parseForm(body))
        #expect(fields["assertion"] == assertion.base64EncodedString())
        #expect(fields["key_id"] == FakeAttester.keyID(number: 1))
    }

    @Test func jsonRequestsCarryTheProtocolFields() throws {
        let base = URL(string: "https://h.test")!
        let challenge = Wire.challengeRequest(baseURL: base, clientID: "clid_test", keyID: "k+/=")
        #expect(challenge.url?.absoluteString == "https://h.test/v1/oauth/app-attest/challenge")
        #expect(challenge.value(forHTTPHeaderField: "Content-Type") == "application/json")
        #expect(try JSONDecoder().decode([String: String].self, from: #require(challenge.httpBody))
            == ["client_id": "clid_test", "key_id": "k+/="])

        let register = Wire.registerRequest(baseURL: base, clientID: "clid_test", keyID: "k", attestation: Data([1, 2, 3]))
        #expect(register.url?.absoluteString == "https://h.test/v1/oauth/app-attest/register")
        #expect(try JSONDecoder().decode([String: String].self, from: #require(register.httpBody))
            == ["client_id": "clid_test", "key_id": "k", "attestation_object": "AQID"])
    }

    @Test func serverDurationsOutsideOneDayOrInvalidAreIgnored() {
        #expect(Wire.serverDuration(3600) == 3600)
        #expect(Wire.serverDuration(86_400) == 86_400)
        #expect(Wire.serverDuration(0) == 0)
        for bad in [-1, 86_401, .infinity, -.infinity, .nan] as [Double] {
            #expect(Wire.serverDuration(bad) == nil)
        }
        #expect(Wire.serverDuration(nil) == nil)
        #expect(Wire.retryAfter("120") == 120)
        #expect(Wire.retryAfter(" 5 ") == 5)
        for bad in ["abc", "-3", "100000", "inf", "nan", ""] {
            #expect(Wire.retryAfter(bad) == nil)
        }
        #expect(Wire.retryAfter(nil) == nil)
    }

    @Test(arguments: [
        #"{"access_token":"t","expires_in":0}"#,
        #"{"access_token":"t","expires_in":-5}"#,
        #"{"access_token":"t","expires_in":172800}"#,
        #"{"access_token":"t"}"#,
        #"{"access_token":"","expires_in":60}"#,
        #"{"expires_in":60}"#,
        #"{"access_token":"t","expires_in":"60"}"#,
        "not json",
    ])
    func malformedTokenResponsesAreRejected(_ body: String) {
        #expect(throws: AttestClientError.self) { try Wire.parseTokenGrant(Data(body.utf8)) }
    }

    @Test func unusableNextChallengeIsDroppedNotFatal() throws {
        let grant = try Wire.parseTokenGrant(Data(#"{"access_token":"t","expires_in":60,"next_challenge":"short","next_challenge_expires_in":999999}"#.utf8))
        #expect(grant.accessToken == "t" && grant.expiresIn == 60)
        #expect(grant.nextChallenge == nil)
        #expect(grant.nextChallengeExpiresIn == nil)
    }

    @Test func challengeMustBe32Bytes() {
        #expect(throws: AttestClientError.self) {
            try Wire.parseChallenge(Data(#"{"challenge":"AQID","expires_in":300}"#.utf8))
        }
        let urlSafe = Data([UInt8](repeating: 0xFB, count: 32)).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "=", with: "")
        let parsed = try? Wire.parseChallenge(Data(#"{"challenge":"\#(urlSafe)"}"#.utf8))
        #expect(parsed?.bytes == [UInt8](repeating: 0xFB, count: 32))
    }

    @Test func errorCodeReadsBothShapes() {
        #expect(Wire.errorCode(Data(#"{"error":"invalid_grant"}"#.utf8)) == "invalid_grant")
        #expect(Wire.errorCode(Data(#"{"type":"error","error":{"type":"authentication_error"}}"#.utf8)) == "authentication_error")
        #expect(Wire.errorCode(Data("oops".utf8)) == nil)
    }
}
