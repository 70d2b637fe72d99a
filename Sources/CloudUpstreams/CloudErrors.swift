// What a device is told when a cloud upstream refuses: the error's type and a message of our
// own. A cloud's message can name the IAM principal, the AWS account or the Google project, so it
// goes to the log (and the operator's view) only. Compiled into the event-stream fuzzer too.

/// An error from a cloud upstream, as the device gets it and as the log gets it.
public struct CloudErrorAnswer: Sendable, Equatable {
    /// The status the device gets.
    public var status: Int
    /// The Messages API's error type.
    public var type: String
    /// This service's own words: no account, principal or project in them.
    public var message: String
    /// The cloud's exception name and message, for the log only.
    public var detail: String

    /// A credential the cloud refused is the operator's problem, never the device's: the published
    /// client answers a 401 or `authentication_error` by throwing its App Attest token away and
    /// attesting again, so this is a 503 `api_error`.
    public static let credentialsRefused = "the upstream refused this service's credentials"
    /// A context overflow, in the API's words and with the word the published client looks for:
    /// its `ErrorMapper` maps `case .invalidRequest where error.message.lowercased().contains("context")`
    /// (and `request_too_large`) to `LanguageModelError.contextSizeExceeded`.
    public static let promptTooLong = "prompt is too long: the input is longer than the model's context window"
    /// The most of a model's own message passed to the device.
    static let maxModelMessage = 500

    public init(status: Int, type: String, message: String, detail: String) {
        self.status = status
        self.type = type
        self.message = message
        self.detail = detail
    }

    /// The cloud refused this service's credentials: the operator's problem, counted and logged
    /// with its workspace (`attestd_upstream_credential_failures_total`).
    public var isCredentialFailure: Bool { message == Self.credentialsRefused }

    /// The answer for a cloud error of `type` (already mapped), with the cloud's own `cloudMessage`.
    public static func generic(status: Int, type: String, service: String, cloudMessage: String?, exception: String? = nil) -> CloudErrorAnswer {
        let detail = [exception, cloudMessage].compactMap { $0 }.joined(separator: ": ")
        if type == "authentication_error" || type == "permission_error" || status == 401 || status == 403 {
            return CloudErrorAnswer(status: 503, type: "api_error", message: credentialsRefused, detail: detail)
        }
        if type == "invalid_request_error", let cloudMessage, mentionsContextOverflow(cloudMessage) {
            return CloudErrorAnswer(status: 400, type: type, message: promptTooLong, detail: detail)
        }
        let message = switch type {
        case "rate_limit_error": "\(service) is limiting this workspace's requests; retry later"
        case "overloaded_error": "\(service) is overloaded right now; retry later"
        case "invalid_request_error": "\(service) refused the request as invalid"
        case "not_found_error": "\(service) does not serve the requested model for this workspace"
        case "request_too_large": "the request is larger than \(service) takes"
        default: "\(service) could not answer the request"
        }
        return CloudErrorAnswer(status: status, type: type, message: message, detail: detail)
    }

    /// A model's failure (Bedrock's `ModelErrorException`, `ModelStreamErrorException`): 502
    /// `api_error` with the cloud's own message, which is about the model's output, not the
    /// account; anything in it that looks like an ARN, an AWS account ID or an access key ID is
    /// taken out all the same.
    public static func modelFailure(service: String, cloudMessage: String?, exception: String? = nil) -> CloudErrorAnswer {
        let detail = [exception, cloudMessage].compactMap { $0 }.joined(separator: ": ")
        var said = withoutAccountNames(cloudMessage ?? "")
        while said.first == " " || said.first == "\n" { said.removeFirst() }
        while said.last == " " || said.last == "\n" { said.removeLast() }
        if said.count > maxModelMessage { said = String(said.prefix(maxModelMessage)) + "…" }
        return CloudErrorAnswer(status: 502, type: "api_error", message: said.isEmpty ? "\(service)'s model failed while answering" : said,
                                detail: detail)
    }

    /// Whether a cloud's validation message is about the input's length (Bedrock: "Input is too
    /// long for requested model."; the API, behind Vertex: "prompt is too long: … tokens > …
    /// maximum", "input length and `max_tokens` exceed context limit: …").
    static func mentionsContextOverflow(_ message: String) -> Bool {
        let lower = message.lowercased()
        return lower.contains("prompt is too long") || lower.contains("input is too long") || lower.contains("context window")
            || lower.contains("context length") || lower.contains("context limit")
    }

    /// `text` with every ARN (`arn:…` up to a blank or a quote), every run of 12 or more digits
    /// (dashes allowed between them: an AWS account ID) and every access key ID (`AKIA`/`ASIA` and
    /// 16 more capitals or digits) replaced by a placeholder.
    public static func withoutAccountNames(_ text: String) -> String {
        let bytes = Array(text.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        func isAlphanumeric(_ byte: UInt8) -> Bool {
            (0x30...0x39).contains(byte) || (0x41...0x5a).contains(byte) || (0x61...0x7a).contains(byte)
        }
        func isDigit(_ byte: UInt8) -> Bool { (0x30...0x39).contains(byte) }
        func endsARN(_ byte: UInt8) -> Bool {
            byte <= 0x20 || byte == 0x22 || byte == 0x27 || byte == 0x60 || byte == 0x2c || byte == 0x3b || byte == 0x28 || byte == 0x29
                || byte == 0x3c || byte == 0x3e || byte == 0x5b || byte == 0x5d || byte == 0x7b || byte == 0x7d
        }
        func startsWithARN(_ at: Int) -> Bool {
            guard at + 4 <= bytes.count else { return false }
            let word = bytes[at..<(at + 4)].map { $0 | 0x20 }
            return word == Array("arn:".utf8)
        }
        func accessKeyLength(_ at: Int) -> Int? {
            guard at + 20 <= bytes.count, bytes[at + 1] == UInt8(ascii: "K") || bytes[at + 1] == UInt8(ascii: "S"),
                  bytes[at] == UInt8(ascii: "A"), bytes[at + 2] == UInt8(ascii: "I"), bytes[at + 3] == UInt8(ascii: "A"),
                  bytes[(at + 4)..<(at + 20)].allSatisfy({ isDigit($0) || (0x41...0x5a).contains($0) }),
                  at + 20 == bytes.count || !isAlphanumeric(bytes[at + 20]) else { return nil }
            return 20
        }
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            let wordStart = index == 0 || !isAlphanumeric(bytes[index - 1])
            if wordStart, startsWithARN(index) {
                var end = index + 4
                while end < bytes.count, !endsARN(bytes[end]) { end += 1 }
                out += Array("[ARN]".utf8)
                index = end
                continue
            }
            if wordStart, let length = accessKeyLength(index) {
                out += Array("[access key]".utf8)
                index += length
                continue
            }
            if isDigit(byte), wordStart || !isDigit(bytes[index - 1]) {
                // A run of digits, with single dashes between them.
                var end = index
                var digits = 0
                while end < bytes.count {
                    if isDigit(bytes[end]) {
                        digits += 1
                        end += 1
                    } else if bytes[end] == UInt8(ascii: "-"), end + 1 < bytes.count, isDigit(bytes[end + 1]) {
                        end += 1
                    } else {
                        break
                    }
                }
                if digits >= 12 {
                    out += Array("[account]".utf8)
                } else {
                    out += bytes[index..<end]
                }
                index = end
                continue
            }
            out.append(byte)
            index += 1
        }
        return String(decoding: out, as: UTF8.self)
    }
}
