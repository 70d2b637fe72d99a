import StoreRecords
import TokenService
/// A PostgreSQL failure: what kind, the server's SQLSTATE when it sent one, and a message that
/// never carries a password (the connection string appears only redacted).
public struct PostgresError: StoreAvailabilityError, Error, CustomStringConvertible, Sendable {
    public enum Kind: String, Sendable {
        /// Could not connect (refused, authentication, bad connection string, TLS).
        case connect
        /// The server answered with an error (constraint, syntax, statement timeout …).
        case server
        /// The connection broke during the call; whether a write committed is unknown.
        case connectionLost
        /// No answer before the call's deadline; the connection was dropped.
        case timeout
        /// Every pooled connection stayed busy until the call's deadline.
        case poolExhausted
        /// A result column did not have the type the code expected.
        case decoding
    }

    public let kind: Kind
    /// The five-character SQLSTATE (`23505` unique violation, `57014` statement timeout …).
    public let sqlState: String?
    public let message: String
    /// The redacted connection string.
    public let target: String

    public init(_ kind: Kind, sqlState: String? = nil, message: String, target: String) {
        self.kind = kind
        self.sqlState = sqlState
        self.message = message
        self.target = target
    }

    public var description: String {
        "PostgreSQL \(kind.rawValue) error\(sqlState.map { " \($0)" } ?? "") (\(target)): \(message)"
    }

    public var isUniqueViolation: Bool { sqlState == "23505" }

    /// The database is unreachable, overloaded or timing out, rather than refusing this
    /// particular request: callers answer 503 and retry later.
    public var isUnavailable: Bool {
        switch kind {
        case .connect, .connectionLost, .timeout, .poolExhausted: return true
        case .decoding: return false
        case .server:
            guard let sqlState else { return false }
            return sqlState.hasPrefix("08")          // connection exception
                || sqlState.hasPrefix("53")          // insufficient resources (too many connections …)
                || sqlState.hasPrefix("57P")         // admin shutdown, crash shutdown, cannot connect now
                || sqlState == "57014"               // statement timeout (query canceled)
                || sqlState == "55P03"               // lock timeout
                || sqlState == "40001" || sqlState == "40P01"  // serialization failure, deadlock
        }
    }
}
