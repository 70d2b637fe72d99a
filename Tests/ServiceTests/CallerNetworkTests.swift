import Testing
import HTTPServer
import HTTPRouting

/// What per-address limits count a caller as: an IPv6 address's network of the configured length,
/// an IPv4 address (an IPv4-mapped IPv6 one included) as itself.
@Suite struct CallerNetworkTests {
    @Test(arguments: [
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 64, "2001:db8:1:2::"),
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 56, "2001:db8:1::"),
        ("2001:db8:1:2ff:aaaa::1", 56, "2001:db8:1:200::"),
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 128, "2001:db8:1:2:aaaa:bbbb:cccc:dddd"),
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 96, "2001:db8:1:2:aaaa:bbbb::"),
        ("2001:db8:ffff:ffff:1::", 32, "2001:db8::"),
        ("203.0.113.7", 64, "203.0.113.7"),
        ("::ffff:203.0.113.7", 64, "203.0.113.7"),
    ])
    func anAddressCountsAsItsNetwork(_ address: String, _ prefix: Int, _ network: String) throws {
        let parsed = try #require(IPAddress(address))
        #expect(parsed.limitNetwork(ipv6PrefixLength: prefix).description == network)
    }

    @Test func theResolverKeysLimitsOnTheNetworkAndNamesTheCallerWhole() {
        let callers = CallerResolver(trustedProxies: [CIDR("127.0.0.1/32")!], ipv6PrefixLength: 64)
        let forwarded = [(name: "x-forwarded-for", value: "2001:db8:1:2::99")]
        #expect(callers.caller(peer: "127.0.0.1", headers: forwarded) == "2001:db8:1:2::99")
        #expect(callers.limitKey(peer: "127.0.0.1", headers: forwarded) == "2001:db8:1:2::/64")
        #expect(callers.limitKey(peer: "2001:db8:9:9::1", headers: forwarded) == "2001:db8:9:9::/64")
        #expect(callers.limitKey(peer: "198.51.100.4", headers: []) == "198.51.100.4")
        #expect(CallerResolver(trustedProxies: []).limitKey(peer: "2001:db8:9:9::1", headers: []) == "2001:db8:9:9::/64")
    }
}
