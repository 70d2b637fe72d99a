import AppAttest

/// Every reason the service refuses a request, in one enum: the verification steps of App Attest,
/// then the service's own. The reason is exact (logs, metrics, the audit trail); what the caller is
/// told is only the category (`invalid_grant`, …).
public enum RejectionReason: String, Sendable, CaseIterable {
    // App Attest verification (one per step; see `VerificationReason`).
    case malformed, unsupportedFormat, certificateChainInvalid, certificateNotValidAtTime, nonceMismatch, keyIDMismatch
    case rpIDMismatch, counterNotZero, unknownAAGUID, environmentNotAllowed, credentialIDMismatch, signatureInvalid
    case counterNotIncreasing, macSecurityPosture, receiptMalformed, receiptSignature, receiptMismatch, receiptStale
    // The integration's device policy (where the build came from, its version, the platform).
    case distributionNotAllowed, bundleVersionTooOld, extensionsMissing, platformNotAllowed, categoryChanged
    // Apple's fraud-risk metric for the device is above the integration's limit.
    case riskMetricTooHigh
    // The device exchange.
    case invalidRequest
    case unknownClient, clientRevoked
    case noPendingChallenge, keyAlreadyRegistered, unknownKey, counterRaced
    case mintLimit, registrationQuota, challengeLimit, registrationAddressLimit
    // Bearer tokens and the other routes.
    case tokenRejected, outOfScope, noUpstream, methodNotAllowed, introspectionUnauthorized
    // The Messages relay: the integration's policy (the exact `PolicyRefusal` is the detail).
    case policyRefused
    // A workspace on a cloud upstream: the request's model has no mapping there (or it asks for
    // what the cloud does not take).
    case unmappedModel
    case storeUnavailable, internalError

    /// The verification cases are spelled the same here (`everyVerificationReasonHasARejectionReason`
    /// pins it); a case added to one and not the other falls back to `malformed` instead of trapping.
    public init(_ verification: VerificationReason) {
        self = RejectionReason(rawValue: verification.rawValue) ?? .malformed
    }
}

/// Why the service refused a device request: the exact reason, a detail for operators, and the
/// category the caller is told.
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
    public let reason: RejectionReason
    public let detail: String

    public init(_ kind: Kind, _ reason: RejectionReason, _ detail: String) {
        self.kind = kind
        self.reason = reason
        self.detail = detail
    }

    public var description: String { "\(reason.rawValue): \(detail)" }

    public static func request(_ detail: String) -> Rejection { Rejection(.invalidRequest, .invalidRequest, detail) }
    static func verification(_ error: VerificationError) -> Rejection { Rejection(.invalidGrant, RejectionReason(error.reason), error.detail) }
}
