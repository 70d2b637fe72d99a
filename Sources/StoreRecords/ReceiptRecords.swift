import AppAttest
import Foundation
import TokenService

extension StoreColumns {
    public static let dueReceipt = ["key_id", "client_id", "team_id", "environment", "app_id", "receipt", "credential_certificate",
                                    "risk_limit", "risk_claim"]
    public static let appleKey = ["team_id", "key_id", "sealed_key", "set_at", "set_by"]
    /// Devices are refreshed only while they exchanged in the last 30 days (Apple keeps no data longer).
    public static let activeWindow: TimeInterval = 30 * 86_400
}

extension DueReceipt {
    public init(row: some StoreRow) throws {
        self.init(keyID: try row.bytes("key_id"), clientID: try row.text("client_id"), teamID: try row.text("team_id"),
                  environment: AttestationEnvironment(rawValue: try row.text("environment")) ?? .production, appID: try row.text("app_id"),
                  receipt: try row.bytes("receipt"), credentialCertificate: try row.bytes("credential_certificate"),
                  riskLimit: Int(try row.int("risk_limit")), claim: try row.text("risk_claim"))
    }
}

extension SealedAppleKey {
    public init(row: some StoreRow) throws {
        self.init(teamID: try row.text("team_id"), keyID: try row.text("key_id"), sealed: try row.bytes("sealed_key"),
                  setAt: try row.date("set_at"), setBy: try row.text("set_by"))
    }
}
