import Foundation
import Testing
@testable import AttestClient

@Suite struct CredentialStoreTests {
    private func temporaryDirectory() -> URL {
        FileManager.default.temporaryDirectory.appendingPathComponent("attest-store-\(UUID().uuidString)")
    }

    private func permissions(_ url: URL) throws -> Int {
        let attributes = try FileManager.default.attributesOfItem(atPath: url.path)
        return (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
    }

    @Test func fileStoreRoundTripsWithPrivatePermissions() throws {
        let root = temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: root) }
        let directory = root.appendingPathComponent("nested/credentials")
        let store = try FileCredentialStore(directory: directory)
        #expect(try permissions(directory) == 0o700)

        #expect(try store.keyID(for: "clid_a") == nil)
        #expect(try store.token(for: "clid_a") == nil)
        let token = StoredToken(token: "tok", expiresAt: Date(timeIntervalSince1970: 1_700_000_123.456))
        try store.setKeyID("key+/=", for: "clid_a")
        try store.setToken(token, for: "clid_a")
        try store.setKeyID("other", for: "clid_b")

        // A second instance (another process) reads what the first wrote.
        let reopened = try FileCredentialStore(directory: directory)
        #expect(try reopened.keyID(for: "clid_a") == "key+/=")
        #expect(try reopened.token(for: "clid_a") == token)
        #expect(try reopened.keyID(for: "clid_b") == "other")
        #expect(try reopened.token(for: "clid_b") == nil)

        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()
        #expect(files == ["client-clid_a.json", "client-clid_b.json"])      // no temporary files left
        for file in files {
            #expect(try permissions(directory.appendingPathComponent(file)) == 0o600)
        }

        try store.setToken(nil, for: "clid_a")
        #expect(try store.token(for: "clid_a") == nil)
        #expect(try store.keyID(for: "clid_a") == "key+/=")
        try store.setKeyID(nil, for: "clid_a")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["client-clid_b.json"])
    }

    @Test func fileStoreCannotBeSteeredOutOfItsDirectory() throws {
        let root = temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: root) }
        let directory = root.appendingPathComponent("store")
        let store = try FileCredentialStore(directory: directory)
        try store.setKeyID("k", for: "../escape")
        #expect(try store.keyID(for: "../escape") == "k")
        #expect(try FileManager.default.contentsOfDirectory(atPath: root.path) == ["store"])
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        #expect(files.count == 1 && files[0].hasPrefix("sha256-"))
    }

    @Test func fileStoreRejectsAFileAsDirectory() throws {
        let file = temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: file) }
        try Data().write(to: file)
        #expect(throws: (any Error).self) { try FileCredentialStore(directory: file) }
    }

    @Test func clientWorksAcrossRestartsWithFileStore() async throws {
        let root = temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: root) }
        let h = Harness()
        let clock = h.clock
        func client() throws -> AppAttestClient {
            AppAttestClient(clientID: h.server.clientID, baseURL: Harness.baseURL, attester: h.attester,
                            store: try FileCredentialStore(directory: root), transport: h.server, now: { clock.now })
        }
        #expect(try await client().authenticateIfNeeded() == .registered)
        #expect(try await client().authenticateIfNeeded() == .cached)
        h.clock.advance(3600)
        #expect(try await client().authenticateIfNeeded() == .refreshed)
        #expect(h.attester.attestCount == 1)
    }
}

@Suite struct SharedClientTests {
    @Test func oneClientPerClientIDInAProcess() {
        let url = URL(string: "http://127.0.0.1:1")!
        let store = InMemoryCredentialStore()
        let attester = UnsupportedAttesterForSharedTest()
        let a = AppAttestClient.shared(clientID: "clid_shared_a", baseURL: url, attester: attester, store: store)
        let b = AppAttestClient.shared(clientID: "clid_shared_a", baseURL: url, attester: attester, store: store)
        let c = AppAttestClient.shared(clientID: "clid_shared_c", baseURL: url, attester: attester, store: store)
        #expect(a === b)
        #expect(a !== c)
    }
}

private struct UnsupportedAttesterForSharedTest: DeviceAttester {
    var isSupported: Bool { false }
    func generateKey() async throws -> String { throw AttestClientError.attestationUnsupported }
    func attestKey(_ keyID: String, clientDataHash: Data) async throws -> Data { throw AttestClientError.attestationUnsupported }
    func generateAssertion(_ keyID: String, clientDataHash: Data) async throws -> Data { throw AttestClientError.attestationUnsupported }
}
