import Foundation

/// What a token check found, when it was made, and the mark its caller took just before the query.
public struct TokenCheck: Sendable {
    /// The live token's grant; nil when the token is unknown, expired, superseded or revoked.
    public let grant: TokenGrant?
    /// The time the check judged the token at (the query's own time: after the request arrived).
    public let checkedAt: Date
    /// What the caller's `markBeforeCheck` gave just before the query went out.
    public let markBeforeCheck: Int

    public init(grant: TokenGrant?, checkedAt: Date, markBeforeCheck: Int) {
        self.grant = grant
        self.checkedAt = checkedAt
        self.markBeforeCheck = markBeforeCheck
    }
}

/// The token check of a store whose reads cross the network, without blocking the event loop
/// that asks: the query goes out on that loop's own connection (with the loop's other checks
/// of the moment, in one statement), and the answer comes back on the same loop. Nothing is
/// cached: every check is a query that began after it was asked for, so a revocation or a
/// superseded token is refused at the next request, on every instance.
public protocol NonBlockingTokenChecks: AnyObject, Sendable {
    /// Starts the check of a token's hash for the calling thread's event loop and returns true;
    /// `done` is then called once, later, on that loop. False when the calling thread is no loop
    /// this serves: check with the store's blocking call instead.
    /// - Parameter markBeforeCheck: read just before the query is sent (the usage ledger's
    ///   commit count: usage flushed while the query runs is counted, never missed).
    func check(hash: [UInt8], markBeforeCheck: @escaping @Sendable () -> Int,
               done: @escaping @Sendable (Result<TokenCheck, any Error>) -> Void) -> Bool

    /// The checks sent so far, and the queries that carried them (several checks share one).
    var figures: (checks: Int, queries: Int) { get }
    /// Opens what the checks need now (a server, before it listens), waiting at most `timeout` seconds.
    func warm(timeout: Double)
    /// Fails what waits and lets go of the connections; call before the event loops stop.
    func shutdown()
}
