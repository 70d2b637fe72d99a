import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The one way a secrets key file is read (the current key and the previous one; attestd at
/// start and whenever the files change, attestctl for every command that needs them): opened
/// (through a symbolic link, as secret managers install them: the file it names is what is
/// checked), then refused unless it is a regular file that only its owner may read or write, and
/// that this user owns. Root may read a file another user owns (`sudo attestctl …` on the
/// service's own key), but never one open to its group or others.
extension SecretsKeyFile {
    /// A key file is a few dozen bytes; more is not a key file (and is not read whole).
    static let largestFile = 4096

    /// The file's bytes, once it passed the check on the descriptor it was read from (fstat: no
    /// window between the check and the read).
    static func readChecked(_ path: String) throws -> [UInt8] {
        let fd = Foundation.open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)
        guard fd >= 0 else {
            let error = errno
            switch error {
            case ENOENT: throw CryptoError("cannot read the secrets key file \(path): there is none (attestctl init creates it)")
            case EACCES: throw CryptoError("cannot read the secrets key file \(path): this user (\(Self.user(geteuid()))) may not read it; "
                                           + "run this as its owner, or give the file to this user (chown \(geteuid()) \(path))")
            default: throw CryptoError("cannot read the secrets key file \(path): \(String(cString: strerror(error)))")
            }
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw CryptoError("cannot read the secrets key file \(path): \(String(cString: strerror(errno)))") }
        guard info.st_mode & S_IFMT == S_IFREG else { throw CryptoError("the secrets key file \(path) is not a regular file") }
        try checkAccess(path: path, mode: info.st_mode, owner: info.st_uid, effectiveUser: geteuid())
        var bytes = [UInt8](repeating: 0, count: largestFile + 1)
        var count = 0
        while count < bytes.count {
            let got = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress! + count, $0.count - count) }
            if got < 0 {
                if errno == EINTR { continue }
                throw CryptoError("cannot read the secrets key file \(path): \(String(cString: strerror(errno)))")
            }
            if got == 0 { break }
            count += got
        }
        guard count <= largestFile else { throw CryptoError("the secrets key file \(path) does not hold a 32-byte key (it is larger than \(largestFile) bytes)") }
        return Array(bytes[0..<count])
    }

    /// Refuses a key file that its group or others may read, write or run (any of mode 0o077), or
    /// that another user than `effectiveUser` owns (root, uid 0, may read anyone's). The error
    /// names the file and the command that fixes it.
    public static func checkAccess(path: String, mode: mode_t, owner: uid_t, effectiveUser: uid_t) throws {
        let open = UInt32(mode) & 0o077
        if open != 0 {
            var what: [String] = []
            if open & 0o044 != 0 { what.append("readable") }
            if open & 0o022 != 0 { what.append("writable") }
            if what.isEmpty { what.append("executable") }
            throw CryptoError("the secrets key file \(path) is \(what.joined(separator: " and ")) by its group or others "
                              + "(mode \(String(format: "%04o", UInt32(mode) & 0o7777))): run chmod 600 \(path)")
        }
        if owner != effectiveUser && effectiveUser != 0 {
            throw CryptoError("the secrets key file \(path) is owned by \(user(owner)), not by this user (\(user(effectiveUser))): "
                              + "run this as the file's owner, or, if this user is the one that should own it, run chown \(effectiveUser) \(path)")
        }
    }

    /// "uid 1001 (attestd)", or "uid 1001" for a uid without a name here.
    static func user(_ uid: uid_t) -> String {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 1024)
        let found = getpwuid_r(uid, &entry, &buffer, buffer.count, &result) == 0 && result != nil
        guard found, let name = entry.pw_name else { return "uid \(uid)" }
        return "uid \(uid) (\(String(cString: name)))"
    }
}
