/// A decoded CBOR data item (RFC 8949), as far as App Attest and its tooling need.
public indirect enum CBORValue: Hashable, Sendable {
    case unsigned(UInt64)
    /// The negative integer `-1 - n`, stored as `n` so the whole major type 1 range fits.
    case negative(UInt64)
    case bytes([UInt8])
    case text(String)
    case array([CBORValue])
    /// Entries in encoded order; the decoder guarantees keys are distinct.
    case map([CBORMapEntry])
    case tagged(UInt64, CBORValue)
    case bool(Bool)
    case null
    case undefined
    /// Simple values other than false/true/null/undefined.
    case simple(UInt8)
    case float(Double)

    /// Convenience for the common shape `{ "text key": value }`.
    public subscript(key: String) -> CBORValue? {
        guard case .map(let entries) = self else { return nil }
        for entry in entries where entry.key == .text(key) { return entry.value }
        return nil
    }

    public var bytesValue: [UInt8]? {
        if case .bytes(let b) = self { return b }
        return nil
    }

    public var textValue: String? {
        if case .text(let t) = self { return t }
        return nil
    }

    public var arrayValue: [CBORValue]? {
        if case .array(let a) = self { return a }
        return nil
    }

    /// The value as a signed integer, when it fits in Int64.
    public var intValue: Int64? {
        switch self {
        case .unsigned(let n): return n <= UInt64(Int64.max) ? Int64(n) : nil
        case .negative(let n): return n <= UInt64(Int64.max) ? -1 - Int64(n) : nil
        default: return nil
        }
    }

    public static func int(_ value: Int64) -> CBORValue {
        value >= 0 ? .unsigned(UInt64(value)) : .negative(UInt64(-1 - value))
    }
}

public struct CBORMapEntry: Hashable, Sendable {
    public var key: CBORValue
    public var value: CBORValue
    public init(_ key: CBORValue, _ value: CBORValue) {
        self.key = key
        self.value = value
    }
}

extension CBORValue: ExpressibleByStringLiteral {
    public init(stringLiteral value: String) { self = .text(value) }
}
