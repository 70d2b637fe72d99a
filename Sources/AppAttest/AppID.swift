import AttestCrypto

/// An App ID, `TEAMID.bundle.id`: what App Attest hashes into the RP ID.
public struct AppID: Hashable, Sendable, CustomStringConvertible {
    public let teamID: String
    public let bundleID: String
    /// SHA-256 of the App ID's UTF-8 text, computed once.
    public let rpIDHash: [UInt8]

    public init(teamID: String, bundleID: String) {
        self.teamID = teamID
        self.bundleID = bundleID
        rpIDHash = sha256(Array("\(teamID).\(bundleID)".utf8))
    }

    /// Parses `TEAMID.bundle.id` (the team ID is everything before the first dot).
    public init?(_ text: String) {
        guard let dot = text.firstIndex(of: "."), dot != text.startIndex, text.index(after: dot) != text.endIndex else { return nil }
        self.init(teamID: String(text[..<dot]), bundleID: String(text[text.index(after: dot)...]))
    }

    public var description: String { "\(teamID).\(bundleID)" }
}

/// Which App Attest environment a key was attested in, from the attestation's AAGUID.
public enum AttestationEnvironment: String, Sendable, CaseIterable {
    case development
    case production
}
