import CloudUpstreams
import Foundation
import Synchronization
import UpstreamClient

/// Each Vertex workspace's OAuth access token, from its service account by the JWT-bearer grant:
/// fetched once and shared by every request until it nears its end, renewed in the background
/// from half its life on (requests keep the current one meanwhile), and fetched by one transfer
/// at a time however many requests wait for it. The fetch goes through the relay's own upstream
/// client, so it never blocks a loop.
final class VertexAccessTokens: Sendable {
    static let scope = "https://www.googleapis.com/auth/cloud-platform"
    /// The largest token response read.
    static let maxResponse = 65_536

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    typealias Completion = @Sendable (Result<String, Failure>) -> Void

    private struct Entry {
        /// The sealed credentials the token came from: new credentials start afresh.
        var sealed: [UInt8]
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

    private let entries = Mutex<[Int64: Entry]>([:])
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
        let step: Step = entries.withLock { all in
            var entry = all[workspace].flatMap { $0.sealed == sealed ? $0 : nil } ?? Entry(sealed: sealed)
            defer { all[workspace] = entry }
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
            if renew { fetch(workspace: workspace, account: account, tokenURL: tokenURL, start: start) }
            completion(.success(token))
        case .wait(let fetch):
            if fetch { self.fetch(workspace: workspace, account: account, tokenURL: tokenURL, start: start) }
        case .failed(let failure):
            completion(.failure(failure))
        }
    }

    private func fetch(workspace: Int64, account: GoogleServiceAccount, tokenURL: String,
                       start: @Sendable (UpstreamRequest, any UpstreamDelegate) -> Void) {
        fetches.add(1, ordering: .relaxed)
        let request: UpstreamRequest
        do {
            guard let (origin, path) = Self.split(tokenURL) else { throw Failure(description: "the token URL \(tokenURL) is not an absolute http(s) URL") }
            let issuedAt = Int(Date().timeIntervalSince1970)
            let assertion = try account.assertion(scope: Self.scope, audience: tokenURL, issuedAt: issuedAt)
            request = UpstreamRequest(method: "POST", path: path,
                                      headers: [("content-type", "application/x-www-form-urlencoded"), ("accept", "application/json")],
                                      body: account.tokenRequestBody(assertion: assertion), origin: origin)
        } catch {
            finish(workspace: workspace, .failure(Failure(description: "cannot make the service account's JWT grant: \(error)")))
            return
        }
        let fetch = TokenFetch { [self] result in
            finish(workspace: workspace, result.flatMap { body in
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

    private func finish(workspace: Int64, _ result: Result<(String, Int), Failure>) {
        let time = now()
        let waiters = entries.withLock { all -> [Completion] in
            guard var entry = all[workspace] else { return [] }
            entry.fetching = false
            switch result {
            case .success(let (token, expiresIn)):
                entry.token = token
                entry.lifetime = UInt64(max(1, expiresIn)) * 1_000_000_000
                entry.expiresAt = time + entry.lifetime
                entry.failure = nil
            case .failure(let failure):
                entry.failure = (failure, time + Self.failureHold)
            }
            let waiters = entry.waiters
            entry.waiters = []
            all[workspace] = entry
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
