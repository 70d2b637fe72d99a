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
/// one with a live token goes on with its caller in the context.
///
/// With `nonBlocking` checks (PostgreSQL), a request on an event loop suspends while its query
/// runs on the loop's own connection, and goes on when the answer comes back to the loop:
/// nothing waits on the database there. Otherwise the check reads the store where the route
/// runs (SQLite on the loop: a local read).
public struct BearerTokenAuthentication: SuspendingMiddleware {
    let service: DeviceTokenService
    let markBeforeCheck: @Sendable () -> Int
    let nonBlocking: (any NonBlockingTokenChecks)?
    let needsWorker: @Sendable (TokenGrant) -> Bool

    /// - Parameters:
    ///   - markBeforeCheck: read just before the token's query (the relay's ledger takes its
    ///     commit count there, so usage flushed during the query is counted, never missed).
    ///   - nonBlocking: the token check without a blocking read, when the store has one.
    ///   - needsWorker: after a non-blocking check, whether what follows for this grant reads the
    ///     database (a profile's limits): the rest runs on a worker then.
    public init(service: DeviceTokenService, markBeforeCheck: @escaping @Sendable () -> Int = { 0 },
                nonBlocking: (any NonBlockingTokenChecks)? = nil, needsWorker: @escaping @Sendable (TokenGrant) -> Bool = { _ in false }) {
        self.service = service
        self.markBeforeCheck = markBeforeCheck
        self.nonBlocking = nonBlocking
        self.needsWorker = needsWorker
    }

    public func respond(to context: RequestContext, next: (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome? {
        let time = service.now()
        let mark = markBeforeCheck()
        guard let token = Self.presentedToken(context), let grant = try service.authenticate(bearer: token, at: time) else {
            return Self.refusal(context)
        }
        var context = context
        context[AppToken.self] = AppTokenCaller(grant: grant, checkedAt: time, markBeforeCheck: mark)
        return try next(context)
    }

    /// Only with non-blocking checks (SQLite's reads stay on the loop, and do not suspend).
    public var maySuspend: Bool { nonBlocking != nil }

    public func suspend(_ context: RequestContext, resume: @escaping @Sendable (Resumption) -> Void) -> Bool {
        // A token that cannot be live is refused by `respond` without a query.
        guard let nonBlocking, let token = Self.presentedToken(context), let hash = service.tokenHash(bearer: token) else { return false }
        let needsWorker = self.needsWorker
        return nonBlocking.check(hash: hash, markBeforeCheck: markBeforeCheck) { result in
            switch result {
            case .failure(let error):
                resume(.failed(error))
            case .success(let check):
                guard let grant = check.grant else {
                    resume(.answer(Self.refusal(context)))
                    return
                }
                var context = context
                context[AppToken.self] = AppTokenCaller(grant: grant, checkedAt: check.checkedAt, markBeforeCheck: check.markBeforeCheck)
                resume(needsWorker(grant) ? .proceedOnWorker(context) : .proceed(context))
            }
        }
    }

    static func presentedToken(_ context: RequestContext) -> String? {
        guard let token = RequestParsing.bearer(context.request.header("authorization")), token.utf8.count <= FieldLimits.token else { return nil }
        return token
    }

    static func refusal(_ context: RequestContext) -> RouteOutcome {
        RouteOutcome(MessagesAPIError.unauthenticated(context.requestID), reason: RejectionReason.tokenRejected.rawValue)
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
