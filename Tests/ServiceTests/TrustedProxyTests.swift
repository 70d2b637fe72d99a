import Foundation
import RawHTTP
import Testing

/// `--trusted-proxy` through a real hop: the shipped attestd on 127.0.0.1 behind a forwarding
/// proxy on 127.0.0.2 that names each client in X-Forwarded-For, with clients connecting from
/// their own loopback addresses (127.0.0.3, .4, …) and a challenge limit of 3 a minute, so
/// every limit is reached within the test.
@Suite(.serialized) struct TrustedProxyTests {
    static let limit = 3
    static let unknownClientID = "clid_NoSuchIntegrationAtAll"

    /// A database with one integration, attestd on it and the proxy in front.
    final class Hop {
        let directory: URL
        let clientID: String
        let server: ServerProcess
        let proxy: ForwardingProxy

        init(trustedProxy: String?, extraArguments: [String] = []) throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("attestd-proxy-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let db = directory.appendingPathComponent("attestd.sqlite").path
            guard try ServerProcess.attestctl(["init", "--db", db, "--owner", "owner@example.com"]).0 == 0 else { throw HTTPTestError("attestctl init") }
            let created = try ServerProcess.attestctl(["integrations", "create", "--db", db, "--actor", "owner@example.com", "--name", "Proxied",
                                                       "--team-id", "ABCDE12345", "--bundle-id", "com.example.app", "--json"]).1
            clientID = try #require((try JSONSerialization.jsonObject(with: Data(created.utf8)) as? [String: Any])?["client_id"] as? String)
            server = try ServerProcess(db: db, extraArguments: ["--challenge-limit", String(TrustedProxyTests.limit), "--shutdown-grace", "1"]
                                       + (trustedProxy.map { ["--trusted-proxy", $0] } ?? []) + extraArguments)
            do {
                proxy = try ForwardingProxy(host: "127.0.0.2", upstreamPort: server.port)
            } catch {
                server.stop()
                throw error
            }
        }

        func stop() {
            proxy.stop()
            server.stop()
            try? FileManager.default.removeItem(at: directory)
        }

        /// A challenge request for a fresh key from `source`: through the proxy, or straight to
        /// attestd; `forwardedFor` is what the client itself claims in X-Forwarded-For.
        func challenge(from source: String, viaProxy: Bool = true, clientID: String? = nil, forwardedFor: String? = nil,
                       forwarded: String? = nil) throws -> RawResponse {
            let keyID = Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
            let body = #"{"client_id":"\#(clientID ?? self.clientID)","key_id":"\#(keyID)"}"#
            var request = "POST /v1/oauth/app-attest/challenge HTTP/1.1\r\nHost: attest.example.com\r\nContent-Type: application/json\r\n"
                + "Content-Length: \(body.utf8.count)\r\nConnection: close\r\n"
            if let forwardedFor { request += "X-Forwarded-For: \(forwardedFor)\r\n" }
            if let forwarded { request += "Forwarded: \(forwarded)\r\n" }
            let connection = try RawConnection(host: viaProxy ? proxy.host : "127.0.0.1", port: viaProxy ? proxy.port : server.port,
                                               timeout: 3, source: source)
            guard connection.sendAll(request + "\r\n" + body), let response = connection.readFramedResponse() else {
                throw HTTPTestError("no answer from \(viaProxy ? "the proxy" : "attestd") for \(source) (\(connection.lastOutcome))")
            }
            return response
        }

        /// Statuses of `count` challenge requests from `source` (each for a fresh key).
        func statuses(_ count: Int, from source: String, viaProxy: Bool = true, clientID: String? = nil,
                      forwardedFor: (Int) -> String? = { _ in nil }) throws -> [Int] {
            try (0..<count).map { try challenge(from: source, viaProxy: viaProxy, clientID: clientID, forwardedFor: forwardedFor($0)).status }
        }
    }

    static func expectRateLimited(_ response: RawResponse, _ comment: Comment, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(response.status == 429, comment, sourceLocation: sourceLocation)
        #expect(response.json?["error"] as? String == "rate_limit_error", comment, sourceLocation: sourceLocation)
        let retryAfter = response.headers["retry-after"].flatMap { Int($0) }
        #expect(retryAfter.map { (1...60).contains($0) } == true, "retry-after \(response.headers["retry-after"] ?? "missing")", sourceLocation: sourceLocation)
    }

    static let allowed = [Int](repeating: 200, count: limit)

    @Test func behindATrustedProxyEachClientHasItsOwnBudget() async throws {
        let hop = try Hop(trustedProxy: "127.0.0.2/32")
        defer { hop.stop() }

        // (a) The limit applies to the real client, not the proxy every client shares.
        #expect(try hop.statuses(Self.limit, from: "127.0.0.3") == Self.allowed)
        Self.expectRateLimited(try hop.challenge(from: "127.0.0.3"), "127.0.0.3 over its limit")
        #expect(try hop.statuses(Self.limit, from: "127.0.0.4") == Self.allowed, "another client through the same proxy")
        Self.expectRateLimited(try hop.challenge(from: "127.0.0.4"), "127.0.0.4 over its limit")
        // attestd saw the clients' addresses, as the proxy named them.
        #expect(await hop.server.waitForLog(containing: #""remote":"127.0.0.3""#))
        #expect(await hop.server.waitForLog(containing: #""remote":"127.0.0.4""#))
        #expect(!hop.server.log.contains(#""remote":"127.0.0.2""#), "a request was counted against the proxy")

        // (b) Requests naming an unknown client ID spend a budget of their own: a flood of them
        // from 127.0.0.5 leaves a real device at that address its whole budget.
        let flood = try hop.statuses(Self.limit + 5, from: "127.0.0.5", clientID: Self.unknownClientID)
        #expect(flood == [Int](repeating: 401, count: Self.limit) + [Int](repeating: 429, count: 5))
        #expect(try hop.statuses(Self.limit, from: "127.0.0.5") == Self.allowed, "the real device at the flooding address")
        Self.expectRateLimited(try hop.challenge(from: "127.0.0.5"), "the real device over its own limit")

        // A client cannot pick its bucket through the proxy either: the proxy appends the real
        // address after whatever the client claims, and the right-most untrusted hop counts.
        let spoofed = try hop.statuses(Self.limit + 2, from: "127.0.0.6") { "198.51.100.\($0 + 1)" }
        #expect(spoofed == Self.allowed + [429, 429], "spoofed X-Forwarded-For through the proxy")
        #expect(!hop.server.log.contains(#""remote":"198.51.100."#))
        // Nor straight to attestd: a peer that is not a trusted proxy is the caller, whatever it claims.
        let direct = try hop.statuses(Self.limit + 2, from: "127.0.0.7", viaProxy: false) { "198.51.100.\($0 + 1)" }
        #expect(direct == Self.allowed + [429, 429], "spoofed X-Forwarded-For from an untrusted peer")
        // Nor with the header the proxy does not write: a client's own `Forwarded` (which the proxy
        // passes on as it came, after its X-Forwarded-For) is ignored.
        var viaForwarded: [Int] = []
        for n in 0..<(Self.limit + 2) {
            viaForwarded.append(try hop.challenge(from: "127.0.0.8", forwarded: "for=198.51.100.\(70 + n)").status)
        }
        #expect(viaForwarded == Self.allowed + [429, 429], "a client-sent Forwarded through the proxy")
        #expect(hop.proxy.forwarded == 3 * (Self.limit + 1) + (Self.limit + 5) + 2 * (Self.limit + 2), "requests through the proxy")
    }

    /// One subscriber holds a whole IPv6 /64: eight of its addresses share one challenge budget,
    /// another /64 has its own, and the log still names each address. With
    /// `--ipv6-prefix-length 128` each address is a caller of its own again.
    @Test func theAddressesOfOneIPv6Slash64ShareOneLimit() async throws {
        let hop = try Hop(trustedProxy: "127.0.0.9/32")
        defer { hop.stop() }
        let sameNetwork = try hop.statuses(8, from: "127.0.0.9", viaProxy: false) { "2001:db8:1:2:\($0 + 1)::\($0 + 7)" }
        #expect(sameNetwork == Self.allowed + [Int](repeating: 429, count: 8 - Self.limit), "eight addresses of one /64")
        #expect(try hop.statuses(1, from: "127.0.0.9", viaProxy: false) { _ in "2001:db8:1:3::1" } == [200], "the next /64")
        #expect(await hop.server.waitForLog(containing: #""remote":"2001:db8:1:2:8::14""#), "the log keeps the whole address: \(hop.server.log.suffix(600))")

        let exact = try Hop(trustedProxy: "127.0.0.9/32", extraArguments: ["--ipv6-prefix-length", "128"])
        defer { exact.stop() }
        let separate = try exact.statuses(8, from: "127.0.0.9", viaProxy: false) { "2001:db8:1:2:\($0 + 1)::\($0 + 7)" }
        #expect(separate == [Int](repeating: 200, count: 8))
    }

    @Test func withoutTrustedProxiesForwardedForIsIgnored() async throws {
        let hop = try Hop(trustedProxy: nil)
        defer { hop.stop() }
        // (c) Every client behind the proxy is the proxy: one shared budget.
        #expect(try hop.statuses(Self.limit, from: "127.0.0.3") == Self.allowed)
        Self.expectRateLimited(try hop.challenge(from: "127.0.0.4"), "a second client behind an untrusted proxy")
        #expect(await hop.server.waitForLog(containing: #""remote":"127.0.0.2""#))
        #expect(!hop.server.log.contains(#""remote":"127.0.0.3""#) && !hop.server.log.contains(#""remote":"127.0.0.4""#))
        // A direct client claiming other addresses is still counted as itself.
        let spoofed = try hop.statuses(Self.limit + 2, from: "127.0.0.5", viaProxy: false) { "198.51.100.\($0 + 1)" }
        #expect(spoofed == Self.allowed + [429, 429])
        #expect(!hop.server.log.contains(#""remote":"198.51.100."#))
    }
}
