import AppAttest
import AttestCrypto
import AttestWire
import Foundation
import HTTPClient
import ProcessCPU
import SimulatedDevice
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One load run: every device registers once (challenge, register), then the devices refresh by
/// assertion for S seconds, each worker taking the device that has waited longest, with at most
/// one request in flight per worker thread (one keep-alive connection each).
final class LoadRun: Sendable {
    static let minimumChallengeTTL: TimeInterval = 15

    /// A simulated device's identity; its changing state (a pre-issued challenge) travels with it
    /// through the work queue, so only the worker holding it can touch it.
    struct Device: Sendable {
        let keyID: String
        let rawKeyID: [UInt8]
    }

    struct Turn: Sendable {
        let index: Int
        /// A pre-issued challenge and when (monotonic seconds) it expires.
        var next: (bytes: [UInt8], expiresAt: TimeInterval)?
    }

    struct Queue: Sendable {
        var nextToRegister = 0
        var ready: [Turn] = []
        var head = 0

        mutating func take() -> Turn? {
            guard head < ready.count else { return nil }
            defer { head += 1 }
            return ready[head]
        }

        mutating func giveBack(_ turn: Turn) {
            // Compact now and then so the array does not grow with the run.
            if head > 4096 && head * 2 > ready.count { ready.removeFirst(head); head = 0 }
            ready.append(turn)
        }
    }

    let targets: [HTTPTarget]
    let clientID: String
    let attester: SoftwareAttester
    let devices: [Device]
    let workerCount: Int
    let seconds: TimeInterval
    let socketTimeout: TimeInterval
    let watched: WatchedProcesses
    private let queue = Mutex(Queue())
    private let statistics = Mutex(LoadStatistics())

    init(targets: [HTTPTarget], clientID: String, appID: AppID, deviceCount: Int, workers: Int, seconds: TimeInterval,
         socketTimeout: TimeInterval, watched: WatchedProcesses = WatchedProcesses(pids: [])) throws {
        precondition(!targets.isEmpty)
        self.targets = targets
        self.clientID = clientID
        attester = SoftwareAttester(appID: appID, keyDirectory: nil)
        var devices: [Device] = []
        devices.reserveCapacity(deviceCount)
        for _ in 0..<deviceCount {
            let keyID = try attester.makeKey()
            guard let raw = Base64.decode(keyID), raw.count == WireProtocol.keyIDLength else {
                throw HTTPClientError("simulated key ID is malformed")
            }
            devices.append(Device(keyID: keyID, rawKeyID: raw))
        }
        self.devices = devices
        workerCount = workers
        slots = (0..<workers).map { Slot(HTTPConnection(target: targets[$0 % targets.count], timeout: socketTimeout)) }
        self.seconds = seconds
        self.socketTimeout = socketTimeout
        self.watched = watched
    }

    func execute() -> LoadReport {
        let cpuAtStart = processCPUSeconds()

        // Phase 1: every device registers once, within S seconds.
        let registrationStart = monotonicNow()
        let registrationDeadline = registrationStart + seconds
        let registered = runWorkers(workerCount, until: registrationDeadline) { connection in
            while monotonicNow() < registrationDeadline {
                let index: Int? = self.queue.withLock { queue in
                    guard queue.nextToRegister < self.devices.count else { return nil }
                    defer { queue.nextToRegister += 1 }
                    return queue.nextToRegister
                }
                guard let index else { return }
                if let turn = self.register(index, over: connection) {
                    self.queue.withLock { $0.giveBack(turn) }
                }
            }
        }
        let registrationSeconds = monotonicNow() - registrationStart
        let ready = queue.withLock { $0.ready.count }

        // Phase 2: refresh by assertion for S seconds. Workers still stuck in phase 1 would
        // share devices with phase 2, so it only runs when phase 1 ended cleanly.
        let refreshCPUAtStart = processCPUSeconds()
        let watchedAtStart = watched.sample()
        let refreshStart = monotonicNow()
        let refreshDeadline = refreshStart + seconds
        var finished = registered
        if registered && ready > 0 {
            finished = runWorkers(min(workerCount, ready), until: refreshDeadline) { connection in
                while monotonicNow() < refreshDeadline {
                    guard let turn = self.queue.withLock({ $0.take() }) else { return }
                    let after = self.refresh(turn, over: connection)
                    self.queue.withLock { $0.giveBack(after) }
                }
            }
        }
        let refreshSeconds = registered && ready > 0 ? monotonicNow() - refreshStart : 0
        let refreshCPU = processCPUSeconds() - refreshCPUAtStart
        let watchedCPU = watched.spent(from: watchedAtStart, to: watched.sample())
        // A worker still running (a stalled socket) keeps its connection; the process ends soon.
        if finished { for slot in slots { slot.connection.close() } }
        let cpu = processCPUSeconds() - cpuAtStart
        return statistics.withLock {
            $0.report(devices: devices.count, workers: workerCount, refreshSeconds: refreshSeconds,
                      registrationSeconds: registrationSeconds, cpu: cpu, refreshCPU: refreshCPU,
                      watchedRefreshCPU: watchedCPU, finished: finished)
        }
    }

    /// A worker's keep-alive connection (to the targets in turn), kept from registration to
    /// refresh: reconnecting all at once between the phases briefly doubled the connections from
    /// this address, and at 64 devices the server's per-address limit (64) reset a few of them.
    // @unchecked: one thread at a time uses it (a phase's worker, then the next phase's, after the wait).
    private final class Slot: @unchecked Sendable {
        let connection: HTTPConnection
        init(_ connection: HTTPConnection) { self.connection = connection }
    }
    private let slots: [Slot]

    /// `count` threads, worker i on connection i; waits until they all return or `deadline` plus
    /// a grace period (a stalled socket times out within it).
    private func runWorkers(_ count: Int, until deadline: TimeInterval, _ body: @escaping @Sendable (HTTPConnection) -> Void) -> Bool {
        let group = DispatchGroup()
        for worker in 0..<count {
            group.enter()
            let slot = slots[worker]
            let thread = Thread {
                body(slot.connection)
                group.leave()
            }
            thread.stackSize = 1 << 20
            thread.start()
        }
        let grace = 2 * socketTimeout + 2
        let wait = max(0, deadline - monotonicNow()) + grace
        return group.wait(timeout: .now() + wait) == .success
    }

    // MARK: Exchanges

    /// Registers device `index`; its turn (with the pre-issued challenge) on success.
    private func register(_ index: Int, over connection: HTTPConnection) -> Turn? {
        let device = devices[index]
        guard let challenge = fetchChallenge(device, over: connection) else {
            statistics.withLock { $0.registrationFailures += 1 }
            return nil
        }
        do {
            let hash = WireProtocol.registrationClientDataHash(challenge: challenge, sha256: sha256)
            let attestation = try attester.makeAttestation(keyID: device.keyID, clientDataHash: hash)
            let body = RegisterRequest(clientID: clientID, keyID: device.keyID, attestationObject: Base64.encode(attestation)).json
            let sent = monotonicNow()
            guard let response = post(WireProtocol.registerPath, "application/json", Array(body.utf8), over: connection),
                  response.status == 200 else {
                statistics.withLock { $0.registrationFailures += 1 }
                return nil
            }
            statistics.withLock { $0.registrations += 1 }
            return Turn(index: index, next: Self.nextChallenge(in: response.body, receivedAt: sent))
        } catch {
            statistics.withLock { $0.registrationFailures += 1; $0.otherErrors += 1; $0.lastError = "\(error)" }
            return nil
        }
    }

    /// One refresh; the turn to put back in the queue (with the next pre-issued challenge, if any).
    private func refresh(_ turn: Turn, over connection: HTTPConnection) -> Turn {
        let device = devices[turn.index]
        let start = monotonicNow()
        let challenge: [UInt8]
        if let next = turn.next, next.expiresAt - start >= Self.minimumChallengeTTL {
            challenge = next.bytes
        } else {
            guard let fetched = fetchChallenge(device, over: connection) else {
                statistics.withLock { $0.failedExchanges += 1 }
                return Turn(index: turn.index)
            }
            challenge = fetched
        }
        // The challenge is single use, whatever happens next: the returned turn never carries it.
        do {
            let hash = WireProtocol.tokenClientDataHash(challenge: challenge, clientID: clientID, keyID: device.rawKeyID, sha256: sha256)
            let assertion = try attester.makeAssertion(keyID: device.keyID, clientDataHash: hash)
            let form = TokenRequest(clientID: clientID, keyID: device.keyID, assertion: Base64.encode(assertion)).formBody
            let sent = monotonicNow()
            guard let response = post(WireProtocol.tokenPath, "application/x-www-form-urlencoded", Array(form.utf8), over: connection) else {
                statistics.withLock { $0.failedExchanges += 1 }
                return Turn(index: turn.index)
            }
            let latency = (monotonicNow() - start) * 1000
            guard response.status == 200 else {
                statistics.withLock { $0.failedExchanges += 1 }
                return Turn(index: turn.index)
            }
            statistics.withLock { $0.exchanges += 1; $0.latencies.append(latency) }
            return Turn(index: turn.index, next: Self.nextChallenge(in: response.body, receivedAt: sent))
        } catch {
            statistics.withLock { $0.failedExchanges += 1; $0.otherErrors += 1; $0.lastError = "\(error)" }
            return Turn(index: turn.index)
        }
    }

    private func fetchChallenge(_ device: Device, over connection: HTTPConnection) -> [UInt8]? {
        let body = ChallengeRequest(clientID: clientID, keyID: device.keyID).json
        guard let response = post(WireProtocol.challengePath, "application/json", Array(body.utf8), over: connection),
              response.status == 200 else { return nil }
        guard let decoded = ChallengeResponse(json: response.body),
              let text = decoded.challenge, let bytes = Base64.decode(text), bytes.count == WireProtocol.challengeLength else {
            statistics.withLock { $0.otherErrors += 1; $0.lastError = "challenge response without a 32-byte challenge" }
            return nil
        }
        return bytes
    }

    /// Sends one request and counts its status (or transport error).
    private func post(_ path: String, _ contentType: String, _ body: [UInt8], over connection: HTTPConnection) -> HTTPConnection.Response? {
        do {
            let response = try connection.post(path, contentType: contentType, body: body)
            if response.status != 200 { statistics.withLock { $0.statuses[response.status, default: 0] += 1 } }
            return response
        } catch {
            statistics.withLock { $0.transportErrors += 1; $0.lastError = "\(error)" }
            // The server is unreachable or stalled: don't spin on it.
            usleep(10_000)
            return nil
        }
    }

    private static func nextChallenge(in body: [UInt8], receivedAt: TimeInterval) -> (bytes: [UInt8], expiresAt: TimeInterval)? {
        guard let decoded = TokenResponse(json: body),
              let text = decoded.nextChallenge, let bytes = Base64.decode(text), bytes.count == WireProtocol.challengeLength,
              let ttl = WireProtocol.serverDuration(decoded.nextChallengeExpiresIn), ttl > 0 else { return nil }
        return (bytes, receivedAt + ttl)
    }
}

/// What a run counted, and its report.
struct LoadStatistics: Sendable {
    var registrations = 0
    var registrationFailures = 0
    var exchanges = 0
    var failedExchanges = 0
    var latencies: [Double] = []
    var statuses: [Int: Int] = [:]
    var transportErrors = 0
    var otherErrors = 0
    var lastError: String?

    func report(devices: Int, workers: Int, refreshSeconds: TimeInterval, registrationSeconds: TimeInterval,
                cpu: TimeInterval, refreshCPU: TimeInterval, watchedRefreshCPU: [(pid: Int32, seconds: Double)], finished: Bool) -> LoadReport {
        func fixed(_ value: Double, _ digits: Int = 3) -> String { String(format: "%.\(digits)f", value) }
        let sorted = latencies.sorted()
        func percentile(_ p: Double) -> String {
            guard !sorted.isEmpty else { return "n/a" }
            let rank = max(1, Int((p * Double(sorted.count)).rounded(.up)))
            return fixed(sorted[min(rank, sorted.count) - 1])
        }
        var lines = [
            "devices: \(devices)",
            "concurrency: \(workers)",
            "seconds: \(fixed(refreshSeconds))",
            "token_exchanges: \(exchanges)",
            "token_exchanges_per_second: \(fixed(refreshSeconds > 0 ? Double(exchanges) / refreshSeconds : 0, 1))",
            "latency_ms_p50: \(percentile(0.50))",
            "latency_ms_p99: \(percentile(0.99))",
            "latency_ms_max: \(sorted.last.map { fixed($0) } ?? "n/a")",
        ]
        if failedExchanges > 0 { lines.append("failed_exchanges: \(failedExchanges)") }
        for (status, count) in statuses.sorted(by: { $0.key < $1.key }) { lines.append("status_\(status): \(count)") }
        if transportErrors > 0 { lines.append("transport_errors: \(transportErrors)") }
        if otherErrors > 0 { lines.append("other_errors: \(otherErrors)") }
        lines.append("registrations: \(registrations)")
        if registrationFailures > 0 { lines.append("registration_failures: \(registrationFailures)") }
        lines.append("registration_seconds: \(fixed(registrationSeconds))")
        lines.append("loadgen_cpu_seconds: \(fixed(cpu))")
        lines.append("loadgen_refresh_cpu_seconds: \(fixed(refreshCPU))")
        if !watchedRefreshCPU.isEmpty {
            lines.append("watched_refresh_cpu_seconds: \(fixed(watchedRefreshCPU.reduce(0) { $0 + $1.seconds }))")
            for (pid, seconds) in watchedRefreshCPU { lines.append("watched_refresh_cpu_seconds_pid_\(pid): \(fixed(seconds))") }
        }
        if !finished { lines.append("unfinished_workers: true") }
        // A rate measured while requests failed is not a figure: say so, and exit non-zero.
        let failures = registrationFailures + failedExchanges + transportErrors + otherErrors
        let succeeded = registrations > 0 && exchanges > 0 && failures == 0 && finished
        lines.append("result: " + (succeeded ? "ok" : "FAILED"))
        return LoadReport(text: lines.joined(separator: "\n") + "\n", lastError: lastError, succeeded: succeeded,
                          failureSummary: succeeded ? nil
                              : "\(registrationFailures) registrations and \(failedExchanges) exchanges failed (\(transportErrors) transport errors, "
                                + "\(otherErrors) other)\(finished ? "" : ", workers unfinished"): the rate above is not a measurement")
    }
}

struct LoadReport: Sendable {
    let text: String
    let lastError: String?
    let succeeded: Bool
    /// Why the run does not count, for stderr.
    let failureSummary: String?
}

/// Monotonic seconds.
func monotonicNow() -> TimeInterval {
    TimeInterval(DispatchTime.now().uptimeNanoseconds) / 1e9
}

/// The process's user + system CPU time so far.
func processCPUSeconds() -> TimeInterval {
    var usage = rusage()
    #if os(Linux)
    let who = __rusage_who_t(RUSAGE_SELF.rawValue)
    #else
    let who = RUSAGE_SELF
    #endif
    guard getrusage(who, &usage) == 0 else { return .nan }
    func seconds(_ time: timeval) -> TimeInterval { TimeInterval(time.tv_sec) + TimeInterval(time.tv_usec) / 1e6 }
    return seconds(usage.ru_utime) + seconds(usage.ru_stime)
}
