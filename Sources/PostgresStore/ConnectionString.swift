import CPostgres
import Foundation

/// A libpq connection string — a `postgresql://` or `postgres://` URL or `key=value` pairs — that
/// is handed to libpq untouched (so `sslmode`, `PGPASSWORD`, `.pgpass`, `passfile`, several hosts
/// and every other libpq parameter work as in `psql`). It prints only in redacted form: a value
/// of this type can go into a log line or an error without leaking a password.
public struct PostgresConnectionString: Sendable, CustomStringConvertible, Equatable {
    /// What libpq receives. Never log this.
    public let raw: String

    public init(_ raw: String) { self.raw = raw }

    /// The connection string with every password (`user:PASSWORD@` in a URL, `password=` and
    /// `sslpassword=` in a URL's query or in `key=value` form) replaced by `***`.
    public var redactedDescription: String {
        let (text, secrets) = Self.redact(raw)
        // The password repeated anywhere else in the string (another parameter) is masked too.
        return scrub(text, secrets: secrets.filter { $0.count >= 3 }.sorted { $0.count > $1.count })
    }
    public var description: String { redactedDescription }

    /// True for what libpq reads as a connection string rather than a file path: a
    /// `postgresql://` or `postgres://` URL, or `key=value` pairs libpq can parse
    /// (`host=/run/postgresql dbname=attest`). A path such as `./attestd.sqlite` is not.
    public static func isPostgres(_ value: String) -> Bool {
        let lower = value.lowercased()
        if lower.hasPrefix("postgresql://") || lower.hasPrefix("postgres://") { return true }
        guard value.contains("="), !value.hasPrefix("/"), !value.hasPrefix(".") else { return false }
        var error: UnsafeMutablePointer<CChar>?
        guard let options = PQconninfoParse(value, &error) else {
            if let error { PQfreemem(error) }
            return false
        }
        PQconninfoFree(options)
        return true
    }

    // MARK: Redaction

    static let mask = "***"

    static func isSecretKey(_ key: Substring) -> Bool {
        let k = key.lowercased()
        return k == "password" || k == "sslpassword"
    }

    /// The redacted text, and the secrets it masked (as written).
    static func redact(_ text: String) -> (text: String, secrets: [String]) {
        var secrets: [String] = []
        let lower = text.lowercased()
        if lower.hasPrefix("postgresql://") || lower.hasPrefix("postgres://") { return (redactURL(text, &secrets), secrets) }
        return (redactKeyValue(text, &secrets), secrets)
    }

    /// `scheme://user:PASSWORD@host:port/db?password=PASSWORD&sslmode=…`. The credentials end at
    /// the last `@` before the query, so a password holding a stray `/` or `@` is still covered.
    static func redactURL(_ text: String, _ secrets: inout [String]) -> String {
        guard let schemeEnd = text.range(of: "://") else { return text }
        let head = text[..<schemeEnd.upperBound]
        var rest = text[schemeEnd.upperBound...]
        var query: Substring?
        if let question = rest.firstIndex(of: "?") {
            query = rest[rest.index(after: question)...]
            rest = rest[..<question]
        }
        var result = String(head)
        if let at = rest.lastIndex(of: "@") {
            let userinfo = rest[..<at]
            if let colon = userinfo.firstIndex(of: ":") {
                secrets.append(String(userinfo[userinfo.index(after: colon)...]))
                result += userinfo[...colon] + mask
            } else {
                result += userinfo
            }
            result += rest[at...]
        } else {
            result += rest
        }
        if let query {
            var parts: [String] = []
            for part in query.split(separator: "&", omittingEmptySubsequences: false) {
                guard let equals = part.firstIndex(of: "="),
                      isSecretKey(Substring(part[..<equals].removingPercentEncodingLossy())) else {
                    parts.append(String(part))
                    continue
                }
                secrets.append(String(part[part.index(after: equals)...]))
                parts.append(part[...equals] + mask)
            }
            result += "?" + parts.joined(separator: "&")
        }
        return result
    }

    /// `host=db password='it''s secret' sslmode=require`, quoted or not, with backslash escapes:
    /// the same grammar as libpq's conninfo parser. Anything it cannot parse is cut at the first
    /// `password` so that a malformed string still leaks nothing.
    static func redactKeyValue(_ text: String, _ secrets: inout [String]) -> String {
        let chars = Array(text)
        var out = ""
        var i = 0
        func skipSpaces() { while i < chars.count, chars[i].isWhitespace { out.append(chars[i]); i += 1 } }
        while true {
            skipSpaces()
            guard i < chars.count else { return out }
            let keyStart = i
            while i < chars.count, chars[i] != "=", !chars[i].isWhitespace { i += 1 }
            let key = String(chars[keyStart..<i])
            out += key
            skipSpaces()
            guard i < chars.count, chars[i] == "=" else { return cutAtPassword(text, &secrets) }
            out.append("=")
            i += 1
            skipSpaces()
            let secret = isSecretKey(Substring(key))
            var value = ""
            if i < chars.count, chars[i] == "'" {
                value.append("'")
                i += 1
                var closed = false
                while i < chars.count {
                    let c = chars[i]
                    if c == "\\", i + 1 < chars.count { value.append(c); value.append(chars[i + 1]); i += 2; continue }
                    value.append(c)
                    i += 1
                    if c == "'" { closed = true; break }
                }
                guard closed else { return cutAtPassword(text, &secrets) }
            } else {
                while i < chars.count, !chars[i].isWhitespace {
                    if chars[i] == "\\", i + 1 < chars.count { value.append(chars[i]); value.append(chars[i + 1]); i += 2; continue }
                    value.append(chars[i])
                    i += 1
                }
            }
            if secret {
                secrets.append(value)
                if value.hasPrefix("'") { secrets.append(String(value.dropFirst().dropLast())) }
                out += mask
            } else {
                out += value
            }
        }
    }

    static func cutAtPassword(_ text: String, _ secrets: inout [String]) -> String {
        guard let range = text.range(of: "password", options: .caseInsensitive) else { return text }
        secrets.append(String(text[range.upperBound...]).trimmingCharacters(in: CharacterSet(charactersIn: " =")))
        return text[..<range.lowerBound] + "password=" + mask + " …"
    }

    /// Every spelling of a password the string carries (as written, percent-decoded, and as
    /// libpq parsed it), plus `PGPASSWORD`: what must be scrubbed from libpq's own messages,
    /// which may quote a malformed part of the string.
    func secrets(environmentPassword: String?) -> [String] {
        var found: [String] = []
        if let environmentPassword { found.append(environmentPassword) }
        var error: UnsafeMutablePointer<CChar>?
        if let options = PQconninfoParse(raw, &error) {
            var option = options
            while let keyword = option.pointee.keyword {
                if let value = option.pointee.val, Self.isSecretKey(Substring(String(cString: keyword))) {
                    found.append(String(cString: value))
                }
                option += 1
            }
            PQconninfoFree(options)
        }
        if let error { PQfreemem(error) }
        found += Self.redact(raw).secrets
        var expanded: [String] = []
        for secret in found where !secret.isEmpty {
            expanded.append(secret)
            let decoded = secret.removingPercentEncodingLossy()
            if decoded != secret { expanded.append(decoded) }
        }
        // Longest first, so a secret that contains another is replaced whole.
        return Array(Set(expanded.filter { $0.count >= 3 })).sorted { $0.count > $1.count }
    }
}

/// Replaces every secret in `message` by `***`.
func scrub(_ message: String, secrets: [String]) -> String {
    var text = message
    for secret in secrets { text = text.replacingAll(secret, with: PostgresConnectionString.mask) }
    return text
}

extension StringProtocol {
    /// Percent-decoding that keeps malformed escapes as they are (never fails).
    func removingPercentEncodingLossy() -> String {
        let bytes = Array(utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        func hex(_ b: UInt8) -> UInt8? {
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return b - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return b - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): return b - UInt8(ascii: "A") + 10
            default: return nil
            }
        }
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "%"), i + 2 < bytes.count, let h = hex(bytes[i + 1]), let l = hex(bytes[i + 2]) {
                out.append(h << 4 | l)
                i += 3
            } else {
                out.append(bytes[i])
                i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    func replacingAll(_ target: String, with replacement: String) -> String {
        guard !target.isEmpty else { return String(self) }
        var result = ""
        var rest = Substring(self)
        while let range = rest.range(of: target) {
            result += rest[..<range.lowerBound]
            result += replacement
            rest = rest[range.upperBound...]
        }
        return result + rest
    }
}
