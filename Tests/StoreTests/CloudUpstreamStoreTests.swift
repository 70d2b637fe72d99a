import Foundation
import StoreRecords
import Testing
import TokenService

/// A workspace's upstream of each kind, on SQLite and PostgreSQL: stored and read back with its
/// settings, by the admin read and by the token check alike; one row per workspace, so the
/// Anthropic key replaces a cloud upstream and the reverse; a row that does not decode is an error.
@Suite(.timeLimit(.minutes(2)))
struct CloudUpstreamStoreTests {
    typealias F = StoreFixture
    let t0 = StoreFixture.t0

    static let bedrock = CloudUpstreamSettings(region: "us-east-1", endpointURL: "https://bedrock.example.test:8443",
                                               models: ["claude-sonnet-4-5": "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.x-v1:0",
                                                        "claude-haiku-4-5": "anthropic.claude-haiku-4-5-20251001-v1:0"])
    static let vertex = CloudUpstreamSettings(region: "us-east5", project: "my-project-123", endpointURL: "http://127.0.0.1:9999",
                                              tokenURL: "https://oauth.example.test", models: ["claude-sonnet-4-5": "claude-sonnet-4-5@20250929"],
                                              clientEmail: "relay@my-project-123.iam.gserviceaccount.com")

    /// A fresh store with an integration and a registered device's live token.
    func withToken(_ backend: Backend) throws -> (F, Integration, TokenRecord) {
        let f = try StoreFixture(backend)
        let app = try f.integration()
        let (_, token, _) = try f.registered(app)
        return (f, app, token)
    }

    @Test(arguments: Backend.allCases)
    func eachKindRoundTripsThroughTheAdminReadAndTheTokenCheck(_ backend: Backend) throws {
        let (f, app, token) = try withToken(backend)
        let store = f.store

        let bedrock = SealedUpstreamKey(sealed: F.bytes(), last4: "MPLE", setAt: t0, setBy: "owner@example.com", kind: .bedrock, settings: Self.bedrock)
        try store.setUpstreamKey(workspaceID: app.workspaceID, bedrock)
        #expect(try store.upstreamKey(workspaceID: app.workspaceID) == bedrock)
        #expect(try store.liveToken(hash: token.tokenHash, at: t0)?.upstreamKey == bedrock)

        let vertex = SealedUpstreamKey(sealed: F.bytes(), last4: "ab12", setAt: t0 + 60, setBy: "other@example.com", kind: .vertex, settings: Self.vertex)
        try store.setUpstreamKey(workspaceID: app.workspaceID, vertex)
        let read = try #require(try store.upstreamKey(workspaceID: app.workspaceID))
        #expect(read == vertex && read.settings?.project == "my-project-123" && read.settings?.tokenURL == "https://oauth.example.test")
        #expect(try store.liveToken(hash: token.tokenHash, at: t0 + 61)?.upstreamKey == vertex)

        // The Anthropic key takes the same row back: kind anthropic, no settings left behind.
        let key = SealedUpstreamKey(sealed: F.bytes(), last4: "wxyz", setAt: t0 + 120, setBy: "owner@example.com")
        try store.setUpstreamKey(workspaceID: app.workspaceID, key)
        let back = try #require(try store.upstreamKey(workspaceID: app.workspaceID))
        #expect(back == key && back.kind == .anthropic && back.settings == nil)
        #expect(try store.liveToken(hash: token.tokenHash, at: t0 + 121)?.upstreamKey == key)
    }

    @Test(arguments: Backend.allCases)
    func theSchemaRefusesAnUnknownKindAndACloudKindWithoutSettings(_ backend: Backend) throws {
        let f = try StoreFixture(backend)
        let workspace = try f.defaultWorkspace
        let blob = backend == .sqlite ? "x'00'" : "'\\x00'::bytea"
        let insert = "INSERT INTO workspace_upstream_keys (workspace_id, sealed_key, last4, set_at, set_by, kind, settings) VALUES (\(workspace.id), \(blob), 'abcd', 0, 'x', "
        #expect(throws: (any Error).self) { try f.execute(insert + "'azure', '{}')") }
        #expect(throws: (any Error).self) { try f.execute(insert + "'bedrock', NULL)") }
        #expect(throws: (any Error).self) { try f.execute(insert + "'anthropic', '{}')") }
        #expect(try f.store.upstreamKey(workspaceID: workspace.id) == nil)
        // A row from before migration 0015 reads as the Anthropic API's key.
        try f.execute("INSERT INTO workspace_upstream_keys (workspace_id, sealed_key, last4, set_at, set_by) VALUES (\(workspace.id), \(blob), 'abcd', 0, 'x')")
        let old = try #require(try f.store.upstreamKey(workspaceID: workspace.id))
        #expect(old.kind == .anthropic && old.settings == nil && old.last4 == "abcd")
    }

    @Test(arguments: Backend.allCases)
    func settingsThatAreNotTheirJSONAreAClearErrorForBothReads(_ backend: Backend) throws {
        let (f, app, token) = try withToken(backend)
        let store = f.store
        try store.setUpstreamKey(workspaceID: app.workspaceID, SealedUpstreamKey(sealed: F.bytes(), last4: "MPLE", setAt: t0, setBy: "o@example.com",
                                                                                 kind: .bedrock, settings: Self.bedrock))
        try f.execute("UPDATE workspace_upstream_keys SET settings = '{\"region\": 5}'")
        let error = try #require(throws: InvalidStoredValue.self) { try store.upstreamKey(workspaceID: app.workspaceID) }
        #expect(error.description.contains("workspace_upstream_keys.settings"))
        #expect(throws: InvalidStoredValue.self) { try store.liveToken(hash: token.tokenHash, at: t0) }
    }

    /// A row as a decoder sees it, for values the schema would refuse.
    struct Row: StoreRow {
        var values: [String: Any?]
        func value(_ column: String) throws -> Any? {
            guard let value = values[column] else { throw MissingColumn(column) }
            return value
        }
        func isNull(_ column: String) throws -> Bool { try value(column) == nil }
        func int(_ column: String) throws -> Int64 { try value(column) as! Int64 }
        func double(_ column: String) throws -> Double { try value(column) as! Double }
        func text(_ column: String) throws -> String { try value(column) as! String }
        func bytes(_ column: String) throws -> [UInt8] { try value(column) as! [UInt8] }
    }

    @Test func anUnknownKindOrSettingsThatDoNotFitTheKindAreClearErrors() throws {
        let base: [String: Any?] = ["sealed_key": [UInt8](repeating: 1, count: 8), "last4": "abcd", "set_at": 0.0, "set_by": "x", "kind": "bedrock",
                                    "settings": Self.bedrock.encoded()]
        #expect(try SealedUpstreamKey(row: Row(values: base)).settings == Self.bedrock)
        var row = Row(values: base)
        row.values["kind"] = "azure"
        #expect(throws: InvalidStoredValue.self) { try SealedUpstreamKey(row: row) }
        row = Row(values: base)
        row.values["settings"] = .some(nil)
        let missing = try #require(throws: InvalidStoredValue.self) { try SealedUpstreamKey(row: row) }
        #expect(missing.description.contains("bedrock"))
        row = Row(values: base)
        row.values["kind"] = "anthropic"
        #expect(throws: InvalidStoredValue.self) { try SealedUpstreamKey(row: row) }
        row = Row(values: base)
        row.values["settings"] = "not json"
        #expect(throws: InvalidStoredValue.self) { try SealedUpstreamKey(row: row) }
    }
}
