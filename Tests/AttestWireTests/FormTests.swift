import AttestWire
import Testing

/// The token request's form body, both ways: what the client encodes the server decodes back,
/// and what is not percent-encoded UTF-8 is refused rather than repaired.
@Suite struct FormTests {
    @Test func encodedFieldsDecodeBackExactly() throws {
        let fields = ["grant_type": "urn:ietf:params:oauth:grant-type:assertion", "key_id": "ab+/cd==", "client_id": "clid_x",
                      "note": "é ü 漢字 🙂 & = %"]
        let body = FormEncoding.encode(fields)
        #expect(body.hasPrefix("client_id=clid_x&grant_type=urn%3Aietf"))  // sorted, ':' escaped
        #expect(!body.contains("+") && !body.contains("/"))
        #expect(try FormEncoding.decode(Array(body.utf8)) == fields)
    }

    @Test func plusIsASpaceAndEscapesAreEitherCase() throws {
        #expect(try FormEncoding.decode(Array("a=x+y&b=%2b%2F&c=".utf8)) == ["a": "x y", "b": "+/", "c": ""])
        #expect(FormEncoding.percentDecode(Array("%C3%A9".utf8)) == "é")
    }

    @Test(arguments: ["%FF", "%C3%28", "%C3", "%ED%A0%80", "%E", "%G0", "%"])
    func invalidUTF8OrEscapesAreRefused(encoded: String) {
        #expect(FormEncoding.percentDecode(Array(encoded.utf8)) == nil, "\(encoded)")
        #expect(throws: WireFormatError.self) { try FormEncoding.decode(Array("a=\(encoded)".utf8)) }
    }

    @Test func aFieldGivenTwiceIsRefused() {
        #expect(throws: WireFormatError.self) { try FormEncoding.decode(Array("a=1&a=1".utf8)) }
    }
}

extension FormTests {
    /// The token request's body, built from pairs, is the same as from the dictionary: sorted by
    /// name, everything but the unreserved characters escaped.
    @Test func tokenRequestBodyIsTheSortedEncodedForm() throws {
        let request = TokenRequest(clientID: "clid_ab", keyID: "k+/=", assertion: "o2Nm~._-")
        let expected = "assertion=o2Nm~._-&client_id=clid_ab&grant_type=urn%3Aanthropic%3Aparams%3Aoauth%3Agrant-type%3Aapp-attest&key_id=k%2B%2F%3D"
        #expect(request.formBody == expected)
        #expect(request.formBody == FormEncoding.encode(["grant_type": request.grantType, "client_id": request.clientID,
                                                         "key_id": request.keyID, "assertion": request.assertion]))
        #expect(try FormEncoding.decode(Array(request.formBody.utf8))["key_id"] == "k+/=")
    }
}
