import AttestCrypto
import Foundation
import Testing

/// The access check every read of a secrets key file goes through: only its owner may read or
/// write it, and its owner is the reader (or the reader is root); a symbolic link is judged by the
/// file it names; a running reader keeps the keys it holds when the files turn bad, and says why.
@Suite struct SecretsKeyFileAccessTests {
    let path = "/var/lib/attestd/attestd.key"

    func directory() throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("key-access-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    func refusal(mode: mode_t, owner: uid_t = 1001, user: uid_t = 1001) -> String? {
        do {
            try SecretsKeyFile.checkAccess(path: path, mode: S_IFREG | mode, owner: owner, effectiveUser: user)
            return nil
        } catch {
            return "\(error)"
        }
    }

    @Test func onlyTheOwnersOwnFileIsAccepted() throws {
        #expect(refusal(mode: 0o600) == nil)
        #expect(refusal(mode: 0o400) == nil)
        #expect(refusal(mode: 0o640) == "the secrets key file \(path) is readable by its group or others (mode 0640): run chmod 600 \(path)")
        #expect(refusal(mode: 0o604) == "the secrets key file \(path) is readable by its group or others (mode 0604): run chmod 600 \(path)")
        #expect(refusal(mode: 0o666) == "the secrets key file \(path) is readable and writable by its group or others (mode 0666): run chmod 600 \(path)")
        #expect(refusal(mode: 0o602) == "the secrets key file \(path) is writable by its group or others (mode 0602): run chmod 600 \(path)")
        #expect(refusal(mode: 0o610)?.contains("executable by its group or others (mode 0610)") == true)
        // Another user's file: refused, naming both users and both ways out.
        let foreign = try #require(refusal(mode: 0o600, owner: 1001, user: 1002))
        #expect(foreign.hasPrefix("the secrets key file \(path) is owned by uid 1001"), "\(foreign)")
        #expect(foreign.contains("not by this user (uid 1002"), "\(foreign)")
        #expect(foreign.contains("run chown 1002 \(path)"), "\(foreign)")
        // Root may read the service user's file (sudo attestctl …), never one open to others.
        #expect(refusal(mode: 0o600, owner: 1001, user: 0) == nil)
        #expect(refusal(mode: 0o644, owner: 1001, user: 0)?.contains("run chmod 600 \(path)") == true)
    }

    @Test func everyReadOfAKeyFileIsChecked() throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("attestd.key").path
        #expect(try SecretsKeyFile.createIfAbsent(path))
        let key = try SecretsKeyFile.load(path)
        chmod(path, 0o640)
        for read in [{ _ = try SecretsKeyFile.load(path) }, { _ = try SecretsKeyring.load(path) }, { _ = try SecretsKeyFile.beginRotation(path) },
                     { _ = try SecretsKeySource.loading(path) }] as [() throws -> Void] {
            let error = #expect(throws: CryptoError.self) { try read() }
            #expect(error?.description == "the secrets key file \(path) is readable by its group or others (mode 0640): run chmod 600 \(path)")
        }
        #expect(!FileManager.default.fileExists(atPath: SecretsKeyFile.previousPath(path)), "a refused key is never rotated")
        chmod(path, 0o600)
        #expect(try SecretsKeyFile.beginRotation(path))
        // The previous key's file too.
        chmod(SecretsKeyFile.previousPath(path), 0o660)
        let previous = #expect(throws: CryptoError.self) { try SecretsKeyring.load(path) }
        #expect(previous?.description.contains("\(SecretsKeyFile.previousPath(path)) is readable and writable by its group or others (mode 0660)") == true)
        chmod(SecretsKeyFile.previousPath(path), 0o600)
        #expect(try SecretsKeyring.load(path).previous?.keyID == key.keyID)
    }

    @Test func aSymbolicLinkIsJudgedByTheFileItNames() throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let target = dir.appendingPathComponent("managed-secret").path, link = dir.appendingPathComponent("attestd.key").path
        #expect(try SecretsKeyFile.createIfAbsent(target))
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
        #expect(try SecretsKeyFile.load(link).keyID == SecretsKeyFile.load(target).keyID, "a link (mode 0777 itself) to a 0600 file is accepted")
        chmod(target, 0o644)
        let error = #expect(throws: CryptoError.self) { try SecretsKeyFile.load(link) }
        #expect(error?.description.contains("\(link) is readable by its group or others (mode 0644)") == true)
        // Not a regular file: refused without reading it.
        let error2 = #expect(throws: CryptoError.self) { try SecretsKeyFile.load(dir.path) }
        #expect(error2?.description == "the secrets key file \(dir.path) is not a regular file")
    }

    @Test func aRunningReaderKeepsItsKeysWhenTheFilesAreRefusedAndSaysWhy() throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("attestd.key").path
        #expect(try SecretsKeyFile.createIfAbsent(path))
        let source = try SecretsKeySource.loading(path)
        let held = try #require(source.keyring(refresh: .now))
        #expect(source.holding().problem == nil && source.holding().currentKey == SecretBox.describe(keyID: held.current.keyID))
        // A rotation whose new file others may read: the new key is not taken, the old one stays.
        #expect(try SecretsKeyFile.beginRotation(path))
        chmod(path, 0o644)
        #expect(source.keyring(refresh: .now)?.current.keyID == held.current.keyID)
        #expect(source.problem == "the secrets key file \(path) is readable by its group or others (mode 0644): run chmod 600 \(path)")
        // Fixed: the next look takes both files.
        chmod(path, 0o600)
        let fresh = try #require(source.keyring(refresh: .now))
        #expect(fresh.current.keyID != held.current.keyID && fresh.previous?.keyID == held.current.keyID)
        #expect(source.problem == nil)
        // A chmod alone (contents unchanged) is looked at too.
        chmod(SecretsKeyFile.previousPath(path), 0o606)
        #expect(source.keyring(refresh: .now)?.previous?.keyID == held.current.keyID)
        #expect(source.problem?.contains("mode 0606") == true)
        // Put back as it was: the stamps equal those the ring was read with, and still it is read again.
        chmod(SecretsKeyFile.previousPath(path), 0o600)
        #expect(source.keyring(refresh: .now)?.previous?.keyID == held.current.keyID)
        #expect(source.problem == nil)
    }
}
