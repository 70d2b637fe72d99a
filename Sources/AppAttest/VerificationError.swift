/// Why App Attest verification refused an input: one case per verification step, so that logs,
/// metrics and the audit trail can count exactly which step failed.
public enum VerificationReason: String, Sendable, CaseIterable {
    case malformed
    case unsupportedFormat
    case certificateChainInvalid
    case certificateNotValidAtTime
    case nonceMismatch
    case keyIDMismatch
    case rpIDMismatch
    case counterNotZero
    case unknownAAGUID
    case environmentNotAllowed
    case credentialIDMismatch
    case signatureInvalid
    case counterNotIncreasing
    /// A Mac whose aclBlob is not Apple's value (SIP or Full Security off, or no aclBlob).
    case macSecurityPosture
}

/// A rejection: the step that failed and a human-readable detail for operators (never sent to devices).
public struct VerificationError: Error, Equatable, CustomStringConvertible, Sendable {
    public let reason: VerificationReason
    public let detail: String

    public init(_ reason: VerificationReason, _ detail: String) {
        self.reason = reason
        self.detail = detail
    }

    public var description: String { "\(reason.rawValue): \(detail)" }
}
