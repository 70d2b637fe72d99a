@testable import AttestCrypto
import Foundation
import Testing
import TestAuthority

/// The receipt envelope read by the project's own BER reader, each of its checks broken on its
/// own, on receipts of the test receipt authority; and the remembered signer never standing in
/// for a signature or a validity check.
@Suite struct SignedDataTests {
    let now = Date(timeIntervalSince1970: 1_790_000_000)
    let payload = Array("a receipt's payload, signed as Apple signs receipts".utf8)
    var authority: TestReceiptAuthority { TestReceiptAuthority.shared }
    var verifier: SignedDataVerifier { authority.verifier().signedData }

    func refusal(_ der: [UInt8], by verifier: SignedDataVerifier? = nil, at time: Date? = nil) -> SignedDataError? {
        do { _ = try (verifier ?? self.verifier).verify(der, at: time ?? now); return nil } catch { return error }
    }

    /// `bytes` with the last occurrence of `part` changed by `change`.
    func mutating(_ bytes: [UInt8], _ part: [UInt8], _ change: (inout [UInt8]) -> Void) throws -> [UInt8] {
        let start = try #require((0...(bytes.count - part.count)).reversed().first { bytes[$0...].starts(with: part) }, "part not found")
        var mutated = Array(part)
        change(&mutated)
        return Array(bytes[..<start]) + mutated + Array(bytes[(start + part.count)...])
    }

    @Test func anAppleShapedReceiptIsReadWhole() throws {
        let der = try authority.sign(payload: payload)
        let parsed = try CMSSignedData(der)
        #expect(parsed.content == payload)
        #expect(parsed.certificates.count == 3, "signer, intermediate, root")
        #expect(parsed.signedAttributes == nil && parsed.isECDSA)
        #expect(try verifier.verify(der, at: now).content == payload)
    }

    @Test func indefiniteLengthsAndConstructedOctetsAreRead() throws {
        // BER as Apple writes it: the same SignedData with every constructed length indefinite
        // and the content split into two octet segments.
        let der = try authority.sign(payload: payload)
        let indefinite = try Self.reencodedIndefinite(der[...])
        #expect(indefinite != der)
        #expect(try CMSSignedData(indefinite).content == payload)
        #expect(try verifier.verify(indefinite, at: now).content == payload)
    }

    @Test func signedAttributesAreCheckedWhenPresent() throws {
        let der = try authority.sign(payload: payload, signedAttributes: true)
        #expect(try CMSSignedData(der).signedAttributes != nil)
        #expect(try verifier.verify(der, at: now).content == payload)
        // The message digest attribute no longer names the content.
        let wrongDigest = try mutating(der, sha256(payload)) { $0[0] ^= 0x01 }
        #expect(refusal(wrongDigest).map { if case .signature = $0 { true } else { false } } == true, "\(String(describing: refusal(wrongDigest)))")
        // The content changed under intact attributes.
        let wrongContent = try mutating(der, payload) { $0[0] ^= 0x01 }
        #expect(refusal(wrongContent).map { if case .signature = $0 { true } else { false } } == true)
    }

    @Test func eachEnvelopeCheckRefusesOnItsOwn() throws {
        let der = try authority.sign(payload: payload)
        let parsed = try CMSSignedData(der)
        func malformed(_ bytes: [UInt8], _ expected: String) {
            let error = refusal(bytes)
            #expect(error.map { if case .malformed(let detail) = $0 { expected.isEmpty || detail.contains(expected) } else { false } } == true,
                    "expected malformed with \(expected): \(String(describing: error))")
        }
        malformed(der + [0], "after the ContentInfo")
        malformed(try mutating(der, CMSSignedData.signedDataOID) { $0[$0.count - 1] = 0x03 }, "not SignedData")
        malformed(try mutating(der, CMSSignedData.dataOID) { $0[$0.count - 1] = 0x05 }, "not id-data")
        malformed(Array(der.prefix(der.count - 7)), "")
        // The signer's identifier names no certificate of the set (its serial number changed).
        malformed(try mutating(der, Array(parsed.signerID)) { $0[$0.count - 1] ^= 0x01 }, "no certificate of the set")
        // A digest algorithm that is not SHA-2.
        malformed(try mutating(der, [0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01]) { $0[$0.count - 1] = 0x09 }, "digest algorithm")
        // The signature itself.
        let badSignature = try mutating(der, parsed.signature) { $0[$0.count - 1] ^= 0x01 }
        #expect(refusal(badSignature).map { if case .signature = $0 { true } else { false } } == true)
    }

    @Test func theRememberedSignerNeverStandsInForASignatureOrATime() throws {
        let verifier = authority.verifier().signedData
        let der = try authority.sign(payload: payload)
        #expect(try verifier.verify(der, at: now).content == payload)   // the signer is remembered now
        let parsed = try CMSSignedData(der)
        let badSignature = try mutating(der, parsed.signature) { $0[$0.count - 1] ^= 0x01 }
        #expect(refusal(badSignature, by: verifier).map { if case .signature = $0 { true } else { false } } == true)
        let tooLate = refusal(der, by: verifier, at: authority.signer.notAfter.addingTimeInterval(1))
        #expect(tooLate.map { if case .chain = $0 { true } else { false } } == true, "\(String(describing: tooLate))")
        #expect(try verifier.verify(der, at: now).content == payload)
    }

    @Test func junkNeverCrashesTheReader() throws {
        let der = try authority.sign(payload: payload)
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2_000 {
            var bytes = der
            for _ in 0..<Int.random(in: 1...4, using: &generator) { bytes[Int.random(in: 0..<bytes.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator) }
            if let content = try? verifier.verify(bytes, at: now).content { #expect(content == payload) }
        }
        for cut in stride(from: 0, to: der.count, by: 7) { #expect(refusal(Array(der.prefix(cut))) != nil) }
    }

    /// `tlv` re-encoded with indefinite lengths on every constructed element, and every
    /// primitive OCTET STRING over 8 bytes in the envelope split into a constructed one. The
    /// certificates stay DER, as in Apple's receipts.
    static func reencodedIndefinite(_ tlv: ArraySlice<UInt8>) throws -> [UInt8] {
        var reader = BER(tlv)
        let element = try reader.next()
        if element.tag == 0x04, element.contents.count > 8 {
            let half = element.contents.count / 2
            return [0x24, 0x80] + DERWriter.tlv(0x04, Array(element.contents.prefix(half))) + DERWriter.tlv(0x04, Array(element.contents.dropFirst(half))) + [0, 0]
        }
        // Certificates (a SEQUENCE starting with a SEQUENCE whose first element is [0] version) stay DER.
        guard element.isConstructed, !isCertificate(element) else { return Array(element.tlv) }
        var inner = BER(element.contents), out: [UInt8] = [element.tag, 0x80]
        while !inner.isAtEnd { out += try reencodedIndefinite(try inner.next().tlv) }
        return out + [0, 0]
    }

    static func isCertificate(_ element: BER.Element) -> Bool {
        guard element.tag == 0x30 else { return false }
        var reader = BER(element.contents)
        guard let tbs = try? reader.next(), tbs.tag == 0x30 else { return false }
        var fields = BER(tbs.contents)
        return fields.peekTag == 0xa0 && (try? fields.next()) != nil && fields.peekTag == 0x02
    }
}
