/// `application/x-www-form-urlencoded`, as the token request uses it.
public enum FormEncoding {
    /// `name=value` pairs sorted by name (as the published client sends them), both percent-encoded.
    public static func encode(_ fields: [String: String]) -> String { encode(pairs: fields.map { ($0.key, $0.value) }) }

    /// The same from pairs with distinct names, in any order: the token request builds no
    /// dictionary for its four fields, and the body is written into one buffer (the load
    /// generator spent 8% of its CPU on the pieces and their joins).
    public static func encode(pairs: [(name: String, value: String)]) -> String {
        var out = [UInt8]()
        out.reserveCapacity(pairs.reduce(0) { $0 + $1.name.utf8.count + $1.value.utf8.count + 2 } + 16)
        for (index, pair) in pairs.sorted(by: { $0.name < $1.name }).enumerated() {
            if index > 0 { out.append(UInt8(ascii: "&")) }
            appendPercentEncoded(pair.name, to: &out)
            out.append(UInt8(ascii: "="))
            appendPercentEncoded(pair.value, to: &out)
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Percent-encodes everything but RFC 3986 unreserved characters, so base64's `+ / =` and the
    /// grant type's `:` are escaped.
    public static func percentEncode(_ text: String) -> String {
        var out = [UInt8]()
        out.reserveCapacity(text.utf8.count)
        appendPercentEncoded(text, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    private static func appendPercentEncoded(_ text: String, to out: inout [UInt8]) {
        let digits: StaticString = "0123456789ABCDEF"
        digits.withUTF8Buffer { hex in
            for byte in text.utf8 {
                switch byte {
                case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                     UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
                     UInt8(ascii: "_"), UInt8(ascii: "~"):
                    out.append(byte)
                default:
                    out.append(UInt8(ascii: "%"))
                    out.append(hex[Int(byte >> 4)])
                    out.append(hex[Int(byte & 0x0f)])
                }
            }
        }
    }

    /// Fields of a form body, percent-decoded (`+` is a space), in any order, each at most once.
    public static func decode(_ body: [UInt8]) throws(WireFormatError) -> [String: String] {
        var result: [String: String] = [:]
        for pair in body.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: true) {
            let parts = pair.split(separator: UInt8(ascii: "="), maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = percentDecode(parts[0]), let value = percentDecode(parts.count > 1 ? parts[1] : []) else {
                throw WireFormatError("form field is not valid percent-encoded UTF-8")
            }
            guard result[name] == nil else { throw WireFormatError("form field \(name.prefix(32)) given twice") }
            result[name] = value
        }
        return result
    }

    /// One percent-encoded form component (`+` is a space); nil for a bad escape or for bytes that
    /// are not UTF-8.
    public static func percentDecode<Bytes: Collection>(_ encoded: Bytes) -> String? where Bytes.Element == UInt8 {
        var out = [UInt8]()
        out.reserveCapacity(encoded.count)
        var iterator = encoded.makeIterator()
        while let byte = iterator.next() {
            switch byte {
            case UInt8(ascii: "+"): out.append(UInt8(ascii: " "))
            case UInt8(ascii: "%"):
                guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else { return nil }
                out.append(high << 4 | low)
            default: out.append(byte)
            }
        }
        // Invalid UTF-8 is refused, not repaired: a repaired string has other bytes. (Not
        // String(validating:), which Apple's platforms have only from iOS 18 and macOS 15.)
        let text = String(decoding: out, as: UTF8.self)
        return text.utf8.elementsEqual(out) ? text : nil
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

/// A body that does not have the protocol's shape; `detail` is for logs, never for the caller.
public struct WireFormatError: Error, Sendable, CustomStringConvertible {
    public let detail: String
    public init(_ detail: String) { self.detail = detail }
    public var description: String { detail }
}
