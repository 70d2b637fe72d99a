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
