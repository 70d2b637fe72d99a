import Foundation

/// Why `AppAttestClient` could not produce a token.
public enum AttestClientError: Error {
    /// This device can never attest (`DCAppAttestService.isSupported` is false: simulators, older
    /// hardware, most Macs). Fall back to another way of authenticating.
    case attestationUnsupported
    /// No credential this time. `underlying` is the cause: the attester's error, or a
    /// `serverError` when the server rejected the attestation, the assertion or the client ID
    /// (401 `invalid_client` means the client ID is unknown or revoked, which only its owner can fix).
    case attestationFailed(underlying: Error?)
    /// The attester no longer holds the registered key (for example after a restore onto another
    /// device) and the client may not replace it yet (at most once per 10 minutes).
    /// A `DeviceAttester` also throws this from `generateAssertion` when it does not know the key.
    case missingCredential
    /// The host answered 404: the App Attest endpoints are not deployed at this base URL.
    case endpointsNotDeployed
    /// The server's answer was not usable (malformed JSON, missing or invalid fields).
    case invalidResponse(String)
    /// The server rate-limited this device; nothing is sent again before `retryAfter` seconds.
    case rateLimited(retryAfter: TimeInterval)
    /// A registration failed recently (`lastError`); the client does not attest again for
    /// `retryAfter` seconds.
    case backingOff(retryAfter: TimeInterval, lastError: Error)
    /// The server answered with an unexpected status; `code` is its `error` field, if any.
    case serverError(status: Int, code: String?)
    /// The request did not complete (offline, DNS, TLS, timeout).
    case network(underlying: Error)
    /// The credential store could not read or persist the key ID. After a registration the
    /// client keeps the key and token in memory, so later calls in this process succeed.
    case storeFailed(underlying: Error)
}
