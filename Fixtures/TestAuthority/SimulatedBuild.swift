import Foundation
import AppAttest
import AttestCrypto
import CBOR

/// What a simulated device says about the app and the machine, as iOS 27 and macOS 27 devices
/// do: the extension map in its authenticator data (validation category, bundle version, on a
/// Mac the code-directory hash), the aclBlob and the OS fields of its credential certificate.
public struct SimulatedBuild: Sendable, Equatable {
    public var platform: DevicePlatform = .ios
    public var environment: AttestationEnvironment = .development
    /// Apple's launch validation category; nil with `extensions` writes a map without it.
    public var validationCategory: UInt32? = 3
    /// Nil: "1" on iOS, none on a Mac (Macs write no bundle version).
    public var bundleVersion: String? = nil
    /// False: no map at all, as on iOS 26 and earlier.
    public var extensions = true
    /// The aclBlob policy; nil: Apple's Mac value on a Mac, the iPhone value on iOS.
    public var accessControlPolicy: [UInt8]? = nil
    public var osVersion = "27.0"
    /// The attestation's receipt, from the test receipt authority.
    public var receipt: SimulatedReceipt = .valid

    public init() {}

    /// A build of this platform, from this distribution channel, in the environment such builds
    /// attest in by default (development builds in development, the others in production).
    public init(platform: DevicePlatform, distribution: Distribution) {
        self.platform = platform
        validationCategory = Self.category(distribution)
        environment = distribution == .development ? .development : .production
    }

    /// The category number for a distribution name (`unknown` gives 11, a value Apple has not defined).
    public static func category(_ distribution: Distribution) -> UInt32 {
        switch distribution {
        case .invalid: 0
        case .os: 1
        case .testflight: 2
        case .development: 3
        case .appStore: 4
        case .enterprise: 5
        case .developerID: 6
        case .restricted: 7
        case .other: 10
        case .unknown: 11
        }
    }

    public var effectiveBundleVersion: String? { bundleVersion ?? (platform == .ios ? "1" : nil) }

    /// The map, sorted as Apple's canonical encoding sorts it (shorter keys first), or nil.
    public func extensionMap(appID: AppID) -> [CBORMapEntry]? {
        guard extensions else { return nil }
        var entries: [CBORMapEntry] = []
        if platform == .macos {
            entries.append(CBORMapEntry(.text(AuthenticatorExtensions.codeDirectoryHashKey), .bytes(sha256(Array("cdhash \(appID)".utf8)))))
            entries.append(CBORMapEntry(.text(AuthenticatorExtensions.codeDirectoryHashTypeKey), .bytes([0x02])))
        }
        if let version = effectiveBundleVersion {
            entries.append(CBORMapEntry(.text(AuthenticatorExtensions.bundleVersionKey), .text(version)))
        }
        if let category = validationCategory {
            let le = [UInt8(category & 0xff), UInt8(category >> 8 & 0xff), UInt8(category >> 16 & 0xff), UInt8(category >> 24)]
            entries.append(CBORMapEntry(.text(AuthenticatorExtensions.validationCategoryKey), .bytes(le)))
        }
        return entries.sorted { a, b in
            let x = CBOREncoder.encode(a.key), y = CBOREncoder.encode(b.key)
            return x.count != y.count ? x.count < y.count : x.lexicographicallyPrecedes(y)
        }
    }

    public func attestationOptions(appID: AppID) -> TestAuthority.AttestationOptions {
        var options = TestAuthority.AttestationOptions()
        options.environment = environment
        options.extensionMap = extensionMap(appID: appID)
        options.accessControlPolicy = accessControlPolicy
            ?? (platform == .macos ? AccessControlExtension.applesMacValue : TestAuthority.iPhoneAccessControlPolicy)
        options.osInformation = [(OSInformation.versionTag, osVersion), (OSInformation.buildTag, "24A1"),
                                 (OSInformation.platformTag, platform == .macos ? "macosx" : "iphoneos")]
        switch receipt {
        case .valid: break
        case .none: options.receipt = .none
        case .badSignature: options.receiptBytes = { Array($0.dropLast()) + [$0.last! ^ 0x01] }
        case .wrongAppID: options.receiptFields = { $0.appID = "ZZZZZ99999.com.example.other" }
        case .otherCertificate: options.receiptFields = { $0.attestedCertificate = Array($0.attestedCertificate.reversed()) }
        case .stale: options.receiptFields = { $0.createdAt = $0.createdAt.addingTimeInterval(-3600) }
        case .rogueIntermediate: options.receipt = .impostor(.rogueIntermediate)
        case .keyAgreementSigner: options.receipt = .impostor(.keyAgreementOnly)
        case .farFutureNotBefore:
            options.receiptFields = { $0.notBefore = Date(timeIntervalSince1970: 253_370_764_800); $0.expiresAt = Date(timeIntervalSince1970: 253_402_214_400) }
        }
        return options
    }
}

/// Which receipt a simulated device sends: Apple's kind, or one with a single thing wrong.
public enum SimulatedReceipt: String, Sendable, CaseIterable {
    case valid
    /// No receipt in the statement.
    case none
    /// The signature's last byte flipped.
    case badSignature = "bad-signature"
    /// Signed for another App ID.
    case wrongAppID = "wrong-app-id"
    /// Naming another certificate than the attested key's.
    case otherCertificate = "other-certificate"
    /// Created an hour before the attestation.
    case stale
    /// Signed under another intermediate of the receipt root (the pin refuses it).
    case rogueIntermediate = "rogue-intermediate"
    /// Signed by a certificate whose only key usage is keyAgreement.
    case keyAgreementSigner = "key-agreement-signer"
    /// "Not before" in the year 9999 (a device that would never be asked about again).
    case farFutureNotBefore = "far-future-not-before"
}
