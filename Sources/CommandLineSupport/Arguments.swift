import AttestWire
import Foundation

/// A usage error: printed on stderr, exit status 2, nothing changed.
public struct UsageError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// `--name value` options (repeatable) and `--flag` switches, parsed strictly: an unknown
/// option is an error, not silently ignored.
public struct Arguments {
    private var values: [String: [String]] = [:]
    private var flags: Set<String> = []
    public var positional: [String] = []

    public init(_ arguments: [String], options: Set<String>, flags allowedFlags: Set<String> = []) throws {
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

    public func value(_ name: String) throws -> String? {
        guard let all = values[name] else { return nil }
        guard all.count == 1 else { throw UsageError("--\(name) given \(all.count) times") }
        return all[0]
    }

    public func required(_ name: String) throws -> String {
        guard let value = try value(name) else { throw UsageError("--\(name) is required") }
        return value
    }

    public func all(_ name: String) -> [String] { values[name] ?? [] }
    public func has(_ name: String) -> Bool { flags.contains(name) }
    public func has(option name: String) -> Bool { values[name] != nil }

    public func integer(_ name: String, default fallback: Int? = nil, range: ClosedRange<Int> = 0...Int.max) throws -> Int? {
        guard let text = try value(name) else { return fallback }
        guard let number = Int(text), range.contains(number) else { throw UsageError("--\(name) must be a whole number in \(range.lowerBound)...\(range.upperBound)") }
        return number
    }
}

/// Base64 in the standard or URL-safe alphabet, padded or not; surrounding white space ignored.
public func decodeBase64(_ text: String) -> [UInt8]? {
    Base64.decode(text.trimmingCharacters(in: .whitespacesAndNewlines))
}

/// `<base64>` or `@file` (file holding base64 text or raw bytes).
public func readBytesArgument(_ value: String, name: String) throws -> [UInt8] {
    if value.hasPrefix("@") {
        let path = String(value.dropFirst())
        guard let data = FileManager.default.contents(atPath: path) else { throw UsageError("--\(name): cannot read \(path)") }
        if let text = String(data: data, encoding: .utf8), let decoded = decodeBase64(text) { return decoded }
        return Array(data)
    }
    guard let decoded = decodeBase64(value) else { throw UsageError("--\(name) is not base64") }
    return decoded
}

public func printJSON(_ object: [String: Any]) {
    let data = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
    print(String(decoding: data, as: UTF8.self))
    fflush(nil)   // in order with anything written to the descriptor directly (streamed text)
}

public func parseISO8601(_ text: String) -> Date? {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    if let date = formatter.date(from: text) { return date }
    formatter.formatOptions = [.withInternetDateTime]
    return formatter.date(from: text)
}

/// Global options may come before the subcommand, as in `git` and `kubectl`:
/// `attestctl --db PATH init …` means `attestctl init … --db PATH`. Returns the command words with
/// the leading global options moved to the end; anything else before the command is an error.
public func hoistGlobalOptions(_ argv: [String], options: Set<String>) throws -> [String] {
    var globals: [String] = []
    var i = 0
    while i < argv.count, argv[i].hasPrefix("--") {
        let argument = argv[i]
        let name = String(argument.dropFirst(2).prefix { $0 != "=" })
        if argument == "--help" || argument == "--version" { break }
        guard options.contains(name) else {
            throw UsageError("unknown option \(argument) before the command (global options: \(options.sorted().map { "--\($0)" }.joined(separator: ", ")))")
        }
        if argument.contains("=") {
            globals.append(argument)
        } else {
            guard i + 1 < argv.count else { throw UsageError("\(argument) needs a value") }
            globals += [argument, argv[i + 1]]
            i += 1
        }
        i += 1
    }
    return Array(argv[i...]) + globals
}

/// Whether `--help` or `-h` was asked for anywhere among `argv`.
public func wantsHelp(_ argv: [String]) -> Bool {
    argv.contains("--help") || argv.contains("-h")
}

/// Runs a tool's `main`: exits with its status; a usage error prints one line and exits 2, any
/// other error prints one line and exits 1.
public func runTool(_ name: String, _ main: () throws -> Int32) -> Never {
    do {
        exit(try main())
    } catch let error as UsageError {
        FileHandle.standardError.write(Data("\(name): \(error.description)\n".utf8))
        exit(2)
    } catch {
        FileHandle.standardError.write(Data("\(name): \(error)\n".utf8))
        exit(1)
    }
}
