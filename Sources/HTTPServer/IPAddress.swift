#if canImport(Glibc)
import Glibc
#endif

/// An IPv4 or IPv6 address: the one type the server, the per-address limit, the caller and the
/// trusted networks all use. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is its IPv4 address.
public struct IPAddress: Hashable, Sendable, CustomStringConvertible {
    /// 4 bytes for IPv4, 16 for IPv6, in network order (two words: no allocation).
    private let high: UInt64
    private let low: UInt64
    public let isIPv6: Bool

    /// From an IP literal ("10.0.0.1", "::1", "[::1]"); nil for anything else (no name lookup).
    public init?(_ text: String) {
        var literal = Substring(text)
        while literal.first == " " { literal.removeFirst() }
        while literal.last == " " { literal.removeLast() }
        if literal.hasPrefix("["), literal.hasSuffix("]") { literal = literal.dropFirst().dropLast() }
        var v4 = in_addr()
        if inet_pton(AF_INET, String(literal), &v4) == 1 {
            self.init(ipv4: v4)
            return
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, String(literal), &v6) == 1 else { return nil }
        self.init(ipv6: v6)
    }

    /// From a socket address; nil when it is not IPv4 or IPv6.
    public init?(_ address: UnsafePointer<sockaddr>) {
        switch Int32(address.pointee.sa_family) {
        case AF_INET: self.init(ipv4: address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr })
        case AF_INET6: self.init(ipv6: address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_addr })
        default: return nil
        }
    }

    private init(ipv4: in_addr) {
        high = 0
        low = UInt64(UInt32(bigEndian: ipv4.s_addr))
        isIPv6 = false
    }

    private init(ipv6: in6_addr) {
        let words = withUnsafeBytes(of: ipv6) { ($0.loadUnaligned(fromByteOffset: 0, as: UInt64.self).bigEndian,
                                                  $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self).bigEndian) }
        // ::ffff:a.b.c.d is IPv4.
        if words.0 == 0, words.1 >> 32 == 0xffff {
            high = 0
            low = words.1 & 0xffff_ffff
            isIPv6 = false
        } else {
            (high, low, isIPv6) = (words.0, words.1, true)
        }
    }

    private init(high: UInt64, low: UInt64, isIPv6: Bool) {
        (self.high, self.low, self.isIPv6) = (high, low, isIPv6)
    }

    /// The network of this address that per-address limits count as one caller: an IPv6
    /// address with all but its first `ipv6PrefixLength` bits cleared (one subscriber's /64 is
    /// 2^64 addresses, each a fresh bucket otherwise); an IPv4 address as it is.
    public func limitNetwork(ipv6PrefixLength: Int) -> IPAddress {
        guard isIPv6 else { return self }
        let bits = Swift.min(Swift.max(ipv6PrefixLength, 0), 128)
        let highMask: UInt64 = bits >= 64 ? .max : (bits == 0 ? 0 : ~(UInt64.max >> UInt64(bits)))
        let lowMask: UInt64 = bits <= 64 ? 0 : (bits == 128 ? .max : ~(UInt64.max >> UInt64(bits - 64)))
        return IPAddress(high: high & highMask, low: low & lowMask, isIPv6: true)
    }

    /// The address's bytes in network order (4 or 16).
    public var bytes: [UInt8] {
        isIPv6 ? (0..<8).map { UInt8(truncatingIfNeeded: high >> (56 - 8 * $0)) } + (0..<8).map { UInt8(truncatingIfNeeded: low >> (56 - 8 * $0)) }
            : (0..<4).map { UInt8(truncatingIfNeeded: low >> (24 - 8 * $0)) }
    }

    public var description: String {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: Int(INET6_ADDRSTRLEN)) { text -> String in
            var bytes = self.bytes
            guard inet_ntop(isIPv6 ? AF_INET6 : AF_INET, &bytes, text.baseAddress, socklen_t(text.count)) != nil else { return "" }
            return String(cString: text.baseAddress!)
        }
    }

    /// Runs `body` with this address and `port` as a socket address.
    func withSockaddr<T, E: Error>(port: UInt16, _ body: (UnsafeMutableRawPointer, socklen_t) throws(E) -> T) throws(E) -> T {
        if isIPv6 {
            var address = sockaddr_in6()
            address.sin6_family = sa_family_t(AF_INET6)
            address.sin6_port = port.bigEndian
            withUnsafeMutableBytes(of: &address.sin6_addr) { raw in for (index, byte) in bytes.enumerated() { raw[index] = byte } }
            return try withUnsafeMutablePointer(to: &address) { pointer throws(E) in try body(pointer, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(truncatingIfNeeded: low).bigEndian
        return try withUnsafeMutablePointer(to: &address) { pointer throws(E) in try body(pointer, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
}
