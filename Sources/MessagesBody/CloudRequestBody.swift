/// The Messages request as a cloud upstream takes it: the same JSON with a few top-level members
/// taken out and a few put in, edited as bytes (the body may be a 30 MB image; nothing else in
/// it is decoded or rewritten).
public enum CloudRequestBody {
    /// What Bedrock reads from the path or sets itself (`model`, `stream`), what the relay writes
    /// (`anthropic_version`), and the body's betas, which are sent again as one checked list with
    /// the header's.
    public static let removedForBedrock = JSONMemberScan.Names("model", "stream", "anthropic_version", "anthropic_beta")
    /// The same for Vertex AI, which reads `stream` from the body.
    public static let removedForVertex = JSONMemberScan.Names("model", "anthropic_version", "anthropic_beta")

    /// `body` without the top-level members `removed`, with `added` (name, raw JSON value) first.
    /// One walk over the members: each kept one is copied as it stands (its name, colon and
    /// value) and the separators are written anew, so a removed member's comma is never shared
    /// with another's, whatever the order, spacing or count. A removed name written with escapes,
    /// or given twice, is refused: another parser would read it as the plain name.
    public static func edit(_ body: [UInt8], removing removed: JSONMemberScan.Names, adding added: [(String, String)]) throws -> [UInt8] {
        try body.withUnsafeBytes { raw throws -> [UInt8] in
            let bytes = raw.bindMemory(to: UInt8.self)
            var scanner = JSONMemberScan.Scanner(bytes: bytes)
            var kept: [Range<Int>] = []
            var seen = [Bool](repeating: false, count: removed.bytes.count)
            try scanner.eachMember { name, quote, value throws(JSONMemberScan.Failure) in
                if name.contains(0x5c) { throw .escapedName(at: quote) }
                if let slot = removed.bytes.firstIndex(where: { $0.elementsEqual(name) }) {
                    guard !seen[slot] else { throw .duplicate(removed.names[slot]) }
                    seen[slot] = true
                } else {
                    kept.append(quote..<value.upperBound)
                }
            }
            scanner.skipWhitespace()
            guard scanner.index == bytes.count else { throw JSONMemberScan.Failure.malformed(at: scanner.index) }
            var out: [UInt8] = [UInt8(ascii: "{")]
            out.reserveCapacity(body.count + 128)
            var first = true
            for (name, value) in added {
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                out.append(contentsOf: "\"\(name)\":\(value)".utf8)
            }
            for range in kept {
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[range]))
            }
            out.append(UInt8(ascii: "}"))
            return out
        }
    }
}
