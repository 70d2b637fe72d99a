import AppAttest
import AttestCrypto
import Foundation
import SimulatedDevice
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// `attestctl load`: N simulated devices (in-memory test-authority keys) doing real token
/// exchanges against a running server. Each device registers once, then refreshes by assertion
/// as fast as it can for S seconds, with at most C requests in flight. It speaks the protocol
/// itself over a small keep-alive HTTP/1.1 client on POSIX sockets (one connection per worker),
/// so that its own CPU use stays small and is reported apart from the server's.
enum LoadCommand {
    static let usage = """
        usage: attestctl load --base-url URL --client-id CLID --devices N --seconds S [--concurrency C] [--app-id TEAMID.bundle]
          Registers N simulated devices (test authority: the server must trust Fixtures/test-authority/root.pem),
          then refreshes their tokens by assertion for S seconds with at most C requests in flight (default N).
          Default --app-id: \(defaultAppID). http only.
        """
    static let defaultAppID = "ABCDE12345.com.example.app"
    /// A stalled request gives up after this long, so the run always ends by itself.
    static let socketTimeout: TimeInterval = 5

    static func run(_ argv: [String]) throws -> Int32 {
        let arguments = try Arguments(argv, options: ["base-url", "client-id", "devices", "seconds", "concurrency", "app-id"],
                                      flags: ["help"])
        if arguments.has("help") { print(usage); return 0 }
        guard arguments.positional.isEmpty else { throw UsageError("unexpected argument \(arguments.positional[0])\n\(usage)") }
        let baseURL = try SimulateDeviceCommand.parseBaseURL(try arguments.required("base-url"), option: "base-url")
        guard baseURL.scheme?.lowercased() == "http" else { throw UsageError("--base-url: load speaks plain http only") }
        let clientID = try arguments.required("client-id")
        guard !clientID.isEmpty else { throw UsageError("--client-id is empty") }
        guard arguments.has(option: "devices") else { throw UsageError("--devices is required") }
        guard arguments.has(option: "seconds") else { throw UsageError("--seconds is required") }
        let devices = try arguments.integer("devices", range: 1...100_000)!
        let seconds = try arguments.integer("seconds", range: 1...3600)!
        let concurrency = try arguments.integer("concurrency", default: devices, range: 1...4096)!
        let appText = try arguments.value("app-id") ?? defaultAppID
        guard let appID = AppID(appText) else { throw UsageError("--app-id must be TEAMID.bundle.id, got \(appText)") }
        let target = try HTTPTarget(baseURL)

        #if DEBUG
        FileHandle.standardError.write(Data("warning: debug build; the load generator spends more CPU than it would in release (-c release)\n".utf8))
        #endif
        // A peer closing a keep-alive connection must be an error on that request, not the end of the process.
        signal(SIGPIPE, SIG_IGN)
        let run = try LoadRun(target: target, clientID: clientID, appID: appID, deviceCount: devices,
                              workers: min(concurrency, devices), seconds: TimeInterval(seconds))
        return run.execute()
    }
}

/// Monotonic seconds.
private func monotonicNow() -> TimeInterval {
    TimeInterval(DispatchTime.now().uptimeNanoseconds) / 1e9
}

/// The process's user + system CPU time so far.
private func processCPUSeconds() -> TimeInterval {
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

// MARK: - The run

/// One simulated device. Only the worker that took it from the queue touches it.
private final class LoadDevice {
    let keyID: String
    let rawKeyID: [UInt8]
    let encodedKeyID: String
    var registered = false
    /// A pre-issued challenge and when (monotonic) it expires.
    var next: (bytes: [UInt8], expiresAt: TimeInterval)?

    init(keyID: String) throws {
        self.keyID = keyID
        guard let raw = Data(base64Encoded: keyID), raw.count == 32 else { throw UsageError("simulated key ID is malformed") }
        rawKeyID = [UInt8](raw)
        encodedKeyID = percentEncode(keyID)
    }
}

private final class LoadRun: @unchecked Sendable {
    static let challengePath = "/v1/oauth/app-attest/challenge"
    static let registerPath = "/v1/oauth/app-attest/register"
    static let tokenPath = "/v1/oauth/token"
    static let grantType = "urn:anthropic:params:oauth:grant-type:app-attest"
    static let tokenHashDomain = Array("anthropic-app-attest-token-v1".utf8)
    static let minimumChallengeTTL: TimeInterval = 15

    let target: HTTPTarget
    let clientID: String
    let clientIDBytes: [UInt8]
    let encodedClientID: String
    let challengeBody: (LoadDevice) -> [UInt8]
    let attester: SoftwareAttester
    let devices: [LoadDevice]
    let workerCount: Int
    let seconds: TimeInterval

    // Everything below is guarded by `lock`.
    let lock = NSLock()
    var nextToRegister = 0
    var ring: [Int]
    var ringHead = 0
    var ringCount = 0
    var registrations = 0
    var registrationFailures = 0
    var exchanges = 0
    var failedExchanges = 0
    var latencies: [Double] = []
    var statuses: [Int: Int] = [:]
    var transportErrors = 0
    var otherErrors = 0
    var lastError: String?

    init(target: HTTPTarget, clientID: String, appID: AppID, deviceCount: Int, workers: Int, seconds: TimeInterval) throws {
        self.target = target
        self.clientID = clientID
        clientIDBytes = Array(clientID.utf8)
        let encodedClientID = percentEncode(clientID)
        self.encodedClientID = encodedClientID
        let jsonClientID = jsonString(clientID)
        challengeBody = { device in Array(#"{"client_id":\#(jsonClientID),"key_id":"\#(device.keyID)"}"#.utf8) }
        attester = SoftwareAttester(appID: appID, keyDirectory: nil)
        var devices: [LoadDevice] = []
        devices.reserveCapacity(deviceCount)
        for _ in 0..<deviceCount { devices.append(try LoadDevice(keyID: try attester.makeKey())) }
        self.devices = devices
        workerCount = workers
        self.seconds = seconds
        ring = [Int](repeating: 0, count: deviceCount)
        latencies.reserveCapacity(1 << 16)
    }

    func execute() -> Int32 {
        let cpuAtStart = processCPUSeconds()
        let connections = (0..<workerCount).map { _ in HTTPConnection(target: target, timeout: LoadCommand.socketTimeout) }

        // Phase 1: every device registers once (challenge, then register), within S seconds.
        let registrationStart = monotonicNow()
        let registrationDeadline = registrationStart + seconds
        let registered = runWorkers(connections, until: registrationDeadline) { connection in
            while monotonicNow() < registrationDeadline {
                let index: Int? = self.lock.locked {
                    guard self.nextToRegister < self.devices.count else { return nil }
                    defer { self.nextToRegister += 1 }
                    return self.nextToRegister
                }
                guard let index else { return }
                self.register(self.devices[index], over: connection)
            }
        }
        let registrationSeconds = monotonicNow() - registrationStart
        // Workers still stuck in phase 1 own their devices and connections: no phase 2 then.
        let ready = registered ? devices.indices.filter { devices[$0].registered } : []
        lock.locked {
            for index in ready { ring[(ringHead + ringCount) % ring.count] = index; ringCount += 1 }
        }

        // Phase 2: refresh by assertion for S seconds. A worker takes the device that waited longest.
        let refreshStart = monotonicNow()
        let refreshDeadline = refreshStart + seconds
        var finished = registered
        if !ready.isEmpty {
            finished = runWorkers(Array(connections.prefix(min(workerCount, ready.count))), until: refreshDeadline) { connection in
                while monotonicNow() < refreshDeadline {
                    let index: Int? = self.lock.locked {
                        guard self.ringCount > 0 else { return nil }
                        defer { self.ringHead = (self.ringHead + 1) % self.ring.count; self.ringCount -= 1 }
                        return self.ring[self.ringHead]
                    }
                    guard let index else { return }
                    self.refresh(self.devices[index], over: connection)
                    self.lock.locked {
                        self.ring[(self.ringHead + self.ringCount) % self.ring.count] = index
                        self.ringCount += 1
                    }
                }
            }
        }
        let refreshSeconds = ready.isEmpty ? 0 : monotonicNow() - refreshStart
        let cpu = processCPUSeconds() - cpuAtStart
        if finished { connections.forEach { $0.close() } }

        return lock.locked {
            report(refreshSeconds: refreshSeconds, registrationSeconds: registrationSeconds, cpu: cpu, finished: finished)
        }
    }

    /// One thread per connection; waits until they all return or `deadline` plus a grace period
    /// (a stalled socket times out within it). Returns whether all workers finished.
    private func runWorkers(_ connections: [HTTPConnection], until deadline: TimeInterval,
                            _ body: @escaping (HTTPConnection) -> Void) -> Bool {
        let group = DispatchGroup()
        for connection in connections {
            group.enter()
            let thread = Thread {
                body(connection)
                group.leave()
            }
            thread.stackSize = 1 << 20
            thread.start()
        }
        let grace = 2 * LoadCommand.socketTimeout + 2
        let wait = max(0, deadline - monotonicNow()) + grace
        return group.wait(timeout: .now() + wait) == .success
    }

    // MARK: Exchanges

    private func register(_ device: LoadDevice, over connection: HTTPConnection) {
        guard let challenge = fetchChallenge(device, over: connection) else {
            lock.locked { registrationFailures += 1 }
            return
        }
        do {
            let attestation = try attester.makeAttestation(keyID: device.keyID, clientDataHash: sha256(challenge))
            let body = Array(#"{"attestation_object":"\#(Data(attestation).base64EncodedString())","client_id":\#(jsonString(clientID)),"key_id":"\#(device.keyID)"}"#.utf8)
            let sent = monotonicNow()
            guard let response = post(Self.registerPath, "application/json", body, over: connection), response.status == 200 else {
                lock.locked { registrationFailures += 1 }
                return
            }
            device.next = Self.nextChallenge(in: response.body, receivedAt: sent)
            device.registered = true
            lock.locked { registrations += 1 }
        } catch {
            lock.locked { registrationFailures += 1; otherErrors += 1; lastError = "\(error)" }
        }
    }

    private func refresh(_ device: LoadDevice, over connection: HTTPConnection) {
        let start = monotonicNow()
        var challenge: [UInt8]
        if let next = device.next, next.expiresAt - start >= Self.minimumChallengeTTL {
            challenge = next.bytes
        } else {
            device.next = nil
            guard let fetched = fetchChallenge(device, over: connection) else {
                lock.locked { failedExchanges += 1 }
                return
            }
            challenge = fetched
        }
        // Single use, whatever happens next.
        device.next = nil
        do {
            let hash = sha256(Self.tokenHashDomain + challenge + clientIDBytes + device.rawKeyID)
            let assertion = try attester.makeAssertion(keyID: device.keyID, clientDataHash: hash)
            // Sorted by name, as the published client sends them.
            let form = "assertion=\(percentEncode(Data(assertion).base64EncodedString()))&client_id=\(encodedClientID)"
                + "&grant_type=\(percentEncode(Self.grantType))&key_id=\(device.encodedKeyID)"
            let sent = monotonicNow()
            guard let response = post(Self.tokenPath, "application/x-www-form-urlencoded", Array(form.utf8), over: connection) else {
                lock.locked { failedExchanges += 1 }
                return
            }
            let latency = (monotonicNow() - start) * 1000
            if response.status == 200 {
                device.next = Self.nextChallenge(in: response.body, receivedAt: sent)
                lock.locked { exchanges += 1; latencies.append(latency) }
            } else {
                lock.locked { failedExchanges += 1 }
            }
        } catch {
            lock.locked { failedExchanges += 1; otherErrors += 1; lastError = "\(error)" }
        }
    }

    private func fetchChallenge(_ device: LoadDevice, over connection: HTTPConnection) -> [UInt8]? {
        guard let response = post(Self.challengePath, "application/json", challengeBody(device), over: connection),
              response.status == 200 else { return nil }
        guard let object = Self.jsonObject(response.body), let text = object["challenge"] as? String,
              let bytes = Data(base64Encoded: text), bytes.count == 32 else {
            lock.locked { otherErrors += 1; lastError = "challenge response without a 32-byte challenge" }
            return nil
        }
        return [UInt8](bytes)
    }

    /// Sends one request and counts its status (or transport error).
    private func post(_ path: String, _ contentType: String, _ body: [UInt8], over connection: HTTPConnection) -> HTTPConnection.Response? {
        do {
            let response = try connection.post(target.basePath + path, contentType: contentType, body: body)
            if response.status != 200 { lock.locked { statuses[response.status, default: 0] += 1 } }
            return response
        } catch {
            lock.locked { transportErrors += 1; lastError = "\(error)" }
            // The server is unreachable or stalled: don't spin on it.
            usleep(10_000)
            return nil
        }
    }

    private static func nextChallenge(in body: [UInt8], receivedAt: TimeInterval) -> (bytes: [UInt8], expiresAt: TimeInterval)? {
        guard let object = jsonObject(body), let text = object["next_challenge"] as? String,
              let bytes = Data(base64Encoded: text), bytes.count == 32,
              let ttl = (object["next_challenge_expires_in"] as? NSNumber)?.doubleValue, ttl.isFinite, ttl > 0 else { return nil }
        return ([UInt8](bytes), receivedAt + ttl)
    }

    private static func jsonObject(_ body: [UInt8]) -> [String: Any]? {
        (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any]
    }

    // MARK: Report (caller holds `lock`)

    private func report(refreshSeconds: TimeInterval, registrationSeconds: TimeInterval, cpu: TimeInterval, finished: Bool) -> Int32 {
        func fixed(_ value: Double, _ digits: Int = 3) -> String { String(format: "%.\(digits)f", value) }
        let sorted = latencies.sorted()
        func percentile(_ p: Double) -> String {
            guard !sorted.isEmpty else { return "n/a" }
            let rank = max(1, Int((p * Double(sorted.count)).rounded(.up)))
            return fixed(sorted[min(rank, sorted.count) - 1])
        }
        print("devices: \(devices.count)")
        print("concurrency: \(workerCount)")
        print("seconds: \(fixed(refreshSeconds))")
        print("token_exchanges: \(exchanges)")
        print("token_exchanges_per_second: \(fixed(refreshSeconds > 0 ? Double(exchanges) / refreshSeconds : 0, 1))")
        print("latency_ms_p50: \(percentile(0.50))")
        print("latency_ms_p99: \(percentile(0.99))")
        print("latency_ms_max: \(sorted.last.map { fixed($0) } ?? "n/a")")
        if failedExchanges > 0 { print("failed_exchanges: \(failedExchanges)") }
        for (status, count) in statuses.sorted(by: { $0.key < $1.key }) { print("status_\(status): \(count)") }
        if transportErrors > 0 { print("transport_errors: \(transportErrors)") }
        if otherErrors > 0 { print("other_errors: \(otherErrors)") }
        print("registrations: \(registrations)")
        if registrationFailures > 0 { print("registration_failures: \(registrationFailures)") }
        print("registration_seconds: \(fixed(registrationSeconds))")
        print("loadgen_cpu_seconds: \(fixed(cpu))")
        if !finished { print("unfinished_workers: true") }
        if let lastError {
            FileHandle.standardError.write(Data("attestctl load: last error: \(lastError)\n".utf8))
        }
        fflush(stdout)
        return registrations > 0 && exchanges > 0 ? 0 : 1
    }
}

// MARK: - Encoding

/// Percent-encodes everything but RFC 3986 unreserved characters (so `+ / = :` are escaped).
private func percentEncode(_ text: String) -> String {
    let hexDigits = Array("0123456789ABCDEF".utf8)
    var out = [UInt8]()
    out.reserveCapacity(text.utf8.count * 3 / 2)
    for byte in text.utf8 {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
             UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
             UInt8(ascii: "_"), UInt8(ascii: "~"):
            out.append(byte)
        default:
            out.append(UInt8(ascii: "%"))
            out.append(hexDigits[Int(byte >> 4)])
            out.append(hexDigits[Int(byte & 0x0F)])
        }
    }
    return String(decoding: out, as: UTF8.self)
}

/// A JSON string literal.
private func jsonString(_ text: String) -> String {
    let data = try! JSONSerialization.data(withJSONObject: [text], options: [.withoutEscapingSlashes])
    return String(String(decoding: data, as: UTF8.self).dropFirst().dropLast())
}

private extension NSLock {
    func locked<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }
}

// MARK: - A minimal HTTP/1.1 client

private struct HTTPClientError: Error, CustomStringConvertible {
    let description: String
    /// The connection ended before any byte of the response: a reused keep-alive connection
    /// the server had already closed, so the request may be sent again on a new one.
    var closedBeforeResponse = false
    init(_ description: String, closedBeforeResponse: Bool = false) {
        self.description = description
        self.closedBeforeResponse = closedBeforeResponse
    }
}

/// The resolved address of the base URL's host, and what requests carry for it.
struct HTTPTarget: @unchecked Sendable {
    let address: [UInt8]
    let family: Int32
    let hostHeader: String
    /// The base URL's path without a trailing slash ("" for the root).
    let basePath: String

    init(_ url: URL) throws {
        guard let host = url.host else { throw UsageError("--base-url has no host") }
        let port = url.port ?? 80
        var path = url.path
        while path.hasSuffix("/") { path.removeLast() }
        basePath = path
        let bareHost = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        let literalHost = bareHost.contains(":") ? "[\(bareHost)]" : bareHost
        hostHeader = url.port == nil ? literalHost : "\(literalHost):\(port)"

        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        #if os(Linux)
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        #else
        hints.ai_socktype = SOCK_STREAM
        #endif
        var result: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(bareHost, String(port), &hints, &result)
        guard status == 0, let first = result, let address = first.pointee.ai_addr else {
            throw UsageError("--base-url: cannot resolve \(bareHost): \(String(cString: gai_strerror(status)))")
        }
        defer { freeaddrinfo(result) }
        family = first.pointee.ai_family
        self.address = Array(UnsafeRawBufferPointer(start: address, count: Int(first.pointee.ai_addrlen)))
    }
}

/// One keep-alive HTTP/1.1 connection, used by one thread at a time. Requests carry a
/// Content-Length; responses may be Content-Length framed, chunked, or delimited by close.
private final class HTTPConnection: @unchecked Sendable {
    struct Response {
        let status: Int
        let body: [UInt8]
    }

    static let maxHeaderBytes = 64 * 1024
    static let maxBodyBytes = 4 * 1024 * 1024

    let target: HTTPTarget
    let timeout: TimeInterval
    private var fd: Int32 = -1
    /// Received bytes not consumed yet.
    private var inbox: [UInt8] = []
    private var chunk = [UInt8](repeating: 0, count: 64 * 1024)

    init(target: HTTPTarget, timeout: TimeInterval) {
        self.target = target
        self.timeout = timeout
    }

    deinit { close() }

    func close() {
        if fd >= 0 {
            _ = systemClose(fd)
            fd = -1
        }
        inbox.removeAll(keepingCapacity: true)
    }

    func post(_ path: String, contentType: String, body: [UInt8]) throws -> Response {
        var request = Array("POST \(path) HTTP/1.1\r\nHost: \(target.hostHeader)\r\nContent-Type: \(contentType)\r\nAccept: application/json\r\nContent-Length: \(body.count)\r\n\r\n".utf8)
        request += body
        let reused = fd >= 0
        do {
            return try exchange(request)
        } catch let error as HTTPClientError where reused && error.closedBeforeResponse {
            close()
            do { return try exchange(request) } catch { close(); throw error }
        } catch {
            close()
            throw error
        }
    }

    private func exchange(_ request: [UInt8]) throws -> Response {
        if fd < 0 { try connect() }
        try sendAll(request)
        return try readResponse()
    }

    // MARK: Socket

    private func connect() throws {
        #if os(Linux)
        let socketType = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        #else
        let socketType = SOCK_STREAM
        #endif
        let socket = systemSocket(target.family, socketType, 0)
        guard socket >= 0 else { throw posixError("socket") }
        var one: Int32 = 1
        _ = setsockopt(socket, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        #if canImport(Darwin)
        _ = setsockopt(socket, SOL_SOCKET, SO_NOSIGPIPE, &one, socklen_t(MemoryLayout<Int32>.size))
        #endif
        // Bounds connect (on Linux), send and every recv.
        var time = timeval(tv_sec: Int(timeout), tv_usec: 0)
        _ = setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        _ = setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        let status = target.address.withUnsafeBytes { raw in
            systemConnect(socket, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))
        }
        guard status == 0 else {
            let error = posixError("connect to \(target.hostHeader)")
            _ = systemClose(socket)
            throw error
        }
        fd = socket
        inbox.removeAll(keepingCapacity: true)
    }

    private func sendAll(_ bytes: [UInt8]) throws {
        #if os(Linux)
        let flags = Int32(MSG_NOSIGNAL)
        #else
        let flags: Int32 = 0
        #endif
        try bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let sent = systemSend(fd, buffer.baseAddress! + offset, buffer.count - offset, flags)
                if sent < 0 {
                    if errno == EINTR { continue }
                    let closed = errno == EPIPE || errno == ECONNRESET
                    throw HTTPClientError(posixError("send").description, closedBeforeResponse: closed && offset == 0)
                }
                offset += sent
            }
        }
    }

    /// Appends what the socket has to `inbox`; returns false at end of stream.
    private func receive() throws -> Bool {
        while true {
            let count = chunk.withUnsafeMutableBytes { systemRecv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                inbox.append(contentsOf: chunk[0..<count])
                return true
            }
            if count == 0 { return false }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK {
                throw HTTPClientError("no response within \(Int(timeout)) s")
            }
            throw HTTPClientError(posixError("recv").description, closedBeforeResponse: errno == ECONNRESET && inbox.isEmpty)
        }
    }

    /// Reads until `inbox` holds at least `count` bytes.
    private func fill(_ count: Int) throws {
        while inbox.count < count {
            guard try receive() else { throw HTTPClientError("connection closed in the middle of a response") }
        }
    }

    /// Index of the first `needle` in `inbox` at or after `start`, reading more as needed.
    private func find(_ needle: [UInt8], from start: Int, limit: Int) throws -> Int {
        var from = start
        while true {
            let found: Int? = inbox.withUnsafeBytes { haystack -> Int? in
                // memchr for the first byte, then compare the rest (needles are 2 or 4 bytes).
                var offset = from
                while haystack.count - offset >= needle.count {
                    guard let hit = memchr(haystack.baseAddress! + offset, Int32(needle[0]), haystack.count - offset - needle.count + 1) else {
                        return nil
                    }
                    let index = haystack.baseAddress!.distance(to: UnsafeRawPointer(hit))
                    if memcmp(hit, needle, needle.count) == 0 { return index }
                    offset = index + 1
                }
                return nil
            }
            if let found { return found }
            from = max(start, inbox.count - needle.count + 1)
            guard inbox.count - start < limit else { throw HTTPClientError("response header or chunk line too long") }
            guard try receive() else {
                throw HTTPClientError("connection closed before a complete response", closedBeforeResponse: inbox.isEmpty)
            }
        }
    }

    private static let crlf: [UInt8] = [13, 10]
    private static let headerEnd: [UInt8] = [13, 10, 13, 10]

    private func readResponse() throws -> Response {
        let end = try find(Self.headerEnd, from: 0, limit: Self.maxHeaderBytes)
        let head = try inbox.withUnsafeBufferPointer { try Self.parseHead(UnsafeBufferPointer(rebasing: $0[0..<end])) }
        let status = head.status
        let chunked = head.chunked
        let contentLength = head.contentLength
        var keepAlive = head.keepAlive
        var position = end + 4
        var body: [UInt8] = []
        if status < 200 || status == 204 || status == 304 {
            // No body.
        } else if chunked {
            while true {
                let lineEnd = try find(Self.crlf, from: position, limit: 1024)
                let sizeText = String(decoding: inbox[position..<lineEnd], as: UTF8.self).split(separator: ";").first ?? ""
                guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16), size >= 0,
                      body.count + size <= Self.maxBodyBytes else { throw HTTPClientError("bad chunk size") }
                position = lineEnd + 2
                if size == 0 {
                    // Trailers, up to an empty line.
                    while true {
                        let trailerEnd = try find(Self.crlf, from: position, limit: Self.maxHeaderBytes)
                        defer { position = trailerEnd + 2 }
                        if trailerEnd == position { break }
                    }
                    break
                }
                try fill(position + size + 2)
                body += inbox[position..<(position + size)]
                position += size + 2
            }
        } else if let contentLength {
            try fill(position + contentLength)
            body = Array(inbox[position..<(position + contentLength)])
            position += contentLength
        } else {
            // Delimited by the end of the connection.
            while try receive() {
                guard inbox.count - position <= Self.maxBodyBytes else { throw HTTPClientError("response body too large") }
            }
            body = Array(inbox[position...])
            position = inbox.count
            keepAlive = false
        }
        if keepAlive {
            inbox.removeFirst(position)
        } else {
            close()
        }
        return Response(status: status, body: body)
    }

    private struct Head {
        var status = 0
        var contentLength: Int?
        var chunked = false
        var keepAlive = true
    }

    /// The status line and the framing headers, parsed from the bytes (no String work per response).
    private static func parseHead(_ bytes: UnsafeBufferPointer<UInt8>) throws -> Head {
        func lower(_ byte: UInt8) -> UInt8 { byte >= 65 && byte <= 90 ? byte + 32 : byte }
        func equals(_ range: Range<Int>, _ literal: StaticString) -> Bool {
            guard range.count == literal.utf8CodeUnitCount else { return false }
            let pointer = literal.utf8Start
            for (offset, index) in range.enumerated() where lower(bytes[index]) != pointer[offset] { return false }
            return true
        }
        func contains(_ range: Range<Int>, _ literal: StaticString) -> Bool {
            let length = literal.utf8CodeUnitCount
            guard range.count >= length else { return false }
            for start in range.lowerBound...(range.upperBound - length) where equals(start..<(start + length), literal) { return true }
            return false
        }
        // "HTTP/1.x SSS reason"
        guard bytes.count >= 12, equals(0..<7, "http/1."), bytes[8] == 32,
              (bytes[9...11]).allSatisfy({ $0 >= 48 && $0 <= 57 }), bytes.count == 12 || bytes[12] == 32 || bytes[12] == 13 else {
            throw HTTPClientError("malformed status line: \(String(decoding: bytes.prefix(80), as: UTF8.self))")
        }
        var head = Head()
        head.status = Int(bytes[9] - 48) * 100 + Int(bytes[10] - 48) * 10 + Int(bytes[11] - 48)
        head.keepAlive = bytes[7] != UInt8(ascii: "0")
        // Headers start after the status line's CRLF.
        var lineStart = 12
        while lineStart < bytes.count && bytes[lineStart] != 13 { lineStart += 1 }
        lineStart += 2
        while lineStart < bytes.count {
            var lineEnd = lineStart
            while lineEnd < bytes.count && bytes[lineEnd] != 13 { lineEnd += 1 }
            defer { lineStart = lineEnd + 2 }
            var colon = lineStart
            while colon < lineEnd && bytes[colon] != UInt8(ascii: ":") { colon += 1 }
            guard colon < lineEnd else { continue }
            var valueStart = colon + 1, valueEnd = lineEnd
            while valueStart < valueEnd && (bytes[valueStart] == 32 || bytes[valueStart] == 9) { valueStart += 1 }
            while valueEnd > valueStart && (bytes[valueEnd - 1] == 32 || bytes[valueEnd - 1] == 9) { valueEnd -= 1 }
            let name = lineStart..<colon, value = valueStart..<valueEnd
            if equals(name, "content-length") {
                var length = 0
                for index in value {
                    let digit = bytes[index]
                    guard digit >= 48 && digit <= 57, length <= maxBodyBytes else { throw HTTPClientError("bad Content-Length") }
                    length = length * 10 + Int(digit - 48)
                }
                guard !value.isEmpty, length <= maxBodyBytes else { throw HTTPClientError("bad Content-Length") }
                head.contentLength = length
            } else if equals(name, "transfer-encoding") {
                head.chunked = contains(value, "chunked")
            } else if equals(name, "connection") {
                if contains(value, "close") { head.keepAlive = false } else if contains(value, "keep-alive") { head.keepAlive = true }
            }
        }
        return head
    }

    private func posixError(_ operation: String) -> HTTPClientError {
        HTTPClientError("\(operation): \(String(cString: strerror(errno)))")
    }
}

// Module-qualified system calls: the class has methods of the same names.
#if canImport(Glibc)
private let systemSocket = Glibc.socket
private let systemConnect = Glibc.connect
private let systemSend = Glibc.send
private let systemRecv = Glibc.recv
private let systemClose = Glibc.close
#elseif canImport(Musl)
private let systemSocket = Musl.socket
private let systemConnect = Musl.connect
private let systemSend = Musl.send
private let systemRecv = Musl.recv
private let systemClose = Musl.close
#elseif canImport(Darwin)
private let systemSocket = Darwin.socket
private let systemConnect = Darwin.connect
private let systemSend = Darwin.send
private let systemRecv = Darwin.recv
private let systemClose = Darwin.close
#endif
