import AttestCrypto
import Foundation
import Testing

/// AES-256-GCM for secrets at rest, and the master key file.
@Suite struct SecretBoxTests {
    let box = try! SecretBox(key: [UInt8](repeating: 7, count: 32))
    let plaintext = Array("made-up-upstream-key-for-tests-0001".utf8)
    let workspace1 = Array("upstream-key/workspace/1".utf8)

    @Test func sealsAndOpensWithTheSameAssociatedData() throws {
        let sealed = try box.seal(plaintext, associatedData: workspace1)
        #expect(sealed.count == 1 + 8 + 12 + plaintext.count + 16)
        #expect(SecretBox.keyID(ofSealed: sealed) == box.keyID, "the value names the key that sealed it")
        #expect(sealed.firstRange(of: plaintext) == nil, "the plaintext must not appear in the sealed bytes")
        #expect(try box.open(sealed, associatedData: workspace1) == plaintext)
        // A fresh nonce each time: the same plaintext never seals to the same bytes.
        #expect(try box.seal(plaintext, associatedData: workspace1) != sealed)
    }

    @Test func anotherRowAnotherKeyOrAnyAlteredByteDoesNotOpen() throws {
        let sealed = try box.seal(plaintext, associatedData: workspace1)
        #expect(throws: CryptoError.self) { try box.open(sealed, associatedData: Array("upstream-key/workspace/2".utf8)) }
        #expect(throws: CryptoError.self) { try SecretBox(key: [UInt8](repeating: 8, count: 32)).open(sealed, associatedData: workspace1) }
        for index in sealed.indices {
            var altered = sealed
            altered[index] ^= 0x01
            #expect(throws: CryptoError.self, "byte \(index)") { try box.open(altered, associatedData: workspace1) }
        }
        for length in 0..<sealed.count {
            #expect(throws: CryptoError.self) { try box.open(Array(sealed.prefix(length)), associatedData: workspace1) }
        }
        #expect(throws: CryptoError.self) { try SecretBox(key: [UInt8](repeating: 1, count: 16)) }
    }

    /// The key file sits beside a SQLite file; with a PostgreSQL connection string it is
    /// ./attestd.key, never a path cut from the string (it is logged, and could hold a password).
    @Test func theDefaultKeyPathNeverComesFromAConnectionString() {
        let none: [String: String] = [:]
        #expect(SecretsKeyFile.defaultPath(database: "/var/lib/attestd/db.sqlite", isFile: true, environment: none) == "/var/lib/attestd/attestd.key")
        #expect(SecretsKeyFile.defaultPath(database: "attestd.sqlite", isFile: true, environment: none) == "./attestd.key")
        #expect(SecretsKeyFile.defaultPath(database: "postgresql://u:pw@db/attest", isFile: false, environment: none) == "./attestd.key")
        #expect(SecretsKeyFile.defaultPath(database: "password=hunter2 sslrootcert=/etc/ssl/ca.pem", isFile: false, environment: none)
                == "./attestd.key")
        #expect(SecretsKeyFile.defaultPath(database: "/x/db.sqlite", isFile: true, environment: ["ATTESTD_SECRETS_KEY_FILE": "/k"]) == "/k")
    }

    @Test func theKeyFileIsCreatedOnceWithMode0600() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("secrets-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("attestd.key").path
        #expect(try SecretsKeyFile.createIfAbsent(path))
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        #expect((attributes[.size] as? NSNumber)?.intValue == 32)
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        #expect(try !SecretsKeyFile.createIfAbsent(path), "an existing key is never replaced")
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)
        let sealed = try SecretsKeyFile.load(path).seal(plaintext, associatedData: workspace1)
        #expect(try SecretsKeyFile.load(path).open(sealed, associatedData: workspace1) == plaintext)

        // Hex text (openssl rand -hex 32) with a trailing newline is the same key.
        let hexPath = directory.appendingPathComponent("hex.key").path
        try Data((before.map { String(format: "%02x", $0) }.joined() + "\n").utf8).write(to: URL(fileURLWithPath: hexPath))
        chmod(hexPath, 0o600)   // its owner's alone, as every key file must be
        #expect(try SecretsKeyFile.load(hexPath).open(sealed, associatedData: workspace1) == plaintext)
        let badPath = directory.appendingPathComponent("bad.key").path
        try Data("too short".utf8).write(to: URL(fileURLWithPath: badPath))
        chmod(badPath, 0o600)
        let bad = #expect(throws: CryptoError.self) { try SecretsKeyFile.load(badPath) }
        #expect(bad?.description.contains("does not hold a 32-byte key") == true, "\(String(describing: bad))")
        #expect(throws: CryptoError.self) { try SecretsKeyFile.load(directory.appendingPathComponent("missing").path) }
    }
}
