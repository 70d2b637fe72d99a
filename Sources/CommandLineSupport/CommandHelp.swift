/// A tool's usage text, split so that `TOOL COMMAND [SUBCOMMAND] --help` prints that command alone.
///
/// The text is read as it is written for people: a line that starts with `usage: TOOL` or with
/// `TOOL` at that column begins a command's entry (its first one or two lower-case words name it);
/// lines indented further belong to it; an indented line that starts with an upper-case name and a
/// colon (`DEVICES:`) begins a note that belongs to no command, printed after every entry whose
/// text names it (`[DEVICES]`); lines indented less than the entries are said of every command.
public struct CommandHelp: Sendable {
    struct Entry: Sendable {
        var words: [String]
        var lines: [String]
    }

    let tool: String
    let column: Int
    var entries: [Entry] = []
    var notes: [(name: String, lines: [String])] = []
    var common: [String] = []

    public init(_ usage: String, tool: String) {
        self.tool = tool
        let lines = usage.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        // Only a name some entry refers to as `[NAME]` begins a note (`DATE: …` under a command is its own text).
        let referred = Set(usage.split(separator: "[").compactMap { part -> String? in
            guard let close = part.firstIndex(of: "]") else { return nil }
            let name = part[..<close]
            return name.count >= 2 && name.allSatisfy({ $0.isUppercase && $0.isLetter }) ? String(name) : nil
        })
        column = lines.first.map { $0.hasPrefix("usage: ") ? 7 : Self.indent(of: $0) } ?? 0
        var note: (name: String, indent: Int, lines: [String])?
        func closeNote() {
            if let open = note { notes.append((open.name, open.lines)) }
            note = nil
        }
        // Where a line indented past the entries goes: the last entry, or (after a line said of
        // every command) on with that.
        var inCommon = false
        for (index, line) in lines.enumerated() {
            let text = index == 0 && line.hasPrefix("usage: ") ? String(repeating: " ", count: 7) + line.dropFirst(7) : line
            let indent = Self.indent(of: text), body = text.dropFirst(indent)
            if body.isEmpty { continue }
            if indent == column, body.hasPrefix("\(tool) ") {
                closeNote()
                inCommon = false
                let words = body.split(separator: " ").dropFirst().prefix(2).prefix { Self.isCommandWord($0) }.map(String.init)
                entries.append(Entry(words: words, lines: [text]))
            } else if indent <= column || entries.isEmpty {
                closeNote()
                inCommon = true
                common.append(text)
            } else if inCommon {
                common.append(text)
            } else if let open = note, indent > open.indent {
                note = (open.name, open.indent, open.lines + [text])
            } else if let name = Self.noteName(body), referred.contains(name) {
                closeNote()
                note = (name, indent, [text])
            } else {
                closeNote()
                entries[entries.count - 1].lines.append(text)
            }
        }
        closeNote()
    }

    /// The entries for the command words at the start of `argv` (options and what follows them
    /// ignored), their notes, and what is said of every command; nil when no entry matches.
    public func text(for argv: [String]) -> String? {
        let asked = Array(argv.prefix { !$0.hasPrefix("-") }.prefix(2))
        guard !asked.isEmpty else { return nil }
        let chosen = entries.filter { entry in
            let n = min(entry.words.count, asked.count)
            return n > 0 && Array(entry.words.prefix(n)) == Array(asked.prefix(n))
        }
        guard !chosen.isEmpty else { return nil }
        var out: [String] = []
        for (index, entry) in chosen.enumerated() {
            var first = entry.lines[0]
            if index == 0 { first = "usage: " + first.dropFirst(min(7, Self.indent(of: first))) }
            out.append(first)
            out += entry.lines.dropFirst()
        }
        let said = chosen.flatMap(\.lines).joined(separator: "\n")
        for note in notes where said.contains("[\(note.name)]") { out += note.lines }
        out += common
        return out.joined(separator: "\n")
    }

    /// The command words each entry is named by, in order (tests: every entry is reachable).
    public var commands: [[String]] { entries.map(\.words) }

    static func indent(of line: String) -> Int { line.prefix { $0 == " " }.count }

    static func isCommandWord(_ word: Substring) -> Bool {
        guard let first = word.first, first.isLowercase, first.isLetter else { return false }
        return word.allSatisfy { ($0.isLetter && $0.isLowercase) || $0.isNumber || $0 == "-" }
    }

    /// `DEVICES: …` names the note DEVICES.
    static func noteName(_ body: Substring) -> String? {
        guard let colon = body.firstIndex(of: ":") else { return nil }
        let name = body[..<colon]
        guard name.count >= 2, name.allSatisfy({ $0.isUppercase && $0.isLetter }) else { return nil }
        return String(name)
    }
}
