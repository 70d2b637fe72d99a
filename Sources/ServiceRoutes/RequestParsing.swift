import AttestCrypto
import Foundation
import TokenService

/// A malformed request: answered 400 `invalid_request`, with `detail` kept for the log.
struct BadRequest: Error {
    let detail: String
    /// Already counted and audited by the service (a malformed attempt on a challenge).
    let counted: Bool
    init(_ detail: String, counted: Bool = false) {
        self.detail = detail
        self.counted = counted
    }
}

/// Field limits on everything a device sends (the body as a whole is capped by the HTTP server).
enum FieldLimits {
    static let clientID = 64
    static let keyID = 64            // base64 of 32 bytes is 44 characters
    static let attestationObject = 24 * 1024
    static let assertion = 2 * 1024
    static let token = 256
}

enum RequestParsing {
    /// A JSON object whose values for `fields` are strings; any other field is ignored.
    static func jsonFields(_ body: [UInt8], _ fields: [(name: String, limit: Int)]) throws -> [String: String] {
        guard !body.isEmpty else { throw BadRequest("empty body") }
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
            throw BadRequest("body is not a JSON object")
        }
        var result: [String: String] = [:]
        for (name, limit) in fields {
            guard let value = object[name] else { throw BadRequest("missing field \(name)") }
            guard let text = value as? String else { throw BadRequest("field \(name) is not a string") }
            guard text.utf8.count <= limit else { throw BadRequest("field \(name) is longer than \(limit) bytes") }
            result[name] = text
        }
        return result
    }

    /// `application/x-www-form-urlencoded`: fields percent-decoded (`+` is a space), in any order,
    /// each at most once.
    static func formFields(_ body: [UInt8]) throws -> [String: String] {
        guard let text = String(bytes: body, encoding: .utf8) else { throw BadRequest("form body is not UTF-8") }
        var result: [String: String] = [:]
        for pair in text.split(separator: "&", omittingEmptySubsequences: true) {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = percentDecode(parts[0]), let value = percentDecode(parts.count > 1 ? parts[1] : "") else {
                throw BadRequest("form field is not valid percent-encoding")
            }
            guard result[name] == nil else { throw BadRequest("form field \(name.prefix(32)) given twice") }
            result[name] = value
        }
        return result
    }

    /// Percent-decoding of one form component, on bytes (`+` is a space); nil for a bad escape
    /// or bytes that are not UTF-8.
    static func percentDecode(_ text: Substring) -> String? {
        var out = [UInt8]()
        out.reserveCapacity(text.utf8.count)
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            switch byte {
            case UInt8(ascii: "+"): out.append(UInt8(ascii: " "))
            case UInt8(ascii: "%"):
                guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else { return nil }
                out.append(high << 4 | low)
            default: out.append(byte)
            }
        }
        let text = String(decoding: out, as: UTF8.self)
        return text.utf8.elementsEqual(out) ? text : nil   // decoding repairs invalid UTF-8: refuse instead
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// Base64 in the standard or URL-safe alphabet, padded or not. A space is a `+` whose
    /// percent-encoding was lost on the way (a raw `+` in a form decodes to a space).
    static func base64(_ text: String) -> [UInt8]? {
        if text.utf8.contains(UInt8(ascii: " ")) {
            return Base64.decode(String(decoding: text.utf8.map { $0 == UInt8(ascii: " ") ? UInt8(ascii: "+") : $0 }, as: UTF8.self))
        }
        return Base64.decode(text)
    }

    static func requireBase64(_ fields: [String: String], _ name: String) throws -> [UInt8] {
        guard let text = fields[name], let bytes = base64(text) else { throw BadRequest("field \(name) is not base64") }
        return bytes
    }

    /// The token of an `Authorization: Bearer …` header.
    static func bearer(_ header: String?) -> String? {
        guard let header, header.count > 7, header.prefix(7).lowercased() == "bearer " else { return nil }
        return header.dropFirst(7).trimmingCharacters(in: .whitespaces)
    }
}

/// JSON bodies the service sends, with stable field order for humans reading curl output.
enum JSONBody {
    static func object(_ fields: [(String, Any)]) -> String {
        "{" + fields.map { "\(string($0.0)):\(value($0.1))" }.joined(separator: ",") + "}"
    }

    static func value(_ value: Any) -> String {
        switch value {
        case let text as String: return string(text)
        case let bool as Bool: return bool ? "true" : "false"
        case let int as Int: return String(int)
        case let int as Int64: return String(int)
        case let double as Double: return String(double)
        case let nested as [(String, Any)]: return object(nested)
        default: return "null"
        }
    }

    static func string(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}
