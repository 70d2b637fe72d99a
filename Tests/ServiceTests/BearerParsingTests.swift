@testable import HTTPRouting
import Testing

/// The Authorization header read on every relayed request: scheme in any case, blanks around
/// the token dropped, anything else no token at all.
@Suite struct BearerParsingTests {
    @Test(arguments: [
        ("Bearer at_abc", "at_abc"), ("bearer at_abc", "at_abc"), ("BEARER at_abc", "at_abc"),
        ("Bearer   at_abc \t", "at_abc"), ("Bearer \tat_abc", "at_abc"), ("Bearer at_a b", "at_a b"),
        // Read as bytes: a combining mark after the blank stays with the token, the blank does not.
        ("Bearer \u{301}tok", "\u{301}tok"),
    ])
    func readsTheToken(header: String, token: String) {
        #expect(RequestParsing.bearer(header) == token)
    }

    @Test(arguments: ["Bearer", "Bearer ", "Bearer    ", "Bearer \t ", "Basic at_abc", "Bearerat_abc", "Bearer_at_abc",
                      "Token at_abc", "", "Béarer at_abc"])
    func refusesAnythingElse(header: String) {
        #expect(RequestParsing.bearer(header) == nil)
    }

    @Test func noHeaderIsNoToken() {
        #expect(RequestParsing.bearer(nil) == nil)
    }
}
