import AttestWire
import AppAttest
import AttestCrypto
import EventLoops
import Foundation
import HTTPServer
import ServiceRoutes
import SQLiteStore
import Stores
import TokenService
import Synchronization
import UpstreamClient

/// attestd: the App Attest token service. `attestd serve [options]`.
let usage = """
usage: attestd serve [--db PATH] [--listen HOST:PORT] [--trust-anchor PEM]… [--token-ttl SECONDS]
                     [--mint-limit PER_MINUTE] [--registration-quota PER_HOUR] [--challenge-limit PER_MINUTE]
                     [--introspection-key-file FILE] [--threads N] [--exchange-threads N] [--synchronous full|normal]
                     [--upstream-url URL] [--upstream-ca-file PEM] [--upstream-key-file FILE] [--secrets-key-file FILE]
                     [--max-connections N] [--max-connections-per-ip N] [--no-migrate] [--shutdown-grace SECONDS]
                     [--head-deadline SECONDS] [--min-body-rate BYTES_PER_SECOND] [--write-timeout SECONDS]
                     [--trusted-proxy CIDR]… [--admin-listen HOST:PORT] [--usage-flush-interval SECONDS] [--no-usage-ledger]
--db is a SQLite file or a PostgreSQL URL (postgresql://user@host/db?sslmode=…, as libpq reads it, so PGPASSWORD
          and ~/.pgpass work), default $ATTESTD_DB, else ./attestd.sqlite; --no-migrate only checks the schema
          (apply it with attestctl migrate)
defaults: --db ./attestd.sqlite --listen 127.0.0.1:8080 --token-ttl 3600 --mint-limit 10
          --registration-quota 1000 --challenge-limit 600 --threads and --exchange-threads: one per core,
          at least 2 (PostgreSQL: two per core, at least 4) --synchronous full (0 disables a limit)
          --upstream-url https://api.anthropic.com --secrets-key-file $ATTESTD_SECRETS_KEY_FILE, else attestd.key
          beside the database
--upstream-url: where POST /v1/messages and /v1/messages/count_tokens are relayed, with the
          workspace's own key (attestctl workspaces set-upstream-key), sealed in the database under
          --secrets-key-file (the same file on every instance). --upstream-key-file: the key for
          workspaces without one (whitespace around it trimmed). With neither, /v1/messages answers 503.
--upstream-ca-file: extra trusted roots for the upstream (a local TLS upstream in tests); system roots otherwise.
--shutdown-grace (default 10): on SIGTERM/SIGINT stop accepting, end idle and slow connections, let
          requests in flight finish, end open streams with an SSE overloaded_error event, exit by then.
--head-deadline (default 10): a request head must arrive whole within it, however slowly it trickles.
--min-body-rate (default 1024 bytes/s after 10 s): a body slower than that is cut (a 32 MB image at
          1 KiB/s would take 9 hours; at mobile rates it takes seconds).
--write-timeout (default 30): a client that stops reading its response for that long is cut.
--threads: event loops, each taking connections and relaying the Messages API. --exchange-threads:
          workers for the device exchange and introspection (attestation checks, registrations that
          wait for the database), so that those never hold up a loop.
--trusted-proxy CIDR (repeatable): only when the peer is in one of these networks is the caller's
          address taken from X-Forwarded-For or Forwarded (the right-most hop that is not a trusted
          proxy); from anyone else those headers are ignored. Rate limits per caller use that address.
--admin-listen HOST:PORT (default 127.0.0.1:9090; none: no admin listener): /metrics,
          /v1/oauth/introspect and /v1/authz/check (the token check for nginx auth_request and Envoy
          ext_authz) are served there only, never on the public listener, which faces the internet;
          /healthz and /readyz on both.
--max-connections (default 10000): open streams hold a connection each (epoll keeps idle ones cheap),
          so 1,000 streams plus exchanges fit with room; --max-connections-per-ip (default 64, 0 = none):
          one address cannot take every slot; raise it behind a proxy that connects from one address.
--usage-flush-interval (default 1, at most 5): relayed requests are counted in memory (tokens per
          workspace, integration, model and hour) and written in one transaction this often and at
          shutdown; a kill -9 loses at most one interval. The per-integration policy (attestctl
          integrations update) and the per-device and monthly limits read the database's counts
          plus this instance's unwritten ones. --no-usage-ledger: relay without recording usage or
          applying the policy (benchmarks only: nothing is billed or limited).
--token-ttl is 300 to 86400 seconds: the published client refreshes 60 s before expiry, so a
          shorter token would be refreshed on almost every call and soon hit the mint limit.
"""

struct ServeOptions {
    var db = ProcessInfo.processInfo.environment["ATTESTD_DB"].flatMap { $0.isEmpty ? nil : $0 } ?? "attestd.sqlite"
    var migrate = true
    var host = "127.0.0.1"
    var port: UInt16 = 8080
    var trustAnchors: [String] = []
    var exchange = ExchangeConfiguration()
    var introspectionKeyFile: String?
    /// Set by `--threads` and `--exchange-threads`, else `defaultThreads(for:)`.
    var threads = 0
    var exchangeThreads = 0

    /// On SQLite, one loop and one exchange worker per core: nothing they run waits on the
    /// network, so more threads than cores would only take turns. On PostgreSQL every token check
    /// and exchange waits for a round trip, during which its thread's core would sit idle: twice
    /// as many, at least 4.
    static func defaultThreads(for database: String) -> Int {
        let cores = ProcessInfo.processInfo.activeProcessorCount
        return Stores.isPostgres(database) ? max(4, 2 * cores) : max(2, cores)
    }
    var synchronous = "FULL"
    var upstreamURL = "https://api.anthropic.com"
    var upstreamCAFile: String?
    var upstreamKeyFile: String?
    var secretsKeyFile: String?
    var shutdownGrace = 10.0
    /// The internal listener for /metrics, /v1/oauth/introspect and /v1/authz/check (nil: none,
    /// and those routes are served nowhere: the public listener never has them).
    var admin: (host: String, port: UInt16)? = ("127.0.0.1", 9090)
    var trustedProxies: [CIDR] = []
    var headDeadline = HTTPServerConfiguration().headDeadlineSeconds
    var minBodyRate = HTTPServerConfiguration().minBodyBytesPerSecond
    var writeTimeout = HTTPServerConfiguration().writeTimeoutSeconds
    var maxConnections = HTTPServerConfiguration().maxConnections
    var maxConnectionsPerIP = HTTPServerConfiguration().maxConnectionsPerIP
    var usageFlushInterval = 1.0
    var usageLedger = true

    init(_ arguments: [String]) throws {
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
            case "--token-ttl": exchange.tokenTTL = TimeInterval(try number("--token-ttl", 300...86_400))
            case "--mint-limit": exchange.mintLimitPerMinute = try number("--mint-limit", 0...1_000_000)
            case "--registration-quota": exchange.registrationQuotaPerHour = try number("--registration-quota", 0...100_000_000)
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
            case "--upstream-key-file": upstreamKeyFile = try value()
            case "--secrets-key-file": secretsKeyFile = try value()
            case "--no-migrate": migrate = false
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
            case "--usage-flush-interval": usageFlushInterval = Double(try number("--usage-flush-interval", 1...5))
            case "--no-usage-ledger": usageLedger = false
            case "--threads": threads = try number("--threads", 1...256)
            case "--exchange-threads": exchangeThreads = try number("--exchange-threads", 1...256)
            case "--synchronous":
                let mode = try value().uppercased()
                guard mode == "FULL" || mode == "NORMAL" else { throw StartupError("--synchronous is full or normal") }
                synchronous = mode
            default: throw StartupError("unknown option \(arguments[i])\n\(usage)")
            }
            i += 1
        }
        if threads == 0 { threads = Self.defaultThreads(for: db) }
        if exchangeThreads == 0 { exchangeThreads = Self.defaultThreads(for: db) }
    }
}

extension ServeOptions {
    static func hostPort(_ text: String, option: String) throws -> (String, UInt16) {
        guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]) else {
            throw StartupError("\(option) takes HOST:PORT, e.g. 127.0.0.1:8080, got \(text)")
        }
        return (String(text[..<colon]).trimmingCharacters(in: CharacterSet(charactersIn: "[]")), port)
    }
}

struct StartupError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

// Lines are written by a thread of their own, so the request path only formats and queues.
let logger = Logger.standardErrorWithWriterThread()

/// The relay's upstream, its default key and the secrets key that opens the workspaces' own keys.
func relayConfiguration(_ options: ServeOptions) throws -> RelayConfiguration {
    var upstream = UpstreamConfiguration(baseURL: options.upstreamURL)
    if let caFile = options.upstreamCAFile {
        guard FileManager.default.isReadableFile(atPath: caFile) else { throw StartupError("--upstream-ca-file: cannot read \(caFile)") }
        upstream.caFile = caFile
    }
    var defaultKey: String?
    if let file = options.upstreamKeyFile {
        guard let data = FileManager.default.contents(atPath: file) else { throw StartupError("--upstream-key-file: cannot read \(file)") }
        do { defaultKey = try Validate.upstreamKey(String(decoding: data, as: UTF8.self)) } catch {
            throw StartupError("--upstream-key-file \(file): \(error)")
        }
    }
    let secretsPath = options.secretsKeyFile ?? SecretsKeyFile.defaultPath(database: options.db, isFile: !Stores.isPostgres(options.db))
    var secrets: SecretBox?
    if FileManager.default.fileExists(atPath: secretsPath) {
        do { secrets = try SecretsKeyFile.load(secretsPath) } catch { throw StartupError("\(error)") }
    } else if options.secretsKeyFile != nil {
        throw StartupError("--secrets-key-file: cannot read \(secretsPath)")
    } else {
        logger.warning("no_secrets_key", [("file", secretsPath),
                                          ("note", "workspaces' own upstream keys cannot be opened; attestctl init creates this file")])
    }
    return RelayConfiguration(upstream: upstream, defaultKey: defaultKey, secrets: secrets)
}

func serve(_ options: ServeOptions) throws -> Never {
    var anchors: [Certificate] = []
    for path in options.trustAnchors {
        guard let pem = try? String(contentsOfFile: path, encoding: .utf8) else { throw StartupError("--trust-anchor: cannot read \(path)") }
        let certificates: [Certificate]
        do { certificates = try Certificate.all(pem: pem) } catch { throw StartupError("--trust-anchor \(path): \(error)") }
        for certificate in certificates {
            logger.warning("extra_trust_anchor", [("file", path), ("subject", certificate.subjectName),
                                                  ("sha256", hexString(certificate.sha256Fingerprint)),
                                                  ("note", "attestations chained to this root are accepted next to Apple's; development and tests only")])
        }
        anchors += certificates
    }
    let verifier = try AppAttestVerifier(additionalAnchors: anchors)
    var introspectionKey: String?
    if let file = options.introspectionKeyFile {
        guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { throw StartupError("--introspection-key-file: cannot read \(file)") }
        let key = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard key.utf8.count >= 32 else { throw StartupError("introspection key in \(file) is shorter than 32 characters") }
        introspectionKey = key
    }

    // Loops and exchange workers each may be in the store at once.
    let store = try Stores.open(options.db, connections: options.threads + options.exchangeThreads, synchronous: options.synchronous,
                                mode: options.migrate ? .apply : .verify)
    (store as? SQLiteTokenStore)?.startWatching()
    let audit = BufferedAuditLog(store: store, onError: { logger.error("audit_write_failed", [("error", $0)]) })
    let service = DeviceTokenService(store: store, verifier: verifier, configuration: options.exchange, audit: audit)
    // One event loop per --threads: each runs a libmicrohttpd daemon and a curl multi handle, so
    // a relayed request is taken, checked, sent upstream and answered on one thread.
    let loops = try EventLoopGroup(loops: options.threads)
    var relayOptions = try relayConfiguration(options)
    relayOptions.loops = loops
    let relay = try MessagesRelay(relayOptions)
    let ledger = options.usageLedger
        ? UsageLedger(store: store, metrics: service.metrics, flushInterval: options.usageFlushInterval,
                      report: { logger.error("usage_flush_failed", [("error", $0)]) })
        : nil
    ledger?.start()
    let exchangeWorkers = try WorkerPool(threads: options.exchangeThreads, name: "exchange")
    // The admin routes never answer on the public listener. /metrics is rendered at most once a
    // second: a scrape costs a page of text, and a flood of them must not cost a page each.
    let router = ServiceRouter(service: service, logger: logger, introspectionKey: introspectionKey, relay: relay, ledger: ledger,
                               trustedProxies: options.trustedProxies, separateAdminListener: true,
                               exchangeWorkers: exchangeWorkers, metricsMaxAge: 1)

    var configuration = HTTPServerConfiguration()
    configuration.host = options.host
    configuration.port = options.port
    configuration.threads = options.threads
    configuration.maxConnections = options.maxConnections
    configuration.headDeadlineSeconds = options.headDeadline
    configuration.minBodyBytesPerSecond = options.minBodyRate
    configuration.writeTimeoutSeconds = options.writeTimeout
    configuration.maxConnectionsPerIP = options.maxConnectionsPerIP
    // Image input arrives as base64 in a Messages request: 32 MB there, 64 KiB everywhere else.
    configuration.bodyLimit = { _, path in MessagesRelay.relayedPaths.contains(path) ? MessagesRelay.maxBodyBytes : 65_536 }
    // The transport's own refusals (framing, oversize heads and bodies) in each route's shape.
    configuration.refusalResponse = { status, path in ServiceRouter.refusal(status, path: path) }
    // Over the global cap on request bytes held in memory: the API's "overloaded", so clients back off.
    configuration.overloadedResponse = { _ in
        .json(529, APIErrorResponse(type: "overloaded_error", message: "the service is overloaded; retry shortly").json,
              headers: [("retry-after", "1")])
    }
    let server = HTTPServer(configuration: configuration, loops: loops) { router.handle($0, $1) }
    // Both listeners' figures: refusals and connections on the admin one count too.
    let adminListener = Mutex<HTTPServer?>(nil)
    router.reportTransport {
        (adminListener.withLock { $0 }.map { server.stats() + $0.stats() } ?? server.stats()).prometheusText
            + "# HELP attestd_audit_pending Audit events waiting to be written (they are kept and retried, never dropped).\n"
            + "# TYPE attestd_audit_pending gauge\nattestd_audit_pending \(audit.pendingCount)\n"
    }
    try server.start()
    var adminServer: HTTPServer?
    if let admin = options.admin {
        var adminConfiguration = HTTPServerConfiguration()
        adminConfiguration.host = admin.host
        adminConfiguration.port = admin.port
        adminConfiguration.threads = options.threads
        // Internal: a proxy asking for token checks connects from one address, many times over.
        adminConfiguration.maxConnectionsPerIP = 0
        adminConfiguration.refusalResponse = configuration.refusalResponse
        // On the same loops: the token check a proxy asks for costs what the relay's own does.
        let server = HTTPServer(configuration: adminConfiguration, loops: loops) { request, _ in .response(router.handleAdmin(request)) }
        do { try server.start() } catch { throw StartupError("--admin-listen: \(error) (--admin-listen none turns the admin listener off)") }
        adminServer = server
        adminListener.withLock { $0 = server }
        logger.info("admin_listening", [("address", "\(admin.host.contains(":") ? "[\(admin.host)]" : admin.host):\(server.port)"),
                                        ("routes", "/metrics /v1/oauth/introspect /v1/authz/check /healthz /readyz")])
    } else {
        logger.warning("no_admin_listener", [("note", "/metrics, /v1/oauth/introspect and /v1/authz/check are served nowhere (--admin-listen none)")])
    }
    logger.info("listening", [("address", "\(options.host.contains(":") ? "[\(options.host)]" : options.host):\(server.port)"),
                              ("db", Stores.redacted(options.db)), ("upstream", options.upstreamURL), ("threads", options.threads), ("exchange_threads", options.exchangeThreads), ("token_ttl", Int(options.exchange.tokenTTL)),
                              ("mint_limit_per_minute", options.exchange.mintLimitPerMinute),
                              ("registration_quota_per_hour", options.exchange.registrationQuotaPerHour)])

    // Used and expired challenges are purged once a minute so the table stays small.
    let maintenance = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "maintenance"))
    maintenance.schedule(deadline: .now() + 60, repeating: 60)
    maintenance.setEventHandler {
        do {
            let purged = try store.purgeChallenges(before: Date())
            if purged > 0 { logger.info("challenges_purged", [("count", purged)]) }
            // Challenge requests only matter for their one-minute window.
            _ = try store.purgeChallengeRequests(before: Date() - 120)
        } catch { logger.error("purge_failed", [("error", String(describing: error))]) }
    }
    maintenance.resume()

    // SIGINT/SIGTERM: stop accepting, flush the usage ledger and the audit buffer, exit cleanly.
    let signalQueue = DispatchQueue(label: "signals")
    var sources: [DispatchSourceSignal] = []
    for signalNumber in [SIGINT, SIGTERM] {
        signal(signalNumber, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: signalQueue)
        source.setEventHandler {
            logger.info("stopping", [("signal", Int(signalNumber)), ("grace_seconds", options.shutdownGrace)])
            // Requests in flight finish, open streams get a last SSE event; what is left at the
            // deadline is ended.
            server.shutdown(grace: options.shutdownGrace)
            exchangeWorkers.shutdown()  // what is queued runs (its audit events are in the flush below)
            adminServer?.stop()
            relay.shutdown()
            // After the last relayed request has ended: its usage is in this flush.
            ledger?.stop()
            audit.close()
            logger.drain()
            exit(0)
        }
        source.resume()
        sources.append(source)
    }
    withExtendedLifetime(sources) { dispatchMain() }
}

let arguments = Array(CommandLine.arguments.dropFirst())
do {
    guard arguments.first == "serve" else {
        if ["help", "--help", "-h"].contains(arguments.first ?? "") { print(usage); exit(0) }
        throw StartupError(usage)
    }
    let options = Array(arguments.dropFirst())
    if options.contains(where: { ["--help", "-h", "help"].contains($0) }) { print(usage); exit(0) }
    try serve(try ServeOptions(options))
} catch {
    logger.error("startup_failed", [("error", String(describing: error))])
    logger.drain()
    exit(2)
}
