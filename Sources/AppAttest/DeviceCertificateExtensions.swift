import AttestCrypto
import Foundation

/// The Mac's access-control extension on the credential certificate ("aclBlob", OID
/// 1.2.840.113635.100.8.6): `SEQUENCE { [3] EXPLICIT OCTET STRING policy }`. Apple says to trust
/// a Mac key only when the policy is, byte for byte, the one with System Integrity Protection and
/// Full Security on. iPhones carry this extension too, with another policy: it is checked on Macs only.
public enum AccessControlExtension {
    public static let oid = "1.2.840.113635.100.8.6"

    /// Apple's documented Mac value (SIP and Full Security on), which it says will not change
    /// across macOS versions.
    public static let applesMacValue: [UInt8] = Array(Data(base64Encoded:
        "MEAMAjExMDowCQwCb2uhAwEB/zAJDAJvYaEDAQH/MAsMBG9kZWyhAwEB/zAVDARvc2duoAYMBHJzZWMwBaYDAgEB")!)

    /// The policy octets, or nil when the value is not exactly that structure.
    public static func policy(fromExtensionValue der: [UInt8]) -> [UInt8]? {
        var reader = DER(der[...])
        guard let sequence = reader.read(0x30), reader.isAtEnd else { return nil }
        var inner = DER(sequence)
        guard let explicit = inner.read(0xa3), inner.isAtEnd else { return nil }
        var octets = DER(explicit)
        guard let policy = octets.read(0x04), octets.isAtEnd else { return nil }
        return Array(policy)
    }

    /// The extension value for a policy (the test authority issues it).
    public static func extensionValue(policy: [UInt8]) -> [UInt8] {
        DERWriter.tlv(0x30, DERWriter.tlv(0xa3, DERWriter.tlv(0x04, policy)))
    }
}

/// The OS information Apple puts in the credential certificate (OID 1.2.840.113635.100.8.7,
/// undocumented): a SEQUENCE of context-tagged fields, each wrapping an OCTET STRING or an
/// INTEGER. Informational only: reported and stored, never the ground for a trust decision.
public struct OSInformation: Sendable, Equatable {
    public static let oid = "1.2.840.113635.100.8.7"
    public static let versionTag = 1400, buildTag = 1403, platformTag = 1026, variantTag = 1029

    /// Every text field by tag number.
    public let fields: [Int: String]

    public var version: String? { fields[Self.versionTag] }
    public var build: String? { fields[Self.buildTag] }
    /// `iphoneos`, `macosx`, …
    public var platform: String? { fields[Self.platformTag] }
    /// "Internal", "Beta", … when present.
    public var variant: String? { fields[Self.variantTag] }

    public init(fields: [Int: String]) { self.fields = fields }

    /// Nil when the value is not the structure described above (an unreadable informational
    /// extension is ignored, not refused: Apple does not document it).
    public init?(extensionValue der: [UInt8]) {
        var reader = DER(der[...])
        guard let sequence = reader.read(0x30), reader.isAtEnd else { return nil }
        var fields: [Int: String] = [:]
        var elements = DER(sequence)
        while !elements.isAtEnd {
            guard let (tag, contents) = elements.readContextConstructed() else { return nil }
            var inner = DER(contents)
            if let text = inner.read(0x04) {
                guard inner.isAtEnd, text.count <= 256 else { return nil }
                fields[tag] = String(decoding: text, as: UTF8.self)
            } else if inner.read(0x02) != nil {
                guard inner.isAtEnd else { return nil }
            } else {
                return nil
            }
        }
        self.fields = fields
    }

    /// The extension value for these fields (the test authority issues it).
    public static func extensionValue(_ fields: [(tag: Int, text: String)]) -> [UInt8] {
        DERWriter.tlv(0x30, fields.flatMap { DERWriter.contextConstructed($0.tag, DERWriter.tlv(0x04, Array($0.text.utf8))) })
    }
}

