import AttestWire
import Foundation

/// A malformed request: answered 400 `invalid_request`, with `detail` kept for the log.
public struct BadRequest: Error {
    public let detail: String
    public init(_ detail: String) { self.detail = detail }
}

/// Field limits on everything a device sends (the body as a whole is capped by the HTTP server).
public enum FieldLimits {
    public static let clientID = 64
    public static let keyID = 64            // base64 of 32 bytes is 44 characters
    public static let attestationObject = 24 * 1024
    public static let assertion = 2 * 1024
    public static let token = 256
}

public enum RequestParsing {
    /// A JSON object whose values for `fields` are strings; any other field is ignored.
    public static func jsonFields(_ body: [UInt8], _ fields: [(name: String, limit: Int)]) throws -> [String: String] {
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

    /// `application/x-www-form-urlencoded` fields (AttestWire's decoder), malformed → 400.
    public static func formFields(_ body: [UInt8]) throws -> [String: String] {
        do { return try FormEncoding.decode(body) } catch { throw BadRequest(error.detail) }
    }

    /// Base64 in the standard or URL-safe alphabet, padded or not. A space is a `+` whose
    /// percent-encoding was lost on the way (a raw `+` in a form decodes to a space).
    public static func base64(_ text: String) -> [UInt8]? {
        if text.utf8.contains(UInt8(ascii: " ")) {
            return Base64.decode(String(decoding: text.utf8.map { $0 == UInt8(ascii: " ") ? UInt8(ascii: "+") : $0 }, as: UTF8.self))
        }
        return Base64.decode(text)
    }

    public static func requireBase64(_ fields: [String: String], _ name: String) throws -> [UInt8] {
        guard let text = fields[name], let bytes = base64(text) else { throw BadRequest("field \(name) is not base64") }
        return bytes
    }

    /// The token of an `Authorization: Bearer …` header.
    public static func bearer(_ header: String?) -> String? {
        guard let header else { return nil }
        let bytes = header.utf8
        guard bytes.count > 7, zip(bytes, "bearer ".utf8).allSatisfy({ $0 | 0x20 == $1 }) else { return nil }
        // Byte-wise, in place: this runs on every relayed request. Sliced as bytes: slicing the
        // String would round to a Character boundary (a combining mark after the blank would
        // pull the blank back in).
        let token = withoutBlanks(bytes.dropFirst(7))
        return token.isEmpty ? nil : String(Substring(token))
    }
}

extension RequestParsing {
    /// Whether a `Content-Type` value names `expected` ("type/subtype" in any case; parameters
    /// such as `charset` ignored). No header is no match: a body is read only as what it says it is.
    public static func hasMediaType(_ header: String?, _ expected: String) -> Bool {
        guard let header else { return false }
        let bytes = header.utf8
        return isTrimmed(bytes[..<(bytes.firstIndex(of: UInt8(ascii: ";")) ?? bytes.endIndex)], caseInsensitively: expected)
    }

    /// Whether `bytes`, without the spaces and tabs around them, are `lowercase` in any ASCII
    /// case. Byte by byte: header values are read this way on every request, and lowercasing a
    /// copy allocated.
    @inlinable
    public static func isTrimmed<Bytes: BidirectionalCollection<UInt8>>(_ bytes: Bytes, caseInsensitively lowercase: String) -> Bool {
        withoutBlanks(bytes).elementsEqual(lowercase.utf8) { actual, wanted in
            (actual >= 0x41 && actual <= 0x5A ? actual | 0x20 : actual) == wanted
        }
    }

    /// `bytes` without the spaces and tabs around them, in place.
    @inlinable
    public static func withoutBlanks<Bytes: BidirectionalCollection<UInt8>>(_ bytes: Bytes) -> Bytes.SubSequence {
        func isBlank(_ b: UInt8) -> Bool { b == 0x20 || b == 0x09 }
        var start = bytes.startIndex, end = bytes.endIndex
        while start < end, isBlank(bytes[start]) { start = bytes.index(after: start) }
        while end > start, isBlank(bytes[bytes.index(before: end)]) { end = bytes.index(before: end) }
        return bytes[start..<end]
    }
}
