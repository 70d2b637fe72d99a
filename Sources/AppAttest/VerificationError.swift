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
    /// The receipt is not a SignedData of Apple's shape, or its payload is unreadable.
    case receiptMalformed
    /// The receipt's signature does not verify, or its signer does not chain to the pinned root at the time.
    case receiptSignature
    /// The receipt is for another App ID, key, client hash, type or environment.
    case receiptMismatch
    /// The receipt was not created within five minutes of now, or has expired.
    case receiptStale
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
