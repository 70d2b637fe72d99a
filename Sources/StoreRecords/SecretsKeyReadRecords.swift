import Foundation
import TokenService

extension StoreColumns {
    /// What an attestd last read from its secrets key files (`secrets_key_reads`).
    public static let secretsKeyRead = ["host", "key_file", "current_key", "previous_key", "read_at", "reported_at", "pid", "problem"]
}

extension SecretsKeyRead {
    public init(row: some StoreRow) throws {
        self.init(host: try row.text("host"), keyFile: try row.text("key_file"), currentKey: try row.optional("current_key", row.text),
                  previousKey: try row.optional("previous_key", row.text), readAt: try row.optional("read_at", row.date),
                  reportedAt: try row.date("reported_at"), processID: try row.int("pid"), problem: try row.optional("problem", row.text))
    }
}
