import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The secrets key and, while a rotation is under way, the previous one: new values are sealed
/// under the current key; a value opens with whichever key it names.
public struct SecretsKeyring: Sendable {
    public let current: SecretBox
    public let previous: SecretBox?

    public init(current: SecretBox, previous: SecretBox? = nil) {
        self.current = current
        self.previous = previous
    }

    /// The key file at `path`, and `path.previous` when a rotation is under way.
    public static func load(_ path: String) throws -> SecretsKeyring {
        let current = try SecretsKeyFile.load(path)
        let previousPath = SecretsKeyFile.previousPath(path)
        let previous = FileManager.default.fileExists(atPath: previousPath) ? try SecretsKeyFile.load(previousPath) : nil
        return SecretsKeyring(current: current, previous: previous)
    }

    /// Whether the ring holds the key `sealed` names (a value from before key IDs: any key may be it).
    public func holdsKey(of sealed: [UInt8]) -> Bool {
        guard let id = SecretBox.keyID(ofSealed: sealed) else { return true }
        return id == current.keyID || id == previous?.keyID
    }

    /// Whether `sealed` is under another key than the current one (a rotation re-seals it).
    public func needsResealing(_ sealed: [UInt8]) -> Bool { SecretBox.keyID(ofSealed: sealed) != current.keyID }

    public func open(_ sealed: [UInt8], associatedData: [UInt8]) throws -> [UInt8] {
        guard let id = SecretBox.keyID(ofSealed: sealed) else {
            // Sealed before key IDs: under the current key, or the previous one.
            do { return try current.open(sealed, associatedData: associatedData) } catch {
                guard let previous else { throw error }
                return try previous.open(sealed, associatedData: associatedData)
            }
        }
        if id == current.keyID { return try current.open(sealed, associatedData: associatedData) }
        if let previous, id == previous.keyID { return try previous.open(sealed, associatedData: associatedData) }
        throw CryptoError("sealed under key \(SecretBox.describe(keyID: id)), which is neither the current secrets key (\(SecretBox.describe(keyID: current.keyID)))"
                          + (previous.map { " nor the previous one (\(SecretBox.describe(keyID: $0.keyID)))" } ?? " nor a previous one"))
    }
}

/// The secrets key files as a running service reads them: loaded when first needed, and read
/// again when they change on disk (a rotation by `attestctl secrets rotate`), so that every
/// instance opens values re-sealed under the new key without a restart. A value naming a key the
/// ring does not hold makes it look at the files at once; otherwise at most once a second.
/// Files that fail to load (refused by the access check, half-written, gone) never replace the
/// ring held: `problem` says why until the files load again.
public final class SecretsKeySource: Sendable {
    public let path: String
    private struct State {
        var ring: SecretsKeyring?
        var stamps: [FileStamp?] = []
        var checkedAt: ContinuousClock.Instant?
        /// When the ring held was read from the files.
        var loadedAt: Date?
        /// Why the files on disk did not load at the last look (nil: they did, or never changed).
        var problem: String?
    }
    private let state: Mutex<State>

    public init(path: String, loaded: SecretBox? = nil) {
        self.path = path
        // No stamps yet: the first look at the files loads the previous key too, if there is one.
        state = Mutex(State(ring: loaded.map { SecretsKeyring(current: $0) }, loadedAt: loaded.map { _ in Date() }))
    }

    /// The files at `path` as they are now, both keys, checked: what a service reads at start.
    public static func loading(_ path: String) throws -> SecretsKeySource {
        let source = SecretsKeySource(path: path)
        // The stamps first: a change between them and the read is seen at the next look.
        let stamps = Self.stamps(path)
        let ring = try SecretsKeyring.load(path)
        source.state.withLock { s in
            s.ring = ring
            s.stamps = stamps
            s.checkedAt = ContinuousClock.now
            s.loadedAt = Date()
        }
        return source
    }

    /// The key new values are sealed under, or nil while the file is absent or unreadable.
    public func current() -> SecretBox? { keyring(refresh: .ifDue)?.current }

    /// The keys as the files hold them now (a seal or a rotation's step asks the files first).
    public func keyring(refresh: Refresh = .ifDue) -> SecretsKeyring? {
        state.withLock { s in
            let now = ContinuousClock.now
            // Once a second at most, unless asked now (a value names a key not held, or a seal).
            let due = refresh == .now || s.checkedAt.map { now - $0 >= .seconds(1) } ?? true
            guard due else { return s.ring }
            s.checkedAt = now
            let stamps = Self.stamps(path)
            guard s.ring == nil || stamps != s.stamps else { return s.ring }
            // The first run: no file yet, nothing held, nothing wrong (attestctl init makes it).
            guard s.ring != nil || stamps[0] != nil else {
                s.problem = nil
                return nil
            }
            // A refused, half-written or vanished file keeps the ring already held; no stamps are
            // kept, so the files are read again at every look until they load (even when put back
            // as they were: a chmod back to 0600 leaves the stamps the ring was read with).
            do {
                let ring = try SecretsKeyring.load(path)
                s.ring = ring
                s.stamps = stamps
                s.loadedAt = Date()
                s.problem = nil
            } catch {
                s.stamps = []
                s.problem = "\(error)"
            }
            return s.ring
        }
    }

    public enum Refresh: Sendable { case ifDue, now }

    /// What the service holds, and why the files on disk did not replace it (if they did not).
    public struct Holding: Sendable, Equatable {
        /// Key IDs as operators see them (`SecretBox.describe(keyID:)`); nil: none held.
        public let currentKey: String?
        public let previousKey: String?
        /// When the keys held were read from the files (nil: none yet).
        public let readAt: Date?
        /// Why the files on disk were not taken at the last look (nil: nothing wrong).
        public let problem: String?
    }

    /// The keys held after a look at the files (if one is due) and what that look found.
    public func holding() -> Holding {
        _ = keyring(refresh: .ifDue)
        return state.withLock { s in
            Holding(currentKey: s.ring.map { SecretBox.describe(keyID: $0.current.keyID) },
                    previousKey: s.ring?.previous.map { SecretBox.describe(keyID: $0.keyID) }, readAt: s.loadedAt, problem: s.problem)
        }
    }

    /// Why the files on disk did not load at the last look, or nil.
    public var problem: String? { state.withLock { $0.problem } }

    /// Opens a sealed value with the key it names, reading the files again first when it names a
    /// key not held yet (another instance's attestctl rotated the key a moment ago).
    public func open(_ sealed: [UInt8], associatedData: [UInt8]) throws -> [UInt8] {
        guard var ring = keyring() else {
            throw CryptoError(problem ?? "no secrets key file is loaded (\(path); attestctl init creates it)")
        }
        if !ring.holdsKey(of: sealed), let fresh = keyring(refresh: .now) { ring = fresh }
        return try ring.open(sealed, associatedData: associatedData)
    }

    /// What tells a file changed: device, inode, size and modification time, and its mode and
    /// owner (a chmod or chown is looked at too) (nil: absent).
    struct FileStamp: Equatable {
        let device: UInt64, inode: UInt64, size: Int64, seconds: Int, nanoseconds: Int, mode: UInt32, owner: UInt32
    }

    static func stamps(_ path: String) -> [FileStamp?] {
        [path, SecretsKeyFile.previousPath(path)].map { file in
            var info = stat()
            guard stat(file, &info) == 0 else { return nil }
            return FileStamp(device: UInt64(info.st_dev), inode: UInt64(info.st_ino), size: Int64(info.st_size),
                             seconds: Int(info.st_mtim.tv_sec), nanoseconds: Int(info.st_mtim.tv_nsec),
                             mode: UInt32(info.st_mode), owner: UInt32(info.st_uid))
        }
    }
}

// MARK: Rotation, on disk

extension SecretsKeyFile {
    /// The previous key's file while a rotation is under way.
    public static func previousPath(_ path: String) -> String { path + ".previous" }
    static func nextPath(_ path: String) -> String { path + ".next" }

    /// Makes a new key the current one and keeps the old one beside it (`path.previous`), each
    /// step atomic and durable, so that a rotation killed at any point can be resumed: true when
    /// it began now, false when one was already under way (it is then completed if it had been
    /// stopped halfway through the switch). Readers find the old key in one of the two files at
    /// every moment.
    @discardableResult
    public static func beginRotation(_ path: String) throws -> Bool {
        let previous = previousPath(path), next = nextPath(path)
        let manager = FileManager.default
        if manager.fileExists(atPath: previous) {
            if manager.fileExists(atPath: next) { try rename(next, to: path) }
            return false
        }
        // The current key's bytes, read once and checked to be a key before anything is changed:
        // exactly these become the previous key.
        let current = try readChecked(path)
        _ = try parse(current, path: path)
        // 1. The new key, durable, under a name nobody reads.
        unlink(next)
        guard try createIfAbsent(next) else { throw CryptoError("cannot create \(next): it exists") }
        sameOwner(next, as: path)
        // 2. The current key as the previous one (written whole, then renamed).
        try writeDurably(current, to: previous, owner: path)
        // 3. The switch.
        try rename(next, to: path)
        return true
    }

    /// Runs `body` holding the key file's rotation lock (`path.lock`, an exclusive `flock`): two
    /// rotations, or a rotation and its finish, never interleave. Refuses at once when another
    /// holds it.
    public static func withRotationLock<T>(_ path: String, _ body: () throws -> T) throws -> T {
        let lockPath = path + ".lock"
        let fd = Foundation.open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw CryptoError("cannot open the rotation lock \(lockPath): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            throw CryptoError("another attestctl is rotating the secrets key (it holds \(lockPath)); run this again once it has finished")
        }
        return try body()
    }

    /// Gives `file` the owner and group of `reference` (a rotation run as root must leave key files
    /// the service's user can read); harmless when not allowed.
    static func sameOwner(_ file: String, as reference: String) {
        var info = stat()
        guard stat(reference, &info) == 0 else { return }
        _ = chown(file, info.st_uid, info.st_gid)
    }

    /// Removes the previous key: the rotation is over.
    public static func finishRotation(_ path: String) throws {
        let previous = previousPath(path)
        guard unlink(previous) == 0 || errno == ENOENT else {
            throw CryptoError("cannot remove \(previous): \(String(cString: strerror(errno)))")
        }
        syncDirectory(of: path)
    }

    static func writeDurably(_ bytes: [UInt8], to path: String, owner reference: String) throws {
        let temporary = path + ".tmp"
        unlink(temporary)
        let fd = Foundation.open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw CryptoError("cannot create \(temporary): \(String(cString: strerror(errno)))") }
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd) == 0
        close(fd)
        guard written == bytes.count, synced else {
            unlink(temporary)
            throw CryptoError("cannot write \(temporary): \(String(cString: strerror(errno)))")
        }
        sameOwner(temporary, as: reference)
        try rename(temporary, to: path)
    }

    static func rename(_ from: String, to: String) throws {
        guard Glibc.rename(from, to) == 0 else { throw CryptoError("cannot rename \(from) to \(to): \(String(cString: strerror(errno)))") }
        syncDirectory(of: to)
    }

    /// Makes a rename or removal in the file's directory durable.
    static func syncDirectory(of path: String) {
        let directory = (path as NSString).deletingLastPathComponent
        let fd = Foundation.open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return }
        fsync(fd)
        close(fd)
    }
}
