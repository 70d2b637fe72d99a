import AttestWire
import Foundation
import Testing

/// Log lines and response bodies are JSON written by hand: every string must come back out of a
/// real JSON parser as it went in, whether or not it needed escaping.
@Suite struct JSONTextTests {
    static let samples = ["", "plain", "req_AbC-_09", "quote \" inside", "back\\slash", "line\nbreak\r\ttab",
                          "\u{0}\u{1}\u{1f} controls", "é ü 漢字 🙂", "\u{7f} delete", String(repeating: "x", count: 300) + "\""]

    @Test(arguments: samples)
    func stringsRoundTripThroughAJSONParser(text: String) throws {
        let literal = JSONText.string(text)
        let decoded = try JSONSerialization.jsonObject(with: Data(("[" + literal + "]").utf8)) as? [String]
        #expect(decoded == [text])
        #expect(!literal.utf8.contains { $0 < 0x20 }, "raw control byte in \(literal)")
        var appended = "prefix"
        JSONText.appendString(text, to: &appended)
        #expect(appended == "prefix" + literal)
    }

    @Test func aBridgedStringIsEscapedToo() throws {
        // Not native UTF-8 storage: the escaping check must not rely on contiguous bytes.
        let bridged = NSString(string: "a \"quoted\" word\n").description
        let decoded = try JSONSerialization.jsonObject(with: Data(("[" + JSONText.string(bridged) + "]").utf8)) as? [String]
        #expect(decoded == ["a \"quoted\" word\n"])
    }

    @Test func objectsKeepTheirFieldOrder() throws {
        let text = JSONText.object([("b", 1), ("a", "x\"y"), ("c", true), ("d", [("e", Int64(-2))]), ("f", ["g", "h\\"])])
        #expect(text == #"{"b":1,"a":"x\"y","c":true,"d":{"e":-2},"f":["g","h\\"]}"#)
        #expect(try JSONSerialization.jsonObject(with: Data(text.utf8)) is [String: Any])
    }
}
