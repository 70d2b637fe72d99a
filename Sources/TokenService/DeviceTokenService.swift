import AttestWire
import AppAttest
import AttestCrypto
import Foundation
import Synchronization

/// Limits and lifetimes of the device token exchange.
public struct ExchangeConfiguration: Sendable {
    public var tokenTTL: TimeInterval = 3600
    public var challengeTTL: TimeInterval = 300
    /// Tokens minted per device key per minute (0 = unlimited). Only successful mints count, so
    /// someone who merely knows a key ID cannot lock its device out.
    public var mintLimitPerMinute = 10
    /// Successful registrations per integration per hour (0 = unlimited).
    public var registrationQuotaPerHour = 1000
    /// Challenge requests per caller (remote address) per minute (0 = unlimited): bounds the rows
    /// and the verification work an anonymous caller can cause, without letting one caller
    /// starve an integration's other devices.
    public var challengeLimitPerMinute = 600
    /// Registration requests per caller (remote address) per hour (0 = unlimited): one device
    /// generating key after key cannot use up its integration's quota and lock new installs out.
    /// Many installs behind one carrier NAT share an address: raise it for such audiences.
    public var registrationLimitPerAddress = 20
    /// Lifetime of the `next_challenge` handed out with a token: long enough to still be valid
    /// when the client refreshes, 60 s before the token expires (or a little after).
    public var nextChallengeTTL: TimeInterval { tokenTTL + challengeTTL }
    /// How long after its registration or last refresh a device's receipt is posted to Apple again.
    public var riskRefreshInterval: TimeInterval = 86_400
    public init() {}
}

/// What a successful register or token request returns to the device.
public struct IssuedToken: Sendable {
    public let accessToken: String
    public let expiresIn: Int
    public let nextChallenge: [UInt8]
    public let nextChallengeExpiresIn: Int
}

/// The device token exchange: challenge → attestation → first token; challenge → assertion → token.
/// Knows nothing of HTTP: the transport decodes, calls one method, and encodes the result.
public final class DeviceTokenService: Sendable {
    public let store: any DeviceExchangeStore
    public let verifier: AppAttestVerifier
    public let configuration: ExchangeConfiguration
    public let metrics: Metrics
    let audit: AuditSink
    /// Where device-posture refusals and would-be refusals are counted by rule (the usage ledger
    /// writes them with its flush); nil: not counted.
    public let ruleTally: PolicyRuleTally?
    /// The service's clock: token expiry and usage minutes are read against it.
    public let now: @Sendable () -> Date
    private let keyCache = DeviceKeyCache()

    public static let tokenPrefix = "aat_"
    public static let clientIDPrefix = "clid_"

    public init(store: any DeviceExchangeStore, verifier: AppAttestVerifier, configuration: ExchangeConfiguration = ExchangeConfiguration(),
                metrics: Metrics = Metrics(), audit: AuditSink, ruleTally: PolicyRuleTally? = nil, now: @escaping @Sendable () -> Date = { Date() }) {
        self.store = store
        self.ruleTally = ruleTally
        self.verifier = verifier
        self.configuration = configuration
        self.metrics = metrics
        self.audit = audit
        self.now = now
        metrics.describe("attestd_tokens_issued_total", "Access tokens issued, by grant (registration or assertion).")
        metrics.describe("attestd_registrations_total", "Devices registered by a verified attestation, by where the build came from (distribution; none: the device wrote no category).")
        metrics.describe("attestd_device_policy_refusals_total", "Registrations and refreshes the integration's device policy refused, by reason and distribution.")
        metrics.describe("attestd_device_policy_would_refuse_total", "Registrations and refreshes a monitored device-posture rule would have refused, by rule.")
        metrics.describe("attestd_verification_seconds", "Time spent in App Attest verification, by kind.")
    }

    // MARK: Challenge

    /// A challenge for (client ID, key ID): the pending one with its remaining TTL, or a new one.
    /// - Parameter caller: who is asking (the remote address), for the per-caller challenge limit.
    public func challenge(clientID: String, keyID: [UInt8], caller: String = "") throws -> (challenge: [UInt8], expiresIn: Int) {
        try rejecting(clientID: clientID, keyID: keyID, action: "challenge") {
            let time = now()
            try requireKeyIDShape(keyID)
            // A client ID that names no live integration spends a budget of its own, so junk
            // requests from an address can never use up a real device's challenges there.
            let integration = Result { try liveIntegration(clientID) }
            if configuration.challengeLimitPerMinute > 0 {
                let bucket = (try? integration.get()) == nil ? "unknown-client " + caller : caller
                let window = try store.recordChallengeRequest(caller: bucket, at: time, since: time - 60)
                if let retry = Self.overLimit(window, limit: configuration.challengeLimitPerMinute, seconds: 60, at: time) {
                    throw Rejection(.rateLimited(retryAfter: retry), .challengeLimit,
                                    "caller over \(configuration.challengeLimitPerMinute) challenge requests a minute")
                }
            }
            _ = try integration.get()
            let fresh = IssuedChallenge(bytes: secureRandomBytes(32), expiresAt: time.addingTimeInterval(configuration.challengeTTL))
            let issued = try store.pendingOrNewChallenge(clientID: clientID, keyID: keyID, fresh: fresh, at: time)
            return (issued.bytes, remaining(issued.expiresAt, from: time))
        }
    }

    // MARK: Register

    /// The rolling window a caller's registrations are counted in (beside its challenge requests,
    /// kept an hour instead of two minutes).
    public static func registrationBucket(_ caller: String) -> String { registrationBucketPrefix + caller }
    public static let registrationBucketPrefix = "register "

    /// Verifies the attestation and stores the device with its first token; `completion` gets the
    /// token once that is committed (see `exchanging`).
    /// - Parameter caller: who is asking (the remote address), for the per-address registration limit.
    public func register(clientID: String, keyID: [UInt8], attestationObject: [UInt8], caller: String = "",
                         completion: @escaping @Sendable (Result<IssuedToken, any Error>) -> Void) {
        exchanging(clientID: clientID, keyID: keyID, action: "register", completion: completion) { time, context, integration, challenge, committed in
            if context.device != nil {
                throw Rejection(.invalidGrant, .keyAlreadyRegistered, "key ID is already registered")
            }
            if configuration.registrationLimitPerAddress > 0, !caller.isEmpty {
                let window = try store.recordChallengeRequest(caller: Self.registrationBucket(caller), at: time, since: time - 3600)
                if let retry = Self.overLimit(window, limit: configuration.registrationLimitPerAddress, seconds: 3600, at: time) {
                    throw Rejection(.rateLimited(retryAfter: retry), .registrationAddressLimit,
                                    "caller over \(configuration.registrationLimitPerAddress) registrations an hour")
                }
            }
            if configuration.registrationQuotaPerHour > 0,
               let retry = Self.atLimit(try store.registrationsSince(clientID: integration.clientID, since: time - 3600),
                                        limit: configuration.registrationQuotaPerHour, seconds: 3600, at: time) {
                throw Rejection(.rateLimited(retryAfter: retry), .registrationQuota,
                                "integration over its quota of \(configuration.registrationQuotaPerHour) registrations an hour")
            }
            let verified = try timed("attestation") {
                try verifier.verifyAttestation(attestationObject, keyID: keyID, clientDataHash: WireProtocol.registrationClientDataHash(challenge: challenge, sha256: sha256),
                                               allowedAppIDs: integration.appIDs, allowedEnvironments: integration.environments, at: time)
            }
            try admitting(verified.app, clientID: clientID, at: time) { watched in
                try integration.devicePolicy.checkRegistration(verified.app, platform: verified.platform, environment: verified.environment,
                                                               monitored: integration.policy.monitored, watched: &watched)
            }
            let device = Device(keyID: keyID, clientID: clientID, publicKey: verified.publicKey, counter: 0,
                                environment: verified.environment, appID: verified.appID.description,
                                platform: verified.platform, validationCategory: verified.app.validationCategory,
                                bundleVersion: verified.app.bundleVersion, osVersion: verified.osInformation?.version)
            // Build (and so validate) the device key now: the point must be on the curve, and the
            // first refresh then finds the key parsed.
            _ = try keyCache.key(for: device)
            let (token, record) = mintToken(integration: integration, keyID: keyID, at: time)
            let next = nextChallenge(at: time)
            let quota = configuration.registrationQuotaPerHour > 0
                ? RegistrationQuota(limit: configuration.registrationQuotaPerHour, window: 3600) : nil
            let distribution = Self.label(verified.app)
            let detail = "\(verified.environment.rawValue) \(verified.appID) \(verified.platform.rawValue) "
                + "\(verified.app.distribution?.rawValue ?? "no-category") bundle \(verified.app.bundleVersion ?? "-")"
                + " os \(verified.osInformation?.version ?? "-")"
            // Last: from here the store answers, possibly on another thread.
            store.registerDevice(device, receipt: storedReceipt(verified, at: time), firstToken: record, redeeming: challenge, nextChallenge: next,
                                 quota: quota, at: time, commitTime: now) { [self] result in
                committed(Result {
                    switch try result.get() {
                    case .committed: break
                    case .challengeGone: throw Rejection(.invalidGrant, .noPendingChallenge, "challenge expired or was redeemed concurrently")
                    case .quotaExceeded:
                        // Concurrent registrations filled the quota while this one was verified.
                        let retry = Self.atLimit(try store.registrationsSince(clientID: clientID, since: now() - 3600),
                                                 limit: configuration.registrationQuotaPerHour, seconds: 3600, at: now()) ?? 1
                        throw Rejection(.rateLimited(retryAfter: retry), .registrationQuota,
                                        "integration over its quota of \(configuration.registrationQuotaPerHour) registrations an hour")
                    case .conflict:
                        _ = try liveIntegration(clientID)   // revoked meanwhile: invalid_client
                        throw Rejection(.invalidGrant, .keyAlreadyRegistered, "key ID was registered concurrently")
                    }
                    metrics.increment("attestd_registrations_total", labels: [("distribution", distribution)])
                    metrics.increment("attestd_tokens_issued_total", labels: [("grant", "registration")])
                    audit.record(AuditEvent(at: time, action: "device.registered", clientID: clientID, keyID: keyID, detail: detail))
                    return response(token, next, at: time)
                })
            }
        }
    }

    /// The receipt as stored: read when the verifier validated it, with its first refresh due an
    /// interval on, and never before Apple's "not before".
    func storedReceipt(_ verified: VerifiedAttestation, at time: Date) -> DeviceReceipt {
        guard let receipt = verified.validatedReceipt else { return DeviceReceipt(der: verified.receipt) }
        let risk = DeviceRisk(receiptCreatedAt: receipt.createdAt, receiptNotBefore: receipt.notBefore, receiptExpiresAt: receipt.expiresAt,
                              metric: receipt.riskMetric)
        return DeviceReceipt(der: verified.receipt, credentialCertificate: verified.credentialCertificate, risk: risk,
                             refreshDueAt: max(time + configuration.riskRefreshInterval, receipt.refreshableAt))
    }

    // MARK: Token (assertion)

    /// Verifies the assertion and advances the device's counter with a new token; `completion`
    /// gets the token once that is committed (see `exchanging`).
    public func refresh(clientID: String, keyID: [UInt8], assertion: [UInt8],
                        completion: @escaping @Sendable (Result<IssuedToken, any Error>) -> Void) {
        exchanging(clientID: clientID, keyID: keyID, action: "token", completion: completion) { time, context, integration, challenge, committed in
            guard let device = context.device else {
                throw Rejection(.invalidGrant, .unknownKey, "key ID is not registered for this client")
            }
            if configuration.mintLimitPerMinute > 0,
               let retry = Self.atLimit(try store.mintsSince(clientID: integration.clientID, keyID: keyID, since: time - 60),
                                        limit: configuration.mintLimitPerMinute, seconds: 60, at: time) {
                throw Rejection(.rateLimited(retryAfter: retry), .mintLimit,
                                "device over \(configuration.mintLimitPerMinute) tokens a minute")
            }
            guard let appID = AppID(device.appID) else {
                throw Rejection(.invalidGrant, .unknownKey, "stored app ID \(device.appID) is unreadable")
            }
            let publicKey = try keyCache.key(for: device)
            let hash = WireProtocol.tokenClientDataHash(challenge: challenge, clientID: clientID, keyID: keyID, sha256: sha256)
            let verified = try timed("assertion") {
                try verifier.verifyAssertion(assertion, publicKey: publicKey, clientDataHash: hash, appID: appID, previousCounter: device.counter)
            }
            try admitting(verified.app, clientID: clientID, at: time) { watched in
                try integration.devicePolicy.checkRefresh(verified.app, device: device, monitored: integration.policy.monitored, watched: &watched)
            }
            let refresh = DeviceRefresh(validationCategory: verified.app.validationCategory, bundleVersion: verified.app.bundleVersion,
                                        platform: device.platform == nil ? verified.app.platform : nil)
            let (token, record) = mintToken(integration: integration, keyID: keyID, at: time)
            let next = nextChallenge(at: time)
            let counter = device.counter
            // Last: from here the store answers, possibly on another thread.
            store.advanceCounter(clientID: clientID, keyID: keyID, from: counter, to: verified.counter, refresh: refresh,
                                 token: record, redeeming: challenge, nextChallenge: next, at: time, commitTime: now) { [self] result in
                committed(Result {
                    switch try result.get() {
                    case .committed: break
                    case .challengeGone: throw Rejection(.invalidGrant, .noPendingChallenge, "challenge expired or was redeemed concurrently")
                    case .quotaExceeded: throw Rejection(.invalidGrant, .internalError, "a refresh has no quota")
                    case .conflict:
                        _ = try liveIntegration(clientID)   // revoked meanwhile: invalid_client
                        throw Rejection(.invalidGrant, .counterRaced, "counter moved past \(counter) concurrently")
                    }
                    metrics.increment("attestd_tokens_issued_total", labels: [("grant", "assertion")])
                    return response(token, next, at: time)
                })
            }
        }
    }

    /// The shape of both exchanges. Everything up to the commit runs here, on the caller's thread:
    /// the context read, then `prepare` (checks, verification), which ends by starting the store's
    /// write and hands what the write concluded to the closure it is given. The answer reaches
    /// `completion` from there, on the thread that committed (SQLite batches commits, and the
    /// caller's thread is free meanwhile). Either way a rejection is audited, and when the request
    /// named a pending challenge it is used up (PROTOCOL.md), conditioned on its bytes so that a
    /// newer challenge is never touched; the success path redeemed it in its own transaction.
    private func exchanging(clientID: String, keyID: [UInt8], action: String,
                            completion: @escaping @Sendable (Result<IssuedToken, any Error>) -> Void,
                            _ prepare: (Date, ExchangeContext, Integration, [UInt8],
                                        @escaping @Sendable (Result<IssuedToken, any Error>) -> Void) throws -> Void) {
        let time = now()
        var redeeming: [UInt8]?
        do {
            try requireKeyIDShape(keyID)
            // The integration, the pending challenge and the device: one read.
            let context = try exchangeContext(clientID: clientID, keyID: keyID, at: time)
            let integration = try liveIntegration(context.integration)
            guard let challenge = context.challenge else {
                throw Rejection(.invalidGrant, .noPendingChallenge, "no pending challenge for this key (expired, used, or never issued)")
            }
            redeeming = challenge
            try prepare(time, context, integration, challenge) { [self] result in
                completion(concluded(result, clientID: clientID, keyID: keyID, action: action, challenge: challenge, at: time))
            }
        } catch {
            completion(concluded(.failure(error), clientID: clientID, keyID: keyID, action: action, challenge: redeeming, at: time))
        }
    }

    /// An exchange's result as it goes out: a rejection uses up the challenge the request named
    /// (when it named one) and is written to the audit trail (the router counts it).
    private func concluded(_ result: Result<IssuedToken, any Error>, clientID: String, keyID: [UInt8], action: String,
                           challenge: [UInt8]?, at time: Date) -> Result<IssuedToken, any Error> {
        guard case .failure(let error) = result, let rejection = error as? Rejection else { return result }
        if let challenge {
            do { _ = try store.consumeChallenge(clientID: clientID, keyID: keyID, challenge: challenge, at: time) } catch { return .failure(error) }
        }
        audit.record(AuditEvent(at: now(), action: "\(action).rejected", clientID: String(clientID.prefix(64)),
                                keyID: keyID.count == 32 ? keyID : nil, reason: rejection.reason.rawValue, detail: rejection.detail))
        return result
    }

    /// A register or token request whose key ID parsed but whose proof did not: it is an attempt
    /// all the same, so it uses the challenge up (PROTOCOL.md) and is audited.
    public func rejectMalformedAttempt(clientID: String, keyID: [UInt8], action: String, detail: String) {
        let time = now()
        if keyID.count == 32, Self.isWellFormedClientID(clientID) {
            _ = try? store.consumeChallenge(clientID: clientID, keyID: keyID, at: time)
        }
        audit.record(AuditEvent(at: time, action: "\(action).rejected", clientID: String(clientID.prefix(64)),
                                keyID: keyID.count == 32 ? keyID : nil, reason: RejectionReason.invalidRequest.rawValue, detail: detail))
    }

    // MARK: Using tokens

    /// The grant behind a bearer token, or nil (with the reason counted) when it is not live.
    public func authenticate(bearer token: String, at time: Date? = nil) throws -> TokenGrant? {
        guard let hash = tokenHash(bearer: token) else { return nil }
        return try store.liveToken(hash: hash, at: time ?? now())
    }

    /// What the store keeps of a presented token (its SHA-256), or nil for a token that cannot
    /// be one of ours (refused without a query).
    public func tokenHash(bearer token: String) -> [UInt8]? {
        guard token.hasPrefix(Self.tokenPrefix), token.utf8.count <= 128 else { return nil }
        return sha256(Array(token.utf8))
    }

    // MARK: Helpers

    /// Retry-after seconds when `window` already holds `limit` events (one more would exceed it):
    /// until the oldest one leaves the rolling window. Nil when one more is allowed. Only
    /// successes are counted (tokens minted, devices registered), so knowing a key ID or a client
    /// ID is not enough to lock anyone out.
    static func atLimit(_ window: WindowCount, limit: Int, seconds: TimeInterval, at time: Date) -> Int? {
        guard window.count >= limit else { return nil }
        let frees = (window.oldest ?? time).addingTimeInterval(seconds).timeIntervalSince(time)
        return max(1, Int(frees.rounded(.up)))
    }

    /// As `atLimit`, for a window that already includes this request.
    static func overLimit(_ window: WindowCount, limit: Int, seconds: TimeInterval, at time: Date) -> Int? {
        window.count > limit ? atLimit(WindowCount(count: window.count - 1, oldest: window.oldest), limit: limit, seconds: seconds, at: time) : nil
    }

    private func requireKeyIDShape(_ keyID: [UInt8]) throws {
        guard keyID.count == 32 else { throw Rejection.request("key_id is \(keyID.count) bytes, expected 32") }
    }

    /// `clid_` and URL-safe base64 characters only: anything else (a NUL byte, say) cannot name an
    /// integration and is refused before it reaches SQL or a rate-limit key.
    public static func isWellFormedClientID(_ clientID: String) -> Bool {
        clientID.hasPrefix(clientIDPrefix) && clientID.utf8.count <= 64 && clientID.utf8.count > clientIDPrefix.utf8.count
            && clientID.utf8.allSatisfy { b in
                (0x41...0x5a).contains(b) || (0x61...0x7a).contains(b) || (0x30...0x39).contains(b) || b == 0x2d || b == 0x5f
            }
    }

    private func liveIntegration(_ clientID: String) throws -> Integration {
        guard Self.isWellFormedClientID(clientID) else { throw Rejection(.invalidClient, .unknownClient, "no integration with this client ID") }
        return try liveIntegration(try store.integration(clientID: clientID))
    }

    private func liveIntegration(_ found: Integration?) throws -> Integration {
        guard let integration = found else { throw Rejection(.invalidClient, .unknownClient, "no integration with this client ID") }
        guard !integration.isRevoked else { throw Rejection(.invalidClient, .clientRevoked, "integration was revoked") }
        return integration
    }

    /// What an exchange starts from, for a well-formed client ID (anything else names no integration
    /// and is refused before it reaches SQL).
    private func exchangeContext(clientID: String, keyID: [UInt8], at time: Date) throws -> ExchangeContext {
        guard Self.isWellFormedClientID(clientID) else { throw Rejection(.invalidClient, .unknownClient, "no integration with this client ID") }
        return try store.exchangeContext(clientID: clientID, keyID: keyID, at: time)
    }

    private func mintToken(integration: Integration, keyID: [UInt8], at time: Date) -> (String, TokenRecord) {
        let token = Self.tokenPrefix + base64URL(secureRandomBytes(32))
        let record = TokenRecord(tokenHash: sha256(Array(token.utf8)), clientID: integration.clientID, workspaceID: integration.workspaceID,
                                 keyID: keyID, issuedAt: time, expiresAt: time.addingTimeInterval(configuration.tokenTTL))
        return (token, record)
    }

    private func nextChallenge(at time: Date) -> IssuedChallenge {
        IssuedChallenge(bytes: secureRandomBytes(32), expiresAt: time.addingTimeInterval(configuration.nextChallengeTTL))
    }

    private func response(_ token: String, _ next: IssuedChallenge, at time: Date) -> IssuedToken {
        IssuedToken(accessToken: token, expiresIn: Int(configuration.tokenTTL), nextChallenge: next.bytes,
                      nextChallengeExpiresIn: remaining(next.expiresAt, from: time))
    }

    // Nearest second: the stored expiry is a REAL and may sit a hair below the whole number.
    private func remaining(_ expiry: Date, from time: Date) -> Int { max(1, Int(expiry.timeIntervalSince(time).rounded())) }

    /// The distribution label of the device-policy metrics: Apple's category names, or `none`
    /// for a device that wrote none (a bounded set).
    static func label(_ app: AttestedApp) -> String { app.distribution?.rawValue ?? "none" }

    /// Runs a device-policy check; a refusal is counted by reason and category (and by rule and
    /// day) before it propagates, and what monitored rules would have refused is counted as such.
    private func admitting(_ app: AttestedApp, clientID: String, at time: Date, _ check: (inout [Rejection]) throws -> Void) throws {
        var watched: [Rejection] = []
        do { try check(&watched) } catch let rejection as Rejection {
            metrics.increment("attestd_device_policy_refusals_total", labels: [("reason", rejection.reason.rawValue), ("distribution", Self.label(app))])
            if let rule = PolicyRule(rejection.reason) {
                ruleTally?.count(clientID: clientID, rule: rule, monitored: false, reason: rejection.reason.rawValue, detail: rejection.detail, at: time)
            }
            throw rejection
        }
        for rejection in watched {
            guard let rule = PolicyRule(rejection.reason) else { continue }
            metrics.increment("attestd_device_policy_would_refuse_total", labels: [("rule", rule.rawValue)])
            ruleTally?.count(clientID: clientID, rule: rule, monitored: true, reason: rejection.reason.rawValue, detail: rejection.detail, at: time)
        }
    }

    private func timed<T>(_ kind: String, _ body: () throws -> T) throws -> T {
        let start = DispatchTime.now().uptimeNanoseconds
        defer { metrics.observe("attestd_verification_seconds", seconds: Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9, labels: [("kind", kind)]) }
        do { return try body() } catch let error as VerificationError { throw Rejection.verification(error) }
    }

    /// Runs `body`; a rejection is written to the audit trail before it propagates (the router counts it).
    private func rejecting<T>(clientID: String, keyID: [UInt8], action: String, _ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let rejection as Rejection {
            audit.record(AuditEvent(at: now(), action: "\(action).rejected", clientID: String(clientID.prefix(64)),
                                    keyID: keyID.count == 32 ? keyID : nil, reason: rejection.reason.rawValue, detail: rejection.detail))
            throw rejection
        }
    }
}

/// Parsed device keys, so an assertion does not rebuild the key (device keys never change).
final class DeviceKeyCache: Sendable {
    private let keys = Mutex<[[UInt8]: ECPublicKey]>([:])
    private let capacity = 100_000

    func key(for device: Device) throws -> ECPublicKey {
        if let key = keys.withLock({ $0[device.keyID] }) { return key }
        let key: ECPublicKey
        do { key = try ECPublicKey(p256Point: device.publicKey) } catch {
            throw Rejection(.invalidGrant, .malformed, "stored device key is unreadable: \(error)")
        }
        let capacity = capacity
        keys.withLock { keys in
            if keys.count >= capacity { keys.removeAll(keepingCapacity: true) }
            keys[device.keyID] = key
        }
        return key
    }
}

public func base64URL(_ bytes: [UInt8]) -> String {
    Base64.encode(bytes, urlSafe: true, padded: false)
}
