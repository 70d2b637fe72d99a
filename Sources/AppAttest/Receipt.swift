import AttestCrypto
import Foundation

/// An App Attest receipt (Apple's fraud-assessment receipt), its signature and chain verified:
/// the attestation's own (`ATTEST`) or one Apple's data service returned (`RECEIPT`, with the
/// risk metric). Only `ReceiptVerifier` makes one.
public struct Receipt: Sendable, Equatable {
    public enum Kind: String, Sendable { case attest = "ATTEST", receipt = "RECEIPT" }
    /// `sandbox` for the development environment, `production` for production.
    public enum Environment: String, Sendable {
        case sandbox, production
        public init(_ environment: AttestationEnvironment) { self = environment == .production ? .production : .sandbox }
    }

    public let type: Kind
    public let appID: String
    /// The attested key's credential certificate (DER), byte for byte the attestation's x5c[0].
    public let attestedCertificate: [UInt8]
    /// In an ATTEST receipt the attestation's clientDataHash; in a RECEIPT one a mangled copy,
    /// never to be compared.
    public let clientHash: [UInt8]?
    /// Opaque, the same across refreshes.
    public let token: [UInt8]?
    public let environment: Environment
    public let createdAt: Date
    /// When a refresh may next be asked for (RECEIPT only).
    public let notBefore: Date?
    public let expiresAt: Date?
    /// Keys this app attested on the device lately (RECEIPT only).
    public let riskMetric: Int?
    /// The receipt as Apple sent it (what a refresh posts back).
    public let der: [UInt8]

    /// A refreshed receipt may be asked for from this time on.
    public var refreshableAt: Date { notBefore ?? createdAt }
}

/// Validates receipts against the pinned Apple Root CA - G3 (or, for tests, another receipt root)
/// and binds them to the attestation: Apple's steps from "Assessing fraud risk".
public final class ReceiptVerifier: Sendable {
    /// A new receipt (an attestation's, or a refresh's answer) was created this close to now.
    public static let maxAge: TimeInterval = 300
    public let signedData: SignedDataVerifier

    /// Apple's receipt intermediate, "Apple Application Integration CA 5 - G1": every receipt in
    /// `fixtures/apple` is signed under it. Pinned by its SubjectPublicKeyInfo's SHA-256.
    public static let appleIntermediateSPKISHA256 = "15e325f19b2fb58bbdeaebafb0292e5d45e8a27fb3709ebeff9151d5b172516a"
    /// The extension every Apple receipt signer ("Application Attestation Fraud Receipt Signing") carries.
    public static let signerMarkerOID = "1.2.840.113635.100.12.15"
    /// How long after its creation a receipt's "not before" may be (Apple's is 24 hours).
    public static let maxNotBeforeDelay: TimeInterval = 3 * 86_400

    /// - Parameters:
    ///   - anchors: the roots receipts chain to.
    ///   - pinnedIntermediates: the intermediates receipts must be signed under (their SPKI
    ///     hashes are pinned); `appleIntermediateSPKISHA256` when nil.
    public init(anchors: [Certificate], pinnedIntermediates: [Certificate]? = nil) {
        let pins = pinnedIntermediates.map { $0.map(\.spkiSHA256Hex) } ?? [Self.appleIntermediateSPKISHA256]
        signedData = SignedDataVerifier(anchors: anchors, pin: SignerPin(intermediateSPKISHA256: pins, signerMarkerOID: Self.signerMarkerOID))
    }

    /// The roots and pinned intermediates of a `--receipt-trust-anchor` file: self-signed
    /// certificates are roots, the others the intermediates receipts must be signed under.
    public static func anchors(fromPEMBundle certificates: [Certificate]) throws -> ReceiptVerifier {
        let roots = certificates.filter(\.isSelfSigned), intermediates = certificates.filter { !$0.isSelfSigned }
        guard !roots.isEmpty else { throw TrustAnchorError("a receipt trust anchor file needs its root (a self-signed certificate)") }
        guard !intermediates.isEmpty else {
            throw TrustAnchorError("a receipt trust anchor file needs the intermediate receipts are signed under, after its root: it is pinned")
        }
        return ReceiptVerifier(anchors: roots, pinnedIntermediates: intermediates)
    }

    /// Apple's: G3 alone, fingerprint-checked, and the receipt intermediate pinned.
    public static func apple() throws -> ReceiptVerifier { ReceiptVerifier(anchors: [try AppleRootCAG3.certificate()]) }

    /// The signature and the chain at `time`, then the payload's fields. No binding checks.
    public func read(_ der: [UInt8], at time: Date) throws -> Receipt {
        let signed: SignedContent
        do { signed = try signedData.verify(der, at: time) } catch {
            switch error {
            case .malformed(let detail): throw VerificationError(.receiptMalformed, "receipt is not a SignedData Apple makes: \(detail)")
            case .signature(let detail): throw VerificationError(.receiptSignature, "receipt signature does not verify: \(detail)")
            case .chain(let detail): throw VerificationError(.receiptSignature, "receipt signer: \(detail)")
            case .pin(let detail): throw VerificationError(.receiptSignature, "receipt signer is not Apple's receipt signer: \(detail)")
            }
        }
        let receipt = try ReceiptPayload.parse(signed.content, der: der)
        // A "not before" far ahead would keep the device from ever being asked about again.
        if let notBefore = receipt.notBefore {
            if let expiry = receipt.expiresAt, notBefore > expiry {
                throw VerificationError(.receiptMalformed, "receipt's not-before \(notBefore) is after its expiry \(expiry)")
            }
            guard notBefore.timeIntervalSince(receipt.createdAt) <= Self.maxNotBeforeDelay else {
                throw VerificationError(.receiptMalformed,
                                        "receipt's not-before \(notBefore) is more than \(Int(Self.maxNotBeforeDelay / 86_400)) days after its creation \(receipt.createdAt)")
            }
        }
        return receipt
    }

    /// An attestation's own receipt: ATTEST, for this App ID and this credential certificate,
    /// over this clientDataHash, of the environment the AAGUID names, created within `maxAge` of `time`.
    public func validateAttestationReceipt(_ der: [UInt8], appID: AppID, credentialCertificate: [UInt8], clientDataHash: [UInt8],
                                           environment: AttestationEnvironment, at time: Date) throws -> Receipt {
        let receipt = try read(der, at: time)
        guard receipt.type == .attest else { throw VerificationError(.receiptMismatch, "an attestation's receipt is \(receipt.type.rawValue), expected ATTEST") }
        guard receipt.clientHash == clientDataHash else {
            throw VerificationError(.receiptMismatch, "receipt client hash is not the attestation's clientDataHash")
        }
        try bind(receipt, appID: appID, credentialCertificate: credentialCertificate, environment: environment, at: time)
        return receipt
    }

    /// A receipt Apple's data service returned for a device: RECEIPT, the same App ID,
    /// certificate and environment, new.
    public func validateRefreshedReceipt(_ der: [UInt8], appID: AppID, credentialCertificate: [UInt8],
                                         environment: AttestationEnvironment, at time: Date) throws -> Receipt {
        let receipt = try read(der, at: time)
        guard receipt.type == .receipt else { throw VerificationError(.receiptMismatch, "a refreshed receipt is \(receipt.type.rawValue), expected RECEIPT") }
        try bind(receipt, appID: appID, credentialCertificate: credentialCertificate, environment: environment, at: time)
        return receipt
    }

    func bind(_ receipt: Receipt, appID: AppID, credentialCertificate: [UInt8], environment: AttestationEnvironment, at time: Date) throws {
        guard receipt.appID == appID.description else {
            throw VerificationError(.receiptMismatch, "receipt is for App ID \(receipt.appID.prefix(80)), not \(appID)")
        }
        guard receipt.attestedCertificate == credentialCertificate else {
            throw VerificationError(.receiptMismatch, "receipt's attested certificate is not this key's credential certificate")
        }
        guard receipt.environment == Receipt.Environment(environment) else {
            throw VerificationError(.receiptMismatch, "receipt environment \(receipt.environment.rawValue) does not match the \(environment.rawValue) AAGUID")
        }
        guard abs(receipt.createdAt.timeIntervalSince(time)) <= Self.maxAge else {
            throw VerificationError(.receiptStale, "receipt was created at \(receipt.createdAt), more than \(Int(Self.maxAge)) s from \(time)")
        }
        if let expiry = receipt.expiresAt, expiry < time {
            throw VerificationError(.receiptStale, "receipt expired at \(expiry)")
        }
    }
}

/// The receipt's payload: a SET OF `SEQUENCE { INTEGER type, INTEGER version, OCTET STRING value }`.
/// Apple does not sort the SET, so it is read in order (a strict DER SET reader would refuse it);
/// every length is checked by the bounded reader, a field may appear once, unknown types are skipped.
enum ReceiptPayload {
    static let maxFields = 64

    static func parse(_ content: [UInt8], der: [UInt8]) throws -> Receipt {
        var reader = DER(content[...])
        guard let set = reader.read(0x31), reader.isAtEnd else { throw malformed("payload is not one SET") }
        var fields: [Int: ArraySlice<UInt8>] = [:]
        var elements = DER(set)
        while !elements.isAtEnd {
            guard fields.count < maxFields else { throw malformed("more than \(maxFields) fields") }
            guard let sequence = elements.read(0x30) else { throw malformed("a field is not a SEQUENCE") }
            var field = DER(sequence)
            guard let typeBytes = field.read(0x02), let type = smallInteger(typeBytes), field.read(0x02) != nil,
                  let value = field.read(0x04), field.isAtEnd else {
                throw malformed("a field is not SEQUENCE { INTEGER, INTEGER, OCTET STRING }")
            }
            guard fields.updateValue(value, forKey: type) == nil else { throw malformed("field \(type) appears twice") }
        }
        func required(_ type: Int, _ name: String) throws -> ArraySlice<UInt8> {
            guard let value = fields[type] else { throw malformed("no \(name) (field \(type))") }
            return value
        }
        func text(_ type: Int, _ name: String) throws -> String {
            let bytes = try required(type, name)
            guard bytes.count <= 1024, let text = String(validating: bytes, as: UTF8.self) else { throw malformed("\(name) is not UTF-8 text") }
            return text
        }
        func time(_ type: Int, _ name: String) throws -> Date? {
            guard fields[type] != nil else { return nil }
            let value = try text(type, name)
            guard let date = ISO8601Time.parse(value) else { throw malformed("\(name) '\(value.prefix(40))' is not an ISO 8601 UTC time") }
            return date
        }
        guard let type = Receipt.Kind(rawValue: try text(6, "receipt type")) else { throw malformed("receipt type is neither ATTEST nor RECEIPT") }
        guard let environment = Receipt.Environment(rawValue: try text(7, "environment")) else {
            throw malformed("environment is neither sandbox nor production")
        }
        guard let created = try time(12, "creation time") else { throw malformed("no creation time (field 12)") }
        var risk: Int?
        if fields[17] != nil {
            let value = try text(17, "risk metric")
            guard value.utf8.count <= 9, let number = Int(value), number >= 0 else { throw malformed("risk metric '\(value.prefix(20))' is not a count") }
            risk = number
        }
        return Receipt(type: type, appID: try text(2, "App ID"), attestedCertificate: Array(try required(3, "attested certificate")),
                       clientHash: fields[4].map(Array.init), token: fields[5].map(Array.init), environment: environment,
                       createdAt: created, notBefore: try time(19, "not before"), expiresAt: try time(21, "expiration time"),
                       riskMetric: risk, der: der)
    }

    /// A non-negative INTEGER that fits in a few bytes (field types are 2 to 21).
    static func smallInteger(_ bytes: ArraySlice<UInt8>) -> Int? {
        guard (1...4).contains(bytes.count), bytes.first! & 0x80 == 0 else { return nil }
        return bytes.reduce(0) { $0 << 8 | Int($1) }
    }

    static func malformed(_ detail: String) -> VerificationError { VerificationError(.receiptMalformed, "receipt payload: \(detail)") }
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` (receipts write 1 to 3 fractional digits; up to 9 are read),
/// parsed by hand: no locale, no formatter.
public enum ISO8601Time {
    public static func parse(_ text: String) -> Date? {
        let b = Array(text.utf8)
        guard b.count >= 20, b.count <= 30, b[4] == 0x2d, b[7] == 0x2d, b[10] == 0x54, b[13] == 0x3a, b[16] == 0x3a, b.last == 0x5a else { return nil }
        func number(_ range: Range<Int>) -> Int? {
            var n = 0
            for i in range { guard (0x30...0x39).contains(b[i]) else { return nil }; n = n * 10 + Int(b[i] - 0x30) }
            return n
        }
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10), let hour = number(11..<13),
              let minute = number(14..<16), let second = number(17..<19),
              (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 61 else { return nil }
        var fraction = 0.0
        if b.count > 20 {
            guard b[19] == 0x2e, let digits = number(20..<b.count - 1), b.count - 21 >= 1 else { return nil }
            fraction = Double(digits) / pow(10, Double(b.count - 21))
        } else if b[19] != 0x5a { return nil }
        // Days from the civil date (proleptic Gregorian), no time zone involved.
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        let seconds = Double(days * 86_400 + hour * 3600 + minute * 60 + second) + fraction
        return Date(timeIntervalSince1970: seconds)
    }
}
