import AttestWire
import AppAttest
import AttestCrypto
import Foundation
import HTTPServer
import ServiceRoutes
import SQLiteStore
import TokenService

/// attestd: the App Attest token service. `attestd serve [options]`.
let usage = """
usage: attestd serve [--db PATH] [--listen HOST:PORT] [--trust-anchor PEM]… [--token-ttl SECONDS]
                     [--mint-limit PER_MINUTE] [--registration-quota PER_HOUR] [--challenge-limit PER_MINUTE]
                     [--introspection-key-file FILE] [--threads N] [--synchronous full|normal]
defaults: --db ./attestd.sqlite --listen 127.0.0.1:8080 --token-ttl 3600 --mint-limit 10
          --registration-quota 1000 --challenge-limit 600 --threads 4 --synchronous full (0 disables a limit)
--token-ttl is 300 to 86400 seconds: the published client refreshes 60 s before expiry, so a
          shorter token would be refreshed on almost every call and soon hit the mint limit.
"""

struct ServeOptions {
    var db = "attestd.sqlite"
    var host = "127.0.0.1"
    var port: UInt16 = 8080
    var trustAnchors: [String] = []
    var exchange = ExchangeConfiguration()
    var introspectionKeyFile: String?
    var threads = 4
    var synchronous = "FULL"

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
            case "--listen":
                let text = try value()
                guard let colon = text.lastIndex(of: ":"), let p = UInt16(text[text.index(after: colon)...]) else {
                    throw StartupError("--listen takes HOST:PORT, e.g. 127.0.0.1:8080, got \(text)")
                }
                host = String(text[..<colon]).trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
                port = p
            case "--trust-anchor": trustAnchors.append(try value())
            case "--token-ttl": exchange.tokenTTL = TimeInterval(try number("--token-ttl", 300...86_400))
            case "--mint-limit": exchange.mintLimitPerMinute = try number("--mint-limit", 0...1_000_000)
            case "--registration-quota": exchange.registrationQuotaPerHour = try number("--registration-quota", 0...100_000_000)
            case "--challenge-limit": exchange.challengeLimitPerMinute = try number("--challenge-limit", 0...100_000_000)
            case "--introspection-key-file": introspectionKeyFile = try value()
            case "--threads": threads = try number("--threads", 1...256)
            case "--synchronous":
                let mode = try value().uppercased()
                guard mode == "FULL" || mode == "NORMAL" else { throw StartupError("--synchronous is full or normal") }
                synchronous = mode
            default: throw StartupError("unknown option \(arguments[i])\n\(usage)")
            }
            i += 1
        }
    }
}

struct StartupError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

let logger = Logger()

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

    let store = try SQLiteTokenStore(path: options.db, synchronous: options.synchronous)
    let audit = BufferedAuditLog(store: store, onError: { logger.error("audit_write_failed", [("error", $0)]) })
    let service = DeviceTokenService(store: store, verifier: verifier, configuration: options.exchange, audit: audit)
    let router = ServiceRouter(service: service, logger: logger, introspectionKey: introspectionKey)

    var configuration = HTTPServerConfiguration()
    configuration.host = options.host
    configuration.port = options.port
    configuration.threads = options.threads
    let server = HTTPServer(configuration: configuration) { router.handle($0) }
    try server.start()
    logger.info("listening", [("address", "\(options.host.contains(":") ? "[\(options.host)]" : options.host):\(server.port)"),
                              ("db", options.db), ("threads", options.threads), ("token_ttl", Int(options.exchange.tokenTTL)),
                              ("mint_limit_per_minute", options.exchange.mintLimitPerMinute),
                              ("registration_quota_per_hour", options.exchange.registrationQuotaPerHour)])

    // Used and expired challenges are purged once a minute so the table stays small.
    let maintenance = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "maintenance"))
    maintenance.schedule(deadline: .now() + 60, repeating: 60)
    maintenance.setEventHandler {
        do {
            let purged = try store.purgeChallenges(before: Date())
            if purged > 0 { logger.info("challenges_purged", [("count", purged)]) }
        } catch { logger.error("purge_failed", [("error", String(describing: error))]) }
    }
    maintenance.resume()

    // SIGINT/SIGTERM: stop accepting, flush the audit buffer, exit cleanly.
    let signalQueue = DispatchQueue(label: "signals")
    var sources: [DispatchSourceSignal] = []
    for signalNumber in [SIGINT, SIGTERM] {
        signal(signalNumber, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: signalQueue)
        source.setEventHandler {
            logger.info("stopping", [("signal", Int(signalNumber))])
            server.stop()
            audit.close()
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
    try serve(try ServeOptions(Array(arguments.dropFirst())))
} catch {
    logger.error("startup_failed", [("error", String(describing: error))])
    exit(2)
}
