/// How the stub upstream behaves when a request does not say otherwise.
public struct UpstreamStubConfiguration: Sendable {
    public var host: String
    /// 0 picks a free port (see `UpstreamStubServer.port`).
    public var port: UInt16
    /// Serve HTTPS with this certificate chain and key (PEM files).
    public var tls: TLSFiles?
    /// Accepted `x-api-key` values; nil accepts any non-empty key.
    public var apiKeys: Set<String>?
    /// Wait before the response head.
    public var latency: Duration
    /// Text deltas per reply (one output token each), capped by the request's `max_tokens`.
    public var deltaCount: Int
    /// Pause between two deltas of a stream.
    public var deltaInterval: Duration
    /// When set, a stream's deltas are spread evenly over this long (a slow upstream).
    public var streamDuration: Duration?
    /// `retry-after` on 429 answers.
    public var retryAfterSeconds: Int
    /// Larger request bodies get 413 `request_too_large`.
    public var maxBodyBytes: Int
    /// Bodies up to this size are kept in the request records.
    public var recordBodyLimit: Int
    /// An idle keep-alive connection is closed after this long.
    public var keepAliveTimeout: Duration
    /// Stack of each connection thread: small, so that a thousand open streams stay cheap.
    public var threadStackBytes: Int
    /// Answers requests before the Messages API does (another service's shapes: Apple's data
    /// service); nil from it passes the request on. Runs on the connection's thread and may block.
    public var handler: (@Sendable (StubRequest) -> StubResponse?)? = nil

    public struct TLSFiles: Sendable {
        public var certificateChainPath: String
        public var privateKeyPath: String
        public init(certificateChainPath: String, privateKeyPath: String) {
            self.certificateChainPath = certificateChainPath
            self.privateKeyPath = privateKeyPath
        }
    }

    public init(host: String = "127.0.0.1", port: UInt16 = 0, tls: TLSFiles? = nil, apiKeys: Set<String>? = nil,
                latency: Duration = .zero, deltaCount: Int = 5, deltaInterval: Duration = .milliseconds(20),
                streamDuration: Duration? = nil, retryAfterSeconds: Int = 7, maxBodyBytes: Int = 64 << 20,
                recordBodyLimit: Int = 64 << 10, keepAliveTimeout: Duration = .seconds(60),
                threadStackBytes: Int = 256 << 10) {
        self.host = host
        self.port = port
        self.tls = tls
        self.apiKeys = apiKeys
        self.latency = latency
        self.deltaCount = deltaCount
        self.deltaInterval = deltaInterval
        self.streamDuration = streamDuration
        self.retryAfterSeconds = retryAfterSeconds
        self.maxBodyBytes = maxBodyBytes
        self.recordBodyLimit = recordBodyLimit
        self.keepAliveTimeout = keepAliveTimeout
        self.threadStackBytes = threadStackBytes
    }
}

/// What the stub does with one Messages request, beyond the defaults. Chosen, first match wins,
/// by `UpstreamStubServer.enqueue` (a script the test sets), the request header
/// `x-stub-behavior`, or a model name starting with `stub-` (which survives a relay that
/// forwards only known headers). Both spell it as tokens separated by `,` or `+`:
///
/// | token | effect |
/// |---|---|
/// | `error-<status>` | that status with the API's error envelope: 400 `invalid_request_error`, 401 `authentication_error`, 403 `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429 `rate_limit_error` (+ `retry-after`), 500 `api_error`, 529 `overloaded_error` |
/// | `drop-mid-stream` | close the connection after `message_start` and one delta (JSON: after half the body) |
/// | `drop-after-<n>` | close a stream's connection after n deltas (before `message_delta`) |
/// | `drop-mid-event` | close a stream's connection after one delta and half of the next event |
/// | `stream-error` | an `error` event (`overloaded_error`) after the first delta, then the end of the stream |
/// | `slow-stream-<seconds>` | spread the deltas over that many seconds |
/// | `latency-<ms>` | wait before the response head |
/// | `deltas-<n>` | that many deltas (output tokens) |
/// | `delta-interval-<ms>` | pause between deltas |
/// | `cache-<creation>-<read>` | report these cache token counts |
/// | `cache1h-<n>` | of the cache writes, n were for an hour (`usage.cache_creation`, the rest for 5 minutes) |
/// | `fallback` | the requested model declines: a `fallback` block hands over to the request's first `fallbacks[].model` (`claude-haiku-4-5` for `"default"`), which serves |
/// | `redirect-<status>` | a 3xx with a `Location` elsewhere |
///
/// Example: model `stub-slow-stream-30`, or `x-stub-behavior: error-429`.
public struct StubBehavior: Sendable, Equatable {
    public var errorStatus: Int?
    public var dropMidStream = false
    public var dropAfterDeltas: Int?
    public var dropMidEvent = false
    public var streamError = false
    public var latency: Duration?
    public var deltaCount: Int?
    public var deltaInterval: Duration?
    public var streamDuration: Duration?
    public var cacheCreationTokens: Int?
    public var cacheReadTokens: Int?
    /// Of the cache writes, how many were written for an hour (`cache_creation.ephemeral_1h_input_tokens`).
    public var cacheCreation1hTokens: Int?
    public var fallback = false
    public var redirectStatus: Int?

    public init() {}

    public static let normal = StubBehavior()
    public static func error(_ status: Int) -> StubBehavior { var b = StubBehavior(); b.errorStatus = status; return b }
    public static let dropMidStream: StubBehavior = { var b = StubBehavior(); b.dropMidStream = true; return b }()
    public static let streamError: StubBehavior = { var b = StubBehavior(); b.streamError = true; return b }()
    public static func slowStream(_ duration: Duration) -> StubBehavior { var b = StubBehavior(); b.streamDuration = duration; return b }

    /// Parses the token grammar above; nil when a token is unknown.
    public init?(spec: String) {
        self.init()
        let tokens = spec.split(whereSeparator: { $0 == "," || $0 == "+" }).map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        guard !tokens.isEmpty else { return nil }
        for token in tokens where !token.isEmpty {
            func number(after prefix: String) -> Int? {
                token.hasPrefix(prefix) ? Int(token.dropFirst(prefix.count)) : nil
            }
            if let status = number(after: "error-"), (400...599).contains(status) {
                errorStatus = status
            } else if token == "drop-mid-stream" || token == "drop" {
                dropMidStream = true
            } else if let n = number(after: "drop-after-"), n >= 1 {
                dropAfterDeltas = n
            } else if token == "drop-mid-event" {
                dropMidEvent = true
            } else if token == "stream-error" {
                streamError = true
            } else if let seconds = number(after: "slow-stream-"), seconds >= 0 {
                streamDuration = .seconds(seconds)
            } else if let ms = number(after: "latency-"), ms >= 0 {
                latency = .milliseconds(ms)
            } else if let n = number(after: "deltas-"), n >= 1 {
                deltaCount = n
            } else if let ms = number(after: "delta-interval-"), ms >= 0 {
                deltaInterval = .milliseconds(ms)
            } else if token == "fallback" {
                fallback = true
            } else if let status = number(after: "redirect-"), (300...399).contains(status) {
                redirectStatus = status
            } else if let n = number(after: "cache1h-"), n >= 0 {
                cacheCreation1hTokens = n
            } else if token.hasPrefix("cache-") {
                let parts = token.dropFirst(6).split(separator: "-").compactMap { Int($0) }
                guard parts.count == 2 else { return nil }
                cacheCreationTokens = parts[0]
                cacheReadTokens = parts[1]
            } else {
                return nil
            }
        }
    }
}

/// Token counts, as the stub reported them.
public struct StubUsage: Sendable, Equatable {
    public var inputTokens: Int
    public var outputTokens: Int
    public var cacheCreationInputTokens: Int
    public var cacheReadInputTokens: Int
    /// The part of the cache writes written for an hour.
    public var cacheCreation1hInputTokens = 0

    public init(inputTokens: Int, outputTokens: Int, cacheCreationInputTokens: Int, cacheReadInputTokens: Int) {
        self.inputTokens = inputTokens
        self.outputTokens = outputTokens
        self.cacheCreationInputTokens = cacheCreationInputTokens
        self.cacheReadInputTokens = cacheReadInputTokens
    }

    /// The input side the stub reports for a request body, so that a test can predict it:
    /// `max(1, bytes / 4)` prompt tokens in all; when the body mentions `"cache_control"`, half
    /// of them are read from the cache and a quarter written to it, and `input_tokens` is the
    /// rest (as in the real API, input excludes cache tokens). Otherwise the cache counts are 0.
    public static func input(forBody body: [UInt8]) -> StubUsage {
        let total = max(1, body.count / 4)
        // Foundation's search: the test support itself is built without optimisation.
        guard Data(body).range(of: Data("\"cache_control\"".utf8)) != nil else {
            return StubUsage(inputTokens: total, outputTokens: 0, cacheCreationInputTokens: 0, cacheReadInputTokens: 0)
        }
        let read = total / 2
        let creation = total / 4
        return StubUsage(inputTokens: total - read - creation, outputTokens: 0,
                         cacheCreationInputTokens: creation, cacheReadInputTokens: read)
    }
}

/// The reply text: deltas cycle through these words, one output token each.
public enum StubReply {
    public static let words = ["Hello", " from", " the", " upstream", " stub", "."]
    public static func delta(_ index: Int) -> String { words[index % words.count] }
    public static func text(deltaCount: Int) -> String { (0..<deltaCount).map(delta).joined() }
}

public enum StubOutcome: String, Sendable {
    case inProgress
    /// The whole response was written.
    case completed
    /// The stub closed the connection mid-response (`drop-mid-stream`).
    case droppedByStub
    /// The client closed the connection before the response was complete.
    case clientClosed
}

/// One request as the stub saw it, and what it answered.
public struct StubRequestRecord: Sendable {
    public let index: Int
    public let requestID: String
    public let connectionID: Int
    public let method: String
    public let path: String
    /// Names lowercased, in arrival order.
    public let headers: [(name: String, value: String)]
    public let bodySize: Int
    /// The body when it is at most `recordBodyLimit` bytes.
    public let body: [UInt8]?
    public let receivedAt: ContinuousClock.Instant
    public internal(set) var behavior = StubBehavior.normal
    public internal(set) var model: String?
    public internal(set) var stream = false
    public internal(set) var status = 0
    /// Streams: the input side from `message_start` and the output tokens sent so far.
    public internal(set) var usage: StubUsage?
    public internal(set) var deltaSentAt: [ContinuousClock.Instant] = []
    public internal(set) var outcome = StubOutcome.inProgress

    /// The first value of a header (case-insensitive name).
    public func header(_ name: String) -> String? {
        let lower = name.lowercased()
        return headers.first { $0.name == lower }?.value
    }

    public func headerValues(_ name: String) -> [String] {
        let lower = name.lowercased()
        return headers.filter { $0.name == lower }.map(\.value)
    }
}

public struct StubConnectionEvent: Sendable {
    public enum Kind: Sendable, Equatable {
        case opened
        /// `byClient`: the client closed it (or reset it); otherwise the stub did.
        case closed(byClient: Bool)
    }
    public let connectionID: Int
    public let kind: Kind
    public let at: ContinuousClock.Instant
}

import Foundation

/// A request as a custom handler sees it (header names lowercased).
public struct StubRequest: Sendable {
    public let method: String
    public let path: String
    public let headers: [(name: String, value: String)]
    public let body: [UInt8]
    public func header(_ name: String) -> String? { headers.first { $0.name == name.lowercased() }?.value }
}

/// A custom handler's answer, sent with Content-Length.
public struct StubResponse: Sendable {
    public var status: Int
    public var headers: [(String, String)]
    public var body: [UInt8]
    public init(status: Int, headers: [(String, String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}
