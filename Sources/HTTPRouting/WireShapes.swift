import AttestWire
import HTTPServer

/// The two error shapes of the wire protocol (PROTOCOL.md).
extension ErrorShape {
    /// The device exchange, introspection and the probes: `{"error":"invalid_request"}` and
    /// nothing more (the status says what is wrong), `server_error` when the service fails.
    public static let oauth = ErrorShape(
        name: "oauth",
        refusal: { status, _ in .json(status, OAuthErrorResponse(.invalidRequest).json) },
        overloaded: { _ in .json(503, OAuthErrorResponse(.serverError).json, headers: [("retry-after", "1")]) },
        unavailable: { _ in .json(503, OAuthErrorResponse(.serverError).json, headers: [("retry-after", "1")]) },
        failed: { _ in .json(500, OAuthErrorResponse(.serverError).json) })

    /// The Messages API's envelope, with the request ID: `request_too_large` for 413,
    /// `invalid_request_error` for the other refusals, `overloaded_error` (529) when the body
    /// budget is spent, so clients back off.
    public static let messagesAPI = ErrorShape(
        name: "messages_api",
        refusal: { status, requestID in
            let message = switch status {
            case 405: "this path takes POST"
            case 415: "the request body must be application/json"
            default: HTTPResponse.refusalText(status)
            }
            return .json(status, APIErrorResponse(type: status == 413 ? "request_too_large" : "invalid_request_error",
                                                  message: message, requestID: requestID).json)
        },
        overloaded: { requestID in
            .json(529, APIErrorResponse(type: "overloaded_error", message: "the service is overloaded; retry shortly", requestID: requestID).json,
                  headers: [("retry-after", "1")])
        },
        unavailable: { requestID in
            .json(503, APIErrorResponse(type: "api_error", message: "the service is temporarily unavailable", requestID: requestID).json,
                  headers: [("retry-after", "1")])
        },
        failed: { requestID in .json(500, APIErrorResponse(type: "api_error", message: "internal error", requestID: requestID).json) })
}
