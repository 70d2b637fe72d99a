import AttestCrypto
import Foundation

/// A usage error: printed on stderr, exit status 2, nothing changed.
struct UsageError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// `--name value` options (repeatable) and `--flag` switches, parsed strictly: an unknown
/// option is an error, not silently ignored.
struct Arguments {
    private var values: [String: [String]] = [:]
    private var flags: Set<String> = []
    var positional: [String] = []

    init(_ arguments: [String], options: Set<String>, flags allowedFlags: Set<String> = []) throws {
        var i = 0
        while i < arguments.count {
            let argument = arguments[i]
            if argument.hasPrefix("--") {
                var name = String(argument.dropFirst(2))
                var inlineValue: String?
                if let eq = name.firstIndex(of: "=") {
                    inlineValue = String(name[name.index(after: eq)...])
                    name = String(name[..<eq])
                }
                if allowedFlags.contains(name), inlineValue == nil {
                    flags.insert(name)
                } else if options.contains(name) {
                    if let inlineValue {
                        values[name, default: []].append(inlineValue)
                    } else {
                        guard i + 1 < arguments.count else { throw UsageError("--\(name) needs a value") }
                        values[name, default: []].append(arguments[i + 1])
                        i += 1
                    }
                } else {
                    throw UsageError("unknown option --\(name)")
                }
            } else {
                positional.append(argument)
            }
            i += 1
        }
    }

    func value(_ name: String) throws -> String? {
        guard let all = values[name] else { return nil }
        guard all.count == 1 else { throw UsageError("--\(name) given \(all.count) times") }
        return all[0]
    }

    func required(_ name: String) throws -> String {
        guard let value = try value(name) else { throw UsageError("--\(name) is required") }
        return value
    }

    func all(_ name: String) -> [String] { values[name] ?? [] }
    func has(_ name: String) -> Bool { flags.contains(name) }
    func has(option name: String) -> Bool { values[name] != nil }

    func integer(_ name: String, default fallback: Int? = nil, range: ClosedRange<Int> = 0...Int.max) throws -> Int? {
        guard let text = try value(name) else { return fallback }
        guard let number = Int(text), range.contains(number) else { throw UsageError("--\(name) must be a whole number in \(range.lowerBound)...\(range.upperBound)") }
        return number
    }
}

/// Base64 in the standard or URL-safe alphabet, padded or not; surrounding white space ignored.
func decodeBase64(_ text: String) -> [UInt8]? {
    Base64.decode(text.trimmingCharacters(in: .whitespacesAndNewlines))
}

/// `<base64>` or `@file` (file holding base64 text or raw bytes).
func readBytesArgument(_ value: String, name: String) throws -> [UInt8] {
    if value.hasPrefix("@") {
        let path = String(value.dropFirst())
        guard let data = FileManager.default.contents(atPath: path) else { throw UsageError("--\(name): cannot read \(path)") }
        if let text = String(data: data, encoding: .utf8), let decoded = decodeBase64(text) { return decoded }
        return Array(data)
    }
    guard let decoded = decodeBase64(value) else { throw UsageError("--\(name) is not base64") }
    return decoded
}

func printJSON(_ object: [String: Any]) {
    let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
    print(String(decoding: data, as: UTF8.self))
}

func parseISO8601(_ text: String) -> Date? {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    if let date = formatter.date(from: text) { return date }
    formatter.formatOptions = [.withInternetDateTime]
    return formatter.date(from: text)
}
