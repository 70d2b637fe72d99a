import AttestWire
import AppAttest
import AttestClient
import AttestCrypto
import Foundation
import Synchronization
import TestAuthority
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Why the simulated device could not produce a key, an attestation or an assertion
/// (an unknown key is `AttestClientError.missingCredential` instead, as the protocol requires).
public struct SoftwareAttesterError: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// A simulated App Attest device on the project's test authority (never shipped in apps): P-256
/// keys whose attestations chain to `Fixtures/test-authority/root.pem`, so only a server started
/// with `--trust-anchor Fixtures/test-authority/root.pem` accepts them.
///
/// With a key directory, each key is kept there as `<key ID hex>.pem` (PKCS#8, mode 0600; the
/// directory is created 0700) next to `<key ID hex>.counter`, its assertion counter, which is
/// incremented and written atomically before every signature, so it strictly increases across
/// instances and runs. Without one, keys and counters live in memory only.
public final class SoftwareAttester: DeviceAttester {
    public let appID: AppID
    public let keyDirectory: URL?

    /// The keys known to this instance; the files in `keyDirectory` are also only touched under this lock.
    private let table = Mutex(KeyTable())

    private struct KeyTable {
        /// By key ID hex.
        var byName: [String: Entry] = [:]
        /// Key ID hex by the standard base64 key ID `makeKey` returned: the hot path, without decoding.
        var nameByID: [String: String] = [:]
    }

    private struct Entry {
        let key: DeviceKey
        /// The last counter used; only authoritative when there is no key directory.
        var counter: UInt32 = 0
    }

    /// What the device says about the build and the machine (an iOS 27 development build by default).
    public let build: SimulatedBuild

    public init(appID: AppID, keyDirectory: URL?, build: SimulatedBuild = SimulatedBuild()) {
        self.appID = appID
        self.keyDirectory = keyDirectory
        self.build = build
    }

    public var isSupported: Bool { true }

    // MARK: DeviceAttester

    public func generateKey() async throws -> String {
        try makeKey()
    }

    public func attestKey(_ keyID: String, clientDataHash: Data) async throws -> Data {
        Data(try makeAttestation(keyID: keyID, clientDataHash: [UInt8](clientDataHash)))
    }

    public func generateAssertion(_ keyID: String, clientDataHash: Data) async throws -> Data {
        Data(try makeAssertion(keyID: keyID, clientDataHash: [UInt8](clientDataHash)))
    }

    // MARK: Synchronous API (load generators on plain threads)

    /// Creates and (with a key directory) persists a P-256 key; returns standard base64 of its key ID.
    public func makeKey() throws -> String {
        let key = try DeviceKey.generate()
        let name = hexString(key.keyID)
        let encoded = Data(key.keyID).base64EncodedString()
        try table.withLock { table in
            if let directory = keyDirectory {
                try Self.createPrivateDirectory(directory)
                try Self.writeAtomically(Array(key.privateKey.pem.utf8), to: directory.appendingPathComponent("\(name).pem"))
            }
            table.byName[name] = Entry(key: key)
            table.nameByID[encoded] = name
        }
        return encoded
    }

    /// The attestation object for `keyID` over `clientDataHash`, issued now.
    public func makeAttestation(keyID: String, clientDataHash: [UInt8]) throws -> [UInt8] {
        let key = try table.withLock { try entryName(for: keyID, in: &$0).entry.key }
        return try TestAuthority.shared.attestation(key: key, appID: appID, clientDataHash: clientDataHash, at: Date(),
                                                    options: build.attestationOptions(appID: appID))
    }

    /// The assertion for `keyID` over `clientDataHash`, with the key's next counter value.
    public func makeAssertion(keyID: String, clientDataHash: [UInt8]) throws -> [UInt8] {
        let (key, counter) = try table.withLock { table throws -> (DeviceKey, UInt32) in
            let (name, entry) = try entryName(for: keyID, in: &table)
            let counter = try nextCounter(entry)
            table.byName[name]?.counter = counter
            return (entry.key, counter)
        }
        // Signing happens outside the lock: each caller already holds its own counter value.
        return try TestAuthority.shared.assertion(key: key, appID: appID, clientDataHash: clientDataHash, counter: counter,
                                                  extensionMap: build.extensionMap(appID: appID))
    }

    // MARK: Keys and counters (callers hold the table's lock)

    private func entryName(for keyID: String, in table: inout KeyTable) throws -> (name: String, entry: Entry) {
        // Fast path: the key ID exactly as `makeKey` spelled it.
        if let name = table.nameByID[keyID], let entry = table.byName[name] { return (name, entry) }
        guard let raw = Base64.decode(keyID), raw.count == 32 else { throw AttestClientError.missingCredential }
        let name = hexString(raw)
        if let entry = table.byName[name] { return (name, entry) }
        guard let directory = keyDirectory else { throw AttestClientError.missingCredential }
        let url = directory.appendingPathComponent("\(name).pem")
        guard let data = try Self.readFile(url) else { throw AttestClientError.missingCredential }
        let key: DeviceKey
        do {
            key = try DeviceKey(privateKey: ECPrivateKey(pem: String(decoding: data, as: UTF8.self)))
        } catch {
            throw SoftwareAttesterError("\(url.path) is not a readable private key: \(error)")
        }
        guard key.keyID == raw else { throw SoftwareAttesterError("\(url.path) holds the key of another key ID") }
        let entry = Entry(key: key)
        table.byName[name] = entry
        return (name, entry)
    }

    /// The next counter value, persisted (with a key directory) before it is used, so no value is
    /// ever signed twice.
    private func nextCounter(_ entry: Entry) throws -> UInt32 {
        guard let directory = keyDirectory else {
            guard entry.counter < UInt32.max else { throw SoftwareAttesterError("assertion counter exhausted") }
            return entry.counter + 1
        }
        let name = hexString(entry.key.keyID)
        // Another instance (or process) may share the directory: the counter file, read under an
        // advisory lock on the key file (which is never replaced), is the truth, not this instance's memory.
        let lockFD = open(directory.appendingPathComponent("\(name).pem").path, O_RDONLY | O_CLOEXEC)
        guard lockFD >= 0 else { throw Self.posixError() }
        defer { close(lockFD) }
        while flock(lockFD, LOCK_EX) != 0 {
            guard errno == EINTR else { throw Self.posixError() }
        }
        let url = directory.appendingPathComponent("\(name).counter")
        var current: UInt32 = 0
        if let data = try Self.readFile(url) {
            let text = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            // Never restart from zero on a damaged file: the server would reject every assertion.
            guard let value = UInt32(text) else { throw SoftwareAttesterError("\(url.path) does not hold a counter") }
            current = value
        }
        guard current < UInt32.max else { throw SoftwareAttesterError("assertion counter exhausted") }
        let next = current + 1
        try Self.writeAtomically(Array("\(next)\n".utf8), to: url)
        return next
    }

    // MARK: Files

    private static func createPrivateDirectory(_ directory: URL) throws {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: directory.path, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw POSIXError(.ENOTDIR) }
            return
        }
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        // The requested mode is subject to umask: be explicit.
        guard chmod(directory.path, 0o700) == 0 else { throw posixError() }
    }

    /// Writes a 0600 temporary file (never readable by others), syncs it, and renames it into place.
    private static func writeAtomically(_ bytes: [UInt8], to url: URL) throws {
        let directory = url.deletingLastPathComponent()
        let temporary = directory.appendingPathComponent(".\(url.lastPathComponent).\(UUID().uuidString).tmp")
        let fd = open(temporary.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw posixError() }
        var renamed = false
        defer { if !renamed { unlink(temporary.path) } }
        do {
            try bytes.withUnsafeBytes { buffer in
                var offset = 0
                while offset < buffer.count {
                    let written = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                    if written < 0 {
                        if errno == EINTR { continue }
                        throw posixError()
                    }
                    offset += written
                }
            }
            guard fsync(fd) == 0 else { throw posixError() }
        } catch {
            close(fd)
            throw error
        }
        close(fd)
        guard rename(temporary.path, url.path) == 0 else { throw posixError() }
        renamed = true
    }

    /// The file's contents, or nil if it does not exist.
    private static func readFile(_ url: URL) throws -> [UInt8]? {
        let fd = open(url.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw posixError()
        }
        defer { close(fd) }
        var contents = [UInt8]()
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw posixError()
            }
            if count == 0 { return contents }
            contents += chunk[0..<count]
            guard contents.count <= 1 << 20 else { throw SoftwareAttesterError("\(url.path) is too large") }
        }
    }

    private static func posixError() -> POSIXError {
        POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
    }
}
