// libFuzzer entry point for the AWS event-stream decoder and the Bedrock stream translator
// (`make fuzz-eventstream`), built with swiftc straight from the Sources/CloudUpstreams files
// that need no OpenSSL, so it fuzzes the shipped code.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzEventStream(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    // The same bytes whole and in two pieces, cut where the last byte says: framing must not
    // depend on how the network split them.
    let cut = bytes.isEmpty ? 0 : Int(bytes[bytes.count - 1]) * bytes.count / 256
    let pieces = [Array(bytes[..<cut]), Array(bytes[cut...])]

    var whole = EventStreamDecoder(maxMessageBytes: 2048)
    let wholeResult = decode(&whole, [bytes])
    var split = EventStreamDecoder(maxMessageBytes: 2048)
    let splitResult = decode(&split, pieces)
    switch (wholeResult, splitResult) {
    case (.success(let a), .success(let b)) where a == b && whole.hasPartialMessage == split.hasPartialMessage: break
    case (.failure(let a), .failure(let b)) where a == b: break
    default: fatalError("whole: \(wholeResult), in two pieces at \(cut): \(splitResult)")
    }
    // Whatever decodes encodes back to a frame that decodes to the same message.
    if case .success(let messages) = wholeResult {
        for message in messages {
            let again = encodeEventStreamMessage(headers: message.headers, payload: message.payload)
            var decoder = EventStreamDecoder(maxMessageBytes: 2048)
            guard case .success(let decoded) = decode(&decoder, [again]), decoded == [message], !decoder.hasPartialMessage else {
                fatalError("a decoded message did not survive a round trip")
            }
        }
    }

    // The translator: no traps, and the same SSE bytes or the same error whatever the split.
    var wholeTranslator = BedrockStreamTranslator(maxMessageBytes: 2048)
    var splitTranslator = BedrockStreamTranslator(maxMessageBytes: 2048)
    let wholeSSE = translate(&wholeTranslator, [bytes])
    let splitSSE = translate(&splitTranslator, pieces)
    guard wholeSSE == splitSSE else { fatalError("translator whole: \(wholeSSE), in two pieces at \(cut): \(splitSSE)") }
    // How it ended (an exception before any event is answered with its own status) does not
    // depend on the split either.
    guard wholeTranslator.endedBy == splitTranslator.endedBy, wholeTranslator.eventsTranslated == splitTranslator.eventsTranslated else {
        fatalError("translator ended otherwise in two pieces at \(cut)")
    }
    if let answer = wholeTranslator.endedBy, !(400...599).contains(answer.status) { fatalError("an exception answered \(answer.status)") }

    // A model's words reach the device without an ARN or an account ID in them.
    let cleaned = Array(CloudErrorAnswer.withoutAccountNames(String(decoding: bytes, as: UTF8.self)).utf8)
    var digits = 0, afterDash = false
    for byte in cleaned {
        if (0x30...0x39).contains(byte) {
            digits += 1
            afterDash = false
        } else if byte == UInt8(ascii: "-"), digits > 0, !afterDash {
            afterDash = true
        } else {
            digits = 0
            afterDash = false
        }
        if digits >= 12 { fatalError("an account ID left in a model's words") }
    }

    // Error bodies: any type and body give a JSON object back.
    let header = String(decoding: bytes.prefix(40), as: UTF8.self)
    let mapped = bedrockErrorToAnthropic(status: 400 + size % 200, errorTypeHeader: header, body: bytes)
    guard mapped.body.withUnsafeBytes({ JSONScan.forEachMember(of: $0) { _, _ in } }) else {
        fatalError("an error body that does not scan as a JSON object")
    }
    return 0
}

private func decode(_ decoder: inout EventStreamDecoder, _ pieces: [[UInt8]]) -> Result<[EventStreamMessage], EventStreamError> {
    var messages: [EventStreamMessage] = []
    for piece in pieces {
        let result = piece.withUnsafeBytes { bytes in Result { () throws(EventStreamError) in try decoder.feed(bytes) } }
        switch result {
        case .success(let more): messages += more
        case .failure(let error): return .failure(error)
        }
    }
    return .success(messages)
}

private enum Outcome: Equatable {
    case sse([UInt8])
    case failed(String)
}

private func translate(_ translator: inout BedrockStreamTranslator, _ pieces: [[UInt8]]) -> Outcome {
    var out: [UInt8] = []
    for piece in pieces {
        do {
            out += try piece.withUnsafeBytes { try translator.translate($0) }
        } catch {
            return .failed("\(error)")
        }
    }
    return .sse(out)
}
