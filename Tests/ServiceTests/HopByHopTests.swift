import HTTPServer
@testable import ServiceRoutes
@testable import RelayRoutes
import Testing

/// Which headers cross the relay: a short allow-list each way, minus any that the message's own
/// `Connection` header declares hop-by-hop (RFC 9110 §7.6.1), whatever its case and spacing.
@Suite struct HopByHopTests {
    @Test func theClientsConnectionHeaderKeepsADeclaredHeaderFromTheUpstream() {
        let request = HTTPRequest(method: "POST", path: "/v1/messages", headers: [
            ("Content-Type", "application/json"), ("Anthropic-Beta", "tools-2024-04-04"), ("User-Agent", "app/1"),
            ("Connection", "keep-alive,  Anthropic-Beta ,x-unknown"), ("Authorization", "Bearer at_secret"), ("X-Api-Key", "device"),
        ], body: [1, 2, 3])
        let upstream = MessagesRelay.upstreamRequest(request, key: "sk-workspace")
        #expect(upstream.headers.map(\.name) == ["x-api-key", "anthropic-version", "content-type", "user-agent"])
        #expect(upstream.headers.first?.value == "sk-workspace")
        #expect(upstream.headers[1].value == "2023-06-01")
        #expect(upstream.body == [1, 2, 3])

        let plain = HTTPRequest(method: "POST", path: "/v1/messages", headers: [("anthropic-beta", "b"), ("connection", "keep-alive")])
        #expect(MessagesRelay.upstreamRequest(plain, key: "k").headers.map(\.name) == ["x-api-key", "anthropic-version", "anthropic-beta"])
    }

    @Test func theUpstreamsConnectionHeaderKeepsADeclaredHeaderFromTheClient() {
        let reply: [(name: String, value: String)] = [
            ("content-type", "application/json"), ("request-id", "req_1"), ("retry-after", "3"),
            ("anthropic-ratelimit-requests-remaining", "9"), ("connection", "Retry-After"), ("connection", "close"),
            ("keep-alive", "timeout=5"), ("server", "stub"), ("transfer-encoding", "chunked"),
        ]
        #expect(MessagesRelay.clientHeaders(reply).map(\.name) == ["content-type", "request-id", "anthropic-ratelimit-requests-remaining"])
        #expect(MessagesRelay.isDeclaredHopByHop("request-id", in: [("connection", "request-id")]))
        #expect(!MessagesRelay.isDeclaredHopByHop("request-id", in: [("connection", "request-idx, x-request-id")]))
        #expect(!MessagesRelay.isDeclaredHopByHop("request-id", in: [("connection", "")]))
    }
}
