import Foundation
import TokenService

extension StoreColumns {
    /// Where an attestd listens (`attestd_instances`).
    public static let attestdInstance = ["host", "public_address", "admin_address", "base_urls", "version", "started_at", "pid"]
}

extension AttestdInstance {
    public init(row: some StoreRow) throws {
        let baseURLs = try row.text("base_urls")
        self.init(host: try row.text("host"), publicAddress: try row.text("public_address"),
                  adminAddress: try row.optional("admin_address", row.text),
                  baseURLs: baseURLs.split(separator: "\n").map(String.init), version: try row.text("version"),
                  startedAt: try row.date("started_at"), processID: try row.int("pid"))
    }

    /// `base_urls` as stored: one a line.
    public var storedBaseURLs: String { baseURLs.joined(separator: "\n") }
}
