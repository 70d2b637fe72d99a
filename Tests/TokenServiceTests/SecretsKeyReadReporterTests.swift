import AttestCrypto
import Foundation
import Synchronization
import Testing
import TokenService

/// attestd's report of its secrets key files, with its clock moved by hand and each look made by
/// the test: a row at the first look, then a write only when what it holds or why it refuses the
/// files changed, or when its report is due; a refused file logged once, without a key ID.
@Suite struct SecretsKeyReadReporterTests {
    final class Store: SecretsKeyReadStore {
        let writes = Mutex<[SecretsKeyRead]>([])
        let failing = Mutex<Bool>(false)
        func recordSecretsKeyRead(_ read: SecretsKeyRead) throws {
            if failing.withLock({ $0 }) { throw CancellationError() }
            writes.withLock { $0.append(read) }
        }
        func secretsKeyReads() throws -> [SecretsKeyRead] { writes.withLock { $0 } }
        func purgeSecretsKeyReads(before time: Date) throws -> Int { 0 }
        var count: Int { writes.withLock { $0.count } }
        var last: SecretsKeyRead? { writes.withLock { $0.last } }
    }

    final class Log: Sendable {
        let lines = Mutex<[(event: String, fields: [(String, String)], isError: Bool)]>([])
        var events: [String] { lines.withLock { $0.map(\.event) } }
        var text: String { lines.withLock { $0.map { "\($0.event) \($0.fields)" }.joined(separator: "\n") } }
    }

    @Test func itWritesAtStartOnChangesAndWhenDueAndLogsARefusedFileOnce() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("key-reads-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("attestd.key").path
        #expect(try SecretsKeyFile.createIfAbsent(path))
        let old = SecretBox.describe(keyID: try SecretsKeyFile.load(path).keyID)
        let source = try SecretsKeySource.loading(path)
        let store = Store(), log = Log()
        let clock = Mutex(Date(timeIntervalSince1970: 1_800_000_000))
        let reporter = SecretsKeyReadReporter(source: source, store: store, host: "host-a", reportInterval: 300, now: { clock.withLock { $0 } },
                                              log: { event, fields, isError in log.lines.withLock { $0.append((event, fields, isError)) } })
        func advance(_ seconds: TimeInterval) { clock.withLock { $0 += seconds } }

        reporter.look()
        let first = try #require(store.last)
        #expect(store.count == 1)
        #expect(first.host == "host-a" && first.keyFile == path && first.currentKey == old && first.previousKey == nil)
        #expect(first.readAt != nil && first.problem == nil && first.processID == Int64(getpid()))
        advance(1)
        reporter.look()
        #expect(store.count == 1, "nothing changed: nothing written")
        advance(300)
        reporter.look()
        #expect(store.count == 2 && store.last?.reportedAt == clock.withLock { $0 }, "the report is due")

        // A rotation: both keys held, written at once.
        #expect(try SecretsKeyFile.beginRotation(path))
        let new = SecretBox.describe(keyID: try SecretsKeyFile.load(path).keyID)
        _ = source.keyring(refresh: .now)
        advance(1)
        reporter.look()
        #expect(store.count == 3 && store.last?.currentKey == new && store.last?.previousKey == old)
        #expect(log.events == ["secrets_key_loaded"])

        // The previous key's file turns readable by others: refused, the keys held stay, logged once.
        chmod(SecretsKeyFile.previousPath(path), 0o644)
        _ = source.keyring(refresh: .now)
        advance(1)
        reporter.look()
        reporter.look()
        #expect(store.count == 4)
        #expect(store.last?.currentKey == new && store.last?.previousKey == old)
        #expect(store.last?.problem?.contains("\(SecretsKeyFile.previousPath(path)) is readable by its group or others (mode 0644): run chmod 600") == true)
        #expect(log.events == ["secrets_key_loaded", "secrets_key_refused"])
        #expect(log.lines.withLock { $0.last?.isError } == true)
        // Fixed, and the rotation finished: the files are taken again.
        chmod(SecretsKeyFile.previousPath(path), 0o600)
        try SecretsKeyFile.finishRotation(path)
        _ = source.keyring(refresh: .now)
        advance(1)
        reporter.look()
        #expect(store.count == 5 && store.last?.problem == nil && store.last?.previousKey == nil && store.last?.currentKey == new)
        #expect(log.events == ["secrets_key_loaded", "secrets_key_refused", "secrets_key_accepted", "secrets_key_loaded"], "the previous key gone")

        // The database refuses for a while: logged once, retried at each look, written once it can.
        store.failing.withLock { $0 = true }
        advance(300)
        reporter.look()
        reporter.look()
        #expect(store.count == 5)
        #expect(log.events.filter { $0 == "secrets_key_report_failed" }.count == 1)
        store.failing.withLock { $0 = false }
        advance(1)
        reporter.look()
        #expect(store.count == 6)
        // No key ID ever reaches the log.
        for keyID in [old, new] { #expect(!log.text.contains(keyID)) }
    }
}
