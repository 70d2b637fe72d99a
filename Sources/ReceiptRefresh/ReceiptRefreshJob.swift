import AppAttest
import AppleDataService
import AttestCrypto
import Foundation
import Lifecycle
import Synchronization
import TokenService

/// How the refresh job talks to Apple and how fast.
public struct ReceiptRefreshConfiguration: Sendable {
    public var productionURL = AppleDataClient.productionURL
    public var developmentURL = AppleDataClient.developmentURL
    /// PEM roots for the TLS connection (system roots plus `--apple-data-ca-file`); nil: the system's.
    public var caBundle: [UInt8]?
    /// A device is posted this long after its registration or last refresh.
    public var interval: TimeInterval = 86_400
    /// The cap on requests to Apple per second, across this instance's workers. 20/s refreshes
    /// 1.7 million devices a day, 17 times what 100,000 daily devices need, so a backlog after an
    /// outage clears in hours while Apple never sees a burst from one server.
    public var requestsPerSecond: Double = 20
    /// A claim lapses after this long (a killed instance's devices are taken over by then).
    public var lease: TimeInterval = 60
    /// Requests in flight at once (each a blocking POST on its own thread).
    public var workers = 2
    /// How often an idle job looks for due devices.
    public var pollInterval: TimeInterval = 1
    public init() {}
}

/// Posts each due device's current receipt to Apple's data service and stores the refreshed,
/// validated receipt and its fraud-risk metric. Devices are claimed from the database with a
/// lease, so several instances share the work and none posts a device another holds.
public final class ReceiptRefreshJob: Service {
    public let name = "receipt-refresh"
    let store: ReceiptRefreshStore
    let verifier: ReceiptVerifier
    let secrets: SecretsKeySource?
    let configuration: ReceiptRefreshConfiguration
    let metrics: Metrics
    /// (event, fields, isError): the daemon's log.
    let report: @Sendable (String, [(String, String)], Bool) -> Void
    let now: @Sendable () -> Date

    private struct State {
        var stopping = false
        var queue: [DueReceipt] = []
        /// The rate limiter: the earliest time the next request may start.
        var nextSlot = Date.distantPast
        /// After a 429, a 5xx or a transport failure: nothing is sent before this.
        var pausedUntil = Date.distantPast
        var backoff: TimeInterval = 0
        /// Teams and keys already reported (missing key; 401 or 400 for a key set at a time).
        var reported: Set<String> = []
        /// Opened keys and their current provider token, by team; refreshed when the key changes.
        var keys: [String: CachedKey] = [:]
        /// When the oldest-due metric was last read (a query of its own: at most every 5 s).
        var oldestReadAt = Date.distantPast
    }

    struct CachedKey {
        let sealed: SealedAppleKey
        let key: AppleDataKey?
        var token: String?
        var tokenMadeAt: Date
        /// Apple refused this key (401 or 400): its devices wait for a new key.
        var refused = false
    }

    private let state = Mutex(State())
    private let claimLock = Mutex(())
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let started = Mutex(0)
    private let life = ServiceLife()

    public init(store: ReceiptRefreshStore, verifier: ReceiptVerifier, secrets: SecretsKeySource?, configuration: ReceiptRefreshConfiguration,
                metrics: Metrics, now: @escaping @Sendable () -> Date = { Date() },
                report: @escaping @Sendable (String, [(String, String)], Bool) -> Void) {
        self.store = store
        self.verifier = verifier
        self.secrets = secrets
        self.configuration = configuration
        self.metrics = metrics
        self.now = now
        self.report = report
        metrics.describe("attestd_receipt_refreshes_total", "Receipt refreshes with Apple's data service, by outcome.")
        metrics.describe("attestd_receipt_refresh_oldest_due_seconds", "How long the longest-waiting due device has waited for its refresh.")
        metrics.describe("attestd_risk_metric", "Apple's fraud-risk metric in each refreshed receipt (keys attested on the device lately).")
    }

    public func run() throws { try life.wait() }

    public func start() throws {
        let workers = max(1, configuration.workers)
        for index in 0..<workers {
            // Each worker owns its HTTP client (a curl handle is one thread's), so its connection is reused.
            let client = try AppleDataClient(caBundle: configuration.caBundle)
            let box = ClientBox(client)
            let thread = Thread { [self] in
                work(box.client)
                finished.signal()
                // A worker leaves its loop only when stopping; any other end is the job's death.
                if !state.withLock({ $0.stopping }) { life.end(ServiceEndedError("receipt refresh worker \(index) ended")) }
            }
            thread.name = "receipt-refresh-\(index)"
            started.withLock { $0 += 1 }
            thread.start()
        }
    }

    /// Workers finish the request they are in, until the deadline (a request Apple holds longer
    /// is left: its claim lapses after the lease, and its answer, if it comes, is still stored);
    /// claims not yet posted are released for another instance at once.
    public func stop(by deadline: ContinuousClock.Instant) {
        defer { life.end() }
        let queued = state.withLock { s -> [DueReceipt] in
            s.stopping = true
            defer { s.queue.removeAll() }
            return s.queue
        }
        let workers = started.withLock { $0 }
        for _ in 0..<(workers * 4) { wake.signal() }
        for _ in 0..<workers {
            guard finished.wait(timeout: .now() + seconds(until: deadline)) == .success else { break }
        }
        let time = now()
        for item in queued { _ = try? store.finishReceiptRefresh(ReceiptRefreshOutcome(keyID: item.keyID, claim: item.claim, receipt: nil,
                                                                                         checkedAt: time, nextDue: time)) }
    }

    var isStopping: Bool { state.withLock { $0.stopping } }

    /// Sleeps until `date` or until the job stops; false when stopping.
    func sleep(until date: Date) -> Bool {
        while !isStopping {
            let left = date.timeIntervalSince(now())
            if left <= 0 { return true }
            _ = wake.wait(timeout: .now() + min(left, 1))
        }
        return false
    }

    func work(_ client: AppleDataClient) {
        while !isStopping {
            guard let item = nextItem() else {
                _ = sleep(until: now() + configuration.pollInterval)
                continue
            }
            // One slot per request, across the workers; and nothing while Apple asked to back off.
            let slot = state.withLock { s -> Date in
                let start = max(s.nextSlot, s.pausedUntil, now())
                s.nextSlot = start + 1 / max(0.001, configuration.requestsPerSecond)
                return start
            }
            guard sleep(until: slot) else {
                release(item)
                return
            }
            refresh(item, with: client)
        }
    }

    /// The next claimed device, claiming a batch when none is left.
    func nextItem() -> DueReceipt? {
        if let item = state.withLock({ $0.queue.isEmpty ? nil : $0.queue.removeFirst() }) { return item }
        return claimLock.withLock { _ -> DueReceipt? in
            if let item = state.withLock({ $0.queue.isEmpty ? nil : $0.queue.removeFirst() }) { return item }
            let time = now()
            let batch = max(1, min(100, Int(configuration.requestsPerSecond * configuration.lease / 4)))
            do {
                var claimed = try store.claimDueReceipts(at: time, lease: configuration.lease, limit: batch, claim: base64URL(secureRandomBytes(12)))
                let readOldest = state.withLock { s -> Bool in
                    guard time.timeIntervalSince(s.oldestReadAt) >= 5 else { return false }
                    s.oldestReadAt = time
                    return true
                }
                if readOldest {
                    let oldest = try store.oldestDueReceipt(at: time)
                    metrics.set("attestd_receipt_refresh_oldest_due_seconds", max(0, oldest.map { time.timeIntervalSince($0) } ?? 0))
                }
                guard !claimed.isEmpty else { return nil }
                let first = claimed.removeFirst()
                state.withLock { $0.queue += claimed }
                return first
            } catch {
                report("receipt_refresh_claim_failed", [("error", String(describing: error))], true)
                return nil
            }
        }
    }

    func release(_ item: DueReceipt) {
        let time = now()
        _ = try? store.finishReceiptRefresh(ReceiptRefreshOutcome(keyID: item.keyID, claim: item.claim, receipt: nil, checkedAt: time, nextDue: time))
    }

    func finish(_ item: DueReceipt, _ outcome: String, receipt: ReceiptRefreshOutcome.NewReceipt? = nil, nextDue: Date, at time: Date) {
        metrics.increment("attestd_receipt_refreshes_total", labels: [("outcome", outcome)])
        do {
            let stored = try store.finishReceiptRefresh(ReceiptRefreshOutcome(keyID: item.keyID, claim: item.claim, receipt: receipt,
                                                                             checkedAt: time, nextDue: nextDue))
            if !stored {
                report("receipt_refresh_claim_lost", [("key_id", base64URL(item.keyID)), ("note", "the claim lapsed and another instance took the device")], false)
            }
        } catch {
            report("receipt_refresh_store_failed", [("key_id", base64URL(item.keyID)), ("error", String(describing: error))], true)
        }
    }

    /// Once per thing: a missing key per team, a refused key per (team, key, its set time, status).
    func reportOnce(_ what: String, _ event: String, _ fields: [(String, String)]) {
        guard state.withLock({ $0.reported.insert(what).inserted }) else { return }
        report(event, fields, true)
    }

    // MARK: One device

    func refresh(_ item: DueReceipt, with client: AppleDataClient) {
        let time = now()
        let later = time + configuration.interval
        let sealed: SealedAppleKey, token: String
        switch credentials(item.teamID, at: time) {
        case .usable(let key, let made):
            (sealed, token) = (key, made)
        case .missing:
            // No key for the team: its devices keep their receipt and show risk unknown.
            reportOnce("missing " + item.teamID, "apple_key_missing", [("team_id", item.teamID),
                       ("note", "no App Attest data-service key for this team (attestctl apple-keys set): its devices get no risk metric")])
            return finish(item, "no_key", nextDue: later, at: time)
        case .unusable:
            // Refused by Apple, or it does not open: said once already; the devices wait for a new key.
            return finish(item, "key_refused", nextDue: later, at: time)
        }
        let url = item.environment == .production ? configuration.productionURL : configuration.developmentURL
        let response: AppleDataClient.Response
        do {
            response = try client.post(url: url, receipt: item.receipt, authorization: token)
        } catch {
            report("receipt_refresh_transport_failed", [("url", url), ("error", String(describing: error))], true)
            return finish(item, "transport_error", nextDue: time + backOff(at: time), at: time)
        }
        switch response.status {
        case 200:
            resetBackoff()
            guard let appID = AppID(item.appID), let der = Self.decodeBase64(response.body) else {
                report("receipt_refresh_invalid", [("key_id", base64URL(item.keyID)), ("error", "the answer is not a Base64 receipt")], true)
                return finish(item, "invalid_receipt", nextDue: later, at: time)
            }
            let receipt: Receipt
            do {
                receipt = try verifier.validateRefreshedReceipt(der, appID: appID, credentialCertificate: item.credentialCertificate,
                                                                environment: item.environment, at: time)
            } catch {
                // The last valid receipt stays: an answer that does not validate replaces nothing.
                report("receipt_refresh_invalid", [("key_id", base64URL(item.keyID)), ("error", String(describing: error))], true)
                return finish(item, "invalid_receipt", nextDue: later, at: time)
            }
            let overLimit = item.riskLimit > 0 && (receipt.riskMetric ?? 0) > item.riskLimit
            if let metric = receipt.riskMetric {
                metrics.observe("attestd_risk_metric", seconds: Double(metric), buckets: [0, 1, 2, 3, 5, 10, 25, 50, 100, 1000])
            }
            if overLimit {
                report("risk_limit_exceeded", [("client_id", item.clientID), ("key_id", base64URL(item.keyID)),
                                               ("risk_metric", String(receipt.riskMetric ?? 0)), ("risk_limit", String(item.riskLimit)),
                                               ("note", "refused at its next token refresh")], false)
            }
            finish(item, "refreshed", receipt: .init(der: der, createdAt: receipt.createdAt, notBefore: receipt.notBefore, expiresAt: receipt.expiresAt,
                                                      riskMetric: receipt.riskMetric, overLimit: overLimit),
                   nextDue: max(later, receipt.refreshableAt), at: time)
        case 304:
            resetBackoff()
            finish(item, "not_modified", nextDue: later, at: time)
        case 404:
            // Apple keeps no data past 30 days without a new attestation: the last valid receipt stays.
            resetBackoff()
            finish(item, "not_found", nextDue: later, at: time)
        case 429:
            finish(item, "rate_limited", nextDue: time + backOff(at: time), at: time)
        case 500...599:
            finish(item, "unavailable", nextDue: time + backOff(at: time), at: time)
        case 400:
            // One receipt Apple would not take (a bad payload, the wrong environment, or a receipt
            // someone forged to get exactly this answer): that device waits for its next turn, and
            // the rest of its team go on.
            resetBackoff()
            let cause = String(decoding: response.body.prefix(200), as: UTF8.self)
            report("receipt_refresh_refused", [("team_id", item.teamID), ("key_id", base64URL(item.keyID)), ("status", "400"),
                                               ("cause", "wrong environment or a bad payload: " + cause)], true)
            finish(item, "bad_request", nextDue: later, at: time)
        case 401:
            // The team's key is wrong for every device of the team alike: said once, and the team's
            // devices wait for a new key rather than each being refused.
            let cause = String(decoding: response.body.prefix(200), as: UTF8.self)
            state.withLock { $0.keys[item.teamID]?.refused = true }
            reportOnce("refused \(item.teamID) \(sealed.keyID) \(sealed.setAt.timeIntervalSince1970) \(response.status)", "apple_key_refused",
                       [("team_id", item.teamID), ("key_id", sealed.keyID), ("status", String(response.status)),
                        ("cause", "the provider token did not verify or does not match the receipt's team: " + cause)])
            finish(item, "unauthorized", nextDue: later, at: time)
        default:
            report("receipt_refresh_unexpected", [("status", String(response.status))], true)
            finish(item, "unexpected_status", nextDue: later, at: time)
        }
    }

    enum Credentials {
        case usable(SealedAppleKey, String)
        case missing
        /// Apple refused it, it does not open, or the store could not be read.
        case unusable
    }

    /// The team's key, opened once per change, and a provider token at most 20 minutes old
    /// (Apple refuses tokens older than an hour).
    func credentials(_ teamID: String, at time: Date) -> Credentials {
        let stored: SealedAppleKey?
        do { stored = try store.appleKey(teamID: teamID) } catch {
            report("apple_key_read_failed", [("team_id", teamID), ("error", String(describing: error))], true)
            return .unusable
        }
        guard let stored else { return .missing }
        // A changed key, or one that did not open (no secrets key yet, on a first run), is opened
        // again, outside the lock (opening reports its failures, which takes the lock).
        if state.withLock({ $0.keys[teamID]?.sealed != stored || $0.keys[teamID]?.key == nil }) {
            let opened = open(stored)
            state.withLock { $0.keys[teamID] = CachedKey(sealed: stored, key: opened, token: nil, tokenMadeAt: .distantPast) }
        }
        return state.withLock { s -> Credentials in
            guard var cached = s.keys[teamID], let key = cached.key, !cached.refused else { return .unusable }
            if cached.token == nil || time.timeIntervalSince(cached.tokenMadeAt) > 20 * 60 {
                cached.token = try? ProviderToken.make(key, at: time)
                cached.tokenMadeAt = time
                s.keys[teamID] = cached
            }
            guard let token = cached.token else { return .unusable }
            return .usable(stored, token)
        }
    }

    func open(_ sealed: SealedAppleKey) -> AppleDataKey? {
        guard let secrets, secrets.current() != nil else {
            reportOnce("secrets", "apple_key_unopenable", [("note", "no secrets key: Apple keys cannot be opened (attestctl init creates it)")])
            return nil
        }
        do {
            let pem = try secrets.open(sealed.sealed, associatedData: SealedAppleKey.associatedData(teamID: sealed.teamID, keyID: sealed.keyID))
            return try AppleDataKey(teamID: sealed.teamID, keyID: sealed.keyID, p8: String(decoding: pem, as: UTF8.self))
        } catch {
            reportOnce("unopenable \(sealed.teamID) \(sealed.setAt.timeIntervalSince1970)", "apple_key_unopenable",
                       [("team_id", sealed.teamID), ("key_id", sealed.keyID), ("error", String(describing: error))])
            return nil
        }
    }

    /// Doubles from 1 s to 5 minutes while Apple keeps refusing; every worker waits it out.
    func backOff(at time: Date) -> TimeInterval {
        state.withLock { s in
            s.backoff = min(300, max(1, s.backoff * 2))
            s.pausedUntil = max(s.pausedUntil, time + s.backoff)
            return s.backoff
        }
    }

    func resetBackoff() { state.withLock { $0.backoff = 0 } }

    static func decodeBase64(_ body: [UInt8]) -> [UInt8]? {
        let text = String(decoding: body, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard !text.isEmpty, let data = Data(base64Encoded: text) else { return nil }
        return Array(data)
    }
}

/// A worker's client, handed to its thread once and used only there.
private final class ClientBox: @unchecked Sendable {
    let client: AppleDataClient
    init(_ client: AppleDataClient) { self.client = client }
}
