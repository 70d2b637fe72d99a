/// JSON text written directly, with a stable field order (for humans reading curl output) and
/// without Foundation's encoder on the hot path.
public enum JSONText {
    /// A JSON object from (name, value) pairs. Values: String, Bool, Int, Int64, UInt64, Double,
    /// nested `[(String, Any)]`, `[String]`, or nil / anything else as `null`.
    public static func object(_ fields: [(String, Any)]) -> String {
        var out = "{"
        out.reserveCapacity(fields.count * 24)
        for (index, field) in fields.enumerated() {
            if index > 0 { out += "," }
            out += string(field.0)
            out += ":"
            out += value(field.1)
        }
        return out + "}"
    }

    public static func value(_ value: Any) -> String {
        switch value {
        case let text as String: return string(text)
        case let bool as Bool: return bool ? "true" : "false"
        case let int as Int: return String(int)
        case let int as Int64: return String(int)
        case let int as UInt64: return String(int)
        case let double as Double:
            guard double.isFinite else { return "null" }
            return double == double.rounded() && abs(double) < 1e15 ? String(Int64(double)) : String(double)
        case let nested as [(String, Any)]: return object(nested)
        case let list as [String]: return "[" + list.map(string).joined(separator: ",") + "]"
        default: return "null"
        }
    }

    /// A JSON string literal: quotes, backslashes and control characters escaped.
    public static func string(_ text: String) -> String {
        // Nearly every string needs no escaping: check the bytes once and copy it whole.
        if !needsEscaping(text) {
            return "\"" + text + "\""
        }
        let hex: [Character] = Array("0123456789abcdef")
        var out = "\""
        out.reserveCapacity(text.utf8.count + 2)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out += "\\u00"
                out.append(hex[Int(scalar.value >> 4)])
                out.append(hex[Int(scalar.value & 0x0f)])
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }

    /// `string(text)` appended to `out`: a line built from many fields makes no temporaries.
    public static func appendString(_ text: String, to out: inout String) {
        if needsEscaping(text) {
            out += string(text)
        } else {
            out += "\""
            out += text
            out += "\""
        }
    }

    private static func needsEscaping(_ text: String) -> Bool {
        func needs(_ byte: UInt8) -> Bool { byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") }
        // Over the contiguous bytes when the string has them (native strings do): the generic
        // UTF8View walk cost more than the access log line's other work together.
        return text.utf8.withContiguousStorageIfAvailable { $0.contains(where: needs) } ?? text.utf8.contains(where: needs)
    }
}
