import AttestWire
import Foundation
import Testing

/// The flat JSON reader the load generator reads responses with: what JSONDecoder reads it
/// reads the same, and what is not one well-formed JSON object it refuses.
@Suite struct JSONObjectReaderTests {
    @Test func responsesReadBackAsJSONDecoderReadsThem() throws {
        let responses = [
            TokenResponse(accessToken: "at_x+/=", expiresIn: 3600, nextChallenge: "Y2hhbGxlbmdl", nextChallengeExpiresIn: 300),
            TokenResponse(accessToken: "at_y", expiresIn: 1, nextChallenge: nil, nextChallengeExpiresIn: nil),
        ]
        for response in responses {
            let body = Array(response.json.utf8)
            let read = try #require(TokenResponse(json: body))
            #expect(read == response)
            #expect(read == (try JSONDecoder().decode(TokenResponse.self, from: Data(body))))
        }
        let challenge = ChallengeResponse(challenge: "q83v", expiresIn: 300)
        #expect(ChallengeResponse(json: Array(challenge.json.utf8)) == challenge)
    }

    @Test func escapesWhitespaceNumbersAndNestedValues() throws {
        let body = #" { "a" : "q\"\\\/\b\f\n\r\t\u00e9\ud83d\ude42" , "n":-12.5e1, "z":0, "t":true,"f":false, "x":null,"#
            + #" "o": {"p": [1, {"q": "r"}, []], "s": {}}, "e": "" } "#
        let members = try #require(JSONObjectReader.members(Array(body.utf8)))
        #expect(members["a"] == .string("q\"\\/\u{08}\u{0c}\n\r\té🙂"))
        #expect(members["n"] == .number(-125))
        #expect(members["z"] == .number(0))
        #expect(members["t"] == .bool(true) && members["f"] == .bool(false) && members["x"] == .null)
        #expect(members["o"] == .nested && members["e"] == .string(""))
        #expect(members.count == 8)
        // Raw UTF-8 in a string is kept as it is.
        #expect(JSONObjectReader.members(Array(#"{"k":"漢字 é"}"#.utf8))?["k"] == .string("漢字 é"))
    }

    @Test(arguments: [
        "", " ", "{", "}", "[]", "[1]", "\"a\"", "1", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{,}", "{\"a\":1} x", "{\"a\":1}{}",
        "{a:1}", "{'a':1}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":1e}", "{\"a\":-}", "{\"a\":+1}", "{\"a\":tru}",
        "{\"a\":nul}", "{\"a\":\"x}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\\udc00\"}",
        "{\"a\":\"\\ud800\\u0041\"}", "{\"a\":\"\u{01}\"}", "{\"a\":\"\n\"}", "{\"a\":1,\"a\":2}", "{\"a\":[1,]}", "{\"a\":[1 2]}",
        "{\"a\":{\"b\"}}", "{\"a\":{1:2}}",
    ])
    func malformedBodiesAreRefused(body: String) {
        #expect(JSONObjectReader.members(Array(body.utf8)) == nil, "\(body)")
    }

    @Test func invalidUTF8AndDeepNestingAreRefusedWithoutACrash() {
        #expect(JSONObjectReader.members(Array("{\"a\":\"".utf8) + [0xff] + Array("\"}".utf8)) == nil)
        #expect(JSONObjectReader.members(Array("{\"a\":\"".utf8) + [0xc3] + Array("\"}".utf8)) == nil)
        let deep = "{\"a\":" + String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000) + "}"
        #expect(JSONObjectReader.members(Array(deep.utf8)) == nil)
        let allowed = "{\"a\":" + String(repeating: "[", count: 63) + String(repeating: "]", count: 63) + "}"
        #expect(JSONObjectReader.members(Array(allowed.utf8))?["a"] == .nested)
    }

    @Test func aMemberOfTheWrongTypeFailsTheResponseAsJSONDecoderWould() {
        for body in [#"{"access_token":1}"#, #"{"expires_in":"3600"}"#, #"{"next_challenge":{}}"#] {
            #expect(TokenResponse(json: Array(body.utf8)) == nil, "\(body)")
            #expect((try? JSONDecoder().decode(TokenResponse.self, from: Data(body.utf8))) == nil, "\(body)")
        }
        #expect(TokenResponse(json: Array(#"{"access_token":null}"#.utf8)) == TokenResponse(json: Array("{}".utf8)))
        #expect(ChallengeResponse(json: Array(#"{"challenge":true}"#.utf8)) == nil)
    }
}
