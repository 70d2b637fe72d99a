import AttestCrypto
import Foundation

/// A secrets-key rotation, as the store sees it: every sealed value re-sealed under the new key,
/// one at a time, each replaced only if nobody changed it meanwhile, so that running instances
/// (which hold both keys while the rotation is under way) never meet a value they cannot open,
/// and a rotation stopped anywhere can be run again to finish.
extension AdminService {
    /// What a re-sealing pass did.
    public struct ResealReport: Sendable {
        /// Re-sealed under the current key now.
        public var resealed: [SealedSecret.Owner] = []
        /// Already under the current key (sealed since, or by an earlier, interrupted pass).
        public var alreadyCurrent = 0
        /// Values that open with neither key, with why: they stay as they are.
        public var unopenable: [(owner: SealedSecret.Owner, why: String)] = []
    }

    /// Owners and the primary owner of the default workspace: the secrets key is the whole deployment's.
    public func authorizeSecretsRotation(actor: String) throws {
        _ = try requireRole(try Validate.email(actor), in: try defaultWorkspace(), "rotate the secrets key") { $0 == .primaryOwner || $0 == .owner }
    }

    /// Re-seals under `keyring.current` every value sealed under another key. `resealed` is told
    /// of each as it is committed.
    public func resealSecrets(actor: String, keyring: SecretsKeyring, resealed: (SealedSecret.Owner) -> Void = { _ in }) throws -> ResealReport {
        try authorizeSecretsRotation(actor: actor)
        var report = ResealReport()
        for found in try store.sealedSecrets() {
            var value = found
            // A value changed meanwhile (an operator set a new key) is read again; one that went is done.
            for _ in 0..<8 {
                guard keyring.needsResealing(value.sealed) else {
                    report.alreadyCurrent += 1
                    break
                }
                var opened: (plaintext: [UInt8], associatedData: [UInt8])?
                var failure: (any Error)?
                for associatedData in value.associatedDataCandidates where opened == nil {
                    do {
                        opened = (try keyring.open(value.sealed, associatedData: associatedData), associatedData)
                    } catch {
                        failure = failure ?? error
                    }
                }
                guard let (plaintext, associatedData) = opened else {
                    report.unopenable.append((value.owner, failure.map { "\($0)" } ?? "it opens with neither key"))
                    break
                }
                let fresh = try keyring.current.seal(plaintext, associatedData: associatedData)
                if try store.replaceSealedSecret(value.owner, old: value.sealed, new: fresh) {
                    report.resealed.append(value.owner)
                    resealed(value.owner)
                    break
                }
                guard let again = try store.sealedSecrets().first(where: { $0.owner == value.owner }) else { break }
                value = again
            }
        }
        if !report.resealed.isEmpty {
            try audit(actor: actor, "secrets.resealed",
                      detail: "\(report.resealed.count) sealed values under key \(SecretBox.describe(keyID: keyring.current.keyID))")
        }
        return report
    }

    /// The values not sealed under `keyring.current`: a rotation cannot finish while any is left.
    public func sealedUnderOtherKeys(_ keyring: SecretsKeyring) throws -> [SealedSecret] {
        try store.sealedSecrets().filter { keyring.needsResealing($0.sealed) }
    }

    /// How many values each key ID holds (`nil`: sealed before key IDs).
    public func sealedValuesByKey() throws -> [(keyID: [UInt8]?, count: Int)] {
        var counts: [[UInt8]?: Int] = [:]
        for value in try store.sealedSecrets() { counts[SecretBox.keyID(ofSealed: value.sealed), default: 0] += 1 }
        return counts.map { ($0.key, $0.value) }.sorted { $0.count > $1.count }
    }

    /// What each attestd last reported reading from its key files, by host.
    public func secretsKeyReads() throws -> [SecretsKeyRead] { try store.secretsKeyReads() }

    /// Records a step of a rotation in the audit log.
    public func auditSecrets(actor: String, _ action: String, detail: String) throws {
        try audit(actor: try Validate.email(actor), action, detail: detail)
    }
}
