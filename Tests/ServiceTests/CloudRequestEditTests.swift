import Foundation
import MessagesBody
import Testing
import TokenService
@testable import RelayRoutes
@testable import CloudUpstreams
import UpstreamStub
import UpstreamClient
import Synchronization

/// The edit that makes a device's Messages body a cloud's: every removed member in every
/// position (first, last, adjacent, alone, spaced out), and what must be refused.
@Suite struct CloudRequestEditTests {
    static let members: [(String, String)] = [
        ("model", #""claude-test""#), ("stream", "false"), ("max_tokens", "5"), ("messages", #"[{"role":"user","content":"a, \"b\""}]"#),
        ("anthropic_version", #""old""#),
    ]
    static let spacings: [(String, String)] = [("", ""), (" ", " "), ("\n\t", " \r\n")]

    static func permutations<T>(_ items: [T]) -> [[T]] {
        guard items.count > 1 else { return [items] }
        return items.indices.flatMap { i -> [[T]] in
            var rest = items
            let first = rest.remove(at: i)
            return permutations(rest).map { [first] + $0 }
        }
    }

    static func object(_ text: [UInt8]) -> [String: Any]? {
        try? JSONSerialization.jsonObject(with: Data(text)) as? [String: Any]
    }

    @Test func everyRemovedMemberInEveryPositionLeavesTheRestIntact() throws {
        let removed = JSONMemberScan.Names("model", "stream", "anthropic_version")
        var checked = 0
        for subsetMask in 1..<(1 << Self.members.count) {
            let present = Self.members.enumerated().filter { subsetMask & (1 << $0.offset) != 0 }.map(\.element)
            for order in Self.permutations(present) {
                for (inner, outer) in Self.spacings {
                    let body = outer + "{" + inner + order.map { "\"\($0.0)\"\(inner):\(inner)\($0.1)" }.joined(separator: inner + "," + inner) + inner + "}" + outer
                    let edited = try CloudRequestBody.edit(Array(body.utf8), removing: removed, adding: [("anthropic_version", #""bedrock-2023-05-31""#)])
                    let object = try #require(Self.object(edited), "\(body) → \(String(decoding: edited, as: UTF8.self))")
                    let kept = order.filter { !["model", "stream", "anthropic_version"].contains($0.0) }.map(\.0)
                    #expect(Set(object.keys) == Set(kept + ["anthropic_version"]), "\(body)")
                    #expect(object["anthropic_version"] as? String == "bedrock-2023-05-31")
                    if order.contains(where: { $0.0 == "messages" }) {
                        #expect(((object["messages"] as? [[String: Any]])?.first?["content"] as? String) == #"a, "b""#)
                    }
                    checked += 1
                }
            }
        }
        #expect(checked > 900)
    }

    @Test func anObjectWithOnlyRemovedMembersOrNothingAddedIsStillAnObject() throws {
        let removed = JSONMemberScan.Names("model", "stream")
        for body in [#"{"model":"x"}"#, #"{"model":"x","stream":true}"#, "{}", " { } "] {
            let none = try CloudRequestBody.edit(Array(body.utf8), removing: removed, adding: [])
            #expect(String(decoding: none, as: UTF8.self) == "{}", "\(body)")
            let one = try CloudRequestBody.edit(Array(body.utf8), removing: removed, adding: [("a", "1"), ("b", "[]")])
            #expect(String(decoding: one, as: UTF8.self) == #"{"a":1,"b":[]}"#)
        }
    }

    @Test(arguments: [
        #"{"model":"a","model":"b"}"#,           // twice
        #"{"mod\u0065l":"a"}"#,                  // a removed name with escapes
        #"["model"]"#, "", "   ", "{", #"{"model":}"#, #"{"model":"a",}"#, #"{"model":"a"} x"#, #"{"a":1"#, "null",
    ])
    func whatAnotherParserCouldReadOtherwiseIsRefused(_ body: String) {
        #expect(throws: (any Error).self) {
            try CloudRequestBody.edit(Array(body.utf8), removing: JSONMemberScan.Names("model", "stream"), adding: [("v", "1")])
        }
    }

    @Test func aBodyThatIsNotJSONNeverTrapsTheEdit() {
        // Every prefix and every one-byte change of a real body: refused or edited, never a crash.
        let body = Array(#"{"stream":false , "model":"claude-test","max_tokens":5,"messages":[{"role":"user","content":"Hi \"x\""}]}"#.utf8)
        var outcomes = 0
        for cut in 0...body.count {
            _ = try? CloudRequestBody.edit(Array(body[..<cut]), removing: CloudRoute.removedForBedrock, adding: [("v", "1")])
            outcomes += 1
        }
        for index in body.indices {
            for replacement in [UInt8(ascii: ","), UInt8(ascii: "\""), UInt8(ascii: "}"), UInt8(ascii: ":"), 0x5c, 0x00] {
                var mutated = body
                mutated[index] = replacement
                if let edited = try? CloudRequestBody.edit(mutated, removing: CloudRoute.removedForBedrock, adding: [("v", "1")]) {
                    #expect(edited.first == UInt8(ascii: "{") && edited.last == UInt8(ascii: "}"))
                }
                outcomes += 1
            }
        }
        #expect(outcomes == body.count + 1 + body.count * 6)
    }
}

/// Numbers an upstream sends: bounded where they are read, saturated where they are summed.
@Suite struct UpstreamNumberTests {
    @Test func usageNearTheTopOfInt64IsBoundedAndSumsSaturate() {
        let huge = #"{"usage":{"input_tokens":9223372036854775807,"output_tokens":99999999999999999999999,"cache_creation_input_tokens":-5,"cache_read_input_tokens":4611686018427387904,"server_tool_use":{"web_search_requests":9223372036854775807}}}"#
        let usage = UsageObject.ofReply(Array(huge.utf8))
        #expect(usage?.inputTokens == TokenUsage.maxCount && usage?.outputTokens == TokenUsage.maxCount)
        #expect(usage?.cacheCreationInputTokens == 0 && usage?.cacheReadInputTokens == TokenUsage.maxCount)
        #expect(usage?.serverToolUse["web_search_requests"] == TokenUsage.maxCount)
        #expect(usage?.totalTokens == 3 * TokenUsage.maxCount)
        var counters = UsageCounters()
        counters.inputTokens = .max - 1
        var more = UsageCounters()
        more.inputTokens = 10
        more.errors = [500: .max]
        counters.errors = [500: 3]
        counters += more
        #expect(counters.inputTokens == .max && counters.errors[500] == .max)
        var stream = StreamUsageReader()
        let events = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":18446744073709551616}}}\n\n"
            + "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9223372036854775807}}\n\n"
        Array(events.utf8).withUnsafeBytes { _ = stream.feed($0) }
        #expect(stream.usage.inputTokens == TokenUsage.maxCount && stream.usage.outputTokens == TokenUsage.maxCount)
    }

    /// Found by `make fuzz-relay` (fuzz-seeds-relay/reply-empty-counter-name): a server-tool counter
    /// named "" was kept, to reach the ledger under an empty name.
    @Test func aServerToolCounterNeedsAName() {
        let reply = #"{"usage":{"input_tokens":3,"server_tool_use":{"":5,"web_search_requests":1,"Web":2}}}"#
        #expect(UsageObject.ofReply(Array(reply.utf8))?.serverToolUse == ["web_search_requests": 1])
    }
}

/// The credential cache, driven by hand with a service account's grant: each set of credentials
/// has its own token and fetch, every waiter is answered by its own fetch, a fetch has a
/// deadline, and a refused token is dropped so the next request fetches a fresh one.
@Suite struct VertexAccessTokenTests {
    static func account(_ email: String) throws -> GoogleServiceAccount {
        let json = try JSONSerialization.data(withJSONObject: [
            "type": "service_account", "client_email": email, "private_key": try StubCertificates.rsaPrivateKeyPEM(),
            "token_uri": "https://oauth2.googleapis.com/token", "private_key_id": "k1",
        ])
        return try GoogleServiceAccount(keyFile: Array(json))
    }

    static func deliver(_ delegate: any UpstreamDelegate, status: Int = 200, _ body: String) {
        delegate.upstreamDidReceiveHead(status: status, headers: [("content-type", "application/json")])
        _ = Array(body.utf8).withUnsafeBytes { delegate.upstreamDidReceive($0) }
        delegate.upstreamDidFinish(nil)
    }

    static func identity(_ workspace: Int64, _ sealed: [UInt8]) -> CloudCredentials.Identity {
        CloudCredentials.Identity(workspace: workspace, sealed: sealed, binding: Array("t".utf8))
    }

    static func text(_ result: Result<CloudCredential, CredentialFailure>) -> String {
        if case .success(.bearer(let token)) = result { return token }
        return "failed"
    }

    @Test func anAccountChangeMidFetchGivesEachCredentialItsOwnTokenAndAnswersEveryWaiter() throws {
        let tokens = CloudCredentials()
        let (old, new) = (try Self.account("old@p.iam.gserviceaccount.com"), try Self.account("new@p.iam.gserviceaccount.com"))
        let started = Mutex<[(request: UpstreamRequest, delegate: any UpstreamDelegate)]>([])
        let start: @Sendable (UpstreamRequest, any UpstreamDelegate) -> Void = { request, delegate in started.withLock { $0.append((request, delegate)) } }
        let answers = Mutex<[String]>([])
        func ask(_ name: String, sealed: [UInt8], _ account: GoogleServiceAccount) {
            tokens.credential(Self.identity(7, sealed), source: .googleServiceAccount(account, tokenURL: "https://t.example/token"), start: start) { result in
                answers.withLock { $0.append(name + ":" + Self.text(result)) }
            }
        }
        ask("old-1", sealed: [1], old)
        ask("old-2", sealed: [1], old)     // waits on the same fetch
        ask("new-1", sealed: [2], new)     // the account changed: a fetch of its own
        #expect(started.withLock { $0.count } == 2)
        #expect(started.withLock { $0.allSatisfy { $0.request.totalTimeout == CloudCredentials.fetchDeadline } })
        let (first, second) = started.withLock { ($0[0].delegate, $0[1].delegate) }
        Self.deliver(second, #"{"access_token":"tok-new","expires_in":3600}"#)
        #expect(answers.withLock { $0 } == ["new-1:tok-new"])
        // The old fetch ends later, with an expires_in that would overflow the clock's arithmetic.
        Self.deliver(first, #"{"access_token":"tok-old","expires_in":999999999999999999}"#)
        #expect(answers.withLock { Set($0) } == ["new-1:tok-new", "old-1:tok-old", "old-2:tok-old"])
        // The new credentials' token is served from memory, never the old one.
        ask("new-2", sealed: [2], new)
        #expect(answers.withLock { $0.last } == "new-2:tok-new")
        #expect(started.withLock { $0.count } == 2)
        // Refused upstream, it is dropped: the next request fetches once, then has the fresh one.
        tokens.drop(Self.identity(7, [2]), used: .bearer("tok-new"))
        ask("new-3", sealed: [2], new)
        ask("new-4", sealed: [2], new)
        #expect(started.withLock { $0.count } == 3)
        Self.deliver(started.withLock { $0[2].delegate }, #"{"access_token":"tok-fresh","expires_in":3600}"#)
        #expect(answers.withLock { Array($0.suffix(2)) } == ["new-3:tok-fresh", "new-4:tok-fresh"])
        // Dropping a token that is no longer the cached one changes nothing.
        tokens.drop(Self.identity(7, [2]), used: .bearer("tok-new"))
        ask("new-5", sealed: [2], new)
        #expect(answers.withLock { $0.last } == "new-5:tok-fresh" && started.withLock { $0.count } == 3)
    }

    /// Two upstreams of one workspace (labels in its list) keep a token each: asked in turn, neither
    /// evicts the other, so nothing is fetched again.
    @Test func theUpstreamsOfOneWorkspaceKeepTheirOwnTokens() throws {
        let tokens = CloudCredentials()
        let account = try Self.account("a@p.iam.gserviceaccount.com")
        let started = Mutex<[any UpstreamDelegate]>([])
        let answers = Mutex<[String]>([])
        func ask(_ label: String?) {
            tokens.credential(CloudCredentials.Identity(workspace: 3, label: label, sealed: [UInt8](label.map { Array($0.utf8) } ?? [0]), binding: []),
                              source: .googleServiceAccount(account, tokenURL: "https://t.example/token"),
                              start: { _, delegate in started.withLock { $0.append(delegate) } }) { result in
                answers.withLock { $0.append(Self.text(result)) }
            }
        }
        ask(nil)
        Self.deliver(started.withLock { $0[0] }, #"{"access_token":"own","expires_in":3600}"#)
        ask("vertex-b")
        Self.deliver(started.withLock { $0[1] }, #"{"access_token":"labelled","expires_in":3600}"#)
        for _ in 0..<3 { ask(nil); ask("vertex-b") }
        #expect(started.withLock { $0.count } == 2)
        #expect(answers.withLock { Array($0.suffix(6)) } == ["own", "labelled", "own", "labelled", "own", "labelled"])
    }

    @Test func aFetchThatFailsOrTimesOutAnswersItsWaiters() throws {
        let tokens = CloudCredentials()
        let account = try Self.account("a@p.iam.gserviceaccount.com")
        let started = Mutex<[any UpstreamDelegate]>([])
        let answers = Mutex<[String]>([])
        for _ in 0..<3 {
            tokens.credential(Self.identity(1, [9]), source: .googleServiceAccount(account, tokenURL: "https://t.example/token"),
                              start: { _, delegate in started.withLock { $0.append(delegate) } }) { result in
                answers.withLock { $0.append(Self.text(result)) }
            }
        }
        let delegate = try #require(started.withLock { $0.first })
        delegate.upstreamDidFinish(UpstreamError(kind: .timeout, detail: "the total timeout expired"))
        #expect(answers.withLock { $0 } == ["failed", "failed", "failed"])
    }
}
