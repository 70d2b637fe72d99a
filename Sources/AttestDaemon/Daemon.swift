import AppAttest
import AttestCrypto
import AttestWire
import CBuildInfo
import ConsoleRoutes
import EventLoops
import Foundation
import HTTPRouting
import HTTPServer
import Lifecycle
import ReceiptRefresh
import RelayRoutes
import ServiceRoutes
import Stores
import Synchronization
import TokenService
import UpstreamClient

/// The whole attestd: the store, the token service, the event loops, the relay, the usage
/// ledger, the exchange workers and the listeners, wired together and run as one group of
/// services, started in order and stopped in reverse. `attestd serve` is this and a signal
/// handler; a test can start it in process, send it traffic and stop it.
public final class Daemon: Sendable {
    public let options: ServeOptions
    let logger: Logger
    let group: ServiceGroup
    let publicServer: HTTPServer
    let adminServer: HTTPServer?
    public let service: DeviceTokenService
    /// Every route both listeners serve, as the router reads them.
    public let routeTable: [RouteInfo]

    /// Builds everything (opening and migrating the database); nothing runs until `run`.
    /// - Parameter extraServices: started after the store's own, before the ledger (tests: a
    ///   service that dies on cue).
    public init(_ options: ServeOptions, logger: Logger, extraServices: [any Service] = []) throws {
        self.options = options
        self.logger = logger
        let verifier = try AppAttestVerifier(additionalAnchors: try Self.anchors(options, logger), receipts: try Self.receiptPolicy(options, logger))
        let introspectionKey = try Self.introspectionKey(options)
        // Loops and exchange workers each may be in the store at once.
        let store = try Stores.open(options.db, connections: options.threads + options.exchangeThreads, synchronous: options.synchronous,
                                    mode: options.migrate ? .apply : .verify, warm: true)
        let audit = BufferedAuditLog(store: store, onError: { logger.error("audit_write_failed", [("error", $0)]) })
        // Rules' refusals and would-be refusals, counted by the exchange and the relay alike and
        // written with the usage ledger's flush; the first of each rule per flush is logged.
        let ruleTally = PolicyRuleTally { clientID, rule, reason, detail in
            logger.info("policy_would_refuse", [("client_id", clientID), ("rule", rule.rawValue), ("reason", reason), ("detail", detail)])
        }
        let service = DeviceTokenService(store: store, verifier: verifier, configuration: options.exchange, audit: audit,
                                         ruleTally: options.usageLedger ? ruleTally : nil)
        self.service = service
        // One event loop per --threads: each runs a libmicrohttpd daemon per listener and a curl
        // multi handle, so a relayed request is taken, checked, sent upstream and answered on one thread.
        let loops = try EventLoopGroup(loops: options.threads)
        var relayOptions = try Self.relayConfiguration(options, logger)
        relayOptions.loops = loops
        let relay = try MessagesRelay(relayOptions)
        let ledger = options.usageLedger
            ? UsageLedger(store: store, metrics: service.metrics, flushInterval: options.usageFlushInterval, ruleTally: ruleTally,
                          prices: PriceBook(store: store), report: { logger.error("usage_flush_failed", [("error", $0)]) })
            : nil
        let exchangeWorkers = try WorkerPool(threads: options.exchangeThreads, name: "exchange")
        // PostgreSQL: each loop checks tokens on a connection of its own, never blocking on it.
        let tokenChecks = Stores.nonBlockingTokenChecks(store, loops: loops, now: service.now)
        tokenChecks?.warm(timeout: 10)
        // The admin routes never answer on the public listener. /metrics is rendered at most once a
        // second: a scrape costs a page of text, and a flood of them must not cost a page each.
        let router = ServiceRouter(service: service, logger: logger, introspectionKey: introspectionKey, relay: relay, ledger: ledger,
                                   trustedProxies: options.trustedProxies, trustedProxyHeader: options.trustedProxyHeader,
                                   ipv6PrefixLength: options.ipv6PrefixLength, separateAdminListener: true, adminHostNames: options.adminHostNames,
                                   exchangeWorkers: exchangeWorkers, metricsMaxAge: 1, tokenChecks: tokenChecks,
                                   // The console: on the admin listener only, on the same service layer as attestctl.
                                   extraRoutes: ConsoleRoutes(admin: AdminService(store: store), secrets: relayOptions.secrets,
                                                              trustedProxies: options.trustedProxies,
                                                              trustedProxyHeader: options.trustedProxyHeader, upstreamHealth: relay.health).routes)

        routeTable = router.router.table
        var configuration = HTTPServerConfiguration()
        configuration.host = options.host
        configuration.port = options.port
        configuration.threads = options.threads
        configuration.maxConnections = options.maxConnections
        configuration.headDeadlineSeconds = options.headDeadline
        configuration.minBodyBytesPerSecond = options.minBodyRate
        configuration.writeTimeoutSeconds = options.writeTimeout
        configuration.maxConnectionsPerIP = options.maxConnectionsPerIP
        configuration.ipv6PrefixLength = options.ipv6PrefixLength
        // Body limits and the shapes of the transport's own refusals, from the route table.
        router.configure(&configuration, for: .public)
        publicServer = HTTPServer(configuration: configuration, loops: loops) { router.router.handle($0, $1, on: .public) }
        if let admin = options.admin {
            var adminConfiguration = HTTPServerConfiguration()
            adminConfiguration.host = admin.host
            adminConfiguration.port = admin.port
            adminConfiguration.threads = options.threads
            // Internal: a proxy asking for token checks connects from one address, many times over.
            adminConfiguration.maxConnectionsPerIP = 0
            router.configure(&adminConfiguration, for: .admin)
            adminServer = HTTPServer(configuration: adminConfiguration, loops: loops) { router.router.handle($0, $1, on: .admin) }
        } else {
            adminServer = nil
        }
        // Both listeners' figures: refusals and connections on the admin one count too.
        let (publicServer, adminServer) = (self.publicServer, self.adminServer)
        router.reportTransport {
            (adminServer.map { publicServer.stats() + $0.stats() } ?? publicServer.stats()).prometheusText
                + "# HELP attestd_build_info The release and commit this attestd was built from.\n# TYPE attestd_build_info gauge\n"
                + "attestd_build_info{version=\"\(Self.version)\",commit=\"\(Self.commit)\"} 1\n"
                + "# HELP attestd_audit_pending Audit events waiting to be written (they are kept and retried, never dropped).\n"
                + "# TYPE attestd_audit_pending gauge\nattestd_audit_pending \(audit.pendingCount)\n"
                + (tokenChecks.map { checks in
                    let (sent, queries) = checks.figures
                    return "# HELP attestd_token_checks_sent_total Token checks sent on the event loops' own database connections.\n"
                        + "# TYPE attestd_token_checks_sent_total counter\nattestd_token_checks_sent_total \(sent)\n"
                        + "# HELP attestd_token_check_queries_total Queries that carried them (a loop's checks of the moment share one).\n"
                        + "# TYPE attestd_token_check_queries_total counter\nattestd_token_check_queries_total \(queries)\n"
                } ?? "")
        }

        // Started in this order, stopped in reverse: the listeners stop first (nothing new comes
        // in, what is in flight finishes), then the workers and the relay that served them, and
        // last the writes: the ledger's final flush and the audit log's, after the last request.
        var services: [any Service] = [
            BasicService("event-loops", stop: { _ in loops.shutdown() }),
        ]
        services += store.backgroundServices
        services += extraServices
        services.append(audit)
        if let ledger { services.append(ledger) }
        // Budget alerts: the ledger tells each budget's use, thresholds reached are written with
        // their webhook deliveries in one transaction, and a worker delivers the outbox.
        if let ledger, let webhooks = store as? any WebhookStore {
            let alerts = BudgetAlerts(store: webhooks, metrics: service.metrics, log: { logger.info($0, $1) })
            ledger.observeBudgets { alerts.observe($0) }
            services.append(alerts)
            services.append(try WebhookDeliveryWorker(store: webhooks, secrets: relayOptions.secrets, metrics: service.metrics,
                                                      caFile: options.webhookCAFile, log: { event, fields, isError in
                if isError { logger.error(event, fields) } else { logger.info(event, fields) }
            }))
        }
        services.append(purgeJob(store: store, logger: logger, auditRetentionDays: options.auditRetentionDays))
        // The key files: looked at once a second (a refused file is logged, and never replaces the
        // keys held), and what this instance holds written to the database for attestctl secrets
        // status and finish-rotation (at start, on a change, every five minutes), off the loops.
        if let secrets = relayOptions.secrets {
            services.append(SecretsKeyReadReporter(source: secrets, store: store, log: { event, fields, isError in
                let values: [(String, Any)] = fields.map { ($0.0, $0.1) }
                if isError { logger.error(event, values) } else { logger.info(event, values) }
            }))
        }
        // The hosts cloud credentials may go to: read before the listeners open, then every 10 s
        // (a pin an owner sets reaches every instance within that). A read that fails keeps the
        // last list.
        do { relay.setCloudEndpointPins(try store.cloudEndpointPins()) } catch { throw StartupError("cannot read the pinned cloud hosts: \(error)") }
        services.append(PeriodicTask("cloud-endpoint-pins", every: 10) {
            // A database that is away for a while keeps the list last read; the next look reads it again.
            do { relay.setCloudEndpointPins(try store.cloudEndpointPins()) } catch {
                logger.error("cloud_endpoint_pins_unreadable", [("error", String(describing: error))])
            }
        })
        if let receipts = verifier.receiptVerifier {
            var refresh = ReceiptRefreshConfiguration()
            refresh.productionURL = options.appleDataProductionURL
            refresh.developmentURL = options.appleDataDevelopmentURL
            refresh.interval = options.exchange.riskRefreshInterval
            refresh.requestsPerSecond = options.riskRefreshRate
            refresh.lease = options.riskRefreshLease
            if let caFile = options.appleDataCAFile {
                do { refresh.caBundle = try CABundle.systemRoots(adding: caFile) } catch { throw StartupError("--apple-data-ca-file: \(error)") }
            }
            services.append(ReceiptRefreshJob(store: store, verifier: receipts, secrets: relayOptions.secrets, configuration: refresh,
                                              metrics: service.metrics, report: { event, fields, isError in
                let values: [(String, Any)] = fields.map { ($0.0, $0.1) }
                if isError { logger.error(event, values) } else { logger.info(event, values) }
            }))
        }
        services.append(BasicService("upstream-relay", stop: { _ in relay.shutdown() }))
        // What is queued runs (its audit events are in the audit log's last flush).
        services.append(BasicService("exchange-workers", stop: { _ in exchangeWorkers.shutdown() }))
        // Stopped right after the listeners (nothing asks any more), while the workers and the loops still run.
        if let tokenChecks { services.append(BasicService("token-checks", stop: { _ in tokenChecks.shutdown() })) }
        if let adminServer, let admin = options.admin {
            services.append(HTTPListener(name: "admin-listener", server: adminServer, grace: 0, logger: logger, started: { port in
                let address = AttestdInstance.address(host: admin.host, port: port)
                let console = options.baseURLs.first ?? "http://" + AttestdInstance.reachable(address)
                logger.info("admin_listening", [("address", address),
                                                ("routes", "/console/ /metrics /v1/oauth/introspect /v1/authz/check /healthz /readyz"),
                                                ("console", console + "/console/"),
                                                ("sign_in", Self.signInHint(options, console: console))])
            }, failed: { "--admin-listen: \($0) (--admin-listen none turns the admin listener off)" }))
        }
        services.append(HTTPListener(name: "public-listener", server: publicServer, grace: options.shutdownGrace, logger: logger, started: { [adminServer] port in
            // Where this instance listens, for attestctl console-login: written before "listening"
            // says the service is up. A database that refuses it leaves console-login to its default.
            let instance = AttestdInstance(host: SecretsKeyRead.hostName(), publicAddress: AttestdInstance.address(host: options.host, port: port),
                                           adminAddress: options.admin.flatMap { admin in adminServer.map { AttestdInstance.address(host: admin.host, port: $0.port) } },
                                           baseURLs: options.baseURLs, version: "\(Self.version) (commit \(Self.commit))", startedAt: Date(),
                                           processID: Int64(getpid()))
            do { try store.recordInstance(instance) } catch {
                logger.error("instance_record_failed", [("error", String(describing: error)),
                                                        ("note", "attestctl console-login needs --base-url to find this instance's console")])
            }
            logger.info("listening", [("address", "\(options.host.contains(":") ? "[\(options.host)]" : options.host):\(port)"),
                                      ("version", Self.version), ("commit", Self.commit),
                                      ("db", Stores.redacted(options.db)), ("upstream", options.upstreamURL), ("threads", options.threads),
                                      ("exchange_threads", options.exchangeThreads), ("token_ttl", Int(options.exchange.tokenTTL)),
                                      ("mint_limit_per_minute", options.exchange.mintLimitPerMinute),
                                      ("registration_quota_per_hour", options.exchange.registrationQuotaPerHour)])
        }, failed: { "\($0)" }))
        group = ServiceGroup(services, grace: .milliseconds(Int(options.shutdownGrace * 1000)), report: { event in
            if let detail = event.detail {
                logger.error("service_\(event.kind.rawValue)", [("service", event.service), ("error", detail)])
            } else {
                logger.info("service_\(event.kind.rawValue)", [("service", event.service)])
            }
        }, willStop: {
            // systemd (Type=notify): the stop has begun.
            SystemdNotify.send("STOPPING=1")
        })
    }

    /// Starts every service in order; on failure, those started are stopped and the error thrown.
    public func start() throws {
        if options.admin == nil {
            logger.warning("no_admin_listener", [("note", "/metrics, /v1/oauth/introspect and /v1/authz/check are served nowhere (--admin-listen none)")])
        }
        try group.start()
        // systemd (Type=notify): every listener is open, so the unit is up.
        SystemdNotify.send("READY=1\nSTATUS=serving on port \(port)")
    }

    /// Stops within `--shutdown-grace` on SIGINT or SIGTERM.
    public func stopOnSignals() {
        group.stopOnSignals([SIGINT, SIGTERM]) { [logger, options] number in
            logger.info("stopping", [("signal", Int(number)), ("grace_seconds", options.shutdownGrace)])
        }
    }

    /// Until the daemon has stopped: asked to, or because a service ended on its own (then
    /// everything else was stopped after it, and the outcome names it).
    public func wait() -> ServiceGroupOutcome { group.wait() }

    /// Stops gracefully within `--shutdown-grace`: the listeners drain (requests in flight finish,
    /// open streams end with an SSE `overloaded_error` event), then the rest in reverse order.
    public func stop() {
        group.stop()
    }

    /// The release and the commit this attestd was built from (scripts/embed-version.sh).
    public static let version = String(cString: attest_build_version())
    public static let commit = String(cString: attest_build_commit())
    /// What `attestd --version` prints.
    public static var versionLine: String { "attestd \(version) (commit \(commit))" }

    /// The command that prints a console sign-in link for this instance: `--db` when attestctl's
    /// default would open another database, `--base-url` when its default would link elsewhere
    /// (an attestctl that finds this instance's row needs neither, an older one does).
    static func signInHint(_ options: ServeOptions, console: String) -> String {
        var words = ["attestctl", "console-login", "--actor", "EMAIL"]
        if options.db != "attestd.sqlite" && options.db != "./attestd.sqlite" { words += ["--db", Stores.redacted(options.db)] }
        if console != "http://127.0.0.1:9090" { words += ["--base-url", console] }
        return words.joined(separator: " ")
    }

    /// The public listener's port (0 before `run`).
    public var port: UInt16 { publicServer.port }
    /// The admin listener's port (0 when it has none).
    public var adminPort: UInt16 { adminServer?.port ?? 0 }
    /// What the services did so far, in order.
    public var lifecycle: [LifecycleEvent] { group.events }

    // MARK: Configuration read at start

    /// The certificates in each PEM file of a repeatable root option, each logged loudly.
    static func roots(_ paths: [String], option: String, event: String, note: String, _ logger: Logger) throws -> [Certificate] {
        var roots: [Certificate] = []
        for path in paths {
            guard let pem = try? String(contentsOfFile: path, encoding: .utf8) else { throw StartupError("\(option): cannot read \(path)") }
            let certificates: [Certificate]
            do { certificates = try Certificate.all(pem: pem) } catch { throw StartupError("\(option) \(path): \(error)") }
            for certificate in certificates {
                logger.warning(event, [("file", path), ("subject", certificate.subjectName),
                                       ("sha256", hexString(certificate.sha256Fingerprint)), ("note", note)])
            }
            roots += certificates
        }
        return roots
    }

    static func anchors(_ options: ServeOptions, _ logger: Logger) throws -> [Certificate] {
        try roots(options.trustAnchors, option: "--trust-anchor", event: "extra_trust_anchor",
                  note: "attestations chained to this root are accepted next to Apple's; development and tests only", logger)
    }

    /// G3 unless a test root is trusted: then the test receipt root, or nothing (said loudly).
    static func receiptPolicy(_ options: ServeOptions, _ logger: Logger) throws -> AppAttestVerifier.ReceiptPolicy {
        let roots = try roots(options.receiptTrustAnchors, option: "--receipt-trust-anchor", event: "receipt_trust_anchor",
                              note: "receipts are checked against this root (and pinned intermediate) instead of Apple Root CA - G3; tests only", logger)
        if !roots.isEmpty { return .anchors(roots) }
        if !options.trustAnchors.isEmpty {
            logger.warning("receipts_unchecked", [("note", "--trust-anchor without --receipt-trust-anchor: attestations' receipts are not checked "
                                                  + "and their devices get no risk metric")])
            return .unchecked
        }
        return .apple
    }

    static func introspectionKey(_ options: ServeOptions) throws -> String? {
        guard let file = options.introspectionKeyFile else { return nil }
        guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { throw StartupError("--introspection-key-file: cannot read \(file)") }
        let key = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard key.utf8.count >= 32 else { throw StartupError("introspection key in \(file) is shorter than 32 characters") }
        return key
    }

    /// The relay's upstream, its default key and the secrets key that opens the workspaces' own keys.
    static func relayConfiguration(_ options: ServeOptions, _ logger: Logger) throws -> RelayConfiguration {
        var upstream = UpstreamConfiguration(baseURL: options.upstreamURL)
        if !options.upstreamConnectTo.isEmpty {
            upstream.connectTo = options.upstreamConnectTo
            logger.warning("upstream_connect_to", [("entries", options.upstreamConnectTo.joined(separator: " ")),
                                                   ("note", "tests only: upstream requests for these hosts go to loopback stubs")])
        }
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
        let secrets: SecretsKeySource
        if FileManager.default.fileExists(atPath: secretsPath) {
            // Both files (the previous key's while a rotation is under way), each refused when its
            // group or others may read or write it, or another user owns it.
            do { secrets = try SecretsKeySource.loading(secretsPath) } catch { throw StartupError("\(error)") }
        } else if options.secretsKeyFile != nil {
            throw StartupError("--secrets-key-file: cannot read \(secretsPath)")
        } else {
            // The first run: attestd started before `attestctl init` created the file. It is read
            // once it appears, so a workspace's key opens without a restart.
            logger.warning("no_secrets_key", [("file", secretsPath),
                                              ("note", "workspaces' upstream keys and Apple keys open once attestctl init creates this file")])
            secrets = SecretsKeySource(path: secretsPath)
        }
        var relay = RelayConfiguration(upstream: upstream, defaultKey: defaultKey, secrets: secrets)
        relay.cooldown = UpstreamCooldown(base: .milliseconds(Int64(options.upstreamCooldown * 1000)),
                                          cap: .milliseconds(Int64(options.upstreamCooldownMax * 1000)))
        return relay
    }
}

/// A listener as a service: it starts listening, and stops gracefully within its grace (no new
/// connections, idle ones closed, requests in flight answered, streams ended cleanly).
final class HTTPListener: Service {
    let name: String
    let server: HTTPServer
    let grace: Double
    let logger: Logger
    let started: @Sendable (UInt16) -> Void
    let failed: @Sendable (any Error) -> String

    init(name: String, server: HTTPServer, grace: Double, logger: Logger, started: @escaping @Sendable (UInt16) -> Void,
         failed: @escaping @Sendable (any Error) -> String) {
        self.name = name
        self.server = server
        self.grace = grace
        self.logger = logger
        self.started = started
        self.failed = failed
    }

    private let life = ServiceLife()

    func start() throws {
        do { try server.start() } catch { throw StartupError(failed(error)) }
        started(server.port)
    }

    func run() throws { try life.wait() }

    func stop(by deadline: ContinuousClock.Instant) {
        defer { life.end() }
        server.shutdown(grace: min(grace, seconds(until: deadline)))
        let stats = server.stats()
        logger.info("listener_stopped", [("listener", name), ("requests", Int(stats.requestsCompleted)),
                                         ("unanswered", Int(stats.unansweredRequests)), ("cancelled", Int(stats.cancelledAnswers))])
    }
}

/// Used and expired challenges, and challenge requests past their window, are purged once a
/// minute so those tables stay small; so are audit rows past their retention, in bounded batches
/// (a first run on a large old log deletes it over many minutes, never in one long transaction).
func purgeJob(store: any ExchangeStore & AuditStore & ConsoleStore & SecretsKeyReadStore, logger: Logger, every interval: Double = 60, auditRetentionDays: Int = 400,
              auditBatch: Int = 1000, auditBatchesPerRun: Int = 10) -> PeriodicTask {
    PeriodicTask("purge", every: interval) {
        do {
            if auditRetentionDays > 0 {
                let before = Date() - Double(auditRetentionDays) * 86_400
                var purged = 0
                for _ in 0..<auditBatchesPerRun {
                    let deleted = try store.purgeAudit(before: before, limit: auditBatch)
                    purged += deleted
                    if deleted < auditBatch { break }
                }
                if purged > 0 { logger.info("audit_purged", [("count", purged), ("retention_days", auditRetentionDays)]) }
            }
            let purged = try store.purgeChallenges(before: Date())
            if purged > 0 { logger.info("challenges_purged", [("count", purged)]) }
            // Challenge requests only matter for their one-minute window.
            // (registrations, counted per address for an hour, an hour and two minutes after).
            _ = try store.purgeChallengeRequests(before: Date() - 120, registrationsBefore: Date() - 3720)
            // Console sign-in links and sessions, an hour after they ended.
            _ = try store.purgeConsoleAccess(before: Date() - 3600)
            // Key-file reports of instances gone for a month (stale long before: see SecretsKeyRead).
            _ = try store.purgeSecretsKeyReads(before: Date() - SecretsKeyRead.keptFor)
        } catch { logger.error("purge_failed", [("error", String(describing: error))]) }
    }
}
