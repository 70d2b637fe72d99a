import CloudUpstreams
import Foundation
import Synchronization
import UpstreamClient

/// Each Vertex workspace's OAuth access token, from its service account by the JWT-bearer grant:
/// fetched once and shared by every request until it nears its end, renewed in the background
/// from half its life on (requests keep the current one meanwhile), and fetched by one transfer
/// at a time however many requests wait for it. The fetch goes through the relay's own upstream
/// client, so it never blocks a loop. Tokens are kept by the credentials they came from (the
/// sealed bytes and the token URL), so a workspace whose account changes mid-fetch never gets
/// the old account's token for its new settings, and the old fetch still answers its own waiters.
/// A fetch has a total deadline, so no waiter waits longer than it.
final class VertexAccessTokens: Sendable {
    static let scope = "https://www.googleapis.com/auth/cloud-platform"
    /// The largest token response read.
    static let maxResponse = 65_536

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    typealias Completion = @Sendable (Result<String, Failure>) -> Void

    /// The credentials a token is for: the workspace, its sealed service account and token URL.
    struct Identity: Hashable {
        let workspace: Int64
        let sealed: [UInt8]
        let tokenURL: String
    }

    private struct Entry {
        var token: String?
        /// Monotonic nanoseconds.
        var expiresAt: UInt64 = 0
        var lifetime: UInt64 = 0
        var fetching = false
        var waiters: [Completion] = []
        /// The last fetch failed: requests until `until` fail at once rather than each asking the
        /// token endpoint again.
        var failure: (Failure, until: UInt64)?
    }

    /// How long a failed fetch is answered from memory.
    static let failureHold: UInt64 = 5_000_000_000
    /// The most a token fetch may take, connection included: its waiters are answered by then.
    static let fetchDeadline: Duration = .seconds(20)
    /// The longest lifetime taken from a token endpoint (Google's are an hour): a larger
    /// `expires_in` is read as this, so no number it sends can overflow the clock's arithmetic.
    static let maxLifetimeSeconds = 86_400

    private let entries = Mutex<[Identity: Entry]>([:])
    private let now: @Sendable () -> UInt64
    /// Grants fetched (tests, metrics).
    let fetches = Atomic<Int>(0)

    init(now: @escaping @Sendable () -> UInt64 = { DispatchTime.now().uptimeNanoseconds }) {
        self.now = now
    }

    /// Calls `completion` with a usable token: at once when one is cached, else once the fetch
    /// that is (or is now) under way ends. `start` starts a transfer (on the caller's loop).
    func token(workspace: Int64, sealed: [UInt8], account: GoogleServiceAccount, tokenURL: String,
               start: @escaping @Sendable (UpstreamRequest, any UpstreamDelegate) -> Void, completion: @escaping Completion) {
        enum Step { case ready(String, renew: Bool), wait(fetch: Bool), failed(Failure) }
        let time = now()
        let identity = Identity(workspace: workspace, sealed: sealed, tokenURL: tokenURL)
        let step: Step = entries.withLock { all in
            // Entries of the workspace's earlier credentials go once nobody waits on them.
            if all[identity] == nil {
                all = all.filter { $0.key == identity || $0.key.workspace != workspace || $0.value.fetching }
            }
            var entry = all[identity] ?? Entry()
            defer { all[identity] = entry }
            // Usable until a tenth of its life (at most a minute) before its end.
            let margin = min(60_000_000_000, entry.lifetime / 10)
            if let token = entry.token, entry.expiresAt > time + margin {
                let renew = !entry.fetching && entry.expiresAt - time < entry.lifetime / 2
                if renew { entry.fetching = true }
                return .ready(token, renew: renew)
            }
            if let (failure, until) = entry.failure, time < until { return .failed(failure) }
            entry.waiters.append(completion)
            let fetch = !entry.fetching
            entry.fetching = true
            return .wait(fetch: fetch)
        }
        switch step {
        case .ready(let token, let renew):
            if renew { fetch(identity, account: account, start: start) }
            completion(.success(token))
        case .wait(let fetch):
            if fetch { self.fetch(identity, account: account, start: start) }
        case .failed(let failure):
            completion(.failure(failure))
        }
    }

    private func fetch(_ identity: Identity, account: GoogleServiceAccount, start: @Sendable (UpstreamRequest, any UpstreamDelegate) -> Void) {
        fetches.add(1, ordering: .relaxed)
        let request: UpstreamRequest
        let tokenURL = identity.tokenURL
        do {
            guard let (origin, path) = Self.split(tokenURL) else { throw Failure(description: "the token URL \(tokenURL) is not an absolute http(s) URL") }
            let issuedAt = Int(Date().timeIntervalSince1970)
            let assertion = try account.assertion(scope: Self.scope, audience: tokenURL, issuedAt: issuedAt)
            request = UpstreamRequest(method: "POST", path: path,
                                      headers: [("content-type", "application/x-www-form-urlencoded"), ("accept", "application/json")],
                                      body: account.tokenRequestBody(assertion: assertion), origin: origin, totalTimeout: Self.fetchDeadline)
        } catch {
            finish(identity, .failure(Failure(description: "cannot make the service account's JWT grant: \(error)")))
            return
        }
        let fetch = TokenFetch { [self] result in
            finish(identity, result.flatMap { body in
                do {
                    let (token, expiresIn) = try account.parseTokenResponse(body)
                    return .success((token, expiresIn))
                } catch {
                    return .failure(Failure(description: "the token endpoint's answer does not parse: \(error)"))
                }
            })
        }
        start(request, fetch)
    }

    private func finish(_ identity: Identity, _ result: Result<(String, Int), Failure>) {
        let time = now()
        let waiters = entries.withLock { all -> [Completion] in
            guard var entry = all[identity] else { return [] }
            entry.fetching = false
            switch result {
            case .success(let (token, expiresIn)):
                entry.token = token
                entry.lifetime = UInt64(min(max(1, expiresIn), Self.maxLifetimeSeconds)) * 1_000_000_000
                entry.expiresAt = time + entry.lifetime
                entry.failure = nil
            case .failure(let failure):
                entry.failure = (failure, time + Self.failureHold)
            }
            let waiters = entry.waiters
            entry.waiters = []
            all[identity] = entry
            return waiters
        }
        let outcome = result.map(\.0)
        for waiter in waiters { waiter(outcome) }
    }

    /// `https://host[:port]` and `/path?query` of an absolute URL.
    static func split(_ url: String) -> (String, String)? {
        let lower = url.lowercased()
        guard lower.hasPrefix("https://") || lower.hasPrefix("http://"), let schemeEnd = url.range(of: "://") else { return nil }
        let rest = url[schemeEnd.upperBound...]
        guard let slash = rest.firstIndex(of: "/") else { return (url, "/") }
        return (String(url[..<slash]), String(url[slash...]))
    }
}

/// One token request: its body (bounded) and whether it succeeded.
private final class TokenFetch: UpstreamDelegate {
    private struct State {
        var status = 0
        var body: [UInt8] = []
    }
    private let state = Mutex(State())
    private let done: @Sendable (Result<[UInt8], VertexAccessTokens.Failure>) -> Void

    init(done: @escaping @Sendable (Result<[UInt8], VertexAccessTokens.Failure>) -> Void) { self.done = done }

    func upstreamDidReceiveHead(status: Int, headers: [(name: String, value: String)]) {
        state.withLock { $0.status = status }
    }

    func upstreamDidReceive(_ chunk: UnsafeRawBufferPointer) -> Bool {
        state.withLock { s in
            let room = VertexAccessTokens.maxResponse - s.body.count
            if room > 0 { s.body.append(contentsOf: chunk.prefix(room)) }
        }
        return true
    }

    func upstreamDidFinish(_ error: UpstreamError?) {
        let (status, body) = state.withLock { ($0.status, $0.body) }
        if let error {
            done(.failure(.init(description: "the token endpoint could not be reached: \(error)")))
        } else if status != 200 {
            let excerpt = String(decoding: body.prefix(200), as: UTF8.self)
            done(.failure(.init(description: "the token endpoint answered HTTP \(status): \(excerpt)")))
        } else {
            done(.success(body))
        }
    }
}
