import AttestWire
import AttestCrypto
import CBOR
import Foundation

/// What the device's authenticator data says about the build, beyond the key: where it came from
/// and its version. Apple-signed (the attestation's nonce and the assertion's signature cover
/// it), so as trustworthy as the key itself.
public struct AttestedApp: Sendable, Equatable {
    /// The flags byte as the device wrote it (reported only: framing never depends on it).
    public let flags: UInt8
    /// Nil when the device wrote no extension map (iOS 26 and earlier).
    public let extensions: AuthenticatorExtensions?

    public var validationCategory: UInt32? { extensions?.validationCategory }
    public var distribution: Distribution? { extensions?.distribution }
    public var bundleVersion: String? { extensions?.bundleVersion }
    /// `macos` when the map carries the code-directory hash, which Apple writes on Macs only;
    /// `ios` otherwise (iPhone, iPad, and every device that writes no map).
    public var platform: DevicePlatform { extensions?.isMac == true ? .macos : .ios }

    public init(flags: UInt8, extensions: AuthenticatorExtensions?) {
        self.flags = flags
        self.extensions = extensions
    }
}

/// What a successful attestation proves: this key lives in a genuine Apple device's Secure
/// Enclave and belongs to `appID`. Only `AppAttestVerifier` can make one.
public struct VerifiedAttestation: Sendable {
    public let keyID: [UInt8]
    /// The credential's uncompressed P-256 point, to store for later assertions.
    public let publicKey: [UInt8]
    public let environment: AttestationEnvironment
    public let appID: AppID
    /// Apple's fraud-assessment receipt, as sent (what the first refresh posts).
    public let receipt: [UInt8]
    /// The credential certificate (x5c[0]), which every later receipt must name.
    public let credentialCertificate: [UInt8]
    /// The receipt, validated (nil when the verifier does not check receipts).
    public let validatedReceipt: Receipt?
    public let app: AttestedApp
    /// The access-control policy from the aclBlob extension, when the certificate has a readable one.
    public let accessControlPolicy: [UInt8]?
    /// The OS version, build and platform Apple wrote (informational: never a trust decision).
    public let osInformation: OSInformation?

    public var platform: DevicePlatform { app.platform }
    /// Whether the aclBlob is Apple's Mac value (SIP and Full Security on). Always true for an
    /// accepted Mac attestation; false on iPhones, whose aclBlob holds another policy.
    public var macSecurityPostureOK: Bool { accessControlPolicy == AccessControlExtension.applesMacValue }

    fileprivate init(keyID: [UInt8], publicKey: [UInt8], environment: AttestationEnvironment, appID: AppID, receipt: [UInt8],
                     credentialCertificate: [UInt8], validatedReceipt: Receipt?, app: AttestedApp, accessControlPolicy: [UInt8]?,
                     osInformation: OSInformation?) {
        self.keyID = keyID
        self.publicKey = publicKey
        self.environment = environment
        self.appID = appID
        self.receipt = receipt
        self.credentialCertificate = credentialCertificate
        self.validatedReceipt = validatedReceipt
        self.app = app
        self.accessControlPolicy = accessControlPolicy
        self.osInformation = osInformation
    }
}

/// A verified assertion: the device key signed this request, with this counter.
public struct VerifiedAssertion: Sendable {
    public let counter: UInt32
    public let app: AttestedApp
}

/// Apple App Attest server-side validation, step by step as Apple documents it
/// ("Validating apps that connect to your server"). Pure: no I/O, the time is a parameter.
public final class AppAttestVerifier: Sendable {
    /// Hard limits on inputs; an attestation object is about 5.5 KB, an assertion about 120 B.
    public static let maxAttestationObjectBytes = 16 * 1024
    public static let maxAssertionObjectBytes = 1024
    /// The wire protocol always sends SHA-256 (32 bytes); the library takes any raw value, as
    /// Apple's guide vectors use (21 and 24 bytes), up to this.
    public static let maxClientDataHashBytes = 1024
    static let cborLimits = CBORLimits(maxDepth: 8, maxItems: 64)

    public let chainVerifier: CertificateChainVerifier
    /// Validates each attestation's receipt; nil: receipts are not checked (test setups only).
    public let receiptVerifier: ReceiptVerifier?

    /// How attestations' receipts are checked.
    public enum ReceiptPolicy: Sendable {
        /// Against Apple Root CA - G3 (fingerprint-checked): production.
        case apple
        /// Against these roots in place of G3, under the intermediates given with them (a test
        /// receipt authority: its root and the intermediate that is pinned).
        case anchors([Certificate])
        /// Not at all: a test attestation root is trusted, so no Apple receipt can exist.
        case unchecked
    }

    /// Apple's root (fingerprint-checked) plus any `additionalAnchors`, which callers name
    /// explicitly. Receipts: as `receipts` says; by default against G3 when only Apple's root is
    /// trusted, and unchecked when another attestation root is (it cannot have Apple's receipts).
    public init(additionalAnchors: [Certificate] = [], receipts: ReceiptPolicy? = nil) throws {
        chainVerifier = CertificateChainVerifier(anchors: [try AppleAppAttestationRoot.certificate()] + additionalAnchors)
        receiptVerifier = try Self.receiptVerifier(receipts ?? (additionalAnchors.isEmpty ? .apple : .unchecked))
    }

    /// Only the given anchors (tests that must show Apple's root is not trusted implicitly);
    /// receipts unchecked unless a verifier is given.
    public init(anchors: [Certificate], receiptVerifier: ReceiptVerifier? = nil) {
        chainVerifier = CertificateChainVerifier(anchors: anchors)
        self.receiptVerifier = receiptVerifier
    }

    static func receiptVerifier(_ policy: ReceiptPolicy) throws -> ReceiptVerifier? {
        switch policy {
        case .apple: try ReceiptVerifier.apple()
        case .anchors(let certificates): try ReceiptVerifier.anchors(fromPEMBundle: certificates)
        case .unchecked: nil
        }
    }

    // MARK: Attestation

    public func verifyAttestation(
        _ object: [UInt8], keyID: [UInt8], clientDataHash: [UInt8], allowedAppIDs: [AppID],
        allowedEnvironments: Set<AttestationEnvironment> = Set(AttestationEnvironment.allCases), at time: Date
    ) throws -> VerifiedAttestation {
        guard keyID.count == 32 else { throw VerificationError(.malformed, "key ID is \(keyID.count) bytes, expected 32") }
        try checkClientDataHashSize(clientDataHash)
        let statement = try decodeAttestation(object)
        try checkFormat(statement)
        let authData = try AuthenticatorData(statement.authData, attested: true)
        let leaf = try verifyCertificateChain(statement, at: time)
        try checkNonce(leaf: leaf, authData: statement.authData, clientDataHash: clientDataHash)
        let publicKey = try checkKeyID(leaf: leaf, keyID: keyID)
        let appID = try matchRPID(authData, allowedAppIDs)
        try checkCounterIsZero(authData)
        let environment = try checkAAGUID(authData, allowedEnvironments)
        try checkCredentialID(authData, keyID: keyID)
        let app = AttestedApp(flags: authData.flags, extensions: authData.extensions)
        let policy = try checkMacSecurityPosture(leaf: leaf, platform: app.platform)
        let receipt = try receiptVerifier?.validateAttestationReceipt(statement.receipt, appID: appID, credentialCertificate: statement.x5c[0],
                                                                     clientDataHash: clientDataHash, environment: environment, at: time)
        return VerifiedAttestation(keyID: keyID, publicKey: publicKey, environment: environment, appID: appID, receipt: statement.receipt,
                                   credentialCertificate: statement.x5c[0], validatedReceipt: receipt, app: app, accessControlPolicy: policy,
                                   osInformation: leaf.extensionValue(oid: OSInformation.oid).flatMap(OSInformation.init(extensionValue:)))
    }

    func checkClientDataHashSize(_ clientDataHash: [UInt8]) throws {
        guard clientDataHash.count <= Self.maxClientDataHashBytes else {
            throw VerificationError(.malformed, "clientDataHash is \(clientDataHash.count) bytes, limit \(Self.maxClientDataHashBytes)")
        }
    }

    /// Step 10 (macOS): trust a Mac key only when its aclBlob is Apple's value, SIP and Full
    /// Security on. Returns the policy the certificate carries (iPhones carry another one, which
    /// is reported and never compared).
    func checkMacSecurityPosture(leaf: LeafCertificate, platform: DevicePlatform) throws -> [UInt8]? {
        let value = leaf.extensionValue(oid: AccessControlExtension.oid)
        let policy = value.flatMap(AccessControlExtension.policy(fromExtensionValue:))
        guard platform == .macos else { return policy }
        guard let value else {
            throw VerificationError(.macSecurityPosture, "Mac credential certificate has no aclBlob extension \(AccessControlExtension.oid)")
        }
        guard let policy else {
            throw VerificationError(.macSecurityPosture, "Mac aclBlob (\(value.count) bytes) is not SEQUENCE { [3] OCTET STRING }")
        }
        guard policy == AccessControlExtension.applesMacValue else {
            throw VerificationError(.macSecurityPosture,
                                    "Mac aclBlob policy (\(policy.count) bytes) is not Apple's value for SIP and Full Security on")
        }
        return policy
    }

    struct AttestationStatement {
        let format: String
        let x5c: [[UInt8]]
        let receipt: [UInt8]
        let authData: [UInt8]
    }

    func decodeAttestation(_ object: [UInt8]) throws -> AttestationStatement {
        guard object.count <= Self.maxAttestationObjectBytes else {
            throw VerificationError(.malformed, "attestation object is \(object.count) bytes, limit \(Self.maxAttestationObjectBytes)")
        }
        let value: CBORValue
        do { value = try CBORDecoder.decode(object, limits: Self.cborLimits) } catch {
            throw VerificationError(.malformed, "attestation object is not valid CBOR: \(error)")
        }
        guard let format = value["fmt"]?.textValue else { throw VerificationError(.malformed, "attestation object has no text 'fmt'") }
        guard let statement = value["attStmt"] else { throw VerificationError(.malformed, "attestation object has no 'attStmt'") }
        guard let authData = value["authData"]?.bytesValue else { throw VerificationError(.malformed, "attestation object has no byte string 'authData'") }
        guard let chain = statement["x5c"]?.arrayValue else { throw VerificationError(.malformed, "attStmt has no array 'x5c'") }
        var x5c: [[UInt8]] = []
        for element in chain {
            guard let der = element.bytesValue else { throw VerificationError(.malformed, "x5c holds a non-byte-string element") }
            x5c.append(der)
        }
        guard let receipt = statement["receipt"]?.bytesValue else { throw VerificationError(.malformed, "attStmt has no byte string 'receipt'") }
        return AttestationStatement(format: format, x5c: x5c, receipt: receipt, authData: authData)
    }

    /// Step 0: the statement format must be Apple's.
    func checkFormat(_ statement: AttestationStatement) throws {
        guard statement.format == "apple-appattest" else {
            throw VerificationError(.unsupportedFormat, "fmt is '\(statement.format.prefix(64))', expected 'apple-appattest'")
        }
    }

    /// Step 1: x5c (credential certificate, then intermediates) verifies to a trust anchor at `time`.
    func verifyCertificateChain(_ statement: AttestationStatement, at time: Date) throws -> LeafCertificate {
        // Apple sends exactly the credential certificate and its intermediate; anything else is
        // not an App Attest chain (and extra certificates would only buy an attacker work).
        guard statement.x5c.count == 2 else {
            throw VerificationError(.certificateChainInvalid, "x5c has \(statement.x5c.count) certificates, expected 2")
        }
        do {
            return try chainVerifier.verify(chain: statement.x5c, at: time)
        } catch let error as ChainError {
            switch error {
            case .invalid(let detail): throw VerificationError(.certificateChainInvalid, detail)
            case .notValidAtTime(let detail): throw VerificationError(.certificateNotValidAtTime, detail)
            }
        }
    }

    /// Steps 2–4: nonce = SHA-256(authData ‖ clientDataHash) equals the credential certificate's nonce extension.
    func checkNonce(leaf: LeafCertificate, authData: [UInt8], clientDataHash: [UInt8]) throws {
        guard let value = leaf.extensionValue(oid: NonceExtension.oid) else {
            throw VerificationError(.nonceMismatch, "credential certificate has no nonce extension \(NonceExtension.oid)")
        }
        guard let embedded = NonceExtension.nonce(fromExtensionValue: value) else {
            throw VerificationError(.malformed, "nonce extension is not SEQUENCE { [1] OCTET STRING }")
        }
        let nonce = sha256(authData, clientDataHash)
        guard embedded == nonce else {
            throw VerificationError(.nonceMismatch, "certificate nonce does not equal SHA-256(authData ‖ clientDataHash)")
        }
    }

    /// Step 5: the key ID is SHA-256 of the credential public key's uncompressed point.
    func checkKeyID(leaf: LeafCertificate, keyID: [UInt8]) throws -> [UInt8] {
        guard leaf.publicKeyIsP256 else { throw VerificationError(.malformed, "credential key is not an uncompressed P-256 point") }
        guard sha256(leaf.publicKeyPoint) == keyID else {
            throw VerificationError(.keyIDMismatch, "SHA-256 of the credential public key is not the key ID")
        }
        return leaf.publicKeyPoint
    }

    /// Step 6: the RP ID hash is SHA-256 of one of the allowed App IDs.
    func matchRPID(_ authData: AuthenticatorData, _ allowed: [AppID]) throws -> AppID {
        guard let appID = allowed.first(where: { authData.rpIDHash.elementsEqual($0.rpIDHash) }) else {
            throw VerificationError(.rpIDMismatch, "RP ID hash matches none of \(allowed.count) allowed App ID(s)")
        }
        return appID
    }

    /// Step 7: a fresh attestation has counter 0.
    func checkCounterIsZero(_ authData: AuthenticatorData) throws {
        guard authData.counter == 0 else { throw VerificationError(.counterNotZero, "attestation counter is \(authData.counter)") }
    }

    /// Step 8: the AAGUID names the development or production environment, and it is allowed.
    func checkAAGUID(_ authData: AuthenticatorData, _ allowed: Set<AttestationEnvironment>) throws -> AttestationEnvironment {
        guard let aaguid = authData.aaguid, let environment = AppAttestAAGUID.environment(aaguid) else {
            throw VerificationError(.unknownAAGUID, "AAGUID \(hexString(Array(authData.aaguid ?? []))) is neither appattestdevelop nor appattest")
        }
        guard allowed.contains(environment) else {
            throw VerificationError(.environmentNotAllowed, "\(environment.rawValue) attestations are not allowed for this integration")
        }
        return environment
    }

    /// Step 9: the credential ID is the key ID.
    func checkCredentialID(_ authData: AuthenticatorData, keyID: [UInt8]) throws {
        guard let credentialID = authData.credentialID, credentialID.elementsEqual(keyID) else {
            throw VerificationError(.credentialIDMismatch, "credential ID in authenticator data is not the key ID")
        }
    }

    // MARK: Assertion

    /// Verifies an assertion by a registered device key and returns its counter, which the caller
    /// must store (atomically, conditioned on `previousCounter`).
    public func verifyAssertion(
        _ object: [UInt8], publicKey: ECPublicKey, clientDataHash: [UInt8], appID: AppID, previousCounter: UInt32
    ) throws -> VerifiedAssertion {
        try checkClientDataHashSize(clientDataHash)
        let (signature, authDataBytes) = try decodeAssertion(object)
        let authData = try AuthenticatorData(authDataBytes, attested: false)
        try checkAssertionSignature(signature, authData: authDataBytes, clientDataHash: clientDataHash, publicKey: publicKey)
        guard authData.rpIDHash.elementsEqual(appID.rpIDHash) else {
            throw VerificationError(.rpIDMismatch, "assertion RP ID hash is not SHA-256 of \(appID)")
        }
        guard authData.counter > previousCounter else {
            throw VerificationError(.counterNotIncreasing, "assertion counter \(authData.counter) is not greater than \(previousCounter)")
        }
        return VerifiedAssertion(counter: authData.counter, app: AttestedApp(flags: authData.flags, extensions: authData.extensions))
    }

    func decodeAssertion(_ object: [UInt8]) throws -> (signature: [UInt8], authData: [UInt8]) {
        guard object.count <= Self.maxAssertionObjectBytes else {
            throw VerificationError(.malformed, "assertion is \(object.count) bytes, limit \(Self.maxAssertionObjectBytes)")
        }
        let value: CBORValue
        do { value = try CBORDecoder.decode(object, limits: Self.cborLimits) } catch {
            throw VerificationError(.malformed, "assertion is not valid CBOR: \(error)")
        }
        guard let signature = value["signature"]?.bytesValue, let authData = value["authenticatorData"]?.bytesValue else {
            throw VerificationError(.malformed, "assertion is not a map with byte strings 'signature' and 'authenticatorData'")
        }
        return (signature, authData)
    }

    /// The device signs nonce = SHA-256(authenticatorData ‖ clientDataHash) with ECDSA-SHA256.
    func checkAssertionSignature(_ signature: [UInt8], authData: [UInt8], clientDataHash: [UInt8], publicKey: ECPublicKey) throws {
        let nonce = sha256(authData, clientDataHash)
        guard publicKey.isValidSignature(signature, digest: sha256(nonce)) else {
            throw VerificationError(.signatureInvalid, "assertion signature does not verify with the registered key")
        }
    }
}
