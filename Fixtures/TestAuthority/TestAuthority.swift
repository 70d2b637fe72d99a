import AttestWire
import AppAttest
import AttestCrypto
import CBOR
import Foundation

/// A simulated device's App Attest key: a P-256 key pair whose key ID is SHA-256 of its point.
public final class DeviceKey: Sendable {
    public let privateKey: ECPrivateKey
    public let publicKey: ECPublicKey
    public var keyID: [UInt8] { sha256(publicKey.x962) }

    public init(privateKey: ECPrivateKey) throws {
        self.privateKey = privateKey
        publicKey = try privateKey.publicKey()
    }

    public static func generate() throws -> DeviceKey { try DeviceKey(privateKey: .generate(curve: "P-256")) }
}

/// The project's own App Attest authority, for tests and simulated devices only: it mints
/// attestation objects and assertions in Apple's exact format, chained to its own root
/// (`Fixtures/test-authority/root.pem`), which nothing trusts unless told to.
public final class TestAuthority: Sendable {
    public let root: Certificate
    public let intermediate: Certificate
    private let issuer: CertificateIssuer

    public static let rootPEM = EmbeddedAuthority.rootPEM
    public static let shared: TestAuthority = {
        do { return try TestAuthority() } catch { fatalError("embedded test authority is unreadable: \(error)") }
    }()

    public init() throws {
        root = try Certificate(pem: EmbeddedAuthority.rootPEM)
        intermediate = try Certificate(pem: EmbeddedAuthority.intermediatePEM)
        issuer = CertificateIssuer(certificate: intermediate, key: try ECPrivateKey(pem: EmbeddedAuthority.intermediateKeyPEM))
    }

    /// Deviations from a valid attestation, one per verification step, for tests that must break
    /// exactly one step. The default is a valid attestation.
    public struct AttestationOptions {
        public var format = "apple-appattest"
        public var environment: AttestationEnvironment = .development
        public var aaguid: [UInt8]? = nil
        public var counter: UInt32 = 0
        public var credentialID: [UInt8]? = nil
        /// Embed the nonce of this clientDataHash instead of the real one.
        public var nonceClientDataHash: [UInt8]? = nil
        /// Certify this key in the credential certificate instead of the device's.
        public var certifiedKey: ECPublicKey? = nil
        public var rpIDHash: [UInt8]? = nil
        public var notBefore: Date? = nil
        public var notAfter: Date? = nil
        /// The statement's receipt.
        public var receipt: ReceiptChoice = .signed
        /// Changes to the signed receipt's fields (with `.signed`).
        public var receiptFields: (@Sendable (inout TestReceiptAuthority.Fields) -> Void)? = nil
        /// A change to the signed receipt's bytes (with `.signed`), after signing.
        public var receiptBytes: (@Sendable ([UInt8]) -> [UInt8])? = nil
        /// The extension map written after the credential public key (iOS 27, macOS 27); nil: none.
        public var extensionMap: [CBORMapEntry]? = nil
        /// Raw bytes after the credential public key instead of the encoded map (malformed-input tests).
        public var authDataTail: [UInt8]? = nil
        /// Nil: 0xc0 (AT and ED) with a map, 0x40 without, as shipping devices write them.
        public var flags: UInt8? = nil
        /// The aclBlob's policy (OID 1.2.840.113635.100.8.6); nil: no aclBlob.
        public var accessControlPolicy: [UInt8]? = nil
        /// The whole aclBlob extension value instead of one built from `accessControlPolicy`.
        public var accessControlExtensionValue: [UInt8]? = nil
        /// OS fields for OID 1.2.840.113635.100.8.7 (tag 1400 version, 1403 build, 1026 platform); nil: none.
        public var osInformation: [(tag: Int, text: String)]? = nil
        public init() {}
    }

    public enum ReceiptChoice: Sendable {
        /// An ATTEST receipt from the test receipt authority, bound to this attestation.
        case signed
        /// These bytes as the receipt.
        case raw([UInt8])
        /// An ATTEST receipt bound to this attestation but signed by a signer the pin refuses.
        case impostor(TestReceiptAuthority.Impostor)
        /// No receipt in the statement (every genuine attestation has one).
        case none
    }

    /// The aclBlob policy iPhones carry (not the Mac value): copied from a real iOS 27 credential certificate.
    public static let iPhoneAccessControlPolicy: [UInt8] = Array(Data(base64Encoded:
        "MEMMAjExMD0wCgwDb2tkoQMBAf8wCQwCb2GhAwEB/zALDARvc2duoQMBAf8wCwwEb2RlbKEDAQH/MAoMA29ja6EDAQH/")!)

    /// An attestation object as DCAppAttestService.attestKey returns it.
    public func attestation(key: DeviceKey, appID: AppID, clientDataHash: [UInt8], at time: Date = Date(),
                            options: AttestationOptions = AttestationOptions()) throws -> [UInt8] {
        let keyID = key.keyID
        let aaguid = options.aaguid ?? (options.environment == .production
            ? Array("appattest".utf8) + [UInt8](repeating: 0, count: 7) : Array("appattestdevelop".utf8))
        let credentialID = options.credentialID ?? keyID
        var authData = options.rpIDHash ?? appID.rpIDHash
        authData.append(0x40)  // flags: attested credential data included
        authData += bigEndian(options.counter)
        authData += aaguid
        authData += [UInt8(credentialID.count >> 8), UInt8(credentialID.count & 0xff)] + credentialID
        authData += CBOREncoder.encode(coseKey(key.publicKey))
        let tail = options.authDataTail ?? options.extensionMap.map { CBOREncoder.encode(.map($0)) } ?? []
        authData[32] = options.flags ?? (tail.isEmpty ? 0x40 : 0xc0)
        authData += tail

        let nonce = sha256(authData, options.nonceClientDataHash ?? clientDataHash)
        let nonceExtension: [UInt8] = [0x30, 0x24, 0xa1, 0x22, 0x04, 0x20] + nonce
        var extensions: [CertificateIssuer.Extension] = [.init(oid: "1.2.840.113635.100.8.2", value: nonceExtension)]
        if let value = options.accessControlExtensionValue ?? options.accessControlPolicy.map(AccessControlExtension.extensionValue(policy:)) {
            extensions.append(.init(oid: AccessControlExtension.oid, value: value))
        }
        if let fields = options.osInformation {
            extensions.append(.init(oid: OSInformation.oid, value: OSInformation.extensionValue(fields)))
        }
        let leaf = try issuer.issueLeaf(
            subjectCommonName: hexString(keyID), subjectKey: options.certifiedKey ?? key.publicKey,
            notBefore: options.notBefore ?? time.addingTimeInterval(-86_400),
            notAfter: options.notAfter ?? time.addingTimeInterval(2 * 86_400),
            extensions: extensions)

        var statement = [CBORMapEntry("x5c", .array([.bytes(leaf.der), .bytes(intermediate.der)]))]
        switch options.receipt {
        case .signed:
            var fields = TestReceiptAuthority.Fields(appID: appID.description, attestedCertificate: leaf.der, clientHash: clientDataHash, createdAt: time)
            fields.environment = options.environment == .production ? "production" : "sandbox"
            options.receiptFields?(&fields)
            let signed = try TestReceiptAuthority.shared.receipt(fields)
            statement.append(CBORMapEntry("receipt", .bytes(options.receiptBytes?(signed) ?? signed)))
        case .raw(let bytes): statement.append(CBORMapEntry("receipt", .bytes(bytes)))
        case .impostor(let impostor):
            var fields = TestReceiptAuthority.Fields(appID: appID.description, attestedCertificate: leaf.der, clientHash: clientDataHash, createdAt: time)
            fields.environment = options.environment == .production ? "production" : "sandbox"
            options.receiptFields?(&fields)
            statement.append(CBORMapEntry("receipt", .bytes(try TestReceiptAuthority.shared.receipt(fields, signedBy: impostor))))
        case .none: break
        }
        return CBOREncoder.encode(.map([
            CBORMapEntry("fmt", .text(options.format)),
            CBORMapEntry("attStmt", .map(statement)),
            CBORMapEntry("authData", .bytes(authData)),
        ]))
    }

    /// An assertion as DCAppAttestService.generateAssertion returns it: the extension map after
    /// the header when given (iOS 27 and macOS 27 write the attestation's map again), and the
    /// flags as devices set them (AT although no credential data follows; ED with a map).
    public func assertion(key: DeviceKey, appID: AppID, clientDataHash: [UInt8], counter: UInt32,
                          extensionMap: [CBORMapEntry]? = nil, flags: UInt8? = nil) throws -> [UInt8] {
        let tail = extensionMap.map { CBOREncoder.encode(.map($0)) } ?? []
        let authData = appID.rpIDHash + [flags ?? (tail.isEmpty ? 0x40 : 0xc0)] + bigEndian(counter) + tail
        let nonce = sha256(authData, clientDataHash)
        let signature = try key.privateKey.signSHA256(nonce)
        return CBOREncoder.encode(.map([
            CBORMapEntry("signature", .bytes(signature)),
            CBORMapEntry("authenticatorData", .bytes(authData)),
        ]))
    }

    /// COSE_Key (RFC 9053) for an EC2 P-256 key, as in WebAuthn attested credential data.
    private func coseKey(_ key: ECPublicKey) -> CBORValue {
        let point = key.x962
        return .map([
            CBORMapEntry(.int(1), .int(2)),     // kty: EC2
            CBORMapEntry(.int(3), .int(-7)),    // alg: ES256
            CBORMapEntry(.int(-1), .int(1)),    // crv: P-256
            CBORMapEntry(.int(-2), .bytes(Array(point[1..<33]))),
            CBORMapEntry(.int(-3), .bytes(Array(point[33..<65]))),
        ])
    }

    private func bigEndian(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8(value >> 16 & 0xff), UInt8(value >> 8 & 0xff), UInt8(value & 0xff)]
    }
}
