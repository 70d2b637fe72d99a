import CCurl
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Work for the event thread, queued by other threads.
enum Command: Sendable {
    case start(UpstreamTransfer, UpstreamRequest, any UpstreamDelegate)
    case cancel(UInt64)
    case resume(UInt64)
}

/// What the event thread shares with the rest of the process: the command queue, its wake-up
/// descriptor and the counters. Everything else lives on the thread.
final class EventLoopShared: Sendable {
    let wakeFD: Int32
    let active = Atomic<Int>(0)
    let nextID = Atomic<UInt64>(0)
    private let queue = Mutex(Queue())

    private struct Queue {
        var commands: [Command] = []
        var closed = false
    }

    init(wakeFD: Int32) {
        self.wakeFD = wakeFD
    }

    deinit {
        // Only now: a transfer handle may submit (and so write to this descriptor) until the
        // last reference goes.
        Glibc.close(wakeFD)
    }

    /// Queues a command; false once the loop has shut down. Only the command that finds the
    /// queue empty writes to the eventfd: the loop drains the whole queue after each wake-up.
    func submit(_ command: Command) -> Bool {
        let (accepted, mustWake) = queue.withLock { queue -> (Bool, Bool) in
            if queue.closed { return (false, false) }
            queue.commands.append(command)
            return (true, queue.commands.count == 1)
        }
        if mustWake { wake() }
        return accepted
    }

    /// Refuses further commands and wakes the loop so that it shuts down.
    func close() {
        queue.withLock { $0.closed = true }
        wake()
    }

    /// The queued commands, and whether the loop must stop.
    func take() -> (commands: [Command], closed: Bool) {
        queue.withLock { queue in
            let commands = queue.commands
            queue.commands = []
            return (commands, queue.closed)
        }
    }

    private func wake() {
        var one: UInt64 = 1
        _ = withUnsafeBytes(of: &one) { write(wakeFD, $0.baseAddress, 8) }
    }
}

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
        caBundle = try configuration.caFile.map(Self.bundle(adding:))
        connectTimeoutMilliseconds = Int(max(1, configuration.connectTimeout.wholeMilliseconds))
        idleTimeoutNanoseconds = max(1_000_000, configuration.idleTimeout.wholeNanoseconds)
        allowHTTP2 = configuration.allowHTTP2
        maxIdleConnections = max(0, configuration.maxIdleConnections)
    }

    /// curl takes a single CA bundle (CURLOPT_CAINFO and CURLOPT_CAINFO_BLOB each replace the
    /// default one), so extra roots come as the system bundle followed by the file's
    /// certificates, in memory.
    private static func bundle(adding path: String) throws -> [UInt8] {
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
