import AttestCrypto
import AttestWire
import Foundation

/// A team's App Attest data-service key: the `.p8` (PKCS#8, P-256) Apple issues with
/// DeviceCheck enabled, its 10-character key ID and the team it belongs to.
public struct AppleDataKey: Sendable {
    public let teamID: String
    public let keyID: String
    public let privateKey: ECPrivateKey

    /// Checks the shapes Apple issues: team and key IDs of 10 letters or digits, a P-256 key.
    public init(teamID: String, keyID: String, p8 pem: String) throws {
        guard Self.isAppleIdentifier(teamID) else { throw AppleDataError("team ID must be 10 letters or digits, got \(teamID.prefix(40))") }
        guard Self.isAppleIdentifier(keyID) else { throw AppleDataError("key ID must be 10 letters or digits, got \(keyID.prefix(40))") }
        let key: ECPrivateKey
        do { key = try ECPrivateKey(pem: pem) } catch { throw AppleDataError("the .p8 file holds no readable private key") }
        guard (try? key.publicKey())?.isP256 == true else { throw AppleDataError("the .p8 key is not a P-256 (ES256) key") }
        self.teamID = teamID
        self.keyID = keyID
        privateKey = key
    }

    static func isAppleIdentifier(_ text: String) -> Bool {
        text.utf8.count == 10 && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x41...0x5a).contains($0) || (0x61...0x7a).contains($0) }
    }
}

/// The `Authorization` value Apple's data service takes: an ES256 JWT built like an APNs
/// provider token (header `alg`, `kid`; claims `iss`, the team, and `iat`), sent bare.
public enum ProviderToken {
    public static func make(_ key: AppleDataKey, at time: Date) throws -> String {
        let header = #"{"alg":"ES256","kid":"\#(key.keyID)"}"#
        let claims = #"{"iss":"\#(key.teamID)","iat":\#(Int64(time.timeIntervalSince1970))}"#
        let signingInput = encode(Array(header.utf8)) + "." + encode(Array(claims.utf8))
        // JOSE carries r || s, each 32 bytes, where OpenSSL makes DER.
        guard let raw = ECDSASignature.raw(fromDER: try key.privateKey.signSHA256(Array(signingInput.utf8))) else {
            throw AppleDataError("the ES256 signature could not be encoded")
        }
        return signingInput + "." + encode(raw)
    }

    static func encode(_ bytes: [UInt8]) -> String { Base64.encode(bytes, urlSafe: true, padded: false) }
}

public struct AppleDataError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ description: String) { self.description = description }
}
