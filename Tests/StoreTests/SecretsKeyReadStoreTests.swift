import Foundation
import Testing
import TokenService

/// What each attestd last read from its secrets key files, on SQLite and on PostgreSQL: a row per
/// host and key file, replaced by the next report of the same instance, and purged once old.
@Suite(.timeLimit(.minutes(2)))
struct SecretsKeyReadStoreTests {
    @Test(arguments: Backend.allCases)
    func aReportReplacesItsInstancesRowAndOldRowsArePurged(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let t0 = StoreFixture.t0
        #expect(try f.store.secretsKeyReads().isEmpty)
        let a = SecretsKeyRead(host: "host-a", keyFile: "/var/lib/attestd/attestd.key", currentKey: "0011223344556677", previousKey: nil,
                               readAt: t0, reportedAt: t0, processID: 41, problem: nil)
        var b = SecretsKeyRead(host: "host-b", keyFile: "/var/lib/attestd/attestd.key", currentKey: "8899aabbccddeeff", previousKey: "0011223344556677",
                               readAt: t0 - 60, reportedAt: t0 - 30, processID: 7, problem: nil)
        let none = SecretsKeyRead(host: "host-a", keyFile: "/srv/other/attestd.key", currentKey: nil, previousKey: nil, readAt: nil,
                                  reportedAt: t0 - 90_000, processID: 8, problem: "the secrets key file /srv/other/attestd.key is readable by its group or others (mode 0644): run chmod 600 /srv/other/attestd.key")
        for read in [b, a, none] { try f.store.recordSecretsKeyRead(read) }
        // By host, then key file; every field (times to the bit) as written, NULLs as nil.
        #expect(try f.store.secretsKeyReads() == [none, a, b])
        // The same instance reports again: its row changes, no row is added.
        b.previousKey = nil
        b.readAt = t0 + 10
        b.reportedAt = t0 + 10
        b.processID = 9
        try f.store.recordSecretsKeyRead(b)
        #expect(try f.store.secretsKeyReads() == [none, a, b])
        // Rows last reported before the cut-off go.
        #expect(try f.store.purgeSecretsKeyReads(before: t0 - 3600) == 1)
        #expect(try f.store.secretsKeyReads() == [a, b])
        #expect(try f.store.purgeSecretsKeyReads(before: t0 - 3600) == 0)
    }
}
