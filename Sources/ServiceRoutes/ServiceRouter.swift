import AttestWire
import AttestCrypto
import Foundation
import HTTPServer
import TokenService

/// Maps HTTP to the token service and back. Each route decodes, calls one service method and
/// encodes; errors to the network are opaque, the exact reason goes to the log and metrics.
public final class ServiceRouter: Sendable {
    let service: DeviceTokenService
    let logger: Logger
    let metrics: Metrics
    /// SHA-256 of the introspection key; the key itself is never kept.
    let introspectionKeyHash: [UInt8]?

    public init(service: DeviceTokenService, logger: Logger, introspectionKey: String? = nil) {
        self.service = service
        self.logger = logger
        self.metrics = service.metrics
        introspectionKeyHash = introspectionKey.map { sha256(Array($0.utf8)) }
        metrics.describe("attestd_http_requests_total", "HTTP requests, by route and status.")
    }

    /// What a route produced, plus what the access log should say about it.
    struct Outcome {
        var response: HTTPResponse
        var clientID: String? = nil
        var reason: String? = nil
    }

    public func handle(_ request: HTTPRequest) -> HTTPResponse {
        let start = DispatchTime.now().uptimeNanoseconds
        let route = Self.routeName(request.path)
        var outcome: Outcome
        do {
            outcome = try dispatch(request, route: route)
        } catch {
            // Store failures and the like: logged in full, answered with a bare 500.
            logger.error("internal_error", [("route", route), ("error", String(describing: error))])
            outcome = Outcome(response: .json(500, #"{"error":"server_error"}"#), reason: "internalError")
        }
        let milliseconds = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6
        metrics.increment("attestd_http_requests_total", labels: [("route", route), ("status", String(outcome.response.status))])
        var fields: [(String, Any)] = [("method", String(request.method.prefix(16))), ("route", route),
                                       ("status", outcome.response.status), ("ms", Double(Int(milliseconds * 100)) / 100),
                                       ("remote", request.remoteAddress)]
        if let clientID = outcome.clientID { fields.append(("client_id", String(clientID.prefix(64)))) }
        if let reason = outcome.reason { fields.append(("reason", reason)) }
        logger.info("request", fields)
        return outcome.response
    }

    /// A bounded set of route labels for metrics (never the raw path, which a caller controls).
    static func routeName(_ path: String) -> String {
        switch path {
        case "/v1/oauth/app-attest/challenge", "/v1/oauth/app-attest/register", "/v1/oauth/token", "/v1/oauth/introspect",
             "/v1/messages", "/healthz", "/metrics":
            return path
        default:
            return path.hasPrefix("/v1/") ? "/v1/other" : "other"
        }
    }

    /// The endpoint label the service uses for the same route in `attestd_rejections_total`.
    static func endpointName(_ path: String) -> String {
        switch path {
        case "/v1/oauth/app-attest/challenge": return "challenge"
        case "/v1/oauth/app-attest/register": return "register"
        default: return "token"
        }
    }

    func dispatch(_ request: HTTPRequest, route: String) throws -> Outcome {
        switch (route, request.method) {
        case ("/v1/oauth/app-attest/challenge", "POST"): return try exchange(request) { try challenge($0) }
        case ("/v1/oauth/app-attest/register", "POST"): return try exchange(request) { try register($0) }
        case ("/v1/oauth/token", "POST"): return try exchange(request) { try token($0) }
        case ("/v1/oauth/introspect", "POST"): return try introspect(request)
        case ("/v1/messages", _): return try messages(request)
        case ("/healthz", "GET"): return Outcome(response: .json(200, #"{"status":"ok"}"#))
        case ("/metrics", "GET"):
            return Outcome(response: HTTPResponse(status: 200, headers: [("content-type", "text/plain; version=0.0.4")],
                                                  body: Array(metrics.prometheusText().utf8)))
        case ("/v1/other", _): return try otherAPI(request)
        case ("other", _): return Outcome(response: .json(404, #"{"error":"not_found"}"#))
        default:
            return Outcome(response: .json(405, #"{"error":"invalid_request"}"#, headers: [("allow", route.hasPrefix("/v1/oauth") ? "POST" : "GET")]),
                           reason: "methodNotAllowed")
        }
    }

    // MARK: Device token exchange

    /// Runs one exchange endpoint: malformed input → 400, service rejections → their opaque shape.
    func exchange(_ request: HTTPRequest, _ body: (HTTPRequest) throws -> Outcome) throws -> Outcome {
        do {
            return try body(request)
        } catch let bad as BadRequest {
            if !bad.counted {
                metrics.increment("attestd_rejections_total", labels: [("endpoint", Self.endpointName(request.path)), ("reason", "invalidRequest")])
            }
            return Outcome(response: .json(400, #"{"error":"invalid_request"}"#), reason: "invalidRequest: \(bad.detail)")
        } catch let rejection as Rejection {
            let response: HTTPResponse
            switch rejection.kind {
            case .invalidRequest: response = .json(400, #"{"error":"invalid_request"}"#)
            case .invalidClient: response = .json(401, #"{"error":"invalid_client"}"#)
            case .invalidGrant: response = .json(401, #"{"error":"invalid_grant"}"#)
            case .rateLimited(let retryAfter):
                response = .json(429, #"{"error":"rate_limit_error"}"#, headers: [("retry-after", String(retryAfter))])
            }
            return Outcome(response: response, reason: rejection.reason)
        }
    }

    func challenge(_ request: HTTPRequest) throws -> Outcome {
        let fields = try RequestParsing.jsonFields(request.body, [("client_id", FieldLimits.clientID), ("key_id", FieldLimits.keyID)])
        let clientID = fields["client_id"]!
        let keyID = try RequestParsing.requireBase64(fields, "key_id")
        do {
            let issued = try service.challenge(clientID: clientID, keyID: keyID, caller: request.remoteAddress)
            let body = JSONText.object([("challenge", Base64.encode(issued.challenge)), ("expires_in", issued.expiresIn)])
            return Outcome(response: .json(200, body, headers: [("cache-control", "no-store")]), clientID: clientID)
        }
    }

    func register(_ request: HTTPRequest) throws -> Outcome {
        let fields = try RequestParsing.jsonFields(request.body, [("client_id", FieldLimits.clientID), ("key_id", FieldLimits.keyID),
                                                                  ("attestation_object", FieldLimits.attestationObject)])
        let clientID = fields["client_id"]!
        let keyID = try RequestParsing.requireBase64(fields, "key_id")
        guard let object = RequestParsing.base64(fields["attestation_object"]!) else {
            throw attempt(clientID, keyID, "register", BadRequest("attestation_object is not base64"))
        }
        let response = try service.register(clientID: clientID, keyID: keyID, attestationObject: object)
        return Outcome(response: tokenResponse(response), clientID: clientID)
    }

    func token(_ request: HTTPRequest) throws -> Outcome {
        let fields = try RequestParsing.formFields(request.body)
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
        let response = try service.refresh(clientID: clientID, keyID: keyID, assertion: assertion)
        return Outcome(response: tokenResponse(response), clientID: clientID)
    }

    /// Records a malformed attempt against its challenge and returns the error to throw.
    func attempt(_ clientID: String, _ keyID: [UInt8], _ action: String, _ error: BadRequest) -> BadRequest {
        service.rejectMalformedAttempt(clientID: clientID, keyID: keyID, action: action, detail: error.detail)
        return BadRequest(error.detail, counted: true)
    }

    func tokenResponse(_ response: IssuedToken) -> HTTPResponse {
        let body = JSONText.object([
            ("access_token", response.accessToken), ("token_type", "Bearer"), ("expires_in", response.expiresIn),
            ("next_challenge", Base64.encode(response.nextChallenge)),
            ("next_challenge_expires_in", response.nextChallengeExpiresIn),
        ])
        return .json(200, body, headers: [("cache-control", "no-store"), ("pragma", "no-cache")])
    }

    // MARK: Using tokens

    static func apiError(_ status: Int, _ type: String, _ message: String) -> HTTPResponse {
        .json(status, JSONText.object([("type", "error"), ("error", [("type", type), ("message", message)] as [(String, Any)])]))
    }

    static let unauthenticated = apiError(401, "authentication_error", "invalid, expired or revoked access token")

    /// The grant for the request's bearer token; nil when it must be answered with `unauthenticated`.
    func authenticated(_ request: HTTPRequest) throws -> TokenGrant? {
        guard let token = RequestParsing.bearer(request.header("authorization")), token.utf8.count <= FieldLimits.token else { return nil }
        return try service.authenticate(bearer: token)
    }

    func messages(_ request: HTTPRequest) throws -> Outcome {
        guard let grant = try authenticated(request) else { return Outcome(response: Self.unauthenticated, reason: "tokenRejected") }
        guard request.method == "POST" else {
            return Outcome(response: Self.apiError(405, "invalid_request_error", "use POST"), clientID: grant.clientID)
        }
        return Outcome(response: Self.apiError(503, "api_error", "no upstream Messages API is configured on this service"),
                       clientID: grant.clientID, reason: "noUpstream")
    }

    func otherAPI(_ request: HTTPRequest) throws -> Outcome {
        guard let grant = try authenticated(request) else { return Outcome(response: Self.unauthenticated, reason: "tokenRejected") }
        return Outcome(response: Self.apiError(403, "permission_error", "this access token authorizes the Messages API only"),
                       clientID: grant.clientID, reason: "outOfScope")
    }

    // MARK: Introspection (RFC 7662)

    func introspect(_ request: HTTPRequest) throws -> Outcome {
        guard let expected = introspectionKeyHash, let presented = RequestParsing.bearer(request.header("authorization")),
              constantTimeEquals(sha256(Array(presented.utf8)), expected) else {
            return Outcome(response: .json(401, #"{"error":"invalid_client"}"#, headers: [("www-authenticate", "Bearer")]),
                           reason: "introspectionUnauthorized")
        }
        let fields: [String: String]
        do { fields = try RequestParsing.formFields(request.body) } catch {
            return Outcome(response: .json(400, #"{"error":"invalid_request"}"#), reason: "invalidRequest")
        }
        guard let token = fields["token"] else { return Outcome(response: .json(400, #"{"error":"invalid_request"}"#), reason: "invalidRequest") }
        guard token.utf8.count <= FieldLimits.token, let grant = try service.authenticate(bearer: token) else {
            return Outcome(response: .json(200, #"{"active":false}"#, headers: [("cache-control", "no-store")]))
        }
        let body = JSONText.object([
            ("active", true), ("scope", "messages"), ("client_id", grant.clientID), ("workspace", grant.workspaceName),
            ("exp", Int(grant.expiresAt.timeIntervalSince1970)), ("iat", Int(grant.issuedAt.timeIntervalSince1970)), ("token_type", "Bearer"),
        ])
        return Outcome(response: .json(200, body, headers: [("cache-control", "no-store")]), clientID: grant.clientID)
    }
}
