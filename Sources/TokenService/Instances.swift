import Foundation

/// Where one attestd listens, as it recorded it when its listeners opened (`attestd_instances`):
/// a row per host and public listener, which a restart replaces. `attestctl console-login` reads
/// it to print a link to the admin listener that is really there.
public struct AttestdInstance: Sendable, Equatable {
    /// The host name it runs on (`gethostname`).
    public var host: String
    /// The public listener as it listens (`127.0.0.1:8080`; the real port when 0 was asked for).
    public var publicAddress: String
    /// The admin listener (`127.0.0.1:9090`, `[::1]:9090`), nil with `--admin-listen none`.
    public var adminAddress: String?
    /// Its `--base-url` values, in order: how operators' browsers reach the admin listener.
    public var baseURLs: [String]
    /// `VERSION (commit COMMIT)`.
    public var version: String
    public var startedAt: Date
    public var processID: Int64

    public init(host: String, publicAddress: String, adminAddress: String?, baseURLs: [String], version: String, startedAt: Date,
                processID: Int64) {
        self.host = host
        self.publicAddress = publicAddress
        self.adminAddress = adminAddress
        self.baseURLs = baseURLs
        self.version = version
        self.startedAt = startedAt
        self.processID = processID
    }

    /// The console's origin as an operator's browser reaches it: the first `--base-url`, else the
    /// admin listener's address, a wildcard one (`0.0.0.0`, `[::]`) read as loopback; nil when it
    /// has neither.
    public var consoleBaseURL: String? {
        if let first = baseURLs.first { return first }
        guard let admin = adminAddress else { return nil }
        return "http://" + Self.reachable(admin)
    }

    /// `HOST:PORT` with a wildcard host replaced by the loopback address of its family.
    public static func reachable(_ address: String) -> String {
        if address.hasPrefix("0.0.0.0:") { return "127.0.0.1" + address.dropFirst("0.0.0.0".count) }
        if address.hasPrefix("[::]:") { return "[::1]" + address.dropFirst("[::]".count) }
        return address
    }

    /// `HOST:PORT`, with brackets around an IPv6 host.
    public static func address(host: String, port: UInt16) -> String {
        (host.contains(":") ? "[\(host)]" : host) + ":\(port)"
    }

    /// The instance whose console a command run on `host` should link to: the most recently
    /// started on that host, else the most recently started anywhere.
    public static func likelyConsole(among instances: [AttestdInstance], host: String) -> AttestdInstance? {
        let newestFirst = instances.sorted { $0.startedAt > $1.startedAt }
        return newestFirst.first { $0.host == host } ?? newestFirst.first
    }
}
