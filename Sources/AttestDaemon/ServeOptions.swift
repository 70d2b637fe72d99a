import AppleDataService
import AttestWire
import EventLoops
import Foundation
import HTTPRouting
import HTTPServer
import ReceiptRefresh
import Stores
import TokenService
import UpstreamClient

/// attestd: the App Attest token service. `attestd serve [options]`.
public let serveUsage = """
usage: attestd serve [--db PATH] [--listen HOST:PORT] [--trust-anchor PEM]… [--receipt-trust-anchor PEM]… [--token-ttl SECONDS]
                     [--apple-data-url-production URL] [--apple-data-url-development URL] [--apple-data-ca-file PEM]
                     [--risk-refresh-interval SECONDS] [--risk-refresh-rate PER_SECOND] [--risk-refresh-lease SECONDS]
                     [--mint-limit PER_MINUTE] [--registration-quota PER_HOUR] [--challenge-limit PER_MINUTE]
                     [--registration-limit-per-address PER_HOUR]
                     [--introspection-key-file FILE] [--threads N] [--exchange-threads N] [--synchronous full|normal]
                     [--upstream-url URL] [--upstream-ca-file PEM] [--upstream-key-file FILE] [--secrets-key-file FILE]
                     [--upstream-connect-to HOST:PORT:ADDRESS:PORT]… [--upstream-cooldown SECONDS] [--upstream-cooldown-max SECONDS]
                     [--max-connections N] [--max-connections-per-ip N] [--ipv6-prefix-length N] [--no-migrate] [--shutdown-grace SECONDS]
                     [--head-deadline SECONDS] [--min-body-rate BYTES_PER_SECOND] [--write-timeout SECONDS]
                     [--trusted-proxy CIDR]… [--trusted-proxy-header x-forwarded-for|forwarded] [--admin-listen HOST:PORT] [--usage-flush-interval SECONDS] [--no-usage-ledger]
                     [--audit-retention-days N] [--base-url URL]…
--db is a SQLite file or a PostgreSQL URL (postgresql://user@host/db?sslmode=…, as libpq reads it, so PGPASSWORD
          and ~/.pgpass work), default $ATTESTD_DB, else ./attestd.sqlite; --no-migrate only checks the schema
          (apply it with attestctl migrate)
defaults: --db ./attestd.sqlite --listen 127.0.0.1:8080 --token-ttl 3600 --mint-limit 10
          --registration-quota 1000 --registration-limit-per-address 20 --challenge-limit 600 --threads: one per core, at least 2
          --exchange-threads: eight per core, at least 16 (PostgreSQL: two per core, at least 4)
          --synchronous full (0 disables a limit)
          --upstream-url https://api.anthropic.com --secrets-key-file $ATTESTD_SECRETS_KEY_FILE, else attestd.key
          beside the database
--upstream-url: where POST /v1/messages and /v1/messages/count_tokens are relayed, with the
          workspace's own key (attestctl workspaces set-upstream-key), sealed in the database under
          --secrets-key-file (the same file on every instance). --upstream-key-file: the key for
          workspaces without one (whitespace around it trimmed). With neither, /v1/messages answers 503.
--upstream-ca-file: extra trusted roots for the upstream (a local TLS upstream in tests); system roots otherwise.
--webhook-ca-file: extra trusted roots for webhook receivers (attestctl webhooks add); system roots otherwise.
--upstream-connect-to HOST:PORT:ADDRESS:PORT (repeatable; tests only): every upstream request for HOST:PORT
          (the Anthropic API, a cloud's API or token endpoint) connects to ADDRESS:PORT instead, a loopback
          address (127.0.0.1, [::1]), while Host, SNI and the certificate check keep HOST: a stub standing in
          for bedrock-runtime.us-east-1.amazonaws.com:443 must present a certificate for that name.
--upstream-cooldown (default 5) and --upstream-cooldown-max (default 300): a workspace's upstream whose try failed
          (429, 529, 5xx, no connection, refused credentials) is skipped for --upstream-cooldown seconds, doubled
          with each failure in a row up to --upstream-cooldown-max, then tried again (per instance; fractions allowed).
--shutdown-grace (default 10): on SIGTERM/SIGINT stop accepting, end idle and slow connections, let
          requests in flight finish, end open streams with an SSE overloaded_error event, exit by then.
--head-deadline (default 10): a request head must arrive whole within it, however slowly it trickles.
--min-body-rate (default 1024 bytes/s after 10 s): a body slower than that is cut (a 32 MB image at
          1 KiB/s would take 9 hours; at mobile rates it takes seconds).
--write-timeout (default 30): a client that stops reading its response for that long is cut.
--threads: event loops, each taking connections and relaying the Messages API. --exchange-threads:
          workers for the device exchange and introspection (attestation checks, registrations that
          wait for the database), so that those never hold up a loop. On SQLite the exchanges that
          wait for the database at the same time commit together (one fsync) and are answered by the
          thread that committed them, so a worker never waits for its batch.
--trusted-proxy CIDR (repeatable): only when the peer is in one of these networks is the caller's
          address taken from the header the proxy writes, --trusted-proxy-header (x-forwarded-for, the
          default, or forwarded): the right-most hop that is not a trusted proxy. The other header is
          ignored (a client could put its own hop after the proxy's), and from anyone else both are.
          Rate limits per caller use that address.
--admin-listen HOST:PORT (default 127.0.0.1:9090; none: no admin listener): /metrics,
          /v1/oauth/introspect and /v1/authz/check (the token check for nginx auth_request and Envoy
          ext_authz) are served there only, never on the public listener, which faces the internet;
          /healthz and /readyz on both.
--max-connections (default 10000): open streams hold a connection each (epoll keeps idle ones cheap),
          so 1,000 streams plus exchanges fit with room; --max-connections-per-ip (default 64, 0 = none):
          one address cannot take every slot; raise it behind a proxy that connects from one address.
--ipv6-prefix-length (default 64, 32 to 128): an IPv6 client counts as its /N for every per-address
          limit (connections, challenges, registrations, the fair exchange queue); IPv4 as its /32.
--usage-flush-interval (default 1, at most 5): relayed requests are counted in memory (tokens per
          workspace, integration, model and hour) and written in one transaction this often and at
          shutdown; a kill -9 loses at most one interval. The per-integration policy (attestctl
          integrations update) and the per-device and monthly limits read the database's counts
          plus this instance's unwritten ones. --no-usage-ledger: relay without recording usage or
          applying the policy (benchmarks only: nothing is billed or limited).
--base-url URL (repeatable): how operators' browsers reach the admin listener (its console), e.g.
          https://attest-admin.example.com. The admin listener answers only a Host that is an IP
          address, localhost or one of these hosts; any other gets 421 (DNS rebinding cannot read
          /metrics or the console from an operator's browser). Each attestd records in the database
          where it listens and these URLs; attestctl console-login links to the first (else to the
          admin listener) of the instance started last, on its own host first.
attestd --version: the release and the commit it was built from.
--audit-retention-days (default 400, 0 = keep forever): audit rows older than this are deleted by the
          purge job, at most 10,000 a minute. Device refusals are one row per action, client ID,
          reason and minute with a count, so a flood of bad requests adds few rows.
--trust-anchor PEM (repeatable; development and tests): attestations chained to this root are accepted
          next to Apple's. No Apple receipt can exist for them, so receipts are then not checked (a warning
          says so at start) unless --receipt-trust-anchor PEM names the root that signs theirs and, after it,
          the intermediate their signer is under (pinned), which then replace Apple Root CA - G3 and Apple's
          receipt intermediate for every receipt. Without either, every attestation's receipt must chain to G3
          through Apple Application Integration CA 5 - G1 (its key pinned), from a signer with
          digitalSignature key usage and Apple's receipt-signer extension, and name the attested key, the App
          ID and the attestation's time (at most 300 s off).
--risk-refresh-interval (default 86400): a device's receipt is sent to Apple's data service this long
          after its registration or last refresh (never before the receipt's "not before", never after it
          expires, only while the device exchanged in the last 30 days), with its team's key (attestctl
          apple-keys set); the refreshed receipt is validated and stored with Apple's risk metric.
--risk-refresh-rate (default 20 requests/s per instance): 1.7 million refreshes a day, 17 times what
          100,000 daily devices need, so a backlog clears in hours and Apple never sees a burst.
          429 and 5xx answers back off (1 s doubling to 5 min); 401 and 400 are logged once per team and key.
--apple-data-url-production, --apple-data-url-development (https; Apple's by default) and
          --apple-data-ca-file PEM (extra roots for that connection): where the refresh posts (tests: a stub).
--risk-refresh-lease (default 60): a device claimed by an instance is left to it this long; a killed
          instance's claims lapse by then and another instance takes them.
--token-ttl is 300 to 86400 seconds: the published client refreshes 60 s before expiry, so a
          shorter token would be refreshed on almost every call and soon hit the mint limit.
"""

public struct ServeOptions: Sendable {
    public var db = ProcessInfo.processInfo.environment["ATTESTD_DB"].flatMap { $0.isEmpty ? nil : $0 } ?? "attestd.sqlite"
    public var migrate = true
    public var host = "127.0.0.1"
    public var port: UInt16 = 8080
    public var trustAnchors: [String] = []
    /// Roots trusted for receipts in place of Apple Root CA - G3 (a test receipt authority).
    public var receiptTrustAnchors: [String] = []
    /// Apple's data service and how the refresh job uses it (`exchange.riskRefreshInterval` is its interval).
    public var appleDataProductionURL = AppleDataClient.productionURL
    public var appleDataDevelopmentURL = AppleDataClient.developmentURL
    public var appleDataCAFile: String?
    public var riskRefreshRate = ReceiptRefreshConfiguration().requestsPerSecond
    public var riskRefreshLease = ReceiptRefreshConfiguration().lease
    public var exchange = ExchangeConfiguration()
    public var introspectionKeyFile: String?
    /// Set by `--threads` and `--exchange-threads`, else `defaultThreads(for:)`.
    public var threads = 0
    public var exchangeThreads = 0

    /// One loop per core, at least 2: nothing a loop runs waits (on PostgreSQL the token checks
    /// go out on each loop's own connection without blocking it), so more loops than cores would
    /// only take turns. Measured on PostgreSQL with one core for attestd: 2 loops against 4 relay
    /// at 0.97 against 0.73 of SQLite's rate.
    public static func defaultThreads(for database: String) -> Int {
        max(2, ProcessInfo.processInfo.activeProcessorCount)
    }

    /// PostgreSQL's exchange workers wait for a round trip each, during which their core would
    /// sit idle: twice as many as cores, at least 4.
    static func defaultPostgresWorkers() -> Int {
        max(4, 2 * ProcessInfo.processInfo.activeProcessorCount)
    }

    /// On SQLite, workers waiting for the writer together commit together (group commit), so the
    /// more wait, the fewer fsyncs: 8 workers against 2 on 2 cores, in three interleaved A/B runs,
    /// 1.12 to 1.38 times the exchanges a second and 0.36 fdatasync per exchange against 1.16.
    /// No worker waits for its batch any more (the committing thread answers), so more workers
    /// than that only add context switches: on the asynchronous commit 16 against 64 gave 1.11 to
    /// 1.22 times the exchanges a second at 64 devices; 4, 8 and 16 were within the noise.
    public static func defaultExchangeThreads(for database: String) -> Int {
        Stores.isPostgres(database) ? defaultPostgresWorkers() : min(256, max(16, 8 * ProcessInfo.processInfo.activeProcessorCount))
    }
    public var synchronous = "FULL"
    public var upstreamURL = "https://api.anthropic.com"
    public var upstreamCAFile: String?
    /// Extra trusted roots (PEM) for webhook receivers (tests with a TLS receiver on loopback).
    public var webhookCAFile: String?
    public var upstreamKeyFile: String?
    /// `--upstream-connect-to` entries (tests only), each checked: `HOST:PORT:ADDRESS:PORT` with a loopback ADDRESS.
    public var upstreamConnectTo: [String] = []
    /// `--upstream-cooldown` and `--upstream-cooldown-max`, in seconds.
    public var upstreamCooldown = 5.0
    public var upstreamCooldownMax = 300.0
    public var secretsKeyFile: String?
    public var shutdownGrace = 10.0
    /// The internal listener for /metrics, /v1/oauth/introspect and /v1/authz/check (nil: none,
    /// and those routes are served nowhere: the public listener never has them).
    public var admin: (host: String, port: UInt16)? = ("127.0.0.1", 9090)
    public var trustedProxies: [CIDR] = []
    public var trustedProxyHeader = ForwardingHeader.xForwardedFor
    public var headDeadline = HTTPServerConfiguration().headDeadlineSeconds
    public var minBodyRate = HTTPServerConfiguration().minBodyBytesPerSecond
    public var writeTimeout = HTTPServerConfiguration().writeTimeoutSeconds
    public var maxConnections = HTTPServerConfiguration().maxConnections
    public var maxConnectionsPerIP = HTTPServerConfiguration().maxConnectionsPerIP
    /// How much of an IPv6 client's address per-address limits key on.
    public var ipv6PrefixLength = CallerResolver.defaultIPv6PrefixLength
    public var usageFlushInterval = 1.0
    public var usageLedger = true
    public var auditRetentionDays = 400
    /// Hosts of `--base-url`: accepted as `Host` on the admin listener.
    public var adminHostNames: [String] = []
    /// The `--base-url` values, in order (without a trailing `/`): recorded for attestctl console-login.
    public var baseURLs: [String] = []

    static func httpsURL(_ text: String, option: String) throws -> String {
        guard let url = URL(string: text), url.scheme?.lowercased() == "https", url.host != nil else {
            throw StartupError("\(option) must be an https:// URL, got \(text.prefix(200))")
        }
        return text
    }

    public init(_ arguments: [String]) throws {
        var i = 0
        func value() throws -> String {
            i += 1
            guard i < arguments.count else { throw StartupError("\(arguments[i - 1]) needs a value") }
            return arguments[i]
        }
        func number(_ name: String, _ range: ClosedRange<Int>) throws -> Int {
            let text = try value()
            guard let n = Int(text), range.contains(n) else { throw StartupError("\(name) must be a whole number in \(range.lowerBound)...\(range.upperBound), got \(text)") }
            return n
        }
        while i < arguments.count {
            switch arguments[i] {
            case "--db": db = try value()
            case "--listen": (host, port) = try Self.hostPort(try value(), option: "--listen")
            case "--admin-listen":
                let text = try value()
                admin = text == "none" ? nil : try Self.hostPort(text, option: "--admin-listen")
            case "--trust-anchor": trustAnchors.append(try value())
            case "--receipt-trust-anchor": receiptTrustAnchors.append(try value())
            case "--apple-data-url-production": appleDataProductionURL = try Self.httpsURL(try value(), option: "--apple-data-url-production")
            case "--apple-data-url-development": appleDataDevelopmentURL = try Self.httpsURL(try value(), option: "--apple-data-url-development")
            case "--apple-data-ca-file": appleDataCAFile = try value()
            case "--risk-refresh-rate": riskRefreshRate = Double(try number("--risk-refresh-rate", 1...1000))
            case "--risk-refresh-lease": riskRefreshLease = Double(try number("--risk-refresh-lease", 1...3600))
            case "--risk-refresh-interval": exchange.riskRefreshInterval = TimeInterval(try number("--risk-refresh-interval", 1...90 * 86_400))
            case "--token-ttl": exchange.tokenTTL = TimeInterval(try number("--token-ttl", 300...86_400))
            case "--mint-limit": exchange.mintLimitPerMinute = try number("--mint-limit", 0...1_000_000)
            case "--registration-quota": exchange.registrationQuotaPerHour = try number("--registration-quota", 0...100_000_000)
            case "--registration-limit-per-address":
                exchange.registrationLimitPerAddress = try number("--registration-limit-per-address", 0...100_000_000)
            case "--challenge-limit": exchange.challengeLimitPerMinute = try number("--challenge-limit", 0...100_000_000)
            case "--introspection-key-file": introspectionKeyFile = try value()
            case "--upstream-url":
                let text = try value()
                guard let url = URL(string: text), ["http", "https"].contains(url.scheme?.lowercased() ?? ""), url.host != nil,
                      url.query == nil, url.path.isEmpty || url.path == "/" else {
                    throw StartupError("--upstream-url takes http(s)://host[:port], e.g. https://api.anthropic.com, got \(text)")
                }
                upstreamURL = text.hasSuffix("/") ? String(text.dropLast()) : text
            case "--upstream-ca-file": upstreamCAFile = try value()
            case "--webhook-ca-file": webhookCAFile = try value()
            case "--upstream-key-file": upstreamKeyFile = try value()
            case "--upstream-connect-to": upstreamConnectTo.append(try Self.connectTo(try value()))
            case "--upstream-cooldown", "--upstream-cooldown-max":
                let option = arguments[i], text = try value()
                guard let seconds = Double(text), seconds.isFinite, (0.01...86_400).contains(seconds) else {
                    throw StartupError("\(option) takes seconds from 0.01 to 86400, got \(text.prefix(40))")
                }
                if option == "--upstream-cooldown" { upstreamCooldown = seconds } else { upstreamCooldownMax = seconds }
            case "--secrets-key-file": secretsKeyFile = try value()
            case "--no-migrate": migrate = false
            case "--trusted-proxy-header":
                let text = try value().lowercased()
                guard let header = ForwardingHeader(rawValue: text) else {
                    throw StartupError("--trusted-proxy-header takes x-forwarded-for or forwarded, got \(text)")
                }
                trustedProxyHeader = header
            case "--trusted-proxy":
                let text = try value()
                guard let network = CIDR(text) else { throw StartupError("--trusted-proxy takes an IP network such as 10.0.0.0/8 or ::1, got \(text)") }
                trustedProxies.append(network)
            case "--shutdown-grace": shutdownGrace = Double(try number("--shutdown-grace", 0...3600))
            case "--head-deadline": headDeadline = Double(try number("--head-deadline", 1...600))
            case "--min-body-rate": minBodyRate = try number("--min-body-rate", 0...100_000_000)
            case "--write-timeout": writeTimeout = Double(try number("--write-timeout", 1...3600))
            case "--max-connections": maxConnections = try number("--max-connections", 16...1_000_000)
            case "--max-connections-per-ip": maxConnectionsPerIP = try number("--max-connections-per-ip", 0...1_000_000)
            case "--ipv6-prefix-length": ipv6PrefixLength = try number("--ipv6-prefix-length", 32...128)
            case "--usage-flush-interval": usageFlushInterval = Double(try number("--usage-flush-interval", 1...5))
            case "--no-usage-ledger": usageLedger = false
            case "--base-url":
                let text = try value()
                guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
                      let host = url.host, !host.isEmpty else {
                    throw StartupError("--base-url takes the URL operators' browsers use for the admin listener, such as https://attest-admin.example.com, got \(text)")
                }
                adminHostNames.append(host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host)
                var base = text
                while base.hasSuffix("/") { base.removeLast() }
                if base.hasSuffix("/console") { base.removeLast("/console".count) }
                baseURLs.append(base)
            case "--audit-retention-days": auditRetentionDays = try number("--audit-retention-days", 0...100_000)
            case "--threads": threads = try number("--threads", 1...256)
            case "--exchange-threads": exchangeThreads = try number("--exchange-threads", 1...256)
            case "--synchronous":
                let mode = try value().uppercased()
                guard mode == "FULL" || mode == "NORMAL" else { throw StartupError("--synchronous is full or normal") }
                synchronous = mode
            default: throw StartupError("unknown option \(arguments[i])\n\(serveUsage)")
            }
            i += 1
        }
        if threads == 0 { threads = Self.defaultThreads(for: db) }
        if exchangeThreads == 0 { exchangeThreads = Self.defaultExchangeThreads(for: db) }
    }
}

extension ServeOptions {
    /// One `--upstream-connect-to` value, checked: the shape curl takes, and a loopback address to
    /// connect to (the option exists for tests, whose stubs listen there).
    static func connectTo(_ text: String) throws -> String {
        guard let parts = ConnectToEntry.parse(text) else {
            throw StartupError("--upstream-connect-to takes HOST:PORT:ADDRESS:PORT, e.g. "
                               + "bedrock-runtime.us-east-1.amazonaws.com:443:127.0.0.1:8443, got \(text.prefix(200))")
        }
        let address = parts.address
        let octets = address.split(separator: ".", omittingEmptySubsequences: false)
        let loopbackV4 = octets.count == 4 && octets.first == "127" && octets.allSatisfy { UInt8($0) != nil }
        guard loopbackV4 || address == "[::1]" else {
            throw StartupError("--upstream-connect-to is for tests: its ADDRESS must be a loopback address (127.0.0.0/8 or [::1]), got \(address.prefix(100))")
        }
        return text
    }

    public static func hostPort(_ text: String, option: String) throws -> (String, UInt16) {
        guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]) else {
            throw StartupError("\(option) takes HOST:PORT, e.g. 127.0.0.1:8080, got \(text)")
        }
        return (String(text[..<colon]).trimmingCharacters(in: CharacterSet(charactersIn: "[]")), port)
    }
}

public struct StartupError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

