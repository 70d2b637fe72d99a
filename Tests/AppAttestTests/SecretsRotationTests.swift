import AttestCrypto
import Foundation
import Testing

/// A secrets-key rotation on disk and in a reader: values name their key, a keyring opens each
/// with the key it names (and values from before key IDs with either), the files switch in steps
/// a kill cannot break, and a running reader picks the new key up without a restart.
@Suite struct SecretsRotationTests {
    let plaintext = Array("made-up-upstream-key-for-rotation".utf8)
    let bound = Array("upstream-key/workspace/1".utf8)

    func directory() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rotation-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    /// A value sealed by the format before key IDs: version 1, nonce, ciphertext, tag (built from
    /// a version 2 value of the same key by dropping its key ID, which the tag does not cover).
    func legacy(_ box: SecretBox) throws -> [UInt8] {
        let sealed = try box.seal(plaintext, associatedData: bound)
        return [1] + sealed.dropFirst(1 + SecretBox.keyIDLength)
    }

    @Test func aKeyringOpensEachValueWithTheKeyItNames() throws {
        let old = try SecretBox(key: [UInt8](repeating: 1, count: 32)), new = try SecretBox(key: [UInt8](repeating: 2, count: 32))
        #expect(old.keyID != new.keyID && old.keyID.count == 8)
        let ring = SecretsKeyring(current: new, previous: old)
        let underOld = try old.seal(plaintext, associatedData: bound), underNew = try new.seal(plaintext, associatedData: bound)
        #expect(try ring.open(underOld, associatedData: bound) == plaintext)
        #expect(try ring.open(underNew, associatedData: bound) == plaintext)
        #expect(ring.needsResealing(underOld) && !ring.needsResealing(underNew))
        // Sealed before key IDs, under either key: it opens, and is re-sealed by a rotation.
        for box in [old, new] {
            let value = try legacy(box)
            #expect(SecretBox.keyID(ofSealed: value) == nil)
            #expect(try ring.open(value, associatedData: bound) == plaintext)
            #expect(try box.open(value, associatedData: bound) == plaintext)
            #expect(ring.needsResealing(value))
        }
        // The new key alone does not open the old key's value, and says which key it needs.
        let after = SecretsKeyring(current: new)
        #expect(!after.holdsKey(of: underOld))
        let error = #expect(throws: CryptoError.self) { try after.open(underOld, associatedData: bound) }
        #expect(error?.description.contains(SecretBox.describe(keyID: old.keyID)) == true, "\(String(describing: error))")
        // A key ID swapped for another's does not open either (the value is still checked whole).
        var swapped = underOld
        swapped.replaceSubrange(1...8, with: new.keyID)
        #expect(throws: CryptoError.self) { try ring.open(swapped, associatedData: bound) }
    }

    @Test func theFilesSwitchInStepsThatAKillCannotBreak() throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("attestd.key").path
        #expect(try SecretsKeyFile.createIfAbsent(path))
        let first = try SecretsKeyFile.load(path)
        #expect(try SecretsKeyFile.beginRotation(path), "a rotation begins")
        var ring = try SecretsKeyring.load(path)
        #expect(ring.previous?.keyID == first.keyID && ring.current.keyID != first.keyID)
        for file in [path, SecretsKeyFile.previousPath(path)] {
            let mode = (try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int) ?? 0
            #expect(mode == 0o600, "\(file): \(String(mode, radix: 8))")
        }
        // Run again while it is under way: nothing changes (it resumes).
        #expect(try !SecretsKeyFile.beginRotation(path))
        #expect(try SecretsKeyring.load(path).current.keyID == ring.current.keyID)
        // Killed between writing the previous key and the switch: .next and .previous exist, the
        // current file still holds the old key; running again completes the switch.
        try SecretsKeyFile.finishRotation(path)
        let second = try SecretsKeyFile.load(path)
        #expect(try SecretsKeyFile.createIfAbsent(path + ".next"))
        try FileManager.default.copyItem(atPath: path, toPath: SecretsKeyFile.previousPath(path))
        let pending = try SecretsKeyFile.load(path + ".next")
        #expect(try !SecretsKeyFile.beginRotation(path))
        ring = try SecretsKeyring.load(path)
        #expect(ring.current.keyID == pending.keyID && ring.previous?.keyID == second.keyID)
        #expect(!FileManager.default.fileExists(atPath: path + ".next"))
        // Killed before the previous key was written: only a .next, never used; a new rotation starts over.
        try SecretsKeyFile.finishRotation(path)
        #expect(try SecretsKeyFile.createIfAbsent(path + ".next"))
        let abandoned = try SecretsKeyFile.load(path + ".next")
        #expect(try SecretsKeyFile.beginRotation(path))
        ring = try SecretsKeyring.load(path)
        #expect(ring.previous?.keyID == pending.keyID && ring.current.keyID != abandoned.keyID)
        // Finished: the previous file is gone, and only the current key is read.
        try SecretsKeyFile.finishRotation(path)
        #expect(try SecretsKeyring.load(path).previous == nil)
        // A damaged key file is never rotated away from.
        try Data("not a key".utf8).write(to: URL(fileURLWithPath: path))
        #expect(throws: CryptoError.self) { try SecretsKeyFile.beginRotation(path) }
        #expect(!FileManager.default.fileExists(atPath: SecretsKeyFile.previousPath(path)))
    }

    @Test func twoRotationsNeverInterleave() throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("attestd.key").path
        #expect(try SecretsKeyFile.createIfAbsent(path))
        let first = try SecretsKeyFile.load(path)
        let began = try SecretsKeyFile.withRotationLock(path) { () throws -> Bool in
            // While one holds the lock, another is refused at once, and nothing changes.
            let refused = #expect(throws: CryptoError.self) { try SecretsKeyFile.withRotationLock(path) { try SecretsKeyFile.beginRotation(path) } }
            #expect(refused?.description.contains("another attestctl is rotating") == true)
            #expect(!FileManager.default.fileExists(atPath: SecretsKeyFile.previousPath(path)))
            return try SecretsKeyFile.beginRotation(path)
        }
        #expect(began)
        // Released: the next one runs (and resumes the rotation under way).
        #expect(try !SecretsKeyFile.withRotationLock(path) { try SecretsKeyFile.beginRotation(path) })
        #expect(try SecretsKeyring.load(path).previous?.keyID == first.keyID, "the old key is the previous one, never overwritten")
    }

    @Test func aRunningReaderOpensValuesUnderTheNewKeyWithoutARestart() throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("attestd.key").path
        #expect(try SecretsKeyFile.createIfAbsent(path))
        let old = try SecretsKeyFile.load(path)
        let source = SecretsKeySource(path: path, loaded: old)
        let underOld = try old.seal(plaintext, associatedData: bound)
        #expect(try source.open(underOld, associatedData: bound) == plaintext)
        // attestctl rotates: a value re-sealed under the new key opens at once, and so does the old one.
        #expect(try SecretsKeyFile.beginRotation(path))
        let new = try SecretsKeyFile.load(path)
        let underNew = try new.seal(plaintext, associatedData: bound)
        #expect(try source.open(underNew, associatedData: bound) == plaintext)
        #expect(try source.open(underOld, associatedData: bound) == plaintext)
        #expect(source.keyring(refresh: .now)?.current.keyID == new.keyID, "new values are sealed under the new key")
        // After the rotation finishes, the new key still opens what it sealed.
        try SecretsKeyFile.finishRotation(path)
        #expect(try source.open(underNew, associatedData: bound) == plaintext)
        #expect(source.keyring(refresh: .now)?.previous == nil)
    }
}
