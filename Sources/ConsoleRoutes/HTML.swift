import Foundation

/// HTML text that is safe to send as is: everything that came from a user, the database or a
/// request goes through `HTML.text` (or an attribute helper) first, so a name such as
/// `<script>` shows as those characters.
struct HTML: Sendable, ExpressibleByStringLiteral {
    var raw: String
    init(raw: String) { self.raw = raw }
    init(stringLiteral value: String) { raw = value }

    static func + (a: HTML, b: HTML) -> HTML { HTML(raw: a.raw + b.raw) }
    static func += (a: inout HTML, b: HTML) { a.raw += b.raw }
    static func join(_ parts: [HTML], _ separator: HTML = "") -> HTML { HTML(raw: parts.map(\.raw).joined(separator: separator.raw)) }

    /// Text content or an attribute value (in double quotes), escaped.
    static func text(_ value: String) -> HTML {
        var out = ""
        out.reserveCapacity(value.utf8.count)
        for scalar in value.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default:
                // Control characters other than tab and newline never reach a page.
                if scalar.value < 0x20 && scalar != "\n" && scalar != "\t" { out += "\u{FFFD}" } else { out.unicodeScalars.append(scalar) }
            }
        }
        return HTML(raw: out)
    }

    static func text(_ value: Int) -> HTML { HTML(raw: String(value)) }
    static func text(_ value: Int64) -> HTML { HTML(raw: String(value)) }

    /// `<tag attrs>content</tag>`; attribute values escaped.
    static func element(_ tag: String, _ attributes: [(String, String?)] = [], _ content: HTML = "") -> HTML {
        HTML(raw: "<\(tag)\(attributeText(attributes))>\(content.raw)</\(tag)>")
    }

    static func void(_ tag: String, _ attributes: [(String, String?)]) -> HTML {
        HTML(raw: "<\(tag)\(attributeText(attributes))>")
    }

    /// An SVG element without content: inside `<svg>` the HTML parser needs the `/>`.
    static func svgLeaf(_ tag: String, _ attributes: [(String, String?)]) -> HTML {
        HTML(raw: "<\(tag)\(attributeText(attributes))/>")
    }

    /// A nil value leaves the attribute out; an empty one writes it bare (`required`, `checked`).
    static func attributeText(_ attributes: [(String, String?)]) -> String {
        var out = ""
        for (name, value) in attributes {
            guard let value else { continue }
            out += value.isEmpty ? " \(name)" : " \(name)=\"\(text(value).raw)\""
        }
        return out
    }
}

/// How the console writes times: UTC, with the offset spelled out, inside `<time>`.
enum ConsoleTime {
    static func text(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd HH:mm:ss"
        return formatter.string(from: date) + " UTC (+00:00)"
    }

    static func html(_ date: Date?) -> HTML {
        guard let date else { return "—" }
        let iso = ISO8601DateFormatter()
        iso.formatOptions = [.withInternetDateTime]
        return HTML.element("time", [("datetime", iso.string(from: date))], HTML.text(text(date)))
    }

    /// `YYYY-MM-DD` of a day in UTC.
    static func day(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd"
        return formatter.string(from: date)
    }
}

/// Numbers as the console shows them: digits grouped by commas (12,345).
func grouped(_ value: Int64) -> String {
    let digits = String(value.magnitude)
    var out = ""
    for (index, character) in digits.enumerated() {
        if index > 0 && (digits.count - index) % 3 == 0 { out += "," }
        out.append(character)
    }
    return value < 0 ? "-" + out : out
}
