import AppAttest
@testable import AttestCrypto
import CBOR
import Foundation
import Testing
import TestAuthority

/// The strict leaf parser against OpenSSL's own parse of the same certificates, and against
/// every truncation and single-byte mutation of them.
@Suite struct LeafCertificateTests {
    static func leaves() throws -> [(name: String, leaf: [UInt8], intermediate: [UInt8])] {
        var result: [(String, [UInt8], [UInt8])] = []
        for sample in AppleSample.all() {
            let x5c = try CBORDecoder.decode(sample.attestation!.object)["attStmt"]?["x5c"]?.arrayValue?.compactMap(\.bytesValue) ?? []
            result.append((sample.name, x5c[0], x5c[1]))
        }
        let key = try DeviceKey.generate()
        let object = try TestAuthority.shared.attestation(key: key, appID: AppID(teamID: "ABCDE12345", bundleID: "a.b"),
                                                          clientDataHash: [UInt8](repeating: 1, count: 32))
        let x5c = try CBORDecoder.decode(object)["attStmt"]?["x5c"]?.arrayValue?.compactMap(\.bytesValue) ?? []
        result.append(("test authority", x5c[0], x5c[1]))
        return result
    }

    @Test func agreesWithOpenSSLOnEveryField() throws {
        for (name, der, intermediateDER) in try Self.leaves() {
            let ours = try LeafCertificate(der: der)
            let openssl = try Certificate(der: der)
            let intermediate = try Certificate(der: intermediateDER)
            #expect(ours.notBefore == openssl.notBefore, "\(name)")
            #expect(ours.notAfter == openssl.notAfter, "\(name)")
            #expect(ours.publicKeyIsP256, "\(name)")
            #expect(ours.publicKeyPoint == (try openssl.publicKey()).x962, "\(name)")
            #expect(ours.extensionValue(oid: "1.2.840.113635.100.8.2") == openssl.extensionValue(oid: "1.2.840.113635.100.8.2"), "\(name)")
            #expect(ours.extensionValue(oid: "2.5.29.15") == openssl.extensionValue(oid: "2.5.29.15"), "\(name)")
            #expect(ours.extensionValue(oid: "1.2.3.4") == nil)
            // The signature verifies with the issuer key exactly as OpenSSL's X509_verify says.
            #expect(openssl.isSignatureValid(issuerKey: try intermediate.publicKey()), "\(name)")
        }
    }

    @Test func truncationsAndTrailingBytesAreRefusedWithoutCrashing() throws {
        for (_, der, _) in try Self.leaves() {
            for length in stride(from: 0, to: der.count, by: 7) {
                #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificate(der: Array(der.prefix(length))) }
            }
            #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificate(der: der + [0]) }
        }
    }

    /// Every single-byte change either fails to parse, or parses to a certificate whose signature
    /// no longer verifies — the chain verifier never accepts it.
    @Test func everySingleByteMutationIsRejectedByTheChainVerifier() throws {
        let authority = TestAuthority.shared
        let verifier = CertificateChainVerifier(anchors: [authority.root])
        let key = try DeviceKey.generate()
        let object = try authority.attestation(key: key, appID: AppID(teamID: "ABCDE12345", bundleID: "a.b"),
                                               clientDataHash: [UInt8](repeating: 1, count: 32))
        let x5c = try CBORDecoder.decode(object)["attStmt"]?["x5c"]?.arrayValue?.compactMap(\.bytesValue) ?? []
        _ = try verifier.verify(chain: x5c, at: Date())
        for index in 0..<x5c[0].count {
            var mutated = x5c[0]
            mutated[index] ^= 0x5a
            #expect(throws: ChainError.self, "byte \(index)") { _ = try verifier.verify(chain: [mutated, x5c[1]], at: Date()) }
        }
    }

    @Test func timesParseAsDERRequires() throws {
        // 2049 is the last UTCTime year; 2050 onwards is GeneralizedTime.
        let utc = try LeafCertificateTimes.parse(Array("491231235959Z".utf8), tag: 0x17)
        #expect(utc == ISO8601DateFormatter().date(from: "2049-12-31T23:59:59Z"))
        #expect(try LeafCertificateTimes.parse(Array("500101000000Z".utf8), tag: 0x17) == ISO8601DateFormatter().date(from: "1950-01-01T00:00:00Z"))
        #expect(try LeafCertificateTimes.parse(Array("20500101000000Z".utf8), tag: 0x18) == ISO8601DateFormatter().date(from: "2050-01-01T00:00:00Z"))
        for bad in ["4912312359Z", "491231235959", "491331235959Z", "49123123595AZ", "491231235960Z"] {
            #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificateTimes.parse(Array(bad.utf8), tag: 0x17) }
        }
    }
}

/// Hand-built certificates (unsigned: these exercise the parser's refusals, not trust).
@Suite struct LeafCertificateShapeTests {
    static func tlv(_ tag: UInt8, _ contents: [UInt8]) -> [UInt8] {
        let n = contents.count
        let length: [UInt8] = n < 0x80 ? [UInt8(n)] : n < 0x100 ? [0x81, UInt8(n)] : [0x82, UInt8(n >> 8), UInt8(n & 0xff)]
        return [tag] + length + contents
    }

    static let algorithm = tlv(0x30, tlv(0x06, [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]))
    static let name = tlv(0x30, tlv(0x31, tlv(0x30, tlv(0x06, [0x55, 0x04, 0x03]) + tlv(0x0c, Array("x".utf8)))))
    static let validity = tlv(0x30, tlv(0x17, Array("250101000000Z".utf8)) + tlv(0x17, Array("260101000000Z".utf8)))
    static let spki = tlv(0x30, tlv(0x30, tlv(0x06, [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]) + tlv(0x06, [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]))
                             + tlv(0x03, [0x00, 0x04] + [UInt8](repeating: 1, count: 64)))

    static func certificate(serial: [UInt8] = [0x01], extensions: [[UInt8]]? = []) -> [UInt8] {
        var tbs = tlv(0xa0, tlv(0x02, [0x02])) + tlv(0x02, serial) + algorithm + name + validity + name + spki
        if let extensions { tbs += tlv(0xa3, tlv(0x30, extensions.flatMap { $0 })) }
        return tlv(0x30, tlv(0x30, tbs) + algorithm + tlv(0x03, [0x00, 0x30, 0x00]))
    }

    static func ext(_ oid: [UInt8], critical: Bool = false, _ value: [UInt8]) -> [UInt8] {
        tlv(0x30, tlv(0x06, oid) + (critical ? tlv(0x01, [0xff]) : []) + tlv(0x04, value))
    }

    @Test func aWellFormedCertificateParses() throws {
        let leaf = try LeafCertificate(der: Self.certificate(extensions: [Self.ext([0x55, 0x1d, 0x0f], critical: true, [0x03, 0x02, 0x07, 0x80])]))
        #expect(leaf.publicKeyIsP256)
        #expect(leaf.extensionValue(oid: "2.5.29.15") == [0x03, 0x02, 0x07, 0x80])
        #expect(leaf.notBefore == ISO8601DateFormatter().date(from: "2025-01-01T00:00:00Z"))
    }

    @Test func hostileShapesAreRefused() throws {
        let many = (0..<33).map { Self.ext([0x2a, UInt8($0)], [0x05, 0x00]) }
        #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificate(der: Self.certificate(extensions: many)) }
        #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificate(der: Self.certificate(extensions: [])) }   // empty SEQUENCE
        #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificate(der: Self.certificate(serial: [0x80])) }   // negative
        #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificate(der: Self.certificate(serial: [0x00, 0x01])) }   // not minimal
        #expect(throws: LeafCertificate.ParseError.self) {
            try LeafCertificate(der: Self.certificate(extensions: [Self.ext([0x2a, 0x01], [0x05, 0x00]), Self.ext([0x2a, 0x01], [0x05, 0x00])]))
        }
        #expect(try LeafCertificate(der: Self.certificate(serial: [0x00, 0x80], extensions: nil)).extensionValue(oid: "1.2") == nil)
    }

    @Test func endEntityRulesRefuseCAsAndUnknownCriticalExtensions() throws {
        let basicConstraints: [UInt8] = [0x55, 0x1d, 0x13]
        for value in [[0x30, 0x03, 0x01, 0x01, 0xff], [0x30, 0x03, 0x01, 0x01, 0x01], [0x30, 0x03, 0x01, 0x01, 0x00]] as [[UInt8]] {
            let leaf = try LeafCertificate(der: Self.certificate(extensions: [Self.ext(basicConstraints, critical: true, value)]))
            #expect(throws: LeafCertificate.ParseError.self) { try leaf.checkEndEntityExtensions() }
        }
        let fine = try LeafCertificate(der: Self.certificate(extensions: [Self.ext(basicConstraints, critical: true, [0x30, 0x00])]))
        #expect(throws: Never.self) { try fine.checkEndEntityExtensions() }
        let unknown = try LeafCertificate(der: Self.certificate(extensions: [Self.ext([0x2a, 0x03], critical: true, [0x05, 0x00])]))
        #expect(throws: LeafCertificate.ParseError.self) { try unknown.checkEndEntityExtensions() }
    }

    @Test func calendarAndTimeTypeRules() {
        #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificateTimes.parse(Array("250230000000Z".utf8), tag: 0x17) }   // Feb 30
        #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificateTimes.parse(Array("230229000000Z".utf8), tag: 0x17) }   // not a leap year
        #expect(throws: Never.self) { try LeafCertificateTimes.parse(Array("240229000000Z".utf8), tag: 0x17) }
        #expect(throws: LeafCertificate.ParseError.self) { try LeafCertificateTimes.parse(Array("20250101000000Z".utf8), tag: 0x18) }   // must be UTCTime
    }

    @Test func invalidOIDsNameNothingAndNeverTrap() throws {
        let leaf = try LeafCertificate(der: Self.certificate(extensions: nil))
        for oid in ["2.18446744073709551615", "1.40", "1..2", "3.1", "1", "", "1.2.x"] {
            #expect(leaf.extensionValue(oid: oid) == nil, "\(oid)")
        }
    }
}
