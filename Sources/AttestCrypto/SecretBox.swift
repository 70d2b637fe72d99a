import COpenSSL
import Foundation
import Synchronization

/// AES-256-GCM for secrets at rest (the workspaces' upstream API keys), under a master key that
/// every instance of a deployment reads from the same file. Each value is bound to what it
/// belongs to through the associated data, so a ciphertext copied to another row does not open.
///
/// Sealed format: version 0x02 ‖ the sealing key's 8-byte ID ‖ 12-byte random nonce ‖
/// ciphertext ‖ 16-byte tag. The key ID names the key, so that during a rotation a reader holding
/// the new and the previous key opens each value with the right one (and a value under a key it
/// does not hold says so). Version 0x01, from before rotation, has no key ID; it still opens.
public struct SecretBox: Sendable {
    public static let keyLength = 32
    public static let keyIDLength = 8
    static let version: UInt8 = 2
    static let legacyVersion: UInt8 = 1
    static let nonceLength = 12
    static let tagLength = 16

    private let key: [UInt8]
    /// The first 8 bytes of SHA-256 over a label and the key: names the key, reveals nothing of it.
    public let keyID: [UInt8]

    public init(key: [UInt8]) throws {
        guard key.count == Self.keyLength else { throw CryptoError("a secrets key is \(Self.keyLength) bytes, got \(key.count)") }
        self.key = key
        keyID = Array(sha256(Array("attestd secrets key ID".utf8) + key).prefix(Self.keyIDLength))
    }

    /// The key ID a sealed value names, or nil for a value sealed before key IDs (or malformed).
    public static func keyID(ofSealed sealed: [UInt8]) -> [UInt8]? {
        guard sealed.count >= 1 + keyIDLength + nonceLength + tagLength, sealed[0] == version else { return nil }
        return Array(sealed[1...keyIDLength])
    }

    /// The key ID as operators see it (16 hex digits).
    public static func describe(keyID: [UInt8]?) -> String {
        // Not AttestWire's hexString: the leaf fuzzer compiles this target's sources on their own.
        keyID.map { $0.map { String(format: "%02x", $0) }.joined() } ?? "unnamed (sealed before key IDs)"
    }

    public func seal(_ plaintext: [UInt8], associatedData: [UInt8]) throws -> [UInt8] {
        let nonce = secureRandomBytes(Self.nonceLength)
        var output = [UInt8](repeating: 0, count: plaintext.count + 16)
        var tag = [UInt8](repeating: 0, count: Self.tagLength)
        let written = try withCipher(encrypt: true, nonce: nonce) { context in
            try update(context, associatedData, output: nil)
            let count = try update(context, plaintext, output: &output)
            var final: Int32 = 0
            let ok = output.withUnsafeMutableBufferPointer { EVP_EncryptFinal_ex(context, $0.baseAddress! + count, &final) }
            guard ok == 1 else { throw CryptoError.openSSL("EVP_EncryptFinal_ex") }
            guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, Int32(Self.tagLength), &tag) == 1 else {
                throw CryptoError.openSSL("EVP_CTRL_GCM_GET_TAG")
            }
            return count + Int(final)
        }
        return [Self.version] + keyID + nonce + output[0..<written] + tag
    }

    /// The plaintext, or an error when the value was altered, sealed under another key, or sealed
    /// with other associated data.
    public func open(_ sealed: [UInt8], associatedData: [UInt8]) throws -> [UInt8] {
        let header: Int
        switch sealed.first {
        case Self.version:
            header = 1 + Self.keyIDLength
            guard sealed.count >= header + Self.nonceLength + Self.tagLength else { throw CryptoError("sealed secret is malformed") }
            guard Array(sealed[1..<header]) == keyID else {
                throw CryptoError("sealed secret was sealed under key \(Self.describe(keyID: Self.keyID(ofSealed: sealed))), not \(Self.describe(keyID: keyID))")
            }
        case Self.legacyVersion:
            header = 1
            guard sealed.count >= header + Self.nonceLength + Self.tagLength else { throw CryptoError("sealed secret is malformed") }
        default:
            throw CryptoError("sealed secret is malformed")
        }
        let nonce = Array(sealed[header..<(header + Self.nonceLength)])
        let body = Array(sealed[(header + Self.nonceLength)..<(sealed.count - Self.tagLength)])
        var tag = Array(sealed[(sealed.count - Self.tagLength)...])
        var output = [UInt8](repeating: 0, count: body.count + 16)
        let written = try withCipher(encrypt: false, nonce: nonce) { context in
            try update(context, associatedData, output: nil)
            let count = try update(context, body, output: &output)
            guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, Int32(Self.tagLength), &tag) == 1 else {
                throw CryptoError.openSSL("EVP_CTRL_GCM_SET_TAG")
            }
            var final: Int32 = 0
            let ok = output.withUnsafeMutableBufferPointer { EVP_DecryptFinal_ex(context, $0.baseAddress! + count, &final) }
            ERR_clear_error()
            guard ok == 1 else { throw CryptoError("sealed secret does not open: wrong key, altered, or bound to something else") }
            return count + Int(final)
        }
        return Array(output[0..<written])
    }

    private func withCipher<T>(encrypt: Bool, nonce: [UInt8], _ body: (OpaquePointer) throws -> T) throws -> T {
        guard let context = EVP_CIPHER_CTX_new() else { throw CryptoError.openSSL("EVP_CIPHER_CTX_new") }
        defer { EVP_CIPHER_CTX_free(context) }
        let initialised = key.withUnsafeBufferPointer { key in
            nonce.withUnsafeBufferPointer { nonce in
                encrypt ? EVP_EncryptInit_ex(context, EVP_aes_256_gcm(), nil, key.baseAddress, nonce.baseAddress)
                        : EVP_DecryptInit_ex(context, EVP_aes_256_gcm(), nil, key.baseAddress, nonce.baseAddress)
            }
        }
        guard initialised == 1 else { throw CryptoError.openSSL("EVP_aes_256_gcm init") }
        return try body(context)
    }

    /// Feeds `input`; with `output` nil it is associated data. Returns the bytes written.
    @discardableResult
    private func update(_ context: OpaquePointer, _ input: [UInt8], output: UnsafeMutablePointer<[UInt8]>?) throws -> Int {
        guard !input.isEmpty else { return 0 }
        var written: Int32 = 0
        let ok: Int32 = input.withUnsafeBufferPointer { input in
            if let output {
                return output.pointee.withUnsafeMutableBufferPointer {
                    EVP_CipherUpdate(context, $0.baseAddress, &written, input.baseAddress, Int32(input.count))
                }
            }
            return EVP_CipherUpdate(context, nil, &written, input.baseAddress, Int32(input.count))
        }
        guard ok == 1 else { throw CryptoError.openSSL("EVP_CipherUpdate") }
        return Int(written)
    }
}

/// The deployment's master key for secrets at rest: a file of 32 random bytes, mode 0600, owned
/// by the service's user (a file others may read or write is refused). (A 64-character hex or
/// 44-character base64 text file, e.g. from `openssl rand -hex 32`, is accepted too, with
/// surrounding white space trimmed.)
public enum SecretsKeyFile {
    public static let fileName = "attestd.key"

    /// Where the key file is when no option names it: `ATTESTD_SECRETS_KEY_FILE`, else `attestd.key`
    /// beside a SQLite database file (so `./attestd.key` beside the default `./attestd.sqlite`),
    /// else (`isFile` false: a PostgreSQL URL or `key=value` string) `./attestd.key`. Never a path
    /// derived from a connection string: its "directory" could hold a password, and the path is logged.
    public static func defaultPath(database: String, isFile: Bool,
                                   environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let path = environment["ATTESTD_SECRETS_KEY_FILE"], !path.isEmpty { return path }
        guard isFile, !database.contains("://") else { return "./" + fileName }
        let directory = (database as NSString).deletingLastPathComponent
        return directory.isEmpty ? "./" + fileName : (directory as NSString).appendingPathComponent(fileName)
    }

    /// The key in the file at `path`, refused unless only its owner, this user (or root), may
    /// read or write it (see `readChecked`).
    public static func load(_ path: String) throws -> SecretBox {
        try parse(try readChecked(path), path: path)
    }

    /// A key file's bytes as a key (`path` names it in the error).
    static func parse(_ bytes: [UInt8], path: String) throws -> SecretBox {
        if bytes.count == SecretBox.keyLength { return try SecretBox(key: bytes) }
        let text = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if text.count == 64, let hex = decodeHex(text) { return try SecretBox(key: hex) }
        if let decoded = Data(base64Encoded: text), decoded.count == SecretBox.keyLength { return try SecretBox(key: [UInt8](decoded)) }
        throw CryptoError("the secrets key file \(path) does not hold a 32-byte key (32 raw bytes, 64 hex characters or base64)")
    }

    /// Creates the file with 32 random bytes, mode 0600, only if it does not exist yet.
    /// Returns false when it already existed (nothing is changed then).
    @discardableResult
    public static func createIfAbsent(_ path: String) throws -> Bool {
        let fd = Foundation.open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        if fd < 0 {
            if errno == EEXIST { return false }
            throw CryptoError("cannot create the secrets key file \(path): \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        let key = secureRandomBytes(SecretBox.keyLength)
        let written = key.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        guard written == key.count, fsync(fd) == 0 else {
            unlink(path)
            throw CryptoError("cannot write the secrets key file \(path): \(String(cString: strerror(errno)))")
        }
        return true
    }

    private static func decodeHex(_ text: String) -> [UInt8]? {
        var out: [UInt8] = []
        var high: UInt8?
        for character in text.utf8 {
            let value: UInt8
            switch character {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = character - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): value = character - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): value = character - UInt8(ascii: "A") + 10
            default: return nil
            }
            if let h = high { out.append(h << 4 | value); high = nil } else { high = value }
        }
        return high == nil ? out : nil
    }
}
