import AppAttest
import AttestClient
import AttestCrypto
import Foundation
import SimulatedDevice
import TestAuthority
import Testing
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

@Suite struct SoftwareAttesterTests {
    let appID = AppID(teamID: "ABCDE12345", bundleID: "com.example.app")
    let trusting = try! AppAttestVerifier(additionalAnchors: [TestAuthority.shared.root])

    /// A fresh directory path (not created yet) under the temporary directory.
    func temporaryDirectory() -> URL {
        FileManager.default.temporaryDirectory.appendingPathComponent("software-attester-\(UUID().uuidString)")
    }

    func mode(_ url: URL) -> mode_t {
        var info = stat()
        #expect(stat(url.path, &info) == 0, "stat \(url.path)")
        return info.st_mode & 0o777
    }

    func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    /// The counter an assertion carries, after checking its signature with `publicKey`.
    func counter(of assertion: Data, publicKey: ECPublicKey, hash: [UInt8]) throws -> UInt32 {
        try trusting.verifyAssertion([UInt8](assertion), publicKey: publicKey, clientDataHash: hash, appID: appID,
                                     previousCounter: 0).counter
    }

    func isMissingCredential(_ body: () async throws -> Data) async -> Bool {
        do {
            _ = try await body()
            return false
        } catch AttestClientError.missingCredential {
            return true
        } catch {
            return false
        }
    }

    @Test func keysPersistPrivatelyAndReloadInAnotherInstance() async throws {
        let parent = temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: parent) }
        let directory = parent.appendingPathComponent("keys")
        let first = SoftwareAttester(appID: appID, keyDirectory: directory)
        #expect(first.isSupported)
        let keyID = try await first.generateKey()
        let raw = try #require(Data(base64Encoded: keyID))
        #expect(raw.count == 32)

        let keyFile = directory.appendingPathComponent("\(hex([UInt8](raw))).pem")
        #expect(mode(directory) == 0o700)
        #expect(mode(keyFile) == 0o600)
        let key = try DeviceKey(privateKey: ECPrivateKey(pem: String(contentsOf: keyFile, encoding: .utf8)))
        #expect(key.keyID == [UInt8](raw))

        // A new instance (a new run of the app) signs with the same key.
        let second = SoftwareAttester(appID: appID, keyDirectory: directory)
        let hash = sha256(Array("reload".utf8))
        let assertion = try await second.generateAssertion(keyID, clientDataHash: Data(hash))
        #expect(try counter(of: assertion, publicKey: key.publicKey, hash: hash) == 1)
        let counterFile = directory.appendingPathComponent("\(hex([UInt8](raw))).counter")
        #expect(mode(counterFile) == 0o600)
        // Nothing but the key and its counter: temporary files are renamed into place.
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()
        #expect(names == [counterFile.lastPathComponent, keyFile.lastPathComponent].sorted())
    }

    @Test func countersStrictlyIncreaseAcrossInstances() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let first = SoftwareAttester(appID: appID, keyDirectory: directory)
        let keyID = try await first.generateKey()
        let publicKey = try publicKey(of: try trusting.verifyAttestation(
            [UInt8](try await first.attestKey(keyID, clientDataHash: Data(sha256([1])))),
            keyID: [UInt8](Data(base64Encoded: keyID)!), clientDataHash: sha256([1]), allowedAppIDs: [appID], at: Date()))

        let hash = sha256(Array("counter".utf8))
        var counters: [UInt32] = []
        for _ in 0..<3 {
            counters.append(try counter(of: try await first.generateAssertion(keyID, clientDataHash: Data(hash)), publicKey: publicKey, hash: hash))
        }
        let second = SoftwareAttester(appID: appID, keyDirectory: directory)
        for _ in 0..<2 {
            counters.append(try counter(of: try await second.generateAssertion(keyID, clientDataHash: Data(hash)), publicKey: publicKey, hash: hash))
        }
        // Interleaved instances over the same directory never repeat a value either.
        counters.append(try counter(of: try await first.generateAssertion(keyID, clientDataHash: Data(hash)), publicKey: publicKey, hash: hash))
        #expect(counters == [1, 2, 3, 4, 5, 6])

        // Concurrent callers of one instance each get their own value.
        let concurrent = try await withThrowingTaskGroup(of: UInt32.self) { group in
            for _ in 0..<8 {
                group.addTask { try self.counter(of: try await second.generateAssertion(keyID, clientDataHash: Data(hash)), publicKey: publicKey, hash: hash) }
            }
            return try await group.reduce(into: [UInt32]()) { $0.append($1) }
        }
        #expect(concurrent.sorted() == Array(7...14))
    }

    @Test func inMemoryCountersIncreaseAndNothingIsShared() async throws {
        let attester = SoftwareAttester(appID: appID, keyDirectory: nil)
        let keyID = try attester.makeKey()
        let key = try trusting.verifyAttestation(
            try attester.makeAttestation(keyID: keyID, clientDataHash: sha256([2])),
            keyID: [UInt8](Data(base64Encoded: keyID)!), clientDataHash: sha256([2]), allowedAppIDs: [appID], at: Date())
        let publicKey = try publicKey(of: key)
        let hash = sha256([3])
        for expected in UInt32(1)...3 {
            #expect(try counter(of: Data(try attester.makeAssertion(keyID: keyID, clientDataHash: hash)), publicKey: publicKey, hash: hash) == expected)
        }
        let other = SoftwareAttester(appID: appID, keyDirectory: nil)
        #expect(await isMissingCredential { try await other.generateAssertion(keyID, clientDataHash: Data(hash)) })
    }

    @Test func attestationVerifiesOnlyWithTheTestAuthorityTrusted() async throws {
        let attester = SoftwareAttester(appID: appID, keyDirectory: nil)
        let keyID = try await attester.generateKey()
        let raw = [UInt8](try #require(Data(base64Encoded: keyID)))
        let hash = sha256(Array(repeating: 0x01, count: 32))
        let object = [UInt8](try await attester.attestKey(keyID, clientDataHash: Data(hash)))

        let verified = try trusting.verifyAttestation(object, keyID: raw, clientDataHash: hash, allowedAppIDs: [appID], at: Date())
        #expect(verified.keyID == raw)
        #expect(verified.appID == appID)
        #expect(verified.environment == .development)

        do {
            _ = try AppAttestVerifier().verifyAttestation(object, keyID: raw, clientDataHash: hash, allowedAppIDs: [appID], at: Date())
            Issue.record("Apple's root alone accepted the test authority")
        } catch let error as VerificationError {
            #expect(error.reason == .certificateChainInvalid)
        }
        // Attested for another app, it does not verify for this one.
        let otherApp = AppID(teamID: "ABCDE12345", bundleID: "com.example.other")
        #expect(throws: VerificationError.self) {
            try trusting.verifyAttestation(object, keyID: raw, clientDataHash: hash, allowedAppIDs: [otherApp], at: Date())
        }
    }

    @Test func unknownOrMalformedKeyIsMissingCredential() async throws {
        let directory = temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let attester = SoftwareAttester(appID: appID, keyDirectory: directory)
        let unknown = Data(repeating: 0x07, count: 32).base64EncodedString()
        let hash = Data(sha256([4]))
        #expect(await isMissingCredential { try await attester.generateAssertion(unknown, clientDataHash: hash) })
        #expect(await isMissingCredential { try await attester.attestKey(unknown, clientDataHash: hash) })
        #expect(await isMissingCredential { try await attester.generateAssertion("not base64!", clientDataHash: hash) })
        #expect(await isMissingCredential { try await attester.generateAssertion(Data(repeating: 1, count: 16).base64EncodedString(), clientDataHash: hash) })
        // No counter file is left behind for a key that does not exist.
        #expect(!FileManager.default.fileExists(atPath: directory.appendingPathComponent("\(hex([UInt8](repeating: 7, count: 32))).counter").path))

        // URL-safe, unpadded spellings of a known key ID are the same key.
        let keyID = try await attester.generateKey()
        let urlSafe = keyID.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
        _ = try await attester.generateAssertion(urlSafe, clientDataHash: hash)
    }
}

/// The attested key as a public key object, through its SubjectPublicKeyInfo PEM.
private func publicKey(of attestation: VerifiedAttestation) throws -> ECPublicKey {
    // SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING { point } }
    let prefix: [UInt8] = [0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
                           0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00]
    let der = Data(prefix + attestation.publicKey).base64EncodedString(options: .lineLength64Characters)
    return try ECPublicKey(pem: "-----BEGIN PUBLIC KEY-----\n\(der)\n-----END PUBLIC KEY-----\n")
}
