import AppAttest
import AttestCrypto
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
            let x5c = try CBORDecoder.decode(sample.attestation)["attStmt"]?["x5c"]?.arrayValue?.compactMap(\.bytesValue) ?? []
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
