import AttestWire
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// An access token and the moment it expires.
public struct StoredToken: Codable, Sendable, Equatable {
    public var token: String
    public var expiresAt: Date

    public init(token: String, expiresAt: Date) {
        self.token = token
        self.expiresAt = expiresAt
    }
}

/// Persists, per client ID, the registered App Attest key ID and the current token.
/// Passing `nil` to a setter removes the value.
public protocol CredentialStore: Sendable {
    func keyID(for clientID: String) throws -> String?
    func setKeyID(_ keyID: String?, for clientID: String) throws
    func token(for clientID: String) throws -> StoredToken?
    func setToken(_ token: StoredToken?, for clientID: String) throws
}

/// Keeps credentials in memory only (tests, or an app that re-registers every launch).
public final class InMemoryCredentialStore: CredentialStore {
    private struct Credentials {
        var keyIDs: [String: String] = [:]
        var tokens: [String: StoredToken] = [:]
    }

    private let credentials = LockedValueBox(Credentials())

    public init() {}

    public func keyID(for clientID: String) throws -> String? {
        credentials.withLock { $0.keyIDs[clientID] }
    }

    public func setKeyID(_ keyID: String?, for clientID: String) throws {
        credentials.withLock { $0.keyIDs[clientID] = keyID }
    }

    public func token(for clientID: String) throws -> StoredToken? {
        credentials.withLock { $0.tokens[clientID] }
    }

    public func setToken(_ token: StoredToken?, for clientID: String) throws {
        credentials.withLock { $0.tokens[clientID] = token }
    }
}

/// One JSON file per client ID in a private directory: the directory is created 0700, files are
/// written 0600 to a temporary name and renamed into place, so a reader never sees a partial file.
public final class FileCredentialStore: CredentialStore {
    public let directory: URL
    /// The files of the directory, reached only under the lock: serialises read-modify-write of a
    /// client's file within this process.
    private let files: LockedValueBox<URL>

    private struct Record: Codable {
        var keyID: String?
        var token: StoredToken?
    }

    public init(directory: URL) throws {
        self.directory = directory
        files = LockedValueBox(directory)
        let fileManager = FileManager.default
        var isDirectory: ObjCBool = false
        if fileManager.fileExists(atPath: directory.path, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw POSIXError(.ENOTDIR) }
        } else {
            try fileManager.createDirectory(at: directory, withIntermediateDirectories: true,
                                            attributes: [.posixPermissions: 0o700])
            // Attributes of a new directory are subject to umask and platform quirks: be explicit.
            guard chmod(directory.path, 0o700) == 0 else { throw Self.posixError() }
        }
    }

    public func keyID(for clientID: String) throws -> String? {
        try files.withLock { _ in try read(clientID)?.keyID }
    }

    public func setKeyID(_ keyID: String?, for clientID: String) throws {
        try update(clientID) { $0.keyID = keyID }
    }

    public func token(for clientID: String) throws -> StoredToken? {
        try files.withLock { _ in try read(clientID)?.token }
    }

    public func setToken(_ token: StoredToken?, for clientID: String) throws {
        try update(clientID) { $0.token = token }
    }

    /// Readable names for ordinary client IDs; anything else is hashed so it cannot escape the directory.
    func fileURL(for clientID: String) -> URL {
        let plain = clientID.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-")
        }
        let name: String
        if plain && !clientID.isEmpty && clientID.utf8.count <= 100 {
            name = "client-\(clientID).json"
        } else {
            name = "sha256-\(hexString(platformSHA256(Array(clientID.utf8)))).json"
        }
        return directory.appendingPathComponent(name)
    }

    private func read(_ clientID: String) throws -> Record? {
        let url = fileURL(for: clientID)
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        return try JSONDecoder().decode(Record.self, from: Data(contentsOf: url))
    }

    private func update(_ clientID: String, _ change: (inout Record) -> Void) throws {
        try files.withLock { _ in
            var record = try read(clientID) ?? Record()
            change(&record)
            let url = fileURL(for: clientID)
            if record.keyID == nil && record.token == nil {
                if unlink(url.path) != 0 && errno != ENOENT { throw Self.posixError() }
                return
            }
            try writeAtomically(JSONEncoder().encode(record), to: url)
        }
    }

    private func writeAtomically(_ data: Data, to url: URL) throws {
        let temporary = directory.appendingPathComponent(".\(url.lastPathComponent).\(UUID().uuidString).tmp")
        // O_EXCL with mode 0600: the file is never readable by others, not even briefly.
        let fd = open(temporary.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw Self.posixError() }
        var renamed = false
        defer { if !renamed { unlink(temporary.path) } }
        do {
            try data.withUnsafeBytes { (buffer: UnsafeRawBufferPointer) in
                var offset = 0
                while offset < buffer.count {
                    let written = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                    if written < 0 {
                        if errno == EINTR { continue }
                        throw Self.posixError()
                    }
                    offset += written
                }
            }
            guard fsync(fd) == 0 else { throw Self.posixError() }
        } catch {
            close(fd)
            throw error
        }
        close(fd)
        guard rename(temporary.path, url.path) == 0 else { throw Self.posixError() }
        renamed = true
    }

    private static func posixError() -> POSIXError {
        POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
    }
}

#if canImport(Security)
import Security

/// Keychain-backed store for apps: generic-password items, accessible after first unlock and
/// never migrated to another device (the App Attest key cannot follow, so neither should its ID).
public final class KeychainCredentialStore: CredentialStore {
    public let service: String
    public let accessGroup: String?

    public struct KeychainError: Error {
        public let status: OSStatus
    }

    public init(service: String = "com.anthropic.app-attest", accessGroup: String? = nil) {
        self.service = service
        self.accessGroup = accessGroup
    }

    public func keyID(for clientID: String) throws -> String? {
        try read(account: "\(clientID).key-id").map { String(decoding: $0, as: UTF8.self) }
    }

    public func setKeyID(_ keyID: String?, for clientID: String) throws {
        try write(keyID.map { Data($0.utf8) }, account: "\(clientID).key-id")
    }

    public func token(for clientID: String) throws -> StoredToken? {
        try read(account: "\(clientID).token").map { try JSONDecoder().decode(StoredToken.self, from: $0) }
    }

    public func setToken(_ token: StoredToken?, for clientID: String) throws {
        try write(token.map { try JSONEncoder().encode($0) }, account: "\(clientID).token")
    }

    private func baseQuery(account: String) -> [String: Any] {
        var query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: service,
            kSecAttrAccount as String: account,
        ]
        if let accessGroup {
            query[kSecAttrAccessGroup as String] = accessGroup
        }
        return query
    }

    private func read(account: String) throws -> Data? {
        var query = baseQuery(account: account)
        query[kSecReturnData as String] = true
        query[kSecMatchLimit as String] = kSecMatchLimitOne
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        switch status {
        case errSecSuccess: return result as? Data
        case errSecItemNotFound: return nil
        default: throw KeychainError(status: status)
        }
    }

    private func write(_ data: Data?, account: String) throws {
        let query = baseQuery(account: account)
        guard let data else {
            let status = SecItemDelete(query as CFDictionary)
            guard status == errSecSuccess || status == errSecItemNotFound else { throw KeychainError(status: status) }
            return
        }
        let attributes: [String: Any] = [
            kSecValueData as String: data,
            kSecAttrAccessible as String: kSecAttrAccessibleAfterFirstUnlockThisDeviceOnly,
        ]
        var status = SecItemUpdate(query as CFDictionary, attributes as CFDictionary)
        if status == errSecItemNotFound {
            status = SecItemAdd(query.merging(attributes) { _, new in new } as CFDictionary, nil)
        }
        guard status == errSecSuccess else { throw KeychainError(status: status) }
    }
}
#endif
