import Testing
@testable import ServiceRoutes

/// Request IDs come from a counter now, not the DRBG: they must still never repeat and keep
/// their shape (`req_` and 16 bytes, base64url).
@Suite struct RequestIDTests {
    @Test func idsAreDistinctAndKeepTheirShape() {
        let ids = (0..<100_000).map { _ in ServiceRouter.newRequestID() }
        #expect(Set(ids).count == ids.count)
        let alphabet = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        #expect(ids.allSatisfy { $0.hasPrefix("req_") && $0.count == 26 && $0.dropFirst(4).allSatisfy(alphabet.contains) })
        // Consecutive IDs share the process prefix but not the scrambled counter's bytes.
        #expect(ids[0].prefix(14) == ids[1].prefix(14))  // "req_" and the prefix's first 60 bits
        #expect(ids[0].suffix(10) != ids[1].suffix(10))
    }

    @Test func theScramblerIsABijectionOnASample() {
        var seen = Set<UInt64>()
        for value in UInt64(0)..<50_000 { seen.insert(ServiceRouter.scrambled(value)) }
        for shift in 0..<64 { seen.insert(ServiceRouter.scrambled(UInt64(1) << UInt64(shift) | 0x8000_0000_0000_0000)) }
        #expect(seen.count == 50_000 + 64)  // no two inputs (all distinct) collide
    }
}
