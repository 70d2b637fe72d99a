import Foundation
import SQLiteStore
import Testing
import TokenService

private typealias F = StoreFixture

/// The SQLite store keeps live-token answers per reader while the database is unchanged. Another
/// process (attestctl) writes the same file: each of its changes must reach the very next check.
@Suite(.timeLimit(.minutes(1)))
struct SQLiteGrantCacheTests {
    /// The server's store with one reader, so every check after the first could be answered from
    /// its cache, and a second store on the same file in the part of attestctl.
    private func stores() throws -> (fixture: StoreFixture, server: SQLiteTokenStore, operator: SQLiteTokenStore) {
        let fixture = try StoreFixture(.sqlite)
        let path = fixture.directory!.appendingPathComponent("s.sqlite").path
        return (fixture, try SQLiteTokenStore(path: path, readers: 1), try SQLiteTokenStore(path: path, readers: 1))
    }

    @Test func anotherProcesssRevocationReachesTheNextCheck() throws {
        let (f, server, ctl) = try stores()
        let app = try f.integration(), bystander = try f.integration("Bystander")
        let (_, token, _) = try f.registered(app)
        let (_, other, _) = try f.registered(bystander)
        for _ in 0..<3 {
            #expect(try server.liveToken(hash: token.tokenHash, at: F.t0)?.clientID == app.clientID)
            #expect(try server.liveToken(hash: other.tokenHash, at: F.t0)?.clientID == bystander.clientID)
        }
        #expect(try ctl.revokeIntegration(clientID: app.clientID, at: F.t0 + 1))
        #expect(try server.liveToken(hash: token.tokenHash, at: F.t0 + 2) == nil)
        #expect(try server.liveToken(hash: other.tokenHash, at: F.t0 + 2)?.clientID == bystander.clientID)
    }

    @Test func policyAndRecordedUsageChangesReachTheNextCheck() throws {
        let (f, server, ctl) = try stores()
        let app = try f.integration()
        let (device, token, _) = try f.registered(app)
        #expect(try server.liveToken(hash: token.tokenHash, at: F.t0)?.policy == IntegrationPolicy())
        #expect(try server.liveToken(hash: token.tokenHash, at: F.t0)?.recorded == RecordedUsage())

        let policy = IntegrationPolicy(models: ["claude-a"], maxTokens: 64, deviceRequestsPerMinute: 3, monthlyTokenBudget: 1_000)
        #expect(try ctl.updatePolicy(clientID: app.clientID, policy))
        #expect(try server.liveToken(hash: token.tokenHash, at: F.t0)?.policy == policy)

        var batch = UsageBatch()
        batch.monthTokens[MonthKey(clientID: app.clientID, month: UsageClock.month(F.t0))] = 50
        batch.deviceMinutes[DeviceMinuteKey(clientID: app.clientID, keyID: device.keyID, minute: UsageClock.minute(F.t0))] = 2
        _ = try ctl.recordUsage(batch, purgeDeviceMinutesBefore: 0)
        #expect(try server.liveToken(hash: token.tokenHash, at: F.t0)?.recorded
                == RecordedUsage(monthTokens: 50, deviceRequestsThisMinute: 2, deviceRequestsLastMinute: 0))
        // With nothing written, a new minute still reads the counts for that minute.
        #expect(try server.liveToken(hash: token.tokenHash, at: F.t0 + 60)?.recorded
                == RecordedUsage(monthTokens: 50, deviceRequestsThisMinute: 0, deviceRequestsLastMinute: 2))
    }

    @Test func aKeptGrantStillExpires() throws {
        let (f, server, _) = try stores()
        let app = try f.integration()
        let (_, token, _) = try f.registered(app)
        let justBefore = token.expiresAt - 0.001
        #expect(try server.liveToken(hash: token.tokenHash, at: justBefore)?.clientID == app.clientID)
        #expect(try server.liveToken(hash: token.tokenHash, at: token.expiresAt) == nil)
        // A hash that shares the kept one's first 8 bytes is not taken for it.
        let lookalike = Array(token.tokenHash.prefix(8)) + F.bytes(24)
        #expect(try server.liveToken(hash: lookalike, at: justBefore) == nil)
    }

    /// A user profile's recorded usage is kept like a grant: another process's flush (every
    /// count, the money too) reaches the very next read, and a new minute reads its own counts.
    @Test func anotherProcesssFlushReachesTheNextProfileRead() throws {
        let (f, server, ctl) = try stores()
        let app = try f.integration()
        let month = UsageClock.month(F.t0), minute = UsageClock.minute(F.t0)
        func read(_ profile: String = "uprof_a", minute: Int64 = minute) throws -> RecordedProfileUsage {
            try server.recordedProfileUsage(clientID: app.clientID, profile: profile, month: month, minute: minute)
        }
        #expect(try read() == RecordedProfileUsage())
        #expect(try read() == RecordedProfileUsage())
        var batch = UsageBatch()
        batch.profileMonthTokens[ProfileMonthKey(clientID: app.clientID, profile: "uprof_a", month: month)] = 70
        batch.profileMinutes[ProfileMinuteKey(clientID: app.clientID, profile: "uprof_a", minute: minute)] = 3
        batch.spend[SpendKey(scope: SpendKey.profile(app.clientID, "uprof_a"), period: month)] = 1_500
        batch.spend[SpendKey(scope: SpendKey.profile(app.clientID, "uprof_a"), period: UsageClock.day(F.t0))] = 500
        _ = try ctl.recordUsage(batch, purgeDeviceMinutesBefore: 0)
        var expected = RecordedProfileUsage(monthTokens: 70, requestsThisMinute: 3, requestsLastMinute: 0)
        expected.monthSpend = 1_500
        expected.daySpend = 500
        #expect(try read() == expected)
        #expect(try read() == expected)
        #expect(try read("uprof_b") == RecordedProfileUsage())
        // With nothing written, the next minute reads that minute's counts.
        var nextMinute = RecordedProfileUsage(monthTokens: 70, requestsThisMinute: 0, requestsLastMinute: 3)
        nextMinute.monthSpend = 1_500
        nextMinute.daySpend = 500
        #expect(try read(minute: minute + 1) == nextMinute)
    }
}
