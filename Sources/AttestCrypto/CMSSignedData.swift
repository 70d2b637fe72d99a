/// A cursor over BER TLVs, definite and indefinite lengths (Apple writes its receipts' CMS
/// envelope with indefinite lengths; the certificates inside are DER). Single-byte tags only, as
/// CMS uses; it never reads past its slice, and indefinite nesting is bounded.
struct BER {
    struct Element {
        let tag: UInt8
        /// The whole element, header and end-of-contents marker included.
        let tlv: ArraySlice<UInt8>
        /// Its contents (without an indefinite length's end-of-contents marker).
        let contents: ArraySlice<UInt8>
        var isConstructed: Bool { tag & 0x20 != 0 }
    }

    struct Malformed: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    private(set) var bytes: ArraySlice<UInt8>
    /// Indefinite lengths nest at most this deep (Apple's receipts use four).
    static let maxDepth = 16

    init(_ bytes: ArraySlice<UInt8>) { self.bytes = bytes }

    var isAtEnd: Bool { bytes.isEmpty }
    var peekTag: UInt8? { bytes.first }

    mutating func next() throws(Malformed) -> Element {
        let (element, rest) = try Self.element(at: bytes, depth: 0)
        bytes = rest
        return element
    }

    /// The next element, which must have tag `tag`.
    mutating func read(_ tag: UInt8, _ what: String) throws(Malformed) -> Element {
        guard peekTag == tag else {
            throw Malformed("\(what): expected tag 0x\(String(tag, radix: 16)), found \(peekTag.map { "0x" + String($0, radix: 16) } ?? "the end")")
        }
        return try next()
    }

    /// The next element when its tag is `tag`, else nil (nothing consumed).
    mutating func optional(_ tag: UInt8) throws(Malformed) -> Element? {
        peekTag == tag ? try next() : nil
    }

    private static func element(at bytes: ArraySlice<UInt8>, depth: Int) throws(Malformed) -> (Element, ArraySlice<UInt8>) {
        var cursor = bytes.startIndex
        guard cursor < bytes.endIndex else { throw Malformed("an element is cut short") }
        let tag = bytes[cursor]
        guard tag & 0x1f != 0x1f else { throw Malformed("a multi-byte tag") }
        guard tag != 0 else { throw Malformed("an end-of-contents marker where an element belongs") }
        cursor += 1
        guard cursor < bytes.endIndex else { throw Malformed("an element has no length") }
        let first = bytes[cursor]
        cursor += 1
        if first == 0x80 {
            // Indefinite: constructed only; the contents are elements up to a 00 00 marker.
            guard tag & 0x20 != 0 else { throw Malformed("an indefinite length on a primitive element") }
            guard depth < maxDepth else { throw Malformed("indefinite lengths nest deeper than \(maxDepth)") }
            let start = cursor
            var rest = bytes[cursor...]
            while true {
                guard rest.count >= 2 else { throw Malformed("an indefinite length has no end-of-contents marker") }
                if rest[rest.startIndex] == 0, rest[rest.startIndex + 1] == 0 { break }
                rest = try element(at: rest, depth: depth + 1).1
            }
            let end = rest.startIndex
            let after = end + 2
            return (Element(tag: tag, tlv: bytes[bytes.startIndex..<after], contents: bytes[start..<end]), bytes[after...])
        }
        var length = 0
        if first < 0x80 {
            length = Int(first)
        } else {
            let count = Int(first & 0x7f)
            guard (1...3).contains(count), bytes.endIndex - cursor >= count else { throw Malformed("a length of \(count) bytes") }
            for _ in 0..<count { length = length << 8 | Int(bytes[cursor]); cursor += 1 }
        }
        guard bytes.endIndex - cursor >= length else { throw Malformed("an element runs past its container") }
        let end = cursor + length
        return (Element(tag: tag, tlv: bytes[bytes.startIndex..<end], contents: bytes[cursor..<end]), bytes[end...])
    }

    /// The element with definite lengths throughout (BER's other freedoms are not undone): how
    /// a name written with indefinite lengths compares with a certificate's DER.
    static func definite(_ element: Element) throws(Malformed) -> [UInt8] {
        guard element.isConstructed else { return Array(element.tlv) }
        var reader = BER(element.contents), contents: [UInt8] = []
        while !reader.isAtEnd { contents += try definite(try reader.next()) }
        return DERWriter.tlv(element.tag, contents)
    }

    /// An OCTET STRING's bytes: primitive, or constructed from primitive segments (BER).
    static func octets(_ element: Element, _ what: String) throws(Malformed) -> [UInt8] {
        if element.tag == 0x04 { return Array(element.contents) }
        guard element.tag == 0x24 else { throw Malformed("\(what) is not an OCTET STRING") }
        var reader = BER(element.contents), out: [UInt8] = []
        while !reader.isAtEnd { out += try octets(try reader.next(), what) }
        return out
    }
}

/// The parts of a CMS SignedData (RFC 5652) a receipt's verification reads, located by one
/// pass of `BER` over the bytes: nothing decoded beyond them, no certificate parsed.
struct CMSSignedData {
    static let signedDataOID: [UInt8] = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02]   // 1.2.840.113549.1.7.2
    static let dataOID: [UInt8] = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x01]         // 1.2.840.113549.1.7.1
    static let contentTypeAttribute: [UInt8] = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x03]
    static let messageDigestAttribute: [UInt8] = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x04]

    enum DigestAlgorithm {
        case sha256, sha384, sha512
        /// From an AlgorithmIdentifier's OID (2.16.840.1.101.3.4.2.1/2/3).
        init?(oid: ArraySlice<UInt8>) {
            let prefix: [UInt8] = [0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02]
            guard oid.count == 9, oid.starts(with: prefix) else { return nil }
            switch oid.last {
            case 1: self = .sha256
            case 2: self = .sha384
            case 3: self = .sha512
            default: return nil
            }
        }
        func digest(_ bytes: [UInt8]) -> [UInt8] {
            switch self {
            case .sha256: digestSHA256(bytes)
            case .sha384: digestSHA384(bytes)
            case .sha512: digestSHA512(bytes)
            }
        }
    }

    /// The encapsulated content (id-data), its octets joined.
    let content: [UInt8]
    /// Every certificate of the set, as its own DER.
    let certificates: [ArraySlice<UInt8>]
    /// The one signer's identifier (IssuerAndSerialNumber or [0] SubjectKeyIdentifier), whole.
    let signerID: ArraySlice<UInt8>
    let digestAlgorithm: DigestAlgorithm
    /// The signature algorithm's OID: ECDSA with a SHA-2 digest, or a bare EC key's.
    let signatureAlgorithm: ArraySlice<UInt8>
    /// The signed attributes' contents, when present (the signature then covers them, re-tagged SET).
    let signedAttributes: ArraySlice<UInt8>?
    let signature: [UInt8]

    init(_ der: [UInt8]) throws(BER.Malformed) {
        var top = BER(der[...])
        let contentInfo = try top.read(0x30, "ContentInfo")
        guard top.isAtEnd else { throw BER.Malformed("\(top.bytes.count) bytes after the ContentInfo") }
        var info = BER(contentInfo.contents)
        guard try info.read(0x06, "contentType").contents.elementsEqual(Self.signedDataOID) else { throw BER.Malformed("not SignedData") }
        var explicit = BER(try info.read(0xa0, "content").contents)
        var signedData = BER(try explicit.read(0x30, "SignedData").contents)
        _ = try signedData.read(0x02, "version")
        _ = try signedData.read(0x31, "digestAlgorithms")
        var encapsulated = BER(try signedData.read(0x30, "encapContentInfo").contents)
        guard try encapsulated.read(0x06, "eContentType").contents.elementsEqual(Self.dataOID) else {
            throw BER.Malformed("the content is not id-data")
        }
        guard let eContent = try encapsulated.optional(0xa0) else { throw BER.Malformed("the content is not inside (detached)") }
        var eContentReader = BER(eContent.contents)
        content = try BER.octets(try eContentReader.next(), "eContent")
        var certificates: [ArraySlice<UInt8>] = []
        if let set = try signedData.optional(0xa0) {
            var reader = BER(set.contents)
            while !reader.isAtEnd { certificates.append(try reader.read(0x30, "certificate").tlv) }
        }
        self.certificates = certificates
        _ = try signedData.optional(0xa1)   // CRLs: not read
        var signerInfos = BER(try signedData.read(0x31, "signerInfos").contents)
        var signerInfo = BER(try signerInfos.read(0x30, "SignerInfo").contents)
        guard signerInfos.isAtEnd else { throw BER.Malformed("SignedData must have exactly one signer") }
        _ = try signerInfo.read(0x02, "SignerInfo version")
        var sid = try signerInfo.optional(0x30)
        if sid == nil { sid = try signerInfo.optional(0x80) }
        guard let sid else { throw BER.Malformed("the signer has no identifier") }
        signerID = sid.tlv
        var digest = BER(try signerInfo.read(0x30, "digestAlgorithm").contents)
        guard let algorithm = DigestAlgorithm(oid: try digest.read(0x06, "digestAlgorithm OID").contents) else {
            throw BER.Malformed("digest algorithm is not SHA-256, SHA-384 or SHA-512")
        }
        digestAlgorithm = algorithm
        signedAttributes = try signerInfo.optional(0xa0)?.contents
        var signatureAlgorithmReader = BER(try signerInfo.read(0x30, "signatureAlgorithm").contents)
        signatureAlgorithm = try signatureAlgorithmReader.read(0x06, "signatureAlgorithm OID").contents
        signature = try BER.octets(try signerInfo.next(), "signature")
        _ = try signerInfo.optional(0xa1)
        guard signerInfo.isAtEnd else { throw BER.Malformed("unexpected fields after the signature") }
        guard !content.isEmpty else { throw BER.Malformed("empty content") }
    }

    /// ECDSA with SHA-256/384/512 (1.2.840.10045.4.3.2–4), or id-ecPublicKey (1.2.840.10045.2.1),
    /// which some signers write instead.
    var isECDSA: Bool {
        let ecdsaWithSHA2: [UInt8] = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03]
        let ecPublicKey: [UInt8] = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]
        if signatureAlgorithm.count == 8, signatureAlgorithm.starts(with: ecdsaWithSHA2), (2...4).contains(signatureAlgorithm.last!) { return true }
        return signatureAlgorithm.elementsEqual(ecPublicKey)
    }

    /// The digest the signature covers: the content's, or (with signed attributes) the
    /// attributes' DER as a SET, after checking that they name id-data and the content's digest.
    func signedDigest() throws(BER.Malformed) -> [UInt8] {
        let contentDigest = digestAlgorithm.digest(content)
        guard let attributes = signedAttributes else { return contentDigest }
        var reader = BER(attributes)
        var contentType: ArraySlice<UInt8>?, messageDigest: [UInt8]?
        while !reader.isAtEnd {
            var attribute = BER(try reader.read(0x30, "signed attribute").contents)
            let type = try attribute.read(0x06, "attribute type").contents
            var values = BER(try attribute.read(0x31, "attribute values").contents)
            let value = try values.next()
            guard values.isAtEnd else { throw BER.Malformed("a signed attribute with more than one value") }
            if type.elementsEqual(Self.contentTypeAttribute) {
                guard contentType == nil, value.tag == 0x06 else { throw BER.Malformed("the content-type attribute is repeated or not an OID") }
                contentType = value.contents
            } else if type.elementsEqual(Self.messageDigestAttribute) {
                guard messageDigest == nil else { throw BER.Malformed("the message-digest attribute is repeated") }
                messageDigest = try BER.octets(value, "message digest")
            }
        }
        guard contentType?.elementsEqual(Self.dataOID) == true else { throw BER.Malformed("the signed content-type attribute is not id-data") }
        guard let messageDigest, constantTimeEquals(messageDigest, contentDigest) else {
            throw BER.Malformed("the signed message digest is not the content's")
        }
        // DER of the attributes as signed: the [0] IMPLICIT tag becomes SET OF's.
        return digestAlgorithm.digest([0x31] + DERWriter.length(attributes.count) + Array(attributes))
    }
}

// The module's digests under names the cases above do not shadow (the fuzzers compile this file
// into modules of other names, so `AttestCrypto.sha256` cannot be written).
private func digestSHA256(_ bytes: [UInt8]) -> [UInt8] { sha256(bytes) }
private func digestSHA384(_ bytes: [UInt8]) -> [UInt8] { sha384(bytes) }
private func digestSHA512(_ bytes: [UInt8]) -> [UInt8] { sha512(bytes) }
