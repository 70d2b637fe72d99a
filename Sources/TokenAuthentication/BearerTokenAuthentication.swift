import AttestWire
import Foundation
import HTTPRouting
import HTTPServer
import TokenService

/// Who is calling with an app token, as `BearerTokenAuthentication` found it.
public struct AppTokenCaller: Sendable {
    public let grant: TokenGrant
    /// The time the token was checked at (the policy judges the request at the same time).
    public let checkedAt: Date
    /// What `markBeforeCheck` said just before the token's query (the usage ledger's commit count).
    public let markBeforeCheck: Int
}

/// The context key of an app token's caller.
public enum AppToken: ContextKey {
    public typealias Value = AppTokenCaller
    /// The paths an app token authorizes: the Messages API, and nothing else.
    public static let scope: Set<String> = [WireProtocol.messagesPath, WireProtocol.countTokensPath]
}

/// The app token check, as middleware on the routes that take one (the relay, the token check
/// for a proxy): a request without a live token is answered 401 in the Messages API's shape;
/// one with a live token goes on with its caller in the context. It reads the database, so it
/// runs where its routes run (on a worker when reads cross the network).
public struct BearerTokenAuthentication: Middleware {
    let service: DeviceTokenService
    let markBeforeCheck: @Sendable () -> Int

    /// - Parameter markBeforeCheck: read just before the token's query (the relay's ledger takes
    ///   its commit count there, so usage flushed during the query is counted, never missed).
    public init(service: DeviceTokenService, markBeforeCheck: @escaping @Sendable () -> Int = { 0 }) {
        self.service = service
        self.markBeforeCheck = markBeforeCheck
    }

    public func respond(to context: RequestContext, next: (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome? {
        let time = service.now()
        let mark = markBeforeCheck()
        guard let token = RequestParsing.bearer(context.request.header("authorization")), token.utf8.count <= FieldLimits.token,
              let grant = try service.authenticate(bearer: token, at: time) else {
            return RouteOutcome(MessagesAPIError.unauthenticated(context.requestID), reason: RejectionReason.tokenRejected.rawValue)
        }
        var context = context
        context[AppToken.self] = AppTokenCaller(grant: grant, checkedAt: time, markBeforeCheck: mark)
        return try next(context)
    }
}

/// Answers in the Messages API's error envelope, with the request ID as the real API gives it.
public enum MessagesAPIError {
    public static func response(_ status: Int, _ type: String, _ message: String, requestID: String) -> HTTPResponse {
        .json(status, APIErrorResponse(type: type, message: message, requestID: requestID).json)
    }

    public static func unauthenticated(_ requestID: String) -> HTTPResponse {
        response(401, "authentication_error", "invalid, expired or revoked access token", requestID: requestID)
    }

    /// A live token asking for something besides the Messages API.
    public static func outOfScope(_ requestID: String) -> HTTPResponse {
        response(403, "permission_error", "this access token authorizes the Messages API only", requestID: requestID)
    }
}
