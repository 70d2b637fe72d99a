import CSQLite
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An online copy of a SQLite database through SQLite's backup API, consistent while attestd
/// serves: every page is copied in one step inside one read transaction, so the copy is the
/// database as of one instant (in WAL mode writers go on meanwhile; a copy made in small steps
/// restarts whenever another process commits, which under load is always). Written 0600 to a
/// temporary file beside the destination, synced, then renamed over it: a reader never sees half
/// a backup, and a crash leaves the previous one.
public enum SQLiteBackup {
    public struct Result: Sendable {
        public let pages: Int
        public let bytes: Int
        public let seconds: Double
    }

    public static func copy(database source: String, to destination: String) throws -> Result {
        let started = DispatchTime.now().uptimeNanoseconds
        guard FileManager.default.fileExists(atPath: source) else {
            throw SQLiteError(code: SQLITE_CANTOPEN, message: "no database at \(source)")
        }
        let temporary = destination + ".partial-\(getpid())"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SQLiteError(code: SQLITE_CANTOPEN, message: "cannot create \(temporary): \(String(cString: strerror(errno)))") }
        close(fd)
        var finished = false
        defer { if !finished { unlink(temporary) } }

        var from: OpaquePointer?, to: OpaquePointer?
        defer {
            sqlite3_close_v2(from)
            sqlite3_close_v2(to)
        }
        guard sqlite3_open_v2(source, &from, SQLITE_OPEN_READONLY, nil) == SQLITE_OK, let reader = from else {
            throw SQLiteError(code: SQLITE_CANTOPEN, message: "cannot open \(source): \(from.map { String(cString: sqlite3_errmsg($0)) } ?? "")")
        }
        guard sqlite3_open_v2(temporary, &to, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let writer = to else {
            throw SQLiteError(code: SQLITE_CANTOPEN, message: "cannot open \(temporary)")
        }
        sqlite3_busy_timeout(reader, 5000)
        guard let backup = sqlite3_backup_init(writer, "main", reader, "main") else {
            throw SQLiteError(code: sqlite3_errcode(writer), message: "backup: \(String(cString: sqlite3_errmsg(writer)))")
        }
        var status: Int32
        var attempts = 0
        repeat {
            status = sqlite3_backup_step(backup, -1)
            if status == SQLITE_BUSY || status == SQLITE_LOCKED {
                attempts += 1
                usleep(20_000)
            }
        } while (status == SQLITE_BUSY || status == SQLITE_LOCKED) && attempts < 250
        let pages = Int(sqlite3_backup_pagecount(backup))
        sqlite3_backup_finish(backup)
        guard status == SQLITE_DONE else {
            throw SQLiteError(code: status, message: "backup: \(String(cString: sqlite3_errstr(status)))")
        }
        // The copy is a plain rollback-journal database: one file, restored by copying it back.
        _ = sqlite3_exec(writer, "PRAGMA journal_mode = DELETE", nil, nil, nil)
        sqlite3_close_v2(writer)
        to = nil
        try syncFile(temporary)
        guard rename(temporary, destination) == 0 else {
            throw SQLiteError(code: SQLITE_IOERR, message: "cannot rename the copy to \(destination): \(String(cString: strerror(errno)))")
        }
        finished = true
        try syncFile((destination as NSString).deletingLastPathComponent.isEmpty ? "." : (destination as NSString).deletingLastPathComponent)
        let bytes = (try? FileManager.default.attributesOfItem(atPath: destination)[.size] as? Int) ?? 0
        return Result(pages: pages, bytes: bytes, seconds: Double(DispatchTime.now().uptimeNanoseconds - started) / 1e9)
    }

    private static func syncFile(_ path: String) throws {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw SQLiteError(code: SQLITE_IOERR, message: "cannot open \(path) to sync it") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw SQLiteError(code: SQLITE_IOERR, message: "cannot sync \(path)") }
    }
}
