import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The Messages API's shapes: one exchange on a connection.
struct MessagesAPI {
    let connection: StubConnection
    var server: UpstreamStubServer { connection.server }
    var configuration: UpstreamStubConfiguration { server.configuration }

    func respond(to request: StubHTTPRequest) -> Disposition {
        let keepAlive = request.wantsKeepAlive
        let path = request.path.split(separator: "?", maxSplits: 1).first.map(String.init) ?? request.path
        let isMessages = path == "/v1/messages"
        let isCount = path == "/v1/messages/count_tokens"

        // Record first, so that tests see every request, refused ones included.
        let (index, requestID, scripted) = server.state.withLock { state -> (Int, String, StubBehavior?) in
            state.requestCounter += 1
            let requestID = Self.identifier("req", state.requestCounter)
            let recordBody = request.body.count <= configuration.recordBodyLimit ? request.body : nil
            state.requests.append(StubRequestRecord(index: state.requests.count, requestID: requestID, connectionID: connection.id,
                                                    method: request.method, path: request.path, headers: request.headers,
                                                    bodySize: request.body.count, body: recordBody, receivedAt: .now))
            let scripted = (isMessages || isCount) && !state.script.isEmpty ? state.script.removeFirst() : nil
            return (state.requests.count - 1, requestID, scripted)
        }
        func update(_ change: (inout StubRequestRecord) -> Void) {
            server.state.withLock { state in
                if index < state.requests.count { change(&state.requests[index]) }
            }
        }
        func refuse(_ status: Int, _ message: String, extraHeaders: [(String, String)] = []) -> Disposition {
            update { $0.status = status; $0.outcome = .completed }
            let sent = connection.sendError(status: status, type: Self.errorType(for: status), message: message,
                                            requestID: requestID, keepAlive: keepAlive, extraHeaders: extraHeaders)
            return sent && keepAlive ? .keepAlive : .close(byClient: !sent)
        }

        guard isMessages || isCount else { return refuse(404, "Not found: \(request.method) \(path)") }
        guard request.method == "POST" else { return refuse(405, "Method \(request.method) not allowed on \(path)") }

        // Credentials: the relay must send the workspace's key and nothing of the device's.
        if request.header("authorization") != nil {
            return refuse(400, "stub upstream: the request carries an Authorization header; a device credential must never reach the upstream API")
        }
        guard let key = request.header("x-api-key"), !key.isEmpty else {
            return refuse(401, "x-api-key header is required")
        }
        if let accepted = configuration.apiKeys, !accepted.contains(key) {
            return refuse(401, "invalid x-api-key")
        }
        guard request.header("anthropic-version") != nil else {
            return refuse(400, "anthropic-version: header is required")
        }

        // The body.
        guard let object = try? JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any] else {
            return refuse(400, "There was an error parsing the body of your request: invalid JSON")
        }
        let model = object["model"] as? String
        let stream = (object["stream"] as? Bool) ?? false
        var behavior = scripted
            ?? request.header("x-stub-behavior").flatMap(StubBehavior.init(spec:))
            ?? model.flatMap { $0.hasPrefix("stub-") ? StubBehavior(spec: String($0.dropFirst(5))) : nil }
            ?? .normal
        if behavior.streamDuration == nil, let duration = configuration.streamDuration { behavior.streamDuration = duration }
        let recordedBehavior = behavior
        update { $0.model = model; $0.stream = stream && isMessages; $0.behavior = recordedBehavior }

        if let status = behavior.errorStatus {
            let extra = status == 429 ? [("retry-after", "\(configuration.retryAfterSeconds)")] : []
            return refuse(status, Self.scriptedMessage(status), extraHeaders: extra)
        }
        if let status = behavior.redirectStatus {
            update { $0.status = status; $0.outcome = .completed }
            let sent = connection.sendResponse(status: status, headers: [("location", "https://elsewhere.invalid/v1/messages"),
                                                                         ("request-id", requestID), ("content-type", "text/plain")],
                                               body: "moved", keepAlive: keepAlive)
            return sent && keepAlive ? .keepAlive : .close(byClient: !sent)
        }
        // The API checks a user profile, and takes it only with its beta.
        let betas = request.headers.filter { $0.name == "anthropic-beta" }.map(\.value).flatMap { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } }
        if let profile = request.header("anthropic-user-profile-id") {
            guard profile.hasPrefix("uprof_"), profile.count > 6 else { return refuse(400, "anthropic-user-profile-id: unknown user profile") }
            guard betas.contains("user-profiles-2026-08-18") else {
                return refuse(400, "anthropic-user-profile-id: requires the user-profiles-2026-08-18 beta")
            }
        }
        // Fallbacks: a list or "default", each with its beta; with `fallback` the first one serves.
        var servingModel: String?
        if let fallbacks = object["fallbacks"] {
            if let list = fallbacks as? [[String: Any]] {
                guard list.count <= 3, betas.contains("server-side-fallback-2026-06-01") || betas.contains("server-side-fallback-2026-07-01") else {
                    return refuse(400, "fallbacks: at most 3, with the server-side-fallback-2026-06-01 beta")
                }
                if behavior.fallback { servingModel = list.first?["model"] as? String }
            } else if fallbacks as? String == "default" {
                guard betas.contains("server-side-fallback-2026-07-01") else { return refuse(400, "fallbacks: \"default\" needs server-side-fallback-2026-07-01") }
                if behavior.fallback { servingModel = "claude-haiku-4-5" }
            } else {
                return refuse(400, "fallbacks: must be a list or \"default\"")
            }
        }
        // Server tools bill per use: each web search or fetch tool is used once.
        var serverToolUse: [(String, Int)] = []
        for tool in (object["tools"] as? [[String: Any]]) ?? [] {
            guard let type = tool["type"] as? String else { continue }
            for (prefix, counter) in [("web_search", "web_search_requests"), ("web_fetch", "web_fetch_requests")] where type.hasPrefix(prefix) {
                if let at = serverToolUse.firstIndex(where: { $0.0 == counter }) { serverToolUse[at].1 += 1 } else { serverToolUse.append((counter, 1)) }
            }
        }
        let toolUseJSON = serverToolUse.isEmpty ? "" : ",\"server_tool_use\":{" + serverToolUse.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
        let fallbackBlock = servingModel.map { to in
            "{\"type\":\"fallback\",\"from\":{\"model\":\(jsonString(model ?? ""))},\"to\":{\"model\":\(jsonString(to))},"
                + "\"trigger\":{\"type\":\"refusal\",\"category\":\"cyber\"}}"
        }
        guard let model, !model.isEmpty else { return refuse(400, "model: Field required") }
        guard let messages = object["messages"] as? [Any], !messages.isEmpty else {
            return refuse(400, "messages: Field required")
        }

        var usage = StubUsage.input(forBody: request.body)
        if let creation = behavior.cacheCreationTokens, let read = behavior.cacheReadTokens {
            usage.cacheCreationInputTokens = creation
            usage.cacheReadInputTokens = read
        }
        if let oneHour = behavior.cacheCreation1hTokens { usage.cacheCreation1hInputTokens = min(oneHour, usage.cacheCreationInputTokens) }

        if let latency = behavior.latency ?? (configuration.latency > .zero ? configuration.latency : nil) {
            guard connection.pause(latency) else {
                update { $0.outcome = .clientClosed }
                return .close(byClient: true)
            }
        }

        if isCount {
            let total = usage.inputTokens + usage.cacheCreationInputTokens + usage.cacheReadInputTokens
            let countUsage = StubUsage(inputTokens: total, outputTokens: 0, cacheCreationInputTokens: 0, cacheReadInputTokens: 0)
            update { $0.status = 200; $0.usage = countUsage }
            let sent = connection.sendResponse(status: 200, headers: Self.commonHeaders(requestID: requestID, contentType: "application/json"),
                                               body: "{\"input_tokens\":\(total)}", keepAlive: keepAlive)
            update { $0.outcome = sent ? .completed : .clientClosed }
            return sent && keepAlive ? .keepAlive : .close(byClient: !sent)
        }

        guard let maxTokens = (object["max_tokens"] as? NSNumber)?.intValue, maxTokens >= 1 else {
            return refuse(400, "max_tokens: Field required")
        }
        let wanted = max(1, behavior.deltaCount ?? configuration.deltaCount)
        let deltas = min(wanted, maxTokens)
        let stopReason = deltas < wanted ? "max_tokens" : "end_turn"
        let messageID = Self.identifier("msg", index + 1)

        if !stream {
            usage.outputTokens = deltas
            let finalUsage = usage
            update { $0.status = 200; $0.usage = finalUsage }
            let usageJSON = String(Self.usageJSON(finalUsage).dropLast()) + toolUseJSON + "}"
            let body = "{\"id\":\"\(messageID)\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\(jsonString(model)),"
                + "\"content\":[" + (fallbackBlock.map { $0 + "," } ?? "") + "{\"type\":\"text\",\"text\":\(jsonString(StubReply.text(deltaCount: deltas)))}],"
                + "\"stop_reason\":\"\(stopReason)\",\"stop_sequence\":null,\"usage\":\(usageJSON)}"
            if behavior.dropMidStream {
                // Announce the whole body, send half of it, and hang up.
                let bytes = Array(body.utf8)
                var head = "HTTP/1.1 200 OK\r\n"
                for (name, value) in Self.commonHeaders(requestID: requestID, contentType: "application/json") { head += "\(name): \(value)\r\n" }
                head += "content-length: \(bytes.count)\r\n\r\n"
                _ = connection.send(Array(head.utf8) + bytes[0..<(bytes.count / 2)])
                update { $0.outcome = .droppedByStub }
                return .close(byClient: false)
            }
            let sent = connection.sendResponse(status: 200, headers: Self.commonHeaders(requestID: requestID, contentType: "application/json"),
                                               body: body, keepAlive: keepAlive)
            update { $0.outcome = sent ? .completed : .clientClosed }
            return sent && keepAlive ? .keepAlive : .close(byClient: !sent)
        }

        return streamReply(model: model, messageID: messageID, requestID: requestID, usage: usage, deltas: deltas,
                           stopReason: stopReason, behavior: behavior, keepAlive: keepAlive, fallbackBlock: fallbackBlock,
                           toolUseJSON: toolUseJSON, update: update)
    }

    private func streamReply(model: String, messageID: String, requestID: String, usage inputUsage: StubUsage, deltas: Int,
                             stopReason: String, behavior: StubBehavior, keepAlive: Bool, fallbackBlock: String?, toolUseJSON: String,
                             update: ((inout StubRequestRecord) -> Void) -> Void) -> Disposition {
        var usage = inputUsage
        usage.outputTokens = 1
        let startUsage = usage
        update { $0.status = 200; $0.usage = startUsage }
        server.state.withLock { $0.openStreams += 1 }
        defer { server.state.withLock { $0.openStreams -= 1 } }

        var head = "HTTP/1.1 200 OK\r\n"
        for (name, value) in Self.commonHeaders(requestID: requestID, contentType: "text/event-stream; charset=utf-8") {
            head += "\(name): \(value)\r\n"
        }
        head += "cache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: \(keepAlive ? "keep-alive" : "close")\r\n\r\n"
        func event(_ name: String, _ data: String) -> Bool {
            connection.sendChunk("event: \(name)\ndata: \(data)\n\n")
        }
        func clientGone() -> Disposition {
            update { $0.outcome = .clientClosed }
            return .close(byClient: true)
        }

        guard connection.send(head) else { return clientGone() }
        let start = "{\"type\":\"message_start\",\"message\":{\"id\":\"\(messageID)\",\"type\":\"message\",\"role\":\"assistant\","
            + "\"model\":\(jsonString(model)),\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":\(Self.usageJSON(startUsage))}}"
        guard event("message_start", start) else { return clientGone() }
        // A fallback block first (index 0), then the text (index 1).
        let textIndex = fallbackBlock == nil ? 0 : 1
        if let fallbackBlock {
            guard event("content_block_start", "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":\(fallbackBlock)}"),
                  event("content_block_stop", "{\"type\":\"content_block_stop\",\"index\":0}") else { return clientGone() }
        }
        guard event("content_block_start", "{\"type\":\"content_block_start\",\"index\":\(textIndex),\"content_block\":{\"type\":\"text\",\"text\":\"\"}}"),
              event("ping", "{\"type\":\"ping\"}") else { return clientGone() }

        let interval: Duration
        if let total = behavior.streamDuration {
            interval = total / max(1, deltas)
        } else {
            interval = behavior.deltaInterval ?? configuration.deltaInterval
        }
        for k in 0..<deltas {
            if k > 0 || behavior.streamDuration != nil {
                guard connection.pause(interval) else { return clientGone() }
            }
            let delta = "{\"type\":\"content_block_delta\",\"index\":\(textIndex),\"delta\":{\"type\":\"text_delta\",\"text\":\(jsonString(StubReply.delta(k)))}}"
            guard event("content_block_delta", delta) else { return clientGone() }
            let sentAt = ContinuousClock.now
            update { $0.deltaSentAt.append(sentAt); $0.usage?.outputTokens = k + 1 }
            if (k == 0 && behavior.dropMidStream) || k + 1 == behavior.dropAfterDeltas {
                update { $0.outcome = .droppedByStub }
                return .close(byClient: false)
            }
            if k == 0 && behavior.dropMidEvent {
                // Half an event (its data line cut inside the JSON), then the connection closes.
                _ = connection.sendChunk("event: content_block_delta\ndata: {\"type\":\"content_block_del")
                update { $0.outcome = .droppedByStub }
                return .close(byClient: false)
            }
            if k == 0 && behavior.streamError {
                let error = "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}"
                guard event("error", error), connection.send("0\r\n\r\n") else { return clientGone() }
                update { $0.outcome = .completed }
                return keepAlive ? .keepAlive : .close(byClient: false)
            }
        }
        guard event("content_block_stop", "{\"type\":\"content_block_stop\",\"index\":\(textIndex)}"),
              event("message_delta", "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"\(stopReason)\",\"stop_sequence\":null},"
                    + "\"usage\":{\"output_tokens\":\(deltas)\(toolUseJSON)}}"),
              event("message_stop", "{\"type\":\"message_stop\"}"),
              connection.send("0\r\n\r\n") else { return clientGone() }
        update { $0.outcome = .completed }
        return keepAlive ? .keepAlive : .close(byClient: false)
    }

    // MARK: Shapes

    static func identifier(_ prefix: String, _ n: Int) -> String {
        let digits = String(n)
        return "\(prefix)_stub" + String(repeating: "0", count: max(0, 16 - digits.count)) + digits
    }

    static func usageJSON(_ usage: StubUsage) -> String {
        // The API splits the cache writes by lifetime in `cache_creation` whenever it writes any.
        let split = usage.cacheCreationInputTokens == 0 ? ""
            : ",\"cache_creation\":{\"ephemeral_5m_input_tokens\":\(usage.cacheCreationInputTokens - usage.cacheCreation1hInputTokens),"
                + "\"ephemeral_1h_input_tokens\":\(usage.cacheCreation1hInputTokens)}"
        return "{\"input_tokens\":\(usage.inputTokens),\"cache_creation_input_tokens\":\(usage.cacheCreationInputTokens),"
            + "\"cache_read_input_tokens\":\(usage.cacheReadInputTokens),\"output_tokens\":\(usage.outputTokens)" + split + "}"
    }

    static func errorType(for status: Int) -> String {
        switch status {
        case 400, 405, 408, 431: return "invalid_request_error"
        case 401: return "authentication_error"
        case 403: return "permission_error"
        case 404: return "not_found_error"
        case 413: return "request_too_large"
        case 429: return "rate_limit_error"
        case 529: return "overloaded_error"
        default: return "api_error"
        }
    }

    static func scriptedMessage(_ status: Int) -> String {
        switch status {
        case 429: return "Number of requests has exceeded your rate limit (stub upstream)"
        case 529: return "Overloaded"
        case 500: return "Internal server error"
        default: return "stub upstream: scripted \(status)"
        }
    }

    static func reason(_ status: Int) -> String {
        switch status {
        case 200: return "OK"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 403: return "Forbidden"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 408: return "Request Timeout"
        case 413: return "Payload Too Large"
        case 429: return "Too Many Requests"
        case 431: return "Request Header Fields Too Large"
        case 500: return "Internal Server Error"
        case 529: return "Overloaded"
        default: return "Status \(status)"
        }
    }

    /// Headers on every answer, as the real API sends them (rate-limit figures are fixed).
    static func commonHeaders(requestID: String, contentType: String) -> [(String, String)] {
        let now = time(nil)
        let reset = rfc3339(now + 60)
        return [
            ("date", httpDate(now)),
            ("content-type", contentType),
            ("request-id", requestID),
            ("anthropic-organization-id", "00000000-0000-4000-8000-000000000000"),
            ("anthropic-ratelimit-requests-limit", "4000"),
            ("anthropic-ratelimit-requests-remaining", "3999"),
            ("anthropic-ratelimit-requests-reset", reset),
            ("anthropic-ratelimit-input-tokens-limit", "400000"),
            ("anthropic-ratelimit-input-tokens-remaining", "399000"),
            ("anthropic-ratelimit-input-tokens-reset", reset),
            ("anthropic-ratelimit-output-tokens-limit", "80000"),
            ("anthropic-ratelimit-output-tokens-remaining", "79000"),
            ("anthropic-ratelimit-output-tokens-reset", reset),
            ("anthropic-ratelimit-tokens-limit", "480000"),
            ("anthropic-ratelimit-tokens-remaining", "478000"),
            ("anthropic-ratelimit-tokens-reset", reset),
            ("server", "upstream-stub"),
            // The same name twice, as CDNs send it: a client must keep both.
            ("vary", "accept-encoding"),
            ("vary", "origin"),
        ]
    }

    private static func format(_ t: time_t, _ pattern: String) -> String {
        var seconds = t
        var parts = tm()
        gmtime_r(&seconds, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let n = strftime(&buffer, buffer.count, pattern, &parts)
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func rfc3339(_ t: time_t) -> String { format(t, "%Y-%m-%dT%H:%M:%SZ") }
    static func httpDate(_ t: time_t) -> String { format(t, "%a, %d %b %Y %H:%M:%S GMT") }
}
