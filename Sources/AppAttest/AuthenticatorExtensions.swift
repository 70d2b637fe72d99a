import AttestCrypto
import CBOR

/// Where a build came from: Apple's launch validation category, by the name operators use.
/// `unknown` is any value Apple's table does not define yet; like `invalid`, `os` and
/// `restricted` it is never admitted.
public enum Distribution: String, Sendable, CaseIterable, Comparable {
    case invalid
    case os
    case testflight
    case development
    case appStore = "app-store"
    case enterprise
    case developerID = "developer-id"
    case restricted
    case other
    case unknown

    /// Apple's table: 0 invalid, 1 an OS executable, 2 TestFlight, 3 development, 4 App Store,
    /// 5 enterprise or ad hoc, 6 Developer ID, 7–9 restricted situations, 10 any other identity.
    public init(category: UInt32) {
        switch category {
        case 0: self = .invalid
        case 1: self = .os
        case 2: self = .testflight
        case 3: self = .development
        case 4: self = .appStore
        case 5: self = .enterprise
        case 6: self = .developerID
        case 7, 8, 9: self = .restricted
        case 10: self = .other
        default: self = .unknown
        }
    }

    /// The categories no policy may admit: not an app at all, or not a category we know.
    public var isAlwaysRefused: Bool { [.invalid, .os, .restricted, .unknown].contains(self) }

    /// The names an operator may list in a policy.
    public static let admissible: [Distribution] = allCases.filter { !$0.isAlwaysRefused }

    /// By name, as lists of them are printed.
    public static func < (a: Distribution, b: Distribution) -> Bool { a.rawValue < b.rawValue }
}

/// The CBOR map that iOS 27 and macOS 27 write at the end of the authenticator data: where the
/// build came from, its bundle version and, on a Mac, a hash of its code directory hash. Keys
/// Apple may add later are kept in `entries` and never refused.
public struct AuthenticatorExtensions: Sendable, Equatable {
    public static let validationCategoryKey = "apple_validation_category_01"
    public static let bundleVersionKey = "apple_bundle_version_01"
    public static let codeDirectoryHashKey = "apple_cd_hash_hash_01"
    public static let codeDirectoryHashTypeKey = "apple_cd_hash_type_01"

    /// Far above the four keys devices write; bounds the work an odd map can cause.
    static let maxEntries = 32
    static let maxTextBytes = 256
    static let limits = CBORLimits(maxDepth: 4, maxItems: 96)

    /// Apple's launch validation category (a 4-byte little-endian byte string on the wire).
    public let validationCategory: UInt32?
    /// The app's bundle version (`CFBundleVersion`); Macs write none.
    public let bundleVersion: String?
    /// macOS only: a hash of the code directory hash, and its type.
    public let codeDirectoryHash: [UInt8]?
    public let codeDirectoryHashType: UInt64?
    /// Every entry in the device's order, the known keys included.
    public let entries: [CBORMapEntry]

    public var distribution: Distribution? { validationCategory.map(Distribution.init(category:)) }

    /// Apple writes the code-directory hash on Macs only.
    public var isMac: Bool { codeDirectoryHash != nil || codeDirectoryHashType != nil }

    /// An encoded map on its own (tools and tests), with the same rules as in authenticator data.
    public static func decode(_ bytes: [UInt8]) throws -> AuthenticatorExtensions {
        try AuthenticatorExtensions(decoding: bytes[...], where: "given")
    }

    /// Decodes exactly one map from `bytes` (nothing may follow it); `where` names the position
    /// for error details.
    init(decoding bytes: ArraySlice<UInt8>, where place: String) throws {
        let value: CBORValue
        do { value = try CBORDecoder.decode(Array(bytes), limits: Self.limits) } catch CBORError.trailingBytes(let offset) {
            throw VerificationError(.malformed, "\(bytes.count - offset) byte(s) follow the extension map \(place) (a second item or junk)")
        } catch {
            throw VerificationError(.malformed, "the \(bytes.count) byte(s) \(place) are not one CBOR item: \(error)")
        }
        guard case .map(let entries) = value else {
            throw VerificationError(.malformed, "the item \(place) is \(Self.kind(value)), not an extension map")
        }
        guard entries.count <= Self.maxEntries else {
            throw VerificationError(.malformed, "extension map has \(entries.count) entries, limit \(Self.maxEntries)")
        }
        var category: UInt32?, version: String?, cdHash: [UInt8]?, cdHashType: UInt64?
        for entry in entries {
            guard case .text(let key) = entry.key else {
                throw VerificationError(.malformed, "extension map key is \(Self.kind(entry.key)), not a text string")
            }
            switch key {
            case Self.validationCategoryKey: category = try Self.category(entry.value)
            case Self.bundleVersionKey:
                guard case .text(let text) = entry.value, !text.isEmpty, text.utf8.count <= Self.maxTextBytes else {
                    throw VerificationError(.malformed, "\(key) is \(Self.kind(entry.value)), expected a text string of 1 to \(Self.maxTextBytes) bytes")
                }
                version = text
            case Self.codeDirectoryHashKey:
                guard case .bytes(let hash) = entry.value, (1...64).contains(hash.count) else {
                    throw VerificationError(.malformed, "\(key) is \(Self.kind(entry.value)), expected a byte string of 1 to 64 bytes")
                }
                cdHash = hash
            case Self.codeDirectoryHashTypeKey:
                switch entry.value {
                case .bytes(let b) where b.count == 1: cdHashType = UInt64(b[0])
                case .unsigned(let n): cdHashType = n
                default: throw VerificationError(.malformed, "\(key) is \(Self.kind(entry.value)), expected one byte or an unsigned integer")
                }
            default: break
            }
        }
        validationCategory = category
        bundleVersion = version
        codeDirectoryHash = cdHash
        codeDirectoryHashType = cdHashType
        self.entries = entries
    }

    /// A UInt32 as a 4-byte little-endian byte string (what devices write), or an unsigned integer.
    static func category(_ value: CBORValue) throws -> UInt32 {
        switch value {
        case .bytes(let b) where b.count == 4:
            return UInt32(b[0]) | UInt32(b[1]) << 8 | UInt32(b[2]) << 16 | UInt32(b[3]) << 24
        case .unsigned(let n) where n <= UInt64(UInt32.max):
            return UInt32(n)
        default:
            throw VerificationError(.malformed, "\(validationCategoryKey) is \(kind(value)), expected a 4-byte little-endian byte string or an unsigned integer below 2^32")
        }
    }

    /// What a CBOR item is, for error details (never its contents).
    static func kind(_ value: CBORValue) -> String {
        switch value {
        case .unsigned(let n): return n <= UInt64(UInt32.max) ? "an unsigned integer" : "an unsigned integer above 2^32"
        case .negative: return "a negative integer"
        case .bytes(let b): return "a byte string of \(b.count) byte(s)"
        case .text(let t): return "a text string of \(t.utf8.count) byte(s)"
        case .array: return "an array"
        case .map: return "a map"
        case .tagged: return "a tagged item"
        case .bool, .null, .undefined, .simple: return "a simple value"
        case .float: return "a float"
        }
    }
}

/// Which system attested: decided from the Apple-signed authenticator data (see
/// `AuthenticatorExtensions.isMac`), never from the undocumented OS-information extension.
public enum DevicePlatform: String, Sendable, CaseIterable {
    case ios
    case macos
}
