import AppAttest

/// Why the service refused a device request. The reason is exact (for logs, metrics and the
/// audit trail); what the device is told is only the category (`invalid_grant`, …).
public struct Rejection: Error, Sendable, CustomStringConvertible {
    public enum Kind: Sendable {
        /// 400 invalid_request: the body is malformed or a field is missing.
        case invalidRequest
        /// 401 invalid_client: unknown or revoked client ID.
        case invalidClient
        /// 401 invalid_grant: everything about the key, challenge or proof.
        case invalidGrant
        /// 429 with Retry-After.
        case rateLimited(retryAfter: Int)
    }

    public let kind: Kind
    /// A stable camelCase name: a VerificationReason or one of the service's own reasons below.
    public let reason: String
    public let detail: String

    public init(_ kind: Kind, _ reason: String, _ detail: String) {
        self.kind = kind
        self.reason = reason
        self.detail = detail
    }

    public var description: String { "\(reason): \(detail)" }

    static func request(_ detail: String) -> Rejection { Rejection(.invalidRequest, "invalidRequest", detail) }
    static func verification(_ error: VerificationError) -> Rejection { Rejection(.invalidGrant, error.reason.rawValue, error.detail) }
}

/// The service's own rejection reasons (verification reasons come from `VerificationReason`).
public enum ServiceReason {
    public static let unknownClient = "unknownClient"
    public static let clientRevoked = "clientRevoked"
    public static let noPendingChallenge = "noPendingChallenge"
    public static let keyAlreadyRegistered = "keyAlreadyRegistered"
    public static let unknownKey = "unknownKey"
    public static let counterRaced = "counterRaced"
    public static let mintLimit = "mintLimit"
    public static let registrationQuota = "registrationQuota"
    public static let challengeLimit = "challengeLimit"
    public static let unsupportedGrantType = "unsupportedGrantType"
}
