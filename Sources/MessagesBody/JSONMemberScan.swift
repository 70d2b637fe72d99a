// No imports beyond the C library's memchr: the relay fuzzer (`make fuzz-relay`) compiles this
// target's files alone.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Finds the values of a few top-level members of a JSON object without decoding it: one pass,
/// no recursion (nesting is a counter), no allocation beyond the result, and string contents
/// skipped with `memchr`, so a 20 MB base64 image costs about what reading it once does. Used
/// for the policy's `model` and `max_tokens` and for the upstream's `usage`; everything else in
/// the body is left as it is.
public struct JSONMemberScan {
    public enum Failure: Error, Equatable {
        case notAnObject
        case malformed(at: Int)
        case duplicate(String)
        /// A member name written with escapes (`"max\u005ftokens"`): another parser would read it
        /// as the plain name, so a policy check must not pass it by.
        case escapedName(at: Int)
    }

    /// The member names a scan looks for, with their bytes: made once (a `static let` at the
    /// caller), since scans run on every relayed request and reply.
    public struct Names: Sendable {
        public let names: [String]
        let bytes: [[UInt8]]
        public init(_ names: String...) {
            self.names = names
            bytes = names.map { Array($0.utf8) }
        }
    }

    /// The value ranges of `names`, in their order (nil when absent).
    public static func members(of names: Names, in bytes: UnsafeRawBufferPointer) throws(Failure) -> [Range<Int>?] {
        try members(of: names, in: bytes, within: 0..<bytes.count)
    }

    /// The same for the object in `bytes[range]` (a nested value); ranges are into `bytes`.
    public static func members(of names: Names, in bytes: UnsafeRawBufferPointer, within range: Range<Int>) throws(Failure) -> [Range<Int>?] {
        guard range.lowerBound >= 0, range.upperBound <= bytes.count else { throw .notAnObject }
        var scanner = Scanner(bytes: UnsafeBufferPointer(rebasing: bytes.bindMemory(to: UInt8.self)[range]))
        let found = try scanner.members(names)
        guard range.lowerBound != 0 else { return found }
        return found.map { $0.map { ($0.lowerBound + range.lowerBound)..<($0.upperBound + range.lowerBound) } }
    }

    /// The element ranges of the array at `bytes[range]`, at most `limit` of them (nil past it,
    /// or when the value is not an array).
    public static func elements(in bytes: UnsafeRawBufferPointer, _ range: Range<Int>, limit: Int) throws(Failure) -> [Range<Int>]? {
        guard range.lowerBound >= 0, range.upperBound <= bytes.count, range.count >= 2, bytes[range.lowerBound] == 0x5b else { return nil }
        var scanner = Scanner(bytes: UnsafeBufferPointer(rebasing: bytes.bindMemory(to: UInt8.self)[range]))
        scanner.index = 1
        var found: [Range<Int>] = []
        scanner.skipWhitespace()
        if scanner.index < scanner.bytes.count, scanner.bytes[scanner.index] == 0x5d { return found }
        while true {
            scanner.skipWhitespace()
            let start = scanner.index
            try scanner.skipValue()
            guard found.count < limit else { return nil }
            found.append((start + range.lowerBound)..<(scanner.index + range.lowerBound))
            scanner.skipWhitespace()
            guard scanner.index < scanner.bytes.count else { throw .malformed(at: scanner.index + range.lowerBound) }
            if scanner.bytes[scanner.index] == 0x2c { scanner.index += 1; continue }
            guard scanner.bytes[scanner.index] == 0x5d else { throw .malformed(at: scanner.index + range.lowerBound) }
            return found
        }
    }

    /// Every member of the object at `bytes[range]` with a plain name, in order, at most `limit`
    /// of them (the rest are skipped); nil when it is not an object.
    public static func allMembers(in bytes: UnsafeRawBufferPointer, within range: Range<Int>, limit: Int) -> [(name: String, value: Range<Int>)]? {
        guard range.lowerBound >= 0, range.upperBound <= bytes.count else { return nil }
        var scanner = Scanner(bytes: UnsafeBufferPointer(rebasing: bytes.bindMemory(to: UInt8.self)[range]))
        var found: [(name: String, value: Range<Int>)] = []
        do throws(Failure) {
            try scanner.eachMember { name, _, value throws(Failure) in
                if found.count < limit, !name.contains(0x5c) {
                    found.append((String(decoding: name, as: UTF8.self), (value.lowerBound + range.lowerBound)..<(value.upperBound + range.lowerBound)))
                }
            }
        } catch {
            return nil
        }
        return found
    }

    /// An integer value (`-?[0-9]+`); nil for anything else. Saturates instead of overflowing.
    public static func integer(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Int? {
        var index = range.lowerBound
        let negative = index < range.upperBound && bytes[index] == UInt8(ascii: "-")
        if negative { index += 1 }
        guard index < range.upperBound else { return nil }
        var value = 0
        while index < range.upperBound {
            let b = bytes[index]
            guard b >= 0x30 && b <= 0x39 else { return nil }
            let (times, o1) = value.multipliedReportingOverflow(by: 10)
            let (sum, o2) = times.addingReportingOverflow(Int(b - 0x30))
            value = o1 || o2 ? Int.max : sum
            index += 1
        }
        return negative ? -value : value
    }

    /// A string value without escapes, as text; nil for another kind of value or an escaped string.
    public static func plainString(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> String? {
        guard range.count >= 2, bytes[range.lowerBound] == UInt8(ascii: "\""), bytes[range.upperBound - 1] == UInt8(ascii: "\"") else { return nil }
        let inner = bytes[(range.lowerBound + 1)..<(range.upperBound - 1)]
        guard !inner.contains(UInt8(ascii: "\\")) else { return nil }
        return String(decoding: inner, as: UTF8.self)
    }

    struct Scanner {
        let bytes: UnsafeBufferPointer<UInt8>
        var index = 0

        init(bytes: UnsafeBufferPointer<UInt8>) {
            self.bytes = bytes
        }

        mutating func skipWhitespace() {
            while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0a || bytes[index] == 0x0d || bytes[index] == 0x09 { index += 1 }
        }

        /// With `index` on an opening quote: moves past the closing one.
        mutating func skipString() throws(Failure) {
            let start = index
            var from = index + 1
            while true {
                guard from < bytes.count, let found = memchr(bytes.baseAddress! + from, 0x22, bytes.count - from) else {
                    throw .malformed(at: start)
                }
                let quote = bytes.baseAddress!.distance(to: found.assumingMemoryBound(to: UInt8.self))
                // A quote is escaped when an odd number of backslashes precede it.
                var backslashes = 0
                while quote - backslashes - 1 > start, bytes[quote - backslashes - 1] == 0x5c { backslashes += 1 }
                if backslashes % 2 == 0 {
                    index = quote + 1
                    return
                }
                from = quote + 1
            }
        }

        /// Moves past one value of any kind; nested arrays and objects by a depth counter.
        mutating func skipValue() throws(Failure) {
            guard index < bytes.count else { throw .malformed(at: index) }
            switch bytes[index] {
            case 0x22: try skipString()
            case 0x7b, 0x5b:
                var depth = 0
                repeat {
                    guard index < bytes.count else { throw .malformed(at: index) }
                    switch bytes[index] {
                    case 0x22: try skipString(); continue
                    case 0x7b, 0x5b: depth += 1
                    case 0x7d, 0x5d: depth -= 1
                    default: break
                    }
                    index += 1
                } while depth > 0
            default:
                let start = index
                while index < bytes.count {
                    let b = bytes[index]
                    if b == 0x2c || b == 0x7d || b == 0x5d || b == 0x20 || b == 0x0a || b == 0x0d || b == 0x09 { break }
                    index += 1
                }
                guard index > start else { throw .malformed(at: start) }
            }
        }

        mutating func members(_ names: Names) throws(Failure) -> [Range<Int>?] {
            let wanted = names.bytes
            var found = [Range<Int>?](repeating: nil, count: wanted.count)
            let start = bytes.baseAddress
            try eachMember { name, _, value throws(Failure) in
                if name.contains(0x5c) { throw .escapedName(at: name.baseAddress.flatMap { at in start.map { $0.distance(to: at) } } ?? 0) }
                if let slot = wanted.firstIndex(where: { $0.elementsEqual(name) }) {
                    guard found[slot] == nil else { throw .duplicate(names.names[slot]) }
                    found[slot] = value
                }
            }
            skipWhitespace()
            guard index == bytes.count else { throw .malformed(at: index) }
            return found
        }

        /// Walks the object at `index` (after leading whitespace), calling `visit` with each
        /// member's name (its raw bytes), the offset of the name's opening quote, and the value's
        /// range; leaves `index` just past the `}`.
        mutating func eachMember(_ visit: (UnsafeBufferPointer<UInt8>, Int, Range<Int>) throws(Failure) -> Void) throws(Failure) {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == 0x7b else { throw .notAnObject }
            index += 1
            skipWhitespace()
            if index < bytes.count, bytes[index] == 0x7d {
                index += 1
                return
            }
            while true {
                skipWhitespace()
                guard index < bytes.count, bytes[index] == 0x22 else { throw .malformed(at: index) }
                let nameQuote = index, nameStart = index + 1
                try skipString()
                let name = UnsafeBufferPointer(rebasing: bytes[nameStart..<(index - 1)])
                skipWhitespace()
                guard index < bytes.count, bytes[index] == 0x3a else { throw .malformed(at: index) }
                index += 1
                skipWhitespace()
                let valueStart = index
                try skipValue()
                try visit(name, nameQuote, valueStart..<index)
                skipWhitespace()
                guard index < bytes.count else { throw .malformed(at: index) }
                if bytes[index] == 0x2c { index += 1; continue }
                guard bytes[index] == 0x7d else { throw .malformed(at: index) }
                index += 1
                return
            }
        }
    }
}
