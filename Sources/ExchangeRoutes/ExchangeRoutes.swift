import AttestWire
import HTTPRouting
import HTTPServer
import TokenService

/// The device token exchange (PROTOCOL.md): challenge, register, token. Each handler decodes,
/// calls one service method and encodes; rejections leave in the protocol's opaque shape, their
/// exact reason in the outcome (for the log, the metrics and the audit trail). They run on the
/// exchange workers: an attestation costs milliseconds of CPU and a registration waits for the
/// database's fsync, which on a loop would hold up every other connection of that loop.
public struct ExchangeRoutes: Sendable {
    let service: DeviceTokenService
    let callers: CallerResolver

    public init(service: DeviceTokenService, callers: CallerResolver) {
        self.service = service
        self.callers = callers
    }

    public var routes: [Route] {
        let json = "application/json", form = "application/x-www-form-urlencoded"
        return [
            Route(["POST"], WireProtocol.challengePath, contentType: json, executor: .worker, shape: .oauth, endpoint: "challenge",
                  handler: .answer { context in try exchange { try challenge(context) } }),
            // Answered once their commit is in (SQLite's writer answers them), so a worker is not
            // held while its exchange waits for the batch.
            Route(["POST"], WireProtocol.registerPath, contentType: json, executor: .worker, shape: .oauth, endpoint: "register",
                  handler: .later { context, answer in exchange(answer) { try register(context, $0) } }),
            Route(["POST"], WireProtocol.tokenPath, contentType: form, executor: .worker, shape: .oauth, endpoint: "token",
                  handler: .later { context, answer in exchange(answer) { try token(context, $0) } }),
        ]
    }

    /// Runs one exchange endpoint: malformed input → 400, service rejections → their opaque shape.
    func exchange(_ body: () throws -> RouteOutcome) throws -> RouteOutcome {
        do {
            return try body()
        } catch {
            guard let outcome = Self.refusal(error) else { throw error }
            return outcome
        }
    }

    /// As `exchange`, for an endpoint that answers later: `body` decodes and starts the service
    /// call, which hands its result to the closure `body` is given.
    func exchange(_ answer: @escaping @Sendable (Result<RouteOutcome, any Error>) -> Void,
                  _ body: (@escaping @Sendable (Result<RouteOutcome, any Error>) -> Void) throws -> Void) {
        let refusing: @Sendable (Result<RouteOutcome, any Error>) -> Void = { result in
            if case .failure(let error) = result, let outcome = Self.refusal(error) { return answer(.success(outcome)) }
            answer(result)
        }
        do { try body(refusing) } catch { refusing(.failure(error)) }
    }

    /// The answer to malformed input (400) or a service rejection (its opaque shape); nil for any other error.
    static func refusal(_ error: any Error) -> RouteOutcome? {
        if let bad = error as? BadRequest {
            return RouteOutcome(.json(400, OAuthErrorResponse(.invalidRequest).json), reason: RejectionReason.invalidRequest.rawValue, detail: bad.detail)
        }
        guard let rejection = error as? Rejection else { return nil }
        let response: HTTPResponse
        switch rejection.kind {
        case .invalidRequest: response = .json(400, OAuthErrorResponse(.invalidRequest).json)
        case .invalidClient: response = .json(401, OAuthErrorResponse(.invalidClient).json)
        case .invalidGrant: response = .json(401, OAuthErrorResponse(.invalidGrant).json)
        case .rateLimited(let retryAfter):
            response = .json(429, OAuthErrorResponse(.rateLimited).json, headers: [("retry-after", String(retryAfter))])
        }
        return RouteOutcome(response, reason: rejection.reason.rawValue, detail: rejection.detail)
    }

    func challenge(_ context: RequestContext) throws -> RouteOutcome {
        let request = context.request
        let fields = try RequestParsing.jsonFields(request.body, [("client_id", FieldLimits.clientID), ("key_id", FieldLimits.keyID)])
        let clientID = fields["client_id"]!
        let keyID = try RequestParsing.requireBase64(fields, "key_id")
        let caller = callers.limitKey(peer: request.remoteAddress, headers: request.headers)
        let issued = try service.challenge(clientID: clientID, keyID: keyID, caller: caller)
        let body = JSONText.object([("challenge", Base64.encode(issued.challenge)), ("expires_in", issued.expiresIn)])
        return RouteOutcome(.json(200, body, headers: [("cache-control", "no-store")]), clientID: clientID)
    }

    func register(_ context: RequestContext, _ answer: @escaping @Sendable (Result<RouteOutcome, any Error>) -> Void) throws {
        let fields = try RequestParsing.jsonFields(context.request.body, [("client_id", FieldLimits.clientID), ("key_id", FieldLimits.keyID),
                                                                          ("attestation_object", FieldLimits.attestationObject)])
        let clientID = fields["client_id"]!
        let keyID = try RequestParsing.requireBase64(fields, "key_id")
        guard let object = RequestParsing.base64(fields["attestation_object"]!) else {
            throw attempt(clientID, keyID, "register", BadRequest("attestation_object is not base64"))
        }
        let caller = callers.limitKey(peer: context.request.remoteAddress, headers: context.request.headers)
        service.register(clientID: clientID, keyID: keyID, attestationObject: object, caller: caller) { result in
            answer(result.map { RouteOutcome(Self.tokenResponse($0), clientID: clientID) })
        }
    }

    func token(_ context: RequestContext, _ answer: @escaping @Sendable (Result<RouteOutcome, any Error>) -> Void) throws {
        let fields = try RequestParsing.formFields(context.request.body)
        guard let clientID = fields["client_id"], clientID.utf8.count <= FieldLimits.clientID else { throw BadRequest("missing or long client_id") }
        guard let keyText = fields["key_id"], keyText.utf8.count <= FieldLimits.keyID else { throw BadRequest("missing or long key_id") }
        guard let keyID = RequestParsing.base64(keyText) else { throw BadRequest("key_id is not base64") }
        // From here on the request names a challenge: a malformed proof still uses it up.
        guard fields["grant_type"] == WireProtocol.grantType else {
            throw attempt(clientID, keyID, "token", BadRequest("grant_type is not \(WireProtocol.grantType)"))
        }
        guard let assertionText = fields["assertion"], assertionText.utf8.count <= FieldLimits.assertion,
              let assertion = RequestParsing.base64(assertionText) else {
            throw attempt(clientID, keyID, "token", BadRequest("assertion is missing, too long or not base64"))
        }
        service.refresh(clientID: clientID, keyID: keyID, assertion: assertion) { result in
            answer(result.map { RouteOutcome(Self.tokenResponse($0), clientID: clientID) })
        }
    }

    /// Records a malformed attempt against its challenge and returns the error to throw.
    func attempt(_ clientID: String, _ keyID: [UInt8], _ action: String, _ error: BadRequest) -> BadRequest {
        service.rejectMalformedAttempt(clientID: clientID, keyID: keyID, action: action, detail: error.detail)
        return error
    }

    static func tokenResponse(_ response: IssuedToken) -> HTTPResponse {
        let body = JSONText.object([
            ("access_token", response.accessToken), ("token_type", "Bearer"), ("expires_in", response.expiresIn),
            ("next_challenge", Base64.encode(response.nextChallenge)),
            ("next_challenge_expires_in", response.nextChallengeExpiresIn),
        ])
        return .json(200, body, headers: [("cache-control", "no-store"), ("pragma", "no-cache")])
    }
}
