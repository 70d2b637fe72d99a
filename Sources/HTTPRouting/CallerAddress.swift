import HTTPServer
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An IPv4 or IPv6 network: `10.0.0.0/8`, `::1/128`, or a bare address (a /32 or /128).
public struct CIDR: Sendable, Equatable, CustomStringConvertible {
    let network: IPAddress
    let prefix: Int
    public let description: String

    public init?(_ text: String) {
        let parts = text.split(separator: "/", maxSplits: 1)
        guard let address = IPAddress(String(parts[0])) else { return nil }
        let bits = address.isIPv6 ? 128 : 32
        if parts.count == 2 {
            guard let prefix = Int(parts[1]), (0...bits).contains(prefix) else { return nil }
            self.prefix = prefix
        } else {
            prefix = bits
        }
        network = address
        description = text
    }

    public func contains(_ address: IPAddress) -> Bool {
        guard address.isIPv6 == network.isIPv6 else { return false }
        let (bytes, mine) = (address.bytes, network.bytes)
        var remaining = prefix
        for index in mine.indices where remaining > 0 {
            let mask: UInt8 = remaining >= 8 ? 0xff : ~(0xff >> UInt8(remaining))
            guard bytes[index] & mask == mine[index] & mask else { return false }
            remaining -= 8
        }
        return true
    }
}

/// The one header a trusted proxy writes the client's address into (`--trusted-proxy-header`).
public enum ForwardingHeader: String, Sendable, CaseIterable {
    case xForwardedFor = "x-forwarded-for"
    case forwarded
}

/// Who is calling: the TCP peer, unless the peer is a trusted proxy, in which case the right-most
/// address of the one header that proxy writes (`X-Forwarded-For` by default, or `Forwarded:
/// for=`) that is not itself a trusted proxy. The other header is ignored, whoever sends it: a
/// proxy appends to the header it writes and passes the other through as the client sent it, so
/// reading both would let a client put its own hop last. From anyone else both are ignored: a
/// client cannot choose its own rate-limit bucket.
public struct CallerResolver: Sendable {
    public let trustedProxies: [CIDR]
    public let header: ForwardingHeader
    /// How much of an IPv6 caller's address its limits key on (`--ipv6-prefix-length`).
    public let ipv6PrefixLength: Int
    public static let defaultIPv6PrefixLength = 64

    public init(trustedProxies: [CIDR], header: ForwardingHeader = .xForwardedFor, ipv6PrefixLength: Int = defaultIPv6PrefixLength) {
        self.trustedProxies = trustedProxies
        self.header = header
        self.ipv6PrefixLength = ipv6PrefixLength
    }

    /// The bucket per-address limits and the fair queue count the caller under: an IPv6 caller
    /// as its network (`2001:db8:1:2::/64`), an IPv4 one as its address. The log keeps the whole
    /// address (`caller`).
    public func limitKey(peer: String, headers: [(name: String, value: String)]) -> String {
        let caller = caller(peer: peer, headers: headers)
        guard let address = IPAddress(caller), address.isIPv6 else { return caller }
        return "\(address.limitNetwork(ipv6PrefixLength: ipv6PrefixLength))/\(ipv6PrefixLength)"
    }

    public func isTrusted(_ address: String) -> Bool {
        guard !trustedProxies.isEmpty, let parsed = IPAddress(address) else { return false }
        return trustedProxies.contains { $0.contains(parsed) }
    }

    public func caller(peer: String, headers: [(name: String, value: String)]) -> String {
        guard isTrusted(peer) else { return peer }
        var hops: [String] = []
        for header in headers {
            guard header.name == self.header.rawValue else { continue }
            if self.header == .xForwardedFor {
                hops += header.value.split(separator: ",").map { String($0) }
            } else {
                for element in header.value.split(separator: ",") {
                    for pair in element.split(separator: ";") {
                        let parts = pair.split(separator: "=", maxSplits: 1)
                        guard parts.count == 2, parts[0].trimmingSpaces.lowercased() == "for" else { continue }
                        var value = parts[1].trimmingSpaces
                        if value.hasPrefix("\""), value.hasSuffix("\""), value.count >= 2 { value = String(value.dropFirst().dropLast()) }
                        hops.append(hostWithoutPort(value))
                    }
                }
            }
        }
        // From the right: the first hop that is not a trusted proxy is the caller.
        for hop in hops.reversed() {
            let address = hop.trimmingSpaces
            guard IPAddress(address) != nil else { return peer }   // garbage: do not guess
            if !isTrusted(address) { return address }
        }
        return peer
    }
}

/// The host of a `host[:port]` value: "[2001:db8::1]:4711" and "192.0.2.1:80" lose their port;
/// a bare IPv6 address (more than one colon, no brackets) is left as it is.
func hostWithoutPort(_ value: String) -> String {
    if value.hasPrefix("[") {
        guard let close = value.firstIndex(of: "]") else { return "" }
        return String(value[value.index(after: value.startIndex)..<close])
    }
    if value.filter({ $0 == ":" }).count == 1, let colon = value.firstIndex(of: ":") { return String(value[..<colon]) }
    return value
}

extension StringProtocol {
    /// Without leading and trailing spaces and tabs.
    var trimmingSpaces: String {
        var text = Substring(self)
        while text.first == " " || text.first == "\t" { text.removeFirst() }
        while text.last == " " || text.last == "\t" { text.removeLast() }
        return String(text)
    }
}
