// libFuzzer entry point for what the Messages relay reads and edits as bytes (`make fuzz-relay`):
// the JSON member scan, each cloud's request edit, the policy's scan of a request body, usage from
// a JSON reply (whole, or its tail) and from an SSE stream cut anywhere (Bedrock's invocation
// metrics included), a context overflow's wording, and the token endpoints' answers. Built by swiftc with -sanitize=fuzzer,address straight from Sources/MessagesBody and
// the import-free files of Sources/CloudUpstreams, so it fuzzes the shipped code.
//
// The input's first byte picks the reader by its low three bits, so a seed that starts with a
// digit `0`…`7` is readable text; the rest is that reader's input. Its high bits vary how a
// stream is cut. Foundation's JSONSerialization is the reference: what it reads as an object the
// scans must read too (refusing only escaped or repeated names), and agree with it on the values.

import Foundation

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRelay(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let selector = data[0]
    let input = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    switch selector & 7 {
    case 0: memberScan(input, reference(input))
    case 1: cloudEdit(input, reference(input) as? [String: Any], bedrock: selector & 8 == 0, betas: selector & 16 != 0)
    case 2: requestBody(input, reference(input) as? [String: Any], spendsTokens: selector & 8 == 0)
    case 3:
        let object = reference(input) as? [String: Any]
        replyUsage(input, object)
        errorWording(input, object)
    case 4: streamUsage(input, seed: selector)
    case 5: streamUsage(oneEvent(input), seed: selector)
    case 6: tokenReplies(input, reference(input) as? [String: Any])
    default:
        // Every reader on the same bytes.
        let parsed = reference(input), object = parsed as? [String: Any]
        memberScan(input, parsed)
        cloudEdit(input, object, bedrock: true, betas: true)
        cloudEdit(input, object, bedrock: false, betas: false)
        requestBody(input, object, spendsTokens: true)
        replyUsage(input, object)
        errorWording(input, object)
        streamUsage(input, seed: selector)
        tokenReplies(input, object)
    }
    return 0
}

func fail(_ what: String, _ input: [UInt8]) -> Never {
    fatalError("\(what); input: \(String(decoding: input.prefix(300), as: UTF8.self).debugDescription)")
}

// MARK: - The reference

/// The input as Foundation reads it, when it is a JSON object (or array). Foundation is laxer than
/// RFC 8259 in ways the scans are not meant to follow: it takes a trailing comma (`[1,]`,
/// `{"a":1,}`) and a byte-order mark, and guesses UTF-16 and UTF-32 from NUL bytes. Such inputs
/// have no reference.
func reference(_ bytes: [UInt8]) -> Any? {
    guard let first = bytes.first, first < 0x80, !bytes.contains(0), !hasTrailingComma(bytes) else { return nil }
    return try? JSONSerialization.jsonObject(with: Data(bytes))
}

func referenceObject(_ bytes: [UInt8]) -> [String: Any]? { reference(bytes) as? [String: Any] }

/// A comma followed by nothing but whitespace before `}` or `]`, outside strings.
func hasTrailingComma(_ bytes: [UInt8]) -> Bool {
    var inString = false, escaped = false, afterComma = false
    for byte in bytes {
        if inString {
            if escaped { escaped = false } else if byte == UInt8(ascii: "\\") { escaped = true } else if byte == UInt8(ascii: "\"") { inString = false }
            continue
        }
        if isWhitespace(byte) { continue }
        if afterComma, byte == UInt8(ascii: "}") || byte == UInt8(ascii: "]") { return true }
        afterComma = byte == UInt8(ascii: ",")
        if byte == UInt8(ascii: "\"") { inString = true }
    }
    return false
}

/// An integer JSON number in the reference, exactly (nil for anything else: fractions, exponents,
/// booleans, whose `objCType` is `d` or `c`).
func referenceInteger(_ value: Any?) -> Int64? {
    guard let number = value as? NSNumber else { return nil }
    switch String(cString: number.objCType) {
    case "s", "i", "l", "q": return number.int64Value
    case "S", "I", "L", "Q": return number.uint64Value <= UInt64(Int64.max) ? Int64(number.uint64Value) : nil
    default: return nil
    }
}

func isWhitespace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x0a || byte == 0x0d || byte == 0x09 }

/// `bytes` without JSON whitespace at either end.
func trimmed(_ bytes: [UInt8]) -> Range<Int> {
    var start = 0, end = bytes.count
    while start < end, isWhitespace(bytes[start]) { start += 1 }
    while end > start, isWhitespace(bytes[end - 1]) { end -= 1 }
    return start..<end
}

// MARK: - JSONMemberScan

let scanNames = JSONMemberScan.Names("model", "max_tokens", "stream", "usage", "type", "a", "")

func memberScan(_ input: [UInt8], _ parsed: Any?) {
    let object = parsed as? [String: Any]
    input.withUnsafeBytes { bytes in
        let found: [Range<Int>?]
        do {
            found = try JSONMemberScan.members(of: scanNames, in: bytes)
        } catch {
            // What Foundation reads as an object is refused only for a name written with escapes or repeated.
            if object != nil, !isExpectedRefusal(error) { fail("a JSON object refused: \(error)", input) }
            return
        }
        guard found.count == scanNames.names.count else { fail("\(found.count) slots for \(scanNames.names.count) names", input) }
        let present = found.compactMap { $0 }.sorted { $0.lowerBound < $1.lowerBound }
        for (index, range) in present.enumerated() {
            guard !range.isEmpty, range.lowerBound >= 0, range.upperBound <= bytes.count else { fail("value range \(range)", input) }
            if index > 0, present[index - 1].upperBound > range.lowerBound { fail("overlapping values", input) }
        }
        for (slot, range) in found.enumerated() {
            guard let range else {
                if let object, object[scanNames.names[slot]] != nil { fail("\(scanNames.names[slot]) missed", input) }
                continue
            }
            readValue(bytes, range, input)
            guard let object else { continue }
            let value = object[scanNames.names[slot]]
            guard value != nil else { fail("\(scanNames.names[slot]) found where Foundation has none", input) }
            if let text = JSONMemberScan.plainString(bytes, range), let expected = value as? String, text != expected {
                fail("\(scanNames.names[slot]) read as \(text.debugDescription), Foundation \(expected.debugDescription)", input)
            }
            if let number = JSONMemberScan.integer(bytes, range), abs(number) < 1 << 53, let expected = referenceInteger(value), Int64(number) != expected {
                fail("\(scanNames.names[slot]) read as \(number), Foundation \(expected)", input)
            }
        }
        // A whole array: as many elements as Foundation reads.
        let whole = trimmed(input)
        if whole.count >= 2, input[whole.lowerBound] == UInt8(ascii: "["),
           let array = parsed as? [Any] {
            guard let elements = try? JSONMemberScan.elements(in: bytes, whole, limit: .max), elements.count == array.count else {
                fail("an array of \(array.count) read otherwise", input)
            }
        }
    }
}

func isExpectedRefusal(_ error: Error) -> Bool {
    switch error as? JSONMemberScan.Failure {
    case .duplicate?, .escapedName?: true
    default: false
    }
}

/// The helpers on one value: nothing traps, and what they find lies within it.
func readValue(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>, _ input: [UInt8]) {
    _ = JSONMemberScan.integer(bytes, range)
    // A plain string is its bytes between the quotes (invalid UTF-8 repaired).
    if let text = JSONMemberScan.plainString(bytes, range), String(validating: bytes[(range.lowerBound + 1)..<(range.upperBound - 1)], as: UTF8.self)
        .map({ !$0.utf8.elementsEqual(text.utf8) }) ?? false {
        fail("a plain string read otherwise than its bytes", input)
    }
    if let elements = try? JSONMemberScan.elements(in: bytes, range, limit: 64) {
        for element in elements where element.isEmpty || !range.contains(element.lowerBound) || element.upperBound > range.upperBound {
            fail("element \(element) outside \(range)", input)
        }
    }
    for (_, value) in JSONMemberScan.allMembers(in: bytes, within: range, limit: 64) ?? []
    where value.isEmpty || !range.contains(value.lowerBound) || value.upperBound > range.upperBound {
        fail("member value \(value) outside \(range)", input)
    }
    if let inner = try? JSONMemberScan.members(of: scanNames, in: bytes, within: range) {
        for value in inner.compactMap({ $0 }) where value.isEmpty || !range.contains(value.lowerBound) || value.upperBound > range.upperBound {
            fail("nested value \(value) outside \(range)", input)
        }
    }
}

// MARK: - The cloud body edit

/// The shaping table's edit (`CloudRequestBody.shape`) with a rule of each kind: whatever the
/// input, a shaped body is braced, parses wherever the input did, holds no top-level
/// `cache_control`, and a refusal names a refused member.
func cloudShape(_ input: [UInt8], _ object: [String: Any]?) {
    let rule: (String) -> MemberRule = { name in
        switch name {
        case "model", "stream", "metadata": .remove
        case "cache_control": .moveCacheControl
        case "output_config": .outputConfigHintOnly
        case "container", "fallbacks": .refuse
        default: .pass
        }
    }
    let result: ShapedBody
    do {
        result = try CloudRequestBody.shape(input, rule: rule, adding: [("anthropic_version", #""v""#)])
    } catch {
        if object != nil, !isExpectedRefusal(error) { fail("the shaping refused a JSON object: \(error)", input) }
        return
    }
    switch result {
    case .refused(let what):
        guard ["container", "fallbacks", "output_config.format"].contains(what) else { fail("refused \(what)", input) }
    case .shaped(let body):
        guard body.first == UInt8(ascii: "{"), body.last == UInt8(ascii: "}") else { fail("a shaped body that is not braced", input) }
        guard object != nil else { return }
        guard let shaped = referenceObject(body) else { fail("the shaped body of a JSON object does not parse", input) }
        if shaped["cache_control"] != nil || shaped["model"] != nil { fail("a removed member is left at the top level", input) }
    }
}

func cloudEdit(_ input: [UInt8], _ object: [String: Any]?, bedrock: Bool, betas: Bool) {
    cloudShape(input, object)
    let removed = bedrock ? CloudRequestBody.removedForBedrock : CloudRequestBody.removedForVertex
    var added = [("anthropic_version", bedrock ? #""bedrock-2023-05-31""# : #""vertex-2023-10-16""#)]
    if betas { added.append(("anthropic_beta", #"["a-beta","b-beta"]"#)) }
    let edited: [UInt8]
    do {
        edited = try CloudRequestBody.edit(input, removing: removed, adding: added)
    } catch {
        if object != nil, !isExpectedRefusal(error) { fail("the edit refused a JSON object: \(error)", input) }
        return
    }
    guard edited.first == UInt8(ascii: "{"), edited.last == UInt8(ascii: "}") else { fail("an edited body that is not braced", input) }
    // No removed member is left at the top level; what was added is there once, as written.
    edited.withUnsafeBytes { bytes in
        guard let found = try? JSONMemberScan.members(of: removed, in: bytes) else { fail("the edited body does not scan", input) }
        for (slot, name) in removed.names.enumerated() {
            let value = found[slot].map { String(decoding: bytes[$0], as: UTF8.self) }
            if value != added.first(where: { $0.0 == name })?.1 { fail("\(name) is \(value ?? "absent") after the edit", input) }
        }
    }
    // The kept members, in order and byte for byte.
    let before = input.withUnsafeBytes { bytes in
        (JSONMemberScan.allMembers(in: bytes, within: 0..<bytes.count, limit: .max) ?? []).map { ($0.name, Array(bytes[$0.value])) }
    }
    let after = edited.withUnsafeBytes { bytes in
        (JSONMemberScan.allMembers(in: bytes, within: 0..<bytes.count, limit: .max) ?? []).map { ($0.name, Array(bytes[$0.value])) }
    }
    let kept = before.filter { member in !removed.names.contains(member.0) }
    guard after.count == kept.count + added.count, zip(after.dropFirst(added.count), kept).allSatisfy({ $0.0 == $1.0 && $0.1 == $1.1 }) else {
        fail("the kept members changed", input)
    }
    // Editing again changes nothing: the added members are among the removed ones.
    guard (try? CloudRequestBody.edit(edited, removing: removed, adding: added)) == edited else { fail("a second edit changed the body", input) }
    // JSON in, JSON out, with the same members less the removed ones.
    if let object {
        guard let out = referenceObject(edited) else { fail("the edit of a JSON object is not JSON", input) }
        let expected = Set(object.keys).subtracting(removed.names).union(added.map(\.0))
        if Set(out.keys) != expected { fail("members \(out.keys.sorted()) after the edit, not \(expected.sorted())", input) }
    }
}

// MARK: - The policy's scan of a request body

func requestBody(_ input: [UInt8], _ object: [String: Any]?, spendsTokens: Bool) {
    let (fields, streams) = MessagesRequestBody.read(input, spendsTokens: spendsTokens)
    let asks = MessagesRequestBody.asksForStream(input)
    // The policy scan and the stream check see the same `stream`.
    if asks == true, !streams { fail("asksForStream says a stream, the policy scan does not", input) }
    if fields.problem == nil, asks != streams, !(asks == nil && fields.malformed != nil) {
        fail("stream: policy scan \(streams), asksForStream \(String(describing: asks))", input)
    }
    guard fields.spendsTokens == spendsTokens, fields.betaHeaderValues.isEmpty, fields.profile == nil else { fail("header fields from a body", input) }
    if case .models(let models) = fields.fallbacks, !(1...3).contains(models.count) { fail("\(models.count) fallbacks", input) }
    if fields.serverTools.count > 1024 || fields.serverTools.contains(where: { ($0.maxUses ?? 0) < 0 }) { fail("server tools \(fields.serverTools)", input) }
    guard fields.bodyBetas.count <= 64, fields.bodyBetas.allSatisfy({ beta in
        !beta.isEmpty && beta.utf8.count <= 256 && beta.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7f && $0 != UInt8(ascii: ",") }
    }) else { fail("body betas \(fields.bodyBetas)", input) }
    guard let object else { return }
    // What Foundation reads as an object, the scan reads (a name written with escapes or repeated aside).
    if let problem = fields.problem, problem.hasPrefix("the body is not") { fail("a JSON object unread: \(problem)", input) }
    if let model = fields.model, model != object["model"] as? String { fail("model \(model.debugDescription)", input) }
    if let maxTokens = fields.maxTokens, abs(maxTokens) < 1 << 53, let expected = referenceInteger(object["max_tokens"]), Int64(maxTokens) != expected {
        fail("max_tokens \(maxTokens), Foundation \(expected)", input)
    }
    if let stream = object["stream"], fields.problem == nil, asks != nil, (stream as? NSNumber).map({ String(cString: $0.objCType) }) != "c" {
        fail("stream \(stream) taken as a boolean", input)
    }
}

// MARK: - Usage from a JSON reply

func checkBounds(_ usage: TokenUsage?, _ input: [UInt8]) {
    guard let usage else { return }
    for count in [usage.inputTokens, usage.outputTokens, usage.cacheCreationInputTokens, usage.cacheReadInputTokens]
    where !(0...TokenUsage.maxCount).contains(count) {
        fail("a count of \(count)", input)
    }
    guard usage.serverToolUse.count <= 16, usage.serverToolUse.allSatisfy({ name, count in
        (1...TokenUsage.maxCount).contains(count) && (1...64).contains(name.utf8.count)
            && name.utf8.allSatisfy { (0x61...0x7a).contains($0) || (0x30...0x39).contains($0) || $0 == 0x5f }
    }) else { fail("server tool use \(usage.serverToolUse)", input) }
}

func replyUsage(_ input: [UInt8], _ object: [String: Any]?) {
    let served = UsageObject.servedReply(input)
    checkBounds(served.usage, input)
    guard UsageObject.ofReply(input) == served.usage else { fail("ofReply and servedReply differ", input) }
    // The tail a reply too large to hold leaves, cut anywhere.
    checkBounds(UsageObject.ofTail(input), input)
    if !input.isEmpty { checkBounds(UsageObject.ofTail(Array(input[(Int(input[0]) * input.count / 256)...])), input) }
    guard let usage = served.usage, let object else { return }
    // Each count the scan read is the integer Foundation reads.
    guard let usageObject = object["usage"] as? [String: Any] else { fail("usage read from a reply whose usage is no object", input) }
    let counts = [("input_tokens", usage.inputTokens), ("output_tokens", usage.outputTokens),
                  ("cache_creation_input_tokens", usage.cacheCreationInputTokens), ("cache_read_input_tokens", usage.cacheReadInputTokens)]
    for (name, count) in counts where count > 0 && count < TokenUsage.maxCount {
        if referenceInteger(usageObject[name]) != count { fail("\(name) read as \(count), Foundation \(String(describing: usageObject[name]))", input) }
    }
    if served.model != nil, object["content"] == nil, served.model != object["model"] as? String { fail("model \(served.model!)", input) }
}

/// The context-overflow wording of an error body: the clause added inside the message, nothing
/// else changed, JSON in and JSON out.
func errorWording(_ input: [UInt8], _ object: [String: Any]?) {
    guard let worded = ErrorWording.contextOverflowWorded(input) else { return }
    let clause = Array(ErrorWording.contextClause.utf8)
    guard worded.count == input.count + clause.count, let at = (0...input.count).first(where: { worded[$0..<($0 + clause.count)].elementsEqual(clause) }),
          Array(worded[..<at]) + Array(worded[(at + clause.count)...]) == input else { fail("the wording changed more than the message", input) }
    if object != nil, referenceObject(worded) == nil { fail("a worded error body that is not JSON", input) }
    guard ErrorWording.contextOverflowWorded(worded) == nil else { fail("worded twice", input) }
}

// MARK: - Usage from an SSE stream

struct StreamState: Equatable {
    var usage: TokenUsage
    var servingModel: String?
    var sawStart: Bool
    var sawStop: Bool
    var deltaEvents: Int64

    init(_ reader: StreamUsageReader) {
        usage = reader.usage
        servingModel = reader.servingModel
        sawStart = reader.sawStart
        sawStop = reader.sawStop
        deltaEvents = reader.deltaEvents
    }
}

/// Feeds `input` in pieces of the given sizes; the state and every event boundary (absolute offsets).
func feed(_ input: [UInt8], sizes: some Sequence<Int>) -> (StreamState, [Int]) {
    var reader = StreamUsageReader()
    var boundaries: [Int] = []
    var offset = 0
    input.withUnsafeBytes { bytes in
        var sizes = sizes.makeIterator()
        while offset < bytes.count {
            let size = min(max(1, sizes.next() ?? bytes.count), bytes.count - offset)
            if let boundary = reader.feed(UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + size)])) {
                guard boundary > 0, boundary <= size else { fail("boundary \(boundary) in a piece of \(size)", input) }
                boundaries.append(offset + boundary)
            }
            offset += size
        }
    }
    return (StreamState(reader), boundaries)
}

/// Piece sizes from a small generator seeded by the selector and the length: 1 to 64 bytes, now
/// and then a few hundred.
struct PieceSizes: Sequence, IteratorProtocol {
    var state: UInt64
    mutating func next() -> Int? {
        state = state &* 6364136223846793005 &+ 1442695040888963407
        let draw = Int(truncatingIfNeeded: state >> 33)
        return draw % 8 == 0 ? 1 + draw % 512 : 1 + draw % 64
    }
}

func streamUsage(_ input: [UInt8], seed: UInt8) {
    let (whole, wholeBoundaries) = feed(input, sizes: [input.count])
    checkBounds(whole.usage, input)
    let newlines = input.reduce(0) { $0 + ($1 == 0x0a ? 1 : 0) }
    guard whole.deltaEvents <= newlines else { fail("\(whole.deltaEvents) delta events in \(newlines) lines", input) }
    // Cut anywhere, the same reading and the same event ends.
    let (split, splitBoundaries) = feed(input, sizes: PieceSizes(state: UInt64(seed) << 32 | UInt64(input.count)))
    guard split == whole else { fail("in pieces: \(split), whole: \(whole)", input) }
    guard splitBoundaries.last == wholeBoundaries.last else { fail("last event end \(String(describing: splitBoundaries.last))", input) }
    for boundary in splitBoundaries where input[boundary - 1] != 0x0a { fail("an event end after a byte that is no newline", input) }
    if input.count <= 256 {
        let (bytewise, every) = feed(input, sizes: repeatElement(1, count: input.count))
        guard bytewise == whole, every.last == wholeBoundaries.last, Set(splitBoundaries).isSubset(of: every) else {
            fail("byte by byte: \(bytewise), whole: \(whole)", input)
        }
    }
}

/// One SSE event around the input: the first byte names it (or leaves it unnamed), the rest is its data.
func oneEvent(_ input: [UInt8]) -> [UInt8] {
    let names = ["message_start", "message_delta", "message_stop", "content_block_start", "content_block_delta", "ping", ""]
    guard let first = input.first else { return [] }
    let name = names[Int(first) % names.count]
    return Array((name.isEmpty ? "" : "event: \(name)\n").utf8) + Array("data: ".utf8) + input.dropFirst() + [0x0a, 0x0a]
}

// MARK: - The token endpoints' answers

func tokenReplies(_ input: [UInt8], _ object: [String: Any]?) {
    credentialReplies(input, object)
    // Google's (Vertex AI and its metadata server).
    do {
        let (token, expiresIn) = try GoogleTokenResponse.parse(input)
        guard !token.isEmpty, expiresIn > 0 else { fail("token of \(token.utf8.count) bytes for \(expiresIn) s", input) }
        // Names repeated (or spelt with escapes) may be read as either occurrence: compared only when each is once.
        if let object, distinctTopLevelNames(input) {
            guard object["error"] == nil, object["access_token"] as? String == token,
                  referenceInteger(object["expires_in"]) == Int64(expiresIn) else { fail("token answer read otherwise than Foundation", input) }
        }
    } catch .tokenRefused(let error, let description) {
        guard error.count <= 100, (description?.count ?? 0) <= 300 else { fail("refusal texts unbounded", input) }
    } catch .malformedTokenResponse(let why) {
        if object != nil, why == "not a JSON object" { fail("a JSON object refused as none", input) }
    } catch {
        fail("token answer: \(error)", input)
    }
}

/// The top-level member names, decoded, are all different.
func distinctTopLevelNames(_ input: [UInt8]) -> Bool {
    var names: [[UInt8]] = []
    input.withUnsafeBytes { bytes in _ = JSONScan.forEachMember(of: bytes) { name, _ in names.append(name) } }
    return Set(names).count == names.count
}

/// The renewing sources' endpoints: STS's XML, the container and IMDS JSON, Entra ID's token
/// JSON, and the ISO 8601 times they carry. Nothing traps; whatever is taken is bounded and
/// header-safe, and agrees with Foundation where Foundation reads the same.
func credentialReplies(_ input: [UInt8], _ object: [String: Any]?) {
    func headerSafe(_ text: String) -> Bool { text.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7f } }
    func check(_ keys: TemporaryAWSKeys) {
        guard (16...128).contains(keys.accessKeyID.utf8.count), headerSafe(keys.accessKeyID), headerSafe(keys.secretAccessKey),
              keys.sessionToken.map({ headerSafe($0) && !$0.isEmpty && $0.utf8.count <= CredentialReplies.maxToken }) ?? true,
              keys.expiration >= 0 else { fail("AWS keys out of shape", input) }
    }
    if let keys = try? CredentialReplies.stsCredentials(input) { check(keys) }
    do {
        let keys = try CredentialReplies.awsJSONCredentials(input, source: "fuzz")
        check(keys)
        if let object, distinctTopLevelNames(input) {
            guard object["AccessKeyId"] as? String == keys.accessKeyID, object["SecretAccessKey"] as? String == keys.secretAccessKey else {
                fail("container credentials read otherwise than Foundation", input)
            }
        }
    } catch {
        if error.description.count > 600 { fail("an unbounded error text", input) }
    }
    do {
        let (token, expiresIn) = try CredentialReplies.entraToken(input, now: 1_700_000_000)
        guard !token.isEmpty, headerSafe(token), expiresIn > 0 else { fail("Entra token of \(token.utf8.count) bytes for \(expiresIn) s", input) }
        if let object, distinctTopLevelNames(input), object["access_token"] as? String != token { fail("Entra token read otherwise than Foundation", input) }
    } catch {
        if error.description.count > 600 { fail("an unbounded error text", input) }
    }
    // An ISO 8601 time, when the input is one: Foundation's reading, to the second.
    if input.count <= 40, let seconds = CredentialReplies.epochSeconds(iso8601: input[...]) {
        let formatter = ISO8601DateFormatter()
        let text = String(decoding: input, as: UTF8.self)
        if !text.contains("."), !text.contains("t"), !text.contains("z"), let date = formatter.date(from: text),
           Int64(date.timeIntervalSince1970) != seconds {
            fail("ISO 8601 \(text) read as \(seconds), Foundation \(Int64(date.timeIntervalSince1970))", input)
        }
    }
}
