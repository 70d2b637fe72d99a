import AttestWire
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization

/// What `simulate-device --messages` asks.
struct MessageRequest: Sendable {
    let prompt: String
    let model: String
    let maxTokens: Int
    let stream: Bool

    var json: String {
        "{" + [
            "\"model\":" + JSONText.string(model),
            "\"max_tokens\":\(maxTokens)",
            "\"stream\":\(stream)",
            "\"messages\":[{\"role\":\"user\",\"content\":" + JSONText.string(prompt) + "}]",
        ].joined(separator: ",") + "}"
    }
}

/// What came back: the status, and for the summary line the model, stop reason and usage.
struct MessageReply: Sendable {
    var status: Int
    var printedText = false
    var fields: [String: String] = [:]
    var usage: [String: Int] = [:]
    var error: String?

    var summary: [String: Any] {
        var summary: [String: Any] = ["messages_status": status]
        for (name, value) in fields { summary[name] = value }
        for (name, value) in usage { summary[name] = value }
        if let error { summary["error_type"] = error }
        return summary
    }
}

/// One Messages API call through the service, as the published client makes it: the token as a
/// bearer, `anthropic-version`, and with `"stream": true` the reply's text printed as each
/// `content_block_delta` arrives (URLSession's data delegate hands over bytes as they come).
enum MessagesCall {
    static func send(_ message: MessageRequest, token: String, baseURL: URL) async throws -> MessageReply {
        var request = URLRequest(url: baseURL.appendingPathComponent(String(WireProtocol.messagesPath.dropFirst())))
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.setValue("2023-06-01", forHTTPHeaderField: "anthropic-version")
        request.setValue("attest-sim/1 (simulated device)", forHTTPHeaderField: "User-Agent")
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        request.httpBody = Data(message.json.utf8)
        request.timeoutInterval = 600
        let reader = ReplyReader()
        let session = URLSession(configuration: .ephemeral, delegate: reader, delegateQueue: nil)
        defer { session.finishTasksAndInvalidate() }
        return try await reader.run(session.dataTask(with: request))
    }
}

/// Reads one reply: SSE events line by line as they arrive, or a whole JSON body at the end.
final class ReplyReader: NSObject, URLSessionDataDelegate, Sendable {
    private struct State {
        var reply = MessageReply(status: 0)
        var isEventStream = false
        var buffer: [UInt8] = []
        var continuation: CheckedContinuation<MessageReply, Error>?
    }

    private let state = Mutex(State())

    func run(_ task: URLSessionDataTask) async throws -> MessageReply {
        try await withCheckedThrowingContinuation { continuation in
            state.withLock { $0.continuation = continuation }
            task.resume()
        }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping (URLSession.ResponseDisposition) -> Void) {
        let http = response as? HTTPURLResponse
        state.withLock {
            $0.reply.status = http?.statusCode ?? 0
            $0.isEventStream = (http?.value(forHTTPHeaderField: "Content-Type") ?? "").hasPrefix("text/event-stream")
        }
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        state.withLock { state in
            state.buffer += data
            guard state.isEventStream else { return }
            // Each complete line: `data: {json}` lines carry the events.
            while let newline = state.buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: state.buffer[..<newline], as: UTF8.self)
                state.buffer.removeSubrange(...newline)
                guard line.hasPrefix("data:") else { continue }
                Self.event(Data(line.dropFirst(5).utf8), into: &state.reply)
            }
        }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: Error?) {
        let (continuation, reply) = state.withLock { state -> (CheckedContinuation<MessageReply, Error>?, MessageReply) in
            if !state.isEventStream { Self.message(Data(state.buffer), into: &state.reply) }
            defer { state.continuation = nil }
            return (state.continuation, state.reply)
        }
        if let error { continuation?.resume(throwing: error) } else { continuation?.resume(returning: reply) }
    }

    /// One streamed event: text deltas are printed at once; usage and the stop reason are kept.
    static func event(_ data: Data, into reply: inout MessageReply) {
        guard let event = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return }
        switch event["type"] as? String {
        case "message_start":
            let message = event["message"] as? [String: Any]
            reply.fields["model"] = message?["model"] as? String
            for (name, value) in message?["usage"] as? [String: Any] ?? [:] { if let count = value as? Int { reply.usage[name] = count } }
        case "content_block_delta":
            if let text = (event["delta"] as? [String: Any])?["text"] as? String {
                FileHandle.standardOutput.write(Data(text.utf8))
                reply.printedText = true
            }
        case "message_delta":
            reply.fields["stop_reason"] = (event["delta"] as? [String: Any])?["stop_reason"] as? String
            if let output = (event["usage"] as? [String: Any])?["output_tokens"] as? Int { reply.usage["output_tokens"] = output }
        case "error":
            reply.error = (event["error"] as? [String: Any])?["type"] as? String
        default:
            break
        }
    }

    /// A whole JSON reply: the message's text, or the error envelope's type.
    static func message(_ data: Data, into reply: inout MessageReply) {
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return }
        if let error = object["error"] as? [String: Any] {
            reply.error = error["type"] as? String
            return
        }
        reply.fields["model"] = object["model"] as? String
        reply.fields["stop_reason"] = object["stop_reason"] as? String
        for (name, value) in object["usage"] as? [String: Any] ?? [:] { if let count = value as? Int { reply.usage[name] = count } }
        let text = (object["content"] as? [[String: Any]] ?? []).compactMap { $0["text"] as? String }.joined()
        if !text.isEmpty {
            FileHandle.standardOutput.write(Data(text.utf8))
            reply.printedText = true
        }
    }
}
