import Foundation

/// An end-entity certificate read with a strict DER parser of our own, for the one certificate
/// per attestation that is new every time.
///
/// Why not `d2i_X509`: OpenSSL 3.0 decodes the subject public key through its provider machinery
/// while parsing, about 190 µs here — 15% of an attestation, for a key App Attest only hashes.
/// Nothing here decides trust: `CertificateChainVerifier` verifies the signature over `tbs` with
/// OpenSSL before any field is used, and the intermediate that signed it was validated by
/// OpenSSL's `X509_verify_cert`. Every length is checked against what remains; anything that is
/// not DER of the expected shape is refused.
public struct LeafCertificate: Sendable {
    public let der: [UInt8]
    /// The exact signed bytes (the TBSCertificate TLV).
    let tbs: ArraySlice<UInt8>
    /// SHA-256 or SHA-384, from an ECDSA signature algorithm (outer and inner must agree).
    let signatureDigest: SignatureDigest
    /// The DER `Ecdsa-Sig-Value` from the signature BIT STRING.
    let signature: [UInt8]
    /// The issuer Name, DER, tag included: compared byte for byte with the issuer's subject.
    let issuer: ArraySlice<UInt8>
    public let notBefore: Date
    public let notAfter: Date
    /// The subject key: an uncompressed point when the key is on P-256.
    public let publicKeyPoint: [UInt8]
    public let publicKeyIsP256: Bool
    /// Extensions in order: OID contents (DER, without tag and length), criticality, extnValue contents.
    let extensions: [(oid: ArraySlice<UInt8>, critical: Bool, value: ArraySlice<UInt8>)]

    enum SignatureDigest: Sendable { case sha256, sha384 }

    /// For `attestctl bench verify --breakdown`, which times the signature check on its own.
    public var signedBytesForBenchmark: [UInt8] { Array(tbs) }
    public var signatureForBenchmark: [UInt8] { signature }

    public struct ParseError: Error, CustomStringConvertible, Sendable {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    // DER contents of the OIDs used here.
    static let ecdsaWithSHA256: [UInt8] = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]
    static let ecdsaWithSHA384: [UInt8] = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03]
    static let idECPublicKey: [UInt8] = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]
    static let prime256v1: [UInt8] = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]
    static let basicConstraints: [UInt8] = [0x55, 0x1d, 0x13]
    static let keyUsage: [UInt8] = [0x55, 0x1d, 0x0f]

    /// The outer layer only — the signed bytes, the signature and its digest — so that the
    /// signature can be checked before the TBSCertificate is read at all.
    public struct SignedEnvelope: Sendable {
        let tbs: ArraySlice<UInt8>
        let tbsContents: ArraySlice<UInt8>
        let outerAlgorithm: ArraySlice<UInt8>
        let signature: [UInt8]
        let signatureDigest: SignatureDigest

        public init(der: [UInt8]) throws {
            var outer = DER(der[...])
            guard var certificate = outer.read(0x30).map(DER.init), outer.isAtEnd else { throw ParseError("not one DER SEQUENCE") }
            guard let tbsTLV = certificate.readTLV(0x30) else { throw ParseError("no TBSCertificate") }
            guard let algorithm = certificate.read(0x30) else { throw ParseError("no signatureAlgorithm") }
            guard let signatureBits = certificate.read(0x03), certificate.isAtEnd else { throw ParseError("no signature BIT STRING, or trailing fields") }
            guard signatureBits.first == 0, signatureBits.count > 1 else { throw ParseError("signature BIT STRING has unused bits") }
            tbs = tbsTLV.tlv
            tbsContents = tbsTLV.contents
            outerAlgorithm = algorithm
            signature = Array(signatureBits.dropFirst())
            signatureDigest = try LeafCertificate.signatureDigest(algorithm)
        }

        /// Whether `key` signed these TBS bytes (OpenSSL ECDSA over SHA-256 or SHA-384 of them).
        public func isSigned(by key: ECPublicKey) -> Bool {
            let signed = Array(tbs)
            return key.isValidSignature(signature, digest: signatureDigest == .sha256 ? sha256(signed) : sha384(signed))
        }
    }

    /// At most this many extensions (Apple's credential certificates carry five): bounds the work
    /// spent on a hostile certificate.
    static let maxExtensions = 32

    public init(der: [UInt8]) throws {
        try self.init(der: der, envelope: SignedEnvelope(der: der))
    }

    /// Reads the TBSCertificate of an envelope already parsed (and, on the verification path, verified).
    public init(der: [UInt8], envelope: SignedEnvelope) throws {
        self.der = der
        tbs = envelope.tbs
        signature = envelope.signature
        signatureDigest = envelope.signatureDigest
        let tbsTLV = (tlv: envelope.tbs, contents: envelope.tbsContents)
        let outerAlgorithm = envelope.outerAlgorithm

        var fields = DER(tbsTLV.contents)
        guard let version = fields.read(0xa0), version.elementsEqual([0x02, 0x01, 0x02]) else { throw ParseError("not an X.509 v3 certificate") }
        // A positive INTEGER of at most 20 bytes, minimally encoded.
        guard let serial = fields.read(0x02), !serial.isEmpty, serial.count <= 21, serial.first! & 0x80 == 0,
              serial.count == 1 || serial.first! != 0 || serial[serial.startIndex + 1] & 0x80 != 0 else { throw ParseError("bad serial number") }
        guard let innerAlgorithm = fields.read(0x30), innerAlgorithm.elementsEqual(outerAlgorithm) else {
            throw ParseError("inner and outer signature algorithms differ")
        }
        guard let issuerTLV = fields.readTLV(0x30) else { throw ParseError("no issuer Name") }
        issuer = issuerTLV.tlv
        guard var validity = fields.read(0x30).map(DER.init) else { throw ParseError("no validity") }
        notBefore = try Self.time(&validity)
        notAfter = try Self.time(&validity)
        guard validity.isAtEnd else { throw ParseError("validity has extra fields") }
        guard fields.read(0x30) != nil else { throw ParseError("no subject Name") }
        guard var spki = fields.read(0x30).map(DER.init), var algorithm = spki.read(0x30).map(DER.init),
              let keyBits = spki.read(0x03), spki.isAtEnd else { throw ParseError("bad SubjectPublicKeyInfo") }
        let keyType = algorithm.read(0x06)
        let curve = algorithm.read(0x06)
        guard keyBits.first == 0 else { throw ParseError("public key BIT STRING has unused bits") }
        publicKeyPoint = Array(keyBits.dropFirst())
        publicKeyIsP256 = algorithm.isAtEnd && keyType.map { $0.elementsEqual(Self.idECPublicKey) } == true
            && curve.map { $0.elementsEqual(Self.prime256v1) } == true && publicKeyPoint.count == 65 && publicKeyPoint.first == 0x04
        _ = fields.read(0x81)  // issuerUniqueID, tolerated
        _ = fields.read(0x82)  // subjectUniqueID, tolerated
        var parsed: [(oid: ArraySlice<UInt8>, critical: Bool, value: ArraySlice<UInt8>)] = []
        if let wrapper = fields.read(0xa3) {
            var outerList = DER(wrapper)
            guard var list = outerList.read(0x30).map(DER.init), outerList.isAtEnd, !list.isAtEnd else { throw ParseError("bad or empty extensions") }
            while !list.isAtEnd {
                guard parsed.count < Self.maxExtensions else { throw ParseError("more than \(Self.maxExtensions) extensions") }
                guard var ext = list.read(0x30).map(DER.init), let oid = ext.read(0x06), !oid.isEmpty else { throw ParseError("bad extension") }
                var critical = false
                if let flag = ext.read(0x01) {
                    // DER: BOOLEAN is one byte 0xff for TRUE; FALSE is the DEFAULT and must be omitted.
                    guard flag.elementsEqual([0xff]) else { throw ParseError("extension critical flag is not DER TRUE") }
                    critical = true
                }
                guard let value = ext.read(0x04), ext.isAtEnd else { throw ParseError("bad extension value") }
                guard !parsed.contains(where: { $0.oid.elementsEqual(oid) }) else { throw ParseError("duplicate extension") }
                parsed.append((oid, critical, value))
            }
        }
        guard fields.isAtEnd else { throw ParseError("unexpected fields after extensions") }
        extensions = parsed
    }

    /// The contents of the extnValue OCTET STRING for a dotted OID.
    public func extensionValue(oid dotted: String) -> [UInt8]? {
        guard let encoded = Self.encodeOID(dotted) else { return nil }
        return extensions.first { $0.oid.elementsEqual(encoded) }.map { Array($0.value) }
    }

    /// What an end-entity certificate must not carry: a critical extension we do not understand,
    /// or basic constraints that make it a CA.
    func checkEndEntityExtensions() throws {
        for ext in extensions {
            if ext.oid.elementsEqual(Self.basicConstraints) {
                var value = DER(ext.value)
                guard var constraints = value.read(0x30).map(DER.init), value.isAtEnd else { throw ParseError("bad basic constraints") }
                if let isCA = constraints.read(0x01) {
                    // DER: cA is omitted when FALSE, so a present BOOLEAN must be TRUE (0xff) — a CA.
                    throw ParseError(isCA.elementsEqual([0xff]) ? "leaf certificate is a CA certificate" : "basic constraints cA is not DER")
                }
            } else if ext.critical && !ext.oid.elementsEqual(Self.keyUsage) {
                throw ParseError("unrecognised critical extension")
            }
        }
    }

    static func signatureDigest(_ algorithm: ArraySlice<UInt8>) throws -> SignatureDigest {
        var reader = DER(algorithm)
        guard let oid = reader.read(0x06), reader.isAtEnd else { throw ParseError("signature algorithm has parameters or no OID") }
        if oid.elementsEqual(ecdsaWithSHA256) { return .sha256 }
        if oid.elementsEqual(ecdsaWithSHA384) { return .sha384 }
        throw ParseError("signature algorithm is not ECDSA with SHA-256 or SHA-384")
    }

    /// UTCTime `YYMMDDHHMMSSZ` (years 1950–2049) or GeneralizedTime `YYYYMMDDHHMMSSZ`, as DER requires.
    static func time(_ reader: inout DER) throws -> Date {
        let utc = reader.peekTag == 0x17
        guard let text = reader.read(utc ? 0x17 : 0x18) else { throw ParseError("bad validity time") }
        let digits = Array(text)
        guard digits.count == (utc ? 13 : 15), digits.last == UInt8(ascii: "Z"),
              digits.dropLast().allSatisfy({ (0x30...0x39).contains($0) }) else { throw ParseError("validity time is not DER UTCTime/GeneralizedTime") }
        func number(_ start: Int, _ length: Int) -> Int { digits[start..<start + length].reduce(0) { $0 * 10 + Int($1 - 0x30) } }
        var year = utc ? number(0, 2) : number(0, 4)
        if utc { year += year < 50 ? 2000 : 1900 }
        let o = utc ? 2 : 4
        let (month, day, hour, minute, second) = (number(o, 2), number(o + 2, 2), number(o + 4, 2), number(o + 6, 2), number(o + 8, 2))
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
        let monthDays = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard (1...12).contains(month), (1...monthDays[month - 1]).contains(day), hour < 24, minute < 60, second < 60 else {
            throw ParseError("validity time out of range")
        }
        // RFC 5280 §4.1.2.5: dates through 2049 are UTCTime, from 2050 GeneralizedTime.
        guard utc || year >= 2050 else { throw ParseError("GeneralizedTime used for a year before 2050") }
        // Days from the civil date (proleptic Gregorian), then seconds since 1970.
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        return Date(timeIntervalSince1970: TimeInterval(days * 86_400 + hour * 3600 + minute * 60 + second))
    }

    /// DER contents of a dotted OID (at least two arcs); nil for anything that is not a valid OID.
    static func encodeOID(_ dotted: String) -> [UInt8]? {
        let parts = dotted.split(separator: ".", omittingEmptySubsequences: false)
        let arcs = parts.compactMap { UInt64($0) }
        guard arcs.count >= 2, arcs.count == parts.count, arcs[0] <= 2,
              arcs[0] == 2 ? arcs[1] <= UInt64.max - 80 : arcs[1] < 40 else { return nil }
        var out: [UInt8] = []
        for arc in [arcs[0] * 40 + arcs[1]] + arcs.dropFirst(2) {
            var chunk: [UInt8] = [UInt8(arc & 0x7f)]
            var rest = arc >> 7
            while rest > 0 { chunk.insert(UInt8(rest & 0x7f) | 0x80, at: 0); rest >>= 7 }
            out += chunk
        }
        return out
    }
}

/// A cursor over definite-length DER TLVs that never reads past its slice.
public struct DER {
    private(set) var bytes: ArraySlice<UInt8>

    public init(_ bytes: ArraySlice<UInt8>) { self.bytes = bytes }

    public var isAtEnd: Bool { bytes.isEmpty }
    var peekTag: UInt8? { bytes.first }

    /// The contents of the next element if its tag is `tag`, else nil (and nothing consumed).
    public mutating func read(_ tag: UInt8) -> ArraySlice<UInt8>? { readTLV(tag)?.contents }

    /// The next element, whole (`tlv`) and its contents, if its tag is `tag`.
    mutating func readTLV(_ tag: UInt8) -> (tlv: ArraySlice<UInt8>, contents: ArraySlice<UInt8>)? {
        guard let first = bytes.first, first == tag else { return nil }
        return readElement(headerLength: 1)
    }

    /// The next element if it is context-specific and constructed, with its tag number: high tag
    /// numbers included (BF 8A 78 is [1400]), in at most three bytes.
    public mutating func readContextConstructed() -> (tag: Int, contents: ArraySlice<UInt8>)? {
        guard let first = bytes.first, first & 0xe0 == 0xa0 else { return nil }
        guard first & 0x1f == 0x1f else {
            return readElement(headerLength: 1).map { (Int(first & 0x1f), $0.contents) }
        }
        var tag = 0
        var cursor = bytes.startIndex + 1
        while true {
            guard cursor < bytes.endIndex, cursor - bytes.startIndex <= 3 else { return nil }
            let byte = bytes[cursor]
            // DER: the shortest form, so no leading 0x80 group.
            guard tag != 0 || byte != 0x80 else { return nil }
            tag = tag << 7 | Int(byte & 0x7f)
            cursor += 1
            if byte & 0x80 == 0 { break }
        }
        guard tag >= 31 else { return nil }
        return readElement(headerLength: cursor - bytes.startIndex).map { (tag, $0.contents) }
    }

    /// Reads the length after a tag of `headerLength` bytes, then the element.
    private mutating func readElement(headerLength: Int) -> (tlv: ArraySlice<UInt8>, contents: ArraySlice<UInt8>)? {
        var cursor = bytes.startIndex + headerLength
        guard cursor < bytes.endIndex else { return nil }
        let first = bytes[cursor]
        cursor += 1
        var length = 0
        if first < 0x80 {
            length = Int(first)
        } else {
            // Long form: 1–3 length bytes (certificates are far below 16 MiB), minimal, no leading zero.
            let count = Int(first & 0x7f)
            guard (1...3).contains(count), bytes.endIndex - cursor >= count, bytes[cursor] != 0 else { return nil }
            for _ in 0..<count { length = length << 8 | Int(bytes[cursor]); cursor += 1 }
            guard length >= 0x80 else { return nil }
        }
        guard bytes.endIndex - cursor >= length else { return nil }
        let tlv = bytes[bytes.startIndex..<cursor + length]
        let contents = bytes[cursor..<cursor + length]
        bytes = bytes[(cursor + length)...]
        return (tlv, contents)
    }
}

/// Minimal DER encoding, for the structures the test authority issues.
public enum DERWriter {
    public static func tlv(_ tag: UInt8, _ contents: [UInt8]) -> [UInt8] { [tag] + length(contents.count) + contents }

    /// A context-specific constructed element `[tag]`, high tag numbers included.
    public static func contextConstructed(_ tag: Int, _ contents: [UInt8]) -> [UInt8] {
        guard tag >= 31 else { return tlv(0xa0 | UInt8(tag), contents) }
        var digits: [UInt8] = [UInt8(tag & 0x7f)]
        var rest = tag >> 7
        while rest > 0 { digits.insert(UInt8(rest & 0x7f) | 0x80, at: 0); rest >>= 7 }
        return [0xbf] + digits + length(contents.count) + contents
    }

    static func length(_ n: Int) -> [UInt8] {
        if n < 0x80 { return [UInt8(n)] }
        if n < 0x100 { return [0x81, UInt8(n)] }
        if n < 0x10000 { return [0x82, UInt8(n >> 8), UInt8(n & 0xff)] }
        return [0x83, UInt8(n >> 16), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)]
    }
}

/// Test access to the time parser (a UTCTime or GeneralizedTime TLV built from its text).
public enum LeafCertificateTimes {
    public static func parse(_ text: [UInt8], tag: UInt8) throws -> Date {
        guard text.count < 0x80 else { throw LeafCertificate.ParseError("time too long") }
        var reader = DER(([tag, UInt8(text.count)] + text)[...])
        return try LeafCertificate.time(&reader)
    }
}
