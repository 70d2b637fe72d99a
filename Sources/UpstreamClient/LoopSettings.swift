import CCurl
import Foundation

/// The configuration, checked and prepared once for every transfer.
struct LoopSettings: Sendable {
    let baseURL: String
    let isTLS: Bool
    /// System roots plus `caFile`, as one PEM blob; nil for the system roots alone.
    let caBundle: [UInt8]?
    let connectTimeoutMilliseconds: Int
    let idleTimeoutNanoseconds: UInt64
    let allowHTTP2: Bool
    let maxIdleConnections: Int
    /// CURLOPT_CONNECT_TO's list, shared by every transfer (nil: none).
    let connectTo: CurlStringList?

    init(_ configuration: UpstreamConfiguration) throws {
        var base = configuration.baseURL
        while base.hasSuffix("/") { base.removeLast() }
        let lower = base.lowercased()
        guard lower.hasPrefix("http://") || lower.hasPrefix("https://"), !base.contains(where: { $0.isWhitespace }),
              base.split(separator: "/", omittingEmptySubsequences: true).count >= 2 else {
            throw UpstreamClientError("baseURL must be http:// or https:// followed by a host: \(configuration.baseURL)")
        }
        guard configuration.connectTimeout > .zero, configuration.idleTimeout > .zero else {
            throw UpstreamClientError("connectTimeout and idleTimeout must be positive")
        }
        baseURL = base
        isTLS = lower.hasPrefix("https://")
        caBundle = try configuration.caFile.map(CABundle.systemRoots(adding:))
        connectTimeoutMilliseconds = Int(max(1, configuration.connectTimeout.wholeMilliseconds))
        idleTimeoutNanoseconds = max(1_000_000, configuration.idleTimeout.wholeNanoseconds)
        allowHTTP2 = configuration.allowHTTP2
        maxIdleConnections = max(0, configuration.maxIdleConnections)
        for entry in configuration.connectTo {
            if let problem = ConnectToEntry.problem(entry) { throw UpstreamClientError("connectTo \(entry.prefix(200)): \(problem)") }
        }
        connectTo = configuration.connectTo.isEmpty ? nil : try CurlStringList(configuration.connectTo)
    }
}

/// A curl string list (curl_slist) that lives as long as anything holds it: curl keeps the
/// pointer an option is set to, never a copy.
final class CurlStringList: @unchecked Sendable {
    // Safe: built once in init and only read (handed to curl) afterwards.
    let list: UnsafeMutablePointer<curl_slist>

    init(_ entries: [String]) throws {
        var built: UnsafeMutablePointer<curl_slist>?
        for entry in entries {
            guard let next = curl_slist_append(built, entry) else {
                if let built { curl_slist_free_all(built) }
                throw UpstreamClientError("out of memory building a curl list")
            }
            built = next
        }
        guard let built else { throw UpstreamClientError("an empty curl list") }
        list = built
    }

    deinit { curl_slist_free_all(list) }
}

/// The shape of one CURLOPT_CONNECT_TO entry as this client takes it: `HOST:PORT:ADDRESS:PORT`,
/// every part given (curl would let HOST or PORT be empty, meaning any), HOST a name or IPv4
/// address, ADDRESS an IPv4 address, a name, or an IPv6 address in brackets.
public enum ConnectToEntry {
    public struct Parts: Sendable, Equatable {
        public var host: String
        public var port: UInt16
        public var address: String
        public var addressPort: UInt16

        public init(host: String, port: UInt16, address: String, addressPort: UInt16) {
            self.host = host
            self.port = port
            self.address = address
            self.addressPort = addressPort
        }
    }

    /// The entry's parts; nil when it is not of that shape.
    public static func parse(_ entry: String) -> Parts? {
        guard let firstColon = entry.firstIndex(of: ":") else { return nil }
        let host = String(entry[..<firstColon])
        let rest = entry[entry.index(after: firstColon)...]
        guard let secondColon = rest.firstIndex(of: ":"), let port = UInt16(rest[..<secondColon]), port > 0 else { return nil }
        let target = rest[rest.index(after: secondColon)...]
        guard let lastColon = target.lastIndex(of: ":"), let addressPort = UInt16(target[target.index(after: lastColon)...]),
              addressPort > 0 else { return nil }
        let address = String(target[..<lastColon])
        guard isHostName(host) || isIPv4(host) else { return nil }
        if address.hasPrefix("[") {
            guard address.hasSuffix("]"), address.count > 2,
                  address.dropFirst().dropLast().allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." }) else { return nil }
        } else {
            guard isHostName(address) || isIPv4(address) else { return nil }
        }
        return Parts(host: host, port: port, address: address, addressPort: addressPort)
    }

    /// Why the entry is not of that shape; nil when it is.
    static func problem(_ entry: String) -> String? {
        parse(entry) == nil ? "expected HOST:PORT:ADDRESS:PORT, e.g. bedrock-runtime.us-east-1.amazonaws.com:443:127.0.0.1:8443" : nil
    }

    static func isHostName(_ text: String) -> Bool {
        !text.isEmpty && text.count <= 253 && text.first != "." && text.first != "-"
            && text.utf8.allSatisfy { $0 == 0x2E || $0 == 0x2D || (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) }
    }

    static func isIPv4(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts.allSatisfy { !$0.isEmpty && $0.count <= 3 && $0.allSatisfy(\.isASCII) && UInt8($0) != nil }
    }
}

public enum CABundle {
    /// curl takes a single CA bundle (CURLOPT_CAINFO and CURLOPT_CAINFO_BLOB each replace the
    /// default one), so extra roots come as the system bundle followed by the file's
    /// certificates, in memory.
    public static func systemRoots(adding path: String) throws -> [UInt8] {
        guard let extra = FileManager.default.contents(atPath: path) else {
            throw UpstreamClientError("cannot read caFile \(path)")
        }
        guard String(decoding: extra, as: UTF8.self).contains("-----BEGIN CERTIFICATE-----") else {
            throw UpstreamClientError("caFile \(path) holds no PEM certificate")
        }
        var candidates: [String] = []
        if let builtIn = attest_curl_default_cainfo() { candidates.append(String(cString: builtIn)) }
        candidates += ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"]
        var bundle: [UInt8] = []
        if let system = candidates.lazy.compactMap({ FileManager.default.contents(atPath: $0) }).first {
            bundle.append(contentsOf: system)
            bundle.append(UInt8(ascii: "\n"))
        }
        bundle.append(contentsOf: extra)
        return bundle
    }
}
