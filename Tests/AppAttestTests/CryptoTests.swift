import AttestWire
import AttestCrypto
import Foundation
import Testing

@Suite struct CryptoTests {
    @Test func p256PointsRoundTripAndOffCurvePointsAreRefused() throws {
        for _ in 0..<50 {
            let key = try ECPrivateKey.generate().publicKey()
            let rebuilt = try ECPublicKey(p256Point: key.x962)
            #expect(rebuilt.x962 == key.x962)
            #expect(rebuilt.isP256)
        }
        var point = try ECPrivateKey.generate().publicKey().x962
        point[64] ^= 0x01  // y no longer on the curve
        #expect(throws: CryptoError.self) { try ECPublicKey(p256Point: point) }
        #expect(throws: CryptoError.self) { try ECPublicKey(p256Point: Array(point.prefix(33))) }
        #expect(throws: CryptoError.self) { try ECPublicKey(p256Point: [UInt8](repeating: 0, count: 65)) }
    }

    @Test func signaturesVerifyOnlyForTheSignedMessage() throws {
        let key = try ECPrivateKey.generate()
        let signature = try key.signSHA256(Array("message".utf8))
        #expect(try key.publicKey().isValidSignature(signature, sha256Of: Array("message".utf8)))
        #expect(try !key.publicKey().isValidSignature(signature, sha256Of: Array("massage".utf8)))
        #expect(try !key.publicKey().isValidSignature([0x30, 0x00], sha256Of: Array("message".utf8)))
    }

    /// Signing contexts are kept and reused: from many threads at once every signature is still
    /// over its own message (a context shared by two signers at a time would mix them up), and
    /// ECDSA's random nonce makes no two alike.
    @Test(arguments: ["P-256", "P-384"])
    func reusedSigningContextsSignEachMessageFromManyThreads(curve: String) async throws {
        let key = try ECPrivateKey.generate(curve: curve)
        let publicKey = try key.publicKey()
        let signatures = try await withThrowingTaskGroup(of: (Int, [UInt8]).self) { group in
            for index in 0..<64 {
                group.addTask { (index, try key.signSHA256(Array("message \(index)".utf8))) }
            }
            return try await group.reduce(into: [Int: [UInt8]]()) { $0[$1.0] = $1.1 }
        }
        #expect(signatures.count == 64)
        for (index, signature) in signatures {
            #expect(publicKey.isValidSignature(signature, sha256Of: Array("message \(index)".utf8)))
            #expect(!publicKey.isValidSignature(signature, sha256Of: Array("message \(index + 1)".utf8)))
        }
        #expect(Set(signatures.values).count == 64)
        // Over a digest directly: the same as over the message it is the hash of.
        let digest = sha256(Array("abc".utf8))
        #expect(publicKey.isValidSignature(try key.sign(digest: digest), digest: digest))
    }

    @Test func sha256KnownAnswerAndConstantTimeCompare() {
        #expect(hexString(sha256(Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(sha256(Array("ab".utf8), Array("c".utf8)) == sha256(Array("abc".utf8)))
        #expect(constantTimeEquals([1, 2, 3], [1, 2, 3]))
        #expect(!constantTimeEquals([1, 2, 3], [1, 2, 4]))
        #expect(!constantTimeEquals([1, 2, 3], [1, 2]))
    }

    @Test func appleRootFingerprintIsCheckedAtStartup() throws {
        // The embedded anchor matches the published fingerprint (and the copy in ../shared when present).
        let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("shared/fixtures/apple")
        if let pem = try? String(contentsOf: directory.appendingPathComponent("Apple_App_Attestation_Root_CA.pem"), encoding: .utf8) {
            #expect(hexString(try Certificate(pem: pem).sha256Fingerprint) == "1cb9823ba28ba6ad2d33a006941de2ae4f513ef1d4e831b9f7e0fa7b6242c932")
        } else {
            print("SKIPPED: ../shared/fixtures/apple not found; compared the embedded root with the published fingerprint only")
        }
    }
}
