import Foundation

/// The device's App Attest service, shaped like `DCAppAttestService` so tests and simulators
/// can substitute their own.
public protocol DeviceAttester: Sendable {
    var isSupported: Bool { get }
    /// Creates a key pair and returns its key ID: standard base64 of the 32-byte ID.
    func generateKey() async throws -> String
    /// The CBOR attestation object for `keyID` over `clientDataHash`.
    func attestKey(_ keyID: String, clientDataHash: Data) async throws -> Data
    /// The CBOR assertion for `keyID` over `clientDataHash`. Throws
    /// `AttestClientError.missingCredential` if the key is unknown, so the client re-attests.
    func generateAssertion(_ keyID: String, clientDataHash: Data) async throws -> Data
}

#if canImport(DeviceCheck)
import DeviceCheck

/// `DeviceAttester` backed by `DCAppAttestService.shared`.
@available(iOS 14.0, macOS 11.0, tvOS 15.0, watchOS 9.0, *)
public struct DeviceCheckAttester: DeviceAttester {
    public init() {}

    public var isSupported: Bool { DCAppAttestService.shared.isSupported }

    public func generateKey() async throws -> String {
        try await DCAppAttestService.shared.generateKey()
    }

    public func attestKey(_ keyID: String, clientDataHash: Data) async throws -> Data {
        try await DCAppAttestService.shared.attestKey(keyID, clientDataHash: clientDataHash)
    }

    public func generateAssertion(_ keyID: String, clientDataHash: Data) async throws -> Data {
        do {
            return try await DCAppAttestService.shared.generateAssertion(keyID, clientDataHash: clientDataHash)
        } catch let error as DCError where error.code == .invalidKey {
            // The key is gone (reinstall, restore to another device): the client must re-attest.
            throw AttestClientError.missingCredential
        }
    }
}
#endif
