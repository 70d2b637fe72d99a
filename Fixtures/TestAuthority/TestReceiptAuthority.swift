import AppAttest
import AttestCrypto
import Foundation

/// The project's own receipt authority (`Fixtures/test-receipt-authority/`), shaped like Apple's
/// receipt chain: it signs ATTEST receipts for the test authority's attestations and RECEIPT ones
/// for the stub of Apple's data service. Trusted only with `--receipt-trust-anchor`.
public final class TestReceiptAuthority: Sendable {
    public let root: Certificate
    public let intermediate: Certificate
    public let signer: Certificate
    private let key: ECPrivateKey

    public static let rootPEM = EmbeddedReceiptAuthority.rootPEM
    public static let shared: TestReceiptAuthority = {
        do { return try TestReceiptAuthority() } catch { fatalError("embedded test receipt authority is unreadable: \(error)") }
    }()

    public init() throws {
        root = try Certificate(pem: EmbeddedReceiptAuthority.rootPEM)
        intermediate = try Certificate(pem: EmbeddedReceiptAuthority.intermediatePEM)
        signer = try Certificate(pem: EmbeddedReceiptAuthority.signerPEM)
        key = try ECPrivateKey(pem: EmbeddedReceiptAuthority.signerKeyPEM)
    }

    /// A verifier that trusts this authority as attestd's `--receipt-trust-anchor anchor.pem`
    /// does: its root, and its intermediate pinned.
    public func verifier() -> ReceiptVerifier { ReceiptVerifier(anchors: [root], pinnedIntermediates: [intermediate]) }

    /// Signers the pin must refuse: one under a second intermediate of the same root, and one
    /// under the right intermediate whose only key usage is keyAgreement.
    public enum Impostor: Sendable, CaseIterable { case rogueIntermediate, keyAgreementOnly }

    /// A receipt signed by an impostor, with its chain in the certificate set as Apple sends it.
    public func receipt(_ fields: Fields, signedBy impostor: Impostor) throws -> [UInt8] {
        switch impostor {
        case .rogueIntermediate:
            let intermediate = try Certificate(pem: EmbeddedReceiptAuthority.rogueIntermediatePEM)
            return try SignedDataSigner.sign(Self.payload(fields), signer: try Certificate(pem: EmbeddedReceiptAuthority.rogueSignerPEM),
                                             key: try ECPrivateKey(pem: EmbeddedReceiptAuthority.rogueSignerKeyPEM), chain: [intermediate, root])
        case .keyAgreementOnly:
            return try SignedDataSigner.sign(Self.payload(fields), signer: try Certificate(pem: EmbeddedReceiptAuthority.keyAgreementSignerPEM),
                                             key: try ECPrivateKey(pem: EmbeddedReceiptAuthority.keyAgreementSignerKeyPEM), chain: [intermediate, root])
        }
    }

    /// What goes into a receipt, field by field (nil leaves a field out).
    public struct Fields: Sendable {
        public var type = "ATTEST"
        public var appID: String
        public var attestedCertificate: [UInt8]
        public var clientHash: [UInt8]?
        public var token: [UInt8]? = Array("test-receipt-token".utf8)
        public var environment = "sandbox"
        public var createdAt: Date
        public var riskMetric: Int? = nil
        public var notBefore: Date? = nil
        public var expiresAt: Date?
        /// Raw fields added as they are (type, value): unknown types, duplicates.
        public var extra: [(Int, [UInt8])] = []

        public init(appID: String, attestedCertificate: [UInt8], clientHash: [UInt8]?, createdAt: Date) {
            self.appID = appID
            self.attestedCertificate = attestedCertificate
            self.clientHash = clientHash
            self.createdAt = createdAt
            expiresAt = createdAt.addingTimeInterval(90 * 86_400)
        }

        /// A refreshed receipt for the same key: RECEIPT, the metric, not-before a day on.
        public func refreshed(at time: Date, riskMetric: Int) -> Fields {
            var next = self
            next.type = "RECEIPT"
            next.createdAt = time
            next.riskMetric = riskMetric
            next.notBefore = time.addingTimeInterval(86_400)
            next.expiresAt = time.addingTimeInterval(90 * 86_400)
            next.clientHash = clientHash.map { Array($0.reversed()) }   // Apple mangles it: never compared
            return next
        }
    }

    /// The payload, in Apple's unsorted field order, then signed.
    public func receipt(_ fields: Fields) throws -> [UInt8] {
        try SignedDataSigner.sign(Self.payload(fields), signer: signer, key: key, chain: [intermediate, root])
    }

    /// Signs any payload as a receipt (malformed-payload tests).
    public func sign(payload: [UInt8], signedAttributes: Bool = false) throws -> [UInt8] {
        try SignedDataSigner.sign(payload, signer: signer, key: key, chain: [intermediate, root], signedAttributes: signedAttributes)
    }

    public static func payload(_ fields: Fields) -> [UInt8] {
        func field(_ type: Int, _ value: [UInt8]) -> [UInt8] {
            DERWriter.tlv(0x30, DERWriter.tlv(0x02, [UInt8(type)]) + DERWriter.tlv(0x02, [1]) + DERWriter.tlv(0x04, value))
        }
        var items: [[UInt8]] = []
        if let risk = fields.riskMetric { items.append(field(17, Array(String(risk).utf8))) }
        items.append(field(6, Array(fields.type.utf8)))
        items.append(field(2, Array(fields.appID.utf8)))
        items.append(field(3, fields.attestedCertificate))
        if let hash = fields.clientHash { items.append(field(4, hash)) }
        if let token = fields.token { items.append(field(5, token)) }
        items.append(field(7, Array(fields.environment.utf8)))
        items.append(field(12, Array(time(fields.createdAt).utf8)))
        if let notBefore = fields.notBefore { items.append(field(19, Array(time(notBefore).utf8))) }
        if let expiry = fields.expiresAt { items.append(field(21, Array(time(expiry).utf8))) }
        for (type, value) in fields.extra { items.append(field(type, value)) }
        return DERWriter.tlv(0x31, items.flatMap { $0 })
    }

    /// ISO 8601 UTC with milliseconds, as Apple writes receipt times.
    public static func time(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        formatter.timeZone = TimeZone(identifier: "UTC")
        return formatter.string(from: date)
    }
}
