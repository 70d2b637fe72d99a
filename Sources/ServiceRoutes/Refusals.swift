import AttestWire
import HTTPServer

extension ServiceRouter {
    /// Whether `path` answers in the Messages API's error envelope: the relayed routes, and every
    /// other /v1/ path that is not the device exchange's or introspection (another API, where an
    /// app's token is refused in that API's shape).
    static func speaksMessagesAPI(_ path: String) -> Bool {
        MessagesRelay.relayedPaths.contains(path) || (path.hasPrefix("/v1/") && routes[path] == nil)
    }

    /// A malformed request refused in its route's own shape. The device exchange, introspection
    /// and the probes say `{"error":"invalid_request"}` and nothing more (the status tells what
    /// is wrong); the Messages API's paths answer in its envelope, `request_too_large` for 413
    /// and `invalid_request_error` otherwise. The HTTP server's own refusals (400, 413, 414, 431,
    /// 501: `HTTPServerConfiguration.refusalResponse`) are made here too, so a client never sees
    /// a shape its route does not speak.
    public static func refusal(_ status: Int, path: String, requestID: String? = nil) -> HTTPResponse {
        guard speaksMessagesAPI(path) else { return .json(status, OAuthErrorResponse(.invalidRequest).json) }
        let message = switch status {
        case 405: "this path takes POST"
        case 415: "the request body must be application/json"
        default: HTTPResponse.refusalText(status)
        }
        return .json(status, APIErrorResponse(type: status == 413 ? "request_too_large" : "invalid_request_error",
                                              message: message, requestID: requestID).json)
    }
}
