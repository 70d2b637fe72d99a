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
    /// The wording the Messages API uses for a context overflow, which clients map to their own error.
    public static let promptTooLong = "prompt is too long: the input is longer than the model's context window"

    public init(status: Int, type: String, message: String, detail: String) {
        self.status = status
        self.type = type
        self.message = message
        self.detail = detail
    }

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

    /// Whether a cloud's validation message is about the input's length (Bedrock: "Input is too
    /// long for requested model.", "prompt is too long"; Vertex: the API's own wording).
    static func mentionsContextOverflow(_ message: String) -> Bool {
        let lower = message.lowercased()
        return lower.contains("too long") || lower.contains("context window") || lower.contains("context length")
    }
}
