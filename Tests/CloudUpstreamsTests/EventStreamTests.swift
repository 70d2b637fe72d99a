@testable import CloudUpstreams
import Testing

/// Encoded frames published with botocore's event-stream decoder tests (tests/unit/test_eventstream.py
/// in boto/botocore), byte for byte: the positive ones with their decoded headers and payloads,
/// the corrupted ones with the error each must raise.
enum PublishedFrames {
    static let emptyMessage: [UInt8] = [
        0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x05, 0xc2, 0x48, 0xeb, 0x7d, 0x98, 0xc8, 0xff,
    ]
    static let int8Header: [UInt8] = [
        0x00, 0x00, 0x00, 0x17, 0x00, 0x00, 0x00, 0x07, 0x29, 0x86, 0x01, 0x58, 0x04, 0x62, 0x79, 0x74,
        0x65, 0x02, 0xff, 0xc2, 0xf8, 0x69, 0xdc,
    ]
    static let int16Header: [UInt8] = [
        0x00, 0x00, 0x00, 0x19, 0x00, 0x00, 0x00, 0x09, 0x71, 0x0e, 0x92, 0x3e, 0x05, 0x73, 0x68, 0x6f,
        0x72, 0x74, 0x03, 0xff, 0xff, 0xb2, 0x7c, 0xb6, 0xcc,
    ]
    static let int32Header: [UInt8] = [
        0x00, 0x00, 0x00, 0x1d, 0x00, 0x00, 0x00, 0x0d, 0x83, 0xe3, 0xf0, 0xe7, 0x07, 0x69, 0x6e, 0x74,
        0x65, 0x67, 0x65, 0x72, 0x04, 0xff, 0xff, 0xff, 0xff, 0x8b, 0x8e, 0x12, 0xeb,
    ]
    static let int64Header: [UInt8] = [
        0x00, 0x00, 0x00, 0x1e, 0x00, 0x00, 0x00, 0x0e, 0x5d, 0x4a, 0xdb, 0x8d, 0x04, 0x6c, 0x6f, 0x6e,
        0x67, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x4b, 0xc2, 0x32, 0xda,
    ]
    static let payloadNoHeaders: [UInt8] = [
        0x00, 0x00, 0x00, 0x1d, 0x00, 0x00, 0x00, 0x00, 0xfd, 0x52, 0x8c, 0x5a, 0x7b, 0x27, 0x66, 0x6f,
        0x6f, 0x27, 0x3a, 0x27, 0x62, 0x61, 0x72, 0x27, 0x7d, 0xc3, 0x65, 0x39, 0x36,
    ]
    static let payloadOneStrHeader: [UInt8] = [
        0x00, 0x00, 0x00, 0x3d, 0x00, 0x00, 0x00, 0x20, 0x07, 0xfd, 0x83, 0x96, 0x0c, 0x63, 0x6f, 0x6e,
        0x74, 0x65, 0x6e, 0x74, 0x2d, 0x74, 0x79, 0x70, 0x65, 0x07, 0x00, 0x10, 0x61, 0x70, 0x70, 0x6c,
        0x69, 0x63, 0x61, 0x74, 0x69, 0x6f, 0x6e, 0x2f, 0x6a, 0x73, 0x6f, 0x6e, 0x7b, 0x27, 0x66, 0x6f,
        0x6f, 0x27, 0x3a, 0x27, 0x62, 0x61, 0x72, 0x27, 0x7d, 0x8d, 0x9c, 0x08, 0xb1,
    ]
    static let allHeaderTypes: [UInt8] = [
        0x00, 0x00, 0x00, 0x62, 0x00, 0x00, 0x00, 0x52, 0x03, 0xb5, 0xcb, 0x9c, 0x01, 0x30, 0x00, 0x01,
        0x31, 0x01, 0x01, 0x32, 0x02, 0x02, 0x01, 0x33, 0x03, 0x00, 0x03, 0x01, 0x34, 0x04, 0x00, 0x00,
        0x00, 0x04, 0x01, 0x35, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x01, 0x36, 0x06,
        0x00, 0x05, 0x62, 0x79, 0x74, 0x65, 0x73, 0x01, 0x37, 0x07, 0x00, 0x04, 0x75, 0x74, 0x66, 0x38,
        0x01, 0x38, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x01, 0x39, 0x09, 0x30, 0x31,
        0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x63, 0x35,
        0x36, 0x71,
    ]
    static let errorMessage: [UInt8] = [
        0x00, 0x00, 0x00, 0x52, 0x00, 0x00, 0x00, 0x42, 0xbf, 0x23, 0x63, 0x7e, 0x0d, 0x3a, 0x6d, 0x65,
        0x73, 0x73, 0x61, 0x67, 0x65, 0x2d, 0x74, 0x79, 0x70, 0x65, 0x07, 0x00, 0x05, 0x65, 0x72, 0x72,
        0x6f, 0x72, 0x0b, 0x3a, 0x65, 0x72, 0x72, 0x6f, 0x72, 0x2d, 0x63, 0x6f, 0x64, 0x65, 0x07, 0x00,
        0x04, 0x63, 0x6f, 0x64, 0x65, 0x0e, 0x3a, 0x65, 0x72, 0x72, 0x6f, 0x72, 0x2d, 0x6d, 0x65, 0x73,
        0x73, 0x61, 0x67, 0x65, 0x07, 0x00, 0x07, 0x6d, 0x65, 0x73, 0x73, 0x61, 0x67, 0x65, 0x6b, 0x6c,
        0xea, 0x3d,
    ]
    static let corruptedLength: [UInt8] = [
        0x01, 0x00, 0x00, 0x1d, 0x00, 0x00, 0x00, 0x00, 0xfd, 0x52, 0x8c, 0x5a, 0x7b, 0x27, 0x66, 0x6f,
        0x6f, 0x27, 0x3a, 0x27, 0x62, 0x61, 0x72, 0x27, 0x7d, 0xc3, 0x65, 0x39, 0x36,
    ]
    static let corruptedPayload: [UInt8] = [
        0x00, 0x00, 0x00, 0x1d, 0x00, 0x00, 0x00, 0x00, 0xfd, 0x52, 0x8c, 0x5a, 0x7b, 0x27, 0x66, 0x6f,
        0x6f, 0x27, 0x3a, 0x27, 0x62, 0x61, 0x72, 0x27, 0x8d, 0xc3, 0x65, 0x39, 0x36,
    ]
    static let corruptedHeaders: [UInt8] = [
        0x00, 0x00, 0x00, 0x3d, 0x00, 0x00, 0x00, 0x20, 0x07, 0xfd, 0x83, 0x96, 0x0c, 0x63, 0x6f, 0x6e,
        0x74, 0x65, 0x6e, 0x74, 0x2b, 0x74, 0x79, 0x70, 0x65, 0x07, 0x00, 0x10, 0x61, 0x70, 0x70, 0x6c,
        0x69, 0x63, 0x61, 0x74, 0x69, 0x6f, 0x6e, 0x2f, 0x6a, 0x73, 0x6f, 0x6e, 0x7b, 0x27, 0x66, 0x6f,
        0x6f, 0x27, 0x3a, 0x27, 0x62, 0x61, 0x72, 0x27, 0x7d, 0x8d, 0x9c, 0x08, 0xb1,
    ]
    static let corruptedHeaderLength: [UInt8] = [
        0x00, 0x00, 0x00, 0x3d, 0xff, 0x00, 0x01, 0x02, 0x07, 0xfd, 0x83, 0x96, 0x0c, 0x63, 0x6f, 0x6e,
        0x74, 0x65, 0x6e, 0x74, 0x2d, 0x74, 0x79, 0x70, 0x65, 0x07, 0x00, 0x10, 0x61, 0x70, 0x70, 0x6c,
        0x69, 0x63, 0x61, 0x74, 0x69, 0x6f, 0x6e, 0x2f, 0x6a, 0x73, 0x6f, 0x6e, 0x7b, 0x27, 0x66, 0x6f,
        0x6f, 0x27, 0x3a, 0x27, 0x62, 0x61, 0x72, 0x27, 0x7d, 0x8d, 0x9c, 0x08, 0xb1,
    ]
    static let duplicateHeader: [UInt8] = [
        0x00, 0x00, 0x00, 0x24, 0x00, 0x00, 0x00, 0x14, 0x4b, 0xb9, 0x82, 0xd0, 0x04, 0x74, 0x65, 0x73,
        0x74, 0x04, 0x61, 0x73, 0x64, 0x66, 0x04, 0x74, 0x65, 0x73, 0x74, 0x04, 0x61, 0x73, 0x64, 0x66,
        0xf3, 0xf4, 0x75, 0x63,
    ]
}

struct DecodingCase: Sendable, CustomTestStringConvertible {
    let name: String
    let bytes: [UInt8]
    let headers: [EventStreamHeader]
    let payload: [UInt8]
    var testDescription: String { name }
}

@Suite struct EventStreamTests {
    static let published: [DecodingCase] = [
        DecodingCase(name: "empty message", bytes: PublishedFrames.emptyMessage, headers: [], payload: []),
        DecodingCase(name: "int8 header", bytes: PublishedFrames.int8Header, headers: [.init("byte", .byte(-1))], payload: []),
        DecodingCase(name: "int16 header", bytes: PublishedFrames.int16Header, headers: [.init("short", .short(-1))], payload: []),
        DecodingCase(name: "int32 header", bytes: PublishedFrames.int32Header, headers: [.init("integer", .integer(-1))], payload: []),
        DecodingCase(name: "int64 header", bytes: PublishedFrames.int64Header, headers: [.init("long", .long(-1))], payload: []),
        DecodingCase(name: "payload, no headers", bytes: PublishedFrames.payloadNoHeaders, headers: [], payload: Array("{'foo':'bar'}".utf8)),
        DecodingCase(name: "payload, one string header", bytes: PublishedFrames.payloadOneStrHeader,
                     headers: [.init("content-type", .string("application/json"))], payload: Array("{'foo':'bar'}".utf8)),
        DecodingCase(name: "all header types", bytes: PublishedFrames.allHeaderTypes, headers: [
            .init("0", .bool(true)), .init("1", .bool(false)), .init("2", .byte(2)), .init("3", .short(3)), .init("4", .integer(4)),
            .init("5", .long(5)), .init("6", .byteArray(Array("bytes".utf8))), .init("7", .string("utf8")), .init("8", .timestamp(8)),
            .init("9", .uuid(Array("0123456789abcdef".utf8))),
        ], payload: []),
        DecodingCase(name: "error message", bytes: PublishedFrames.errorMessage, headers: [
            .init(":message-type", .string("error")), .init(":error-code", .string("code")), .init(":error-message", .string("message")),
        ], payload: []),
    ]

    @Test(arguments: published) func publishedFramesDecodeWholeAndByteByByte(_ frame: DecodingCase) throws {
        let expected = EventStreamMessage(headers: frame.headers, payload: frame.payload)
        var whole = EventStreamDecoder()
        #expect(try feed(&whole, frame.bytes) == [expected])
        #expect(!whole.hasPartialMessage)
        var single = EventStreamDecoder()
        var messages: [EventStreamMessage] = []
        for (index, byte) in frame.bytes.enumerated() {
            messages += try feed(&single, [byte])
            #expect(single.hasPartialMessage == (index < frame.bytes.count - 1))
        }
        #expect(messages == [expected])
        // The encoder writes the very same bytes.
        #expect(encodeEventStreamMessage(headers: frame.headers, payload: frame.payload) == frame.bytes)
    }

    @Test func allPublishedFramesInOneFeed() throws {
        var decoder = EventStreamDecoder()
        let messages = try feed(&decoder, Self.published.flatMap(\.bytes))
        #expect(messages == Self.published.map { EventStreamMessage(headers: $0.headers, payload: $0.payload) })
        #expect(messages.last?.stringHeader(":message-type") == "error")
        #expect(messages.last?.stringHeader(":absent") == nil)
        #expect(messages[1].stringHeader("byte") == nil)  // not a string header
    }

    @Test func publishedCorruptionsAreRejected() {
        // A changed length or headers length breaks the prelude CRC, which is checked first.
        expectError(PublishedFrames.corruptedLength, .preludeChecksumMismatch(expected: 0xfd52_8c5a, computed: crc32(Array(PublishedFrames.corruptedLength[0..<8]))))
        expectError(PublishedFrames.corruptedHeaderLength,
                    .preludeChecksumMismatch(expected: 0x07fd_8396, computed: crc32(Array(PublishedFrames.corruptedHeaderLength[0..<8]))))
        expectError(PublishedFrames.corruptedPayload,
                    .messageChecksumMismatch(expected: 0xc365_3936, computed: crc32(Array(PublishedFrames.corruptedPayload.dropLast(4)))))
        expectError(PublishedFrames.corruptedHeaders,
                    .messageChecksumMismatch(expected: 0x8d9c_08b1, computed: crc32(Array(PublishedFrames.corruptedHeaders.dropLast(4)))))
        expectError(PublishedFrames.duplicateHeader, .duplicateHeader("test"))
    }

    /// The standard CRC-32 check value, and zlib's continuation property.
    @Test func crc32MatchesZlib() {
        #expect(crc32(Array("123456789".utf8)) == 0xCBF4_3926)
        #expect(crc32([]) == 0)
        let bytes = Array("The quick brown fox jumps over the lazy dog".utf8)
        #expect(crc32(bytes) == 0x414F_A339)
        #expect(crc32(Array(bytes[10...]), continuing: crc32(Array(bytes[..<10]))) == 0x414F_A339)
    }

    @Test func randomMessagesSurviveARoundTripInRandomPieces() throws {
        var generator = SystemRandomNumberGenerator()
        let values: [EventStreamHeaderValue] = [
            .bool(true), .bool(false), .byte(-128), .short(.min), .integer(.max), .long(.min), .byteArray([]), .byteArray([0, 255]),
            .string(""), .string("é ü 漢字 🙂"), .timestamp(1_700_000_000_000), .uuid(Array(0..<16)),
        ]
        var messages: [EventStreamMessage] = []
        var stream: [UInt8] = []
        for index in 0..<40 {
            let headers = (0..<Int.random(in: 0...6, using: &generator)).map { n in
                EventStreamHeader("h\(index)-\(n)", values.randomElement(using: &generator)!)
            }
            let payload = (0..<Int.random(in: 0...300, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            messages.append(EventStreamMessage(headers: headers, payload: payload))
            stream += encodeEventStreamMessage(headers: headers, payload: payload)
        }
        var decoder = EventStreamDecoder()
        var decoded: [EventStreamMessage] = []
        var offset = 0
        while offset < stream.count {
            let end = min(stream.count, offset + Int.random(in: 1...700, using: &generator))
            decoded += try feed(&decoder, Array(stream[offset..<end]))
            offset = end
        }
        #expect(decoded == messages)
        #expect(!decoder.hasPartialMessage)
    }

    @Test func twoMessagesInOneFeedAndOneStraddlingTheNext() throws {
        let first = encodeEventStreamMessage(headers: [.init(":event-type", .string("chunk"))], payload: Array("one".utf8))
        let second = encodeEventStreamMessage(headers: [], payload: Array("two".utf8))
        let third = encodeEventStreamMessage(headers: [.init("n", .integer(3))], payload: Array("three".utf8))
        var decoder = EventStreamDecoder()
        let cut = first.count + second.count + 5
        let stream = first + second + third
        #expect(try feed(&decoder, Array(stream[..<cut])).map(\.payload) == [Array("one".utf8), Array("two".utf8)])
        #expect(decoder.hasPartialMessage)
        #expect(try feed(&decoder, Array(stream[cut...])).map(\.payload) == [Array("three".utf8)])
        #expect(!decoder.hasPartialMessage)
        #expect(try feed(&decoder, []) == [])
    }

    @Test func aVisitorCanStopTheStream() throws {
        let stream = PublishedFrames.payloadNoHeaders + PublishedFrames.errorMessage + [0xde, 0xad] + PublishedFrames.emptyMessage
        var decoder = EventStreamDecoder()
        var seen: [EventStreamMessage] = []
        try feed(&decoder, stream) { message in
            seen.append(message)
            return message.stringHeader(":message-type") != "error"
        }
        #expect(seen.map(\.payload) == [Array("{'foo':'bar'}".utf8), []])
        #expect(!decoder.hasPartialMessage)
        // Stopped for good: later bytes, even broken ones, are ignored.
        #expect(try feed(&decoder, [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]) == [])
        // Stopping on a message that straddled two pieces drops what followed it.
        var straddled = EventStreamDecoder()
        #expect(try feed(&straddled, Array(PublishedFrames.errorMessage.prefix(30))) == [])
        var count = 0
        try feed(&straddled, Array(PublishedFrames.errorMessage.dropFirst(30)) + PublishedFrames.emptyMessage) { _ in
            count += 1
            return false
        }
        #expect(count == 1 && !straddled.hasPartialMessage)
    }

    @Test func aTruncatedFrameYieldsNothingAndIsReportedPartial() throws {
        let frame = encodeEventStreamMessage(headers: [.init("a", .string("b"))], payload: Array("payload".utf8))
        for length in [1, 11, 12, 13, frame.count - 1] {
            var decoder = EventStreamDecoder()
            #expect(try feed(&decoder, Array(frame[..<length])) == [])
            #expect(decoder.hasPartialMessage)
            #expect(try feed(&decoder, Array(frame[length...])).count == 1)
            #expect(!decoder.hasPartialMessage)
        }
    }

    @Test func anOversizedLengthFailsAsSoonAsThePreludeIsThere() throws {
        let prelude = preludeBytes(total: 0x8000_0000, headersLength: 0)
        var decoder = EventStreamDecoder(maxMessageBytes: 4096)
        #expect(try feed(&decoder, Array(prelude[..<11])) == [])
        #expect(throws: EventStreamError.messageTooLong(totalLength: 0x8000_0000, limit: 4096)) { try feed(&decoder, [prelude[11]]) }
        // The stream is out of step for good.
        #expect(throws: EventStreamError.messageTooLong(totalLength: 0x8000_0000, limit: 4096)) {
            try feed(&decoder, PublishedFrames.emptyMessage)
        }
        #expect(!decoder.hasPartialMessage)
        // Just over the limit, arriving whole.
        expectError(preludeBytes(total: 1 << 20 + 1, headersLength: 0), .messageTooLong(totalLength: 1 << 20 + 1, limit: 1 << 20))
    }

    @Test func lengthsThatCannotHoldTheFrameAreRejected() {
        expectError(preludeBytes(total: 15, headersLength: 0), .messageTooShort(totalLength: 15))
        expectError(preludeBytes(total: 0, headersLength: 0), .messageTooShort(totalLength: 0))
        expectError(preludeBytes(total: 20, headersLength: 5), .headersTooLong(headersLength: 5, totalLength: 20))
        expectError(preludeBytes(total: 16, headersLength: 0xffff_ffff), .headersTooLong(headersLength: 0xffff_ffff, totalLength: 16))
    }

    @Test func badChecksumsAreRejected() {
        var frame = encodeEventStreamMessage(headers: [.init("a", .bool(true))], payload: [1, 2, 3])
        frame[9] ^= 0x01
        expectError(frame, .preludeChecksumMismatch(expected: crc32(Array(frame[0..<8])) ^ 0x0001_0000, computed: crc32(Array(frame[0..<8]))))
        frame[9] ^= 0x01
        frame[frame.count - 5] ^= 0x80  // the payload's last byte
        expectError(frame, .messageChecksumMismatch(expected: bigEndian(frame.suffix(4)), computed: crc32(Array(frame.dropLast(4)))))
    }

    @Test func malformedHeadersAreRejected() {
        // A name that claims 10 bytes where the section has 3.
        expectError(frameWithHeaderSection([10, 0x61, 0x62, 0x63]), .headerPastSection(offset: 0))
        // A string value longer than what is left, in the second header.
        expectError(frameWithHeaderSection([1, 0x61, 0, 1, 0x62, 7, 0, 9, 0x78]), .headerPastSection(offset: 3))
        // Fixed-size values cut short, and a type with no value bytes at all.
        expectError(frameWithHeaderSection([1, 0x61, 4, 0, 0]), .headerPastSection(offset: 0))
        expectError(frameWithHeaderSection([1, 0x61, 9] + [UInt8](repeating: 0, count: 15)), .headerPastSection(offset: 0))
        expectError(frameWithHeaderSection([1, 0x61]), .headerPastSection(offset: 0))
        expectError(frameWithHeaderSection([1, 0x61, 10]), .unknownHeaderType(10, header: "a"))
        expectError(frameWithHeaderSection([2, 0xc3, 0x28, 0]), .invalidUTF8(what: "header name at byte 0 of the headers section"))
        expectError(frameWithHeaderSection([1, 0x61, 7, 0, 2, 0xed, 0xa0]), .invalidUTF8(what: "value of header \"a\""))
        // The same bytes as a byte array are fine.
        var decoder = EventStreamDecoder()
        #expect((try? feed(&decoder, frameWithHeaderSection([1, 0x61, 6, 0, 2, 0xed, 0xa0]))) == [
            EventStreamMessage(headers: [.init("a", .byteArray([0xed, 0xa0]))], payload: [0x70]),
        ])
    }

    @Test func manyHeadersAreCheckedForDuplicatesToo() {
        let headers = (0..<40).map { EventStreamHeader("h\($0)", .bool(true)) }
        var decoder = EventStreamDecoder()
        #expect((try? feed(&decoder, encodeEventStreamMessage(headers: headers, payload: []))).map { $0.first?.headers.count } == 40)
        expectError(encodeEventStreamMessage(headers: headers + [.init("h3", .bool(false))], payload: []), .duplicateHeader("h3"))
    }

    @Test func errorsReadClearly() {
        #expect("\(EventStreamError.preludeChecksumMismatch(expected: 0xab, computed: 0x1234_5678))"
            == "event-stream prelude CRC mismatch: frame says 0x000000ab, bytes give 0x12345678")
        #expect("\(EventStreamError.messageTooLong(totalLength: 2_000_000, limit: 1_048_576))"
            == "event-stream message length 2000000 exceeds the 1048576-byte limit")
        #expect("\(EventStreamError.unknownHeaderType(12, header: ":x"))" == "event-stream header \":x\" has unknown type 12")
    }
}

func feed(_ decoder: inout EventStreamDecoder, _ bytes: [UInt8]) throws(EventStreamError) -> [EventStreamMessage] {
    try bytes.withUnsafeBytes { bytes in Result { () throws(EventStreamError) in try decoder.feed(bytes) } }.get()
}

func feed(_ decoder: inout EventStreamDecoder, _ bytes: [UInt8], each body: (EventStreamMessage) -> Bool) throws(EventStreamError) {
    try bytes.withUnsafeBytes { bytes in Result { () throws(EventStreamError) in try decoder.feed(bytes, each: body) } }.get()
}

/// Fed whole to a fresh decoder, `bytes` raise exactly `error`.
private func expectError(_ bytes: [UInt8], _ error: EventStreamError, sourceLocation: SourceLocation = #_sourceLocation) {
    var decoder = EventStreamDecoder()
    #expect(throws: error, sourceLocation: sourceLocation) { try feed(&decoder, bytes) }
}

/// A 12-byte prelude with a correct CRC for whatever lengths it declares.
private func preludeBytes(total: UInt32, headersLength: UInt32) -> [UInt8] {
    var bytes = bigEndianBytes(total) + bigEndianBytes(headersLength)
    bytes += bigEndianBytes(crc32(bytes))
    return bytes
}

/// A frame with correct lengths and CRCs around a headers section of any bytes, payload "p".
private func frameWithHeaderSection(_ section: [UInt8]) -> [UInt8] {
    var frame = preludeBytes(total: UInt32(16 + section.count + 1), headersLength: UInt32(section.count)) + section + [0x70]
    frame += bigEndianBytes(crc32(frame))
    return frame
}

private func bigEndianBytes(_ value: UInt32) -> [UInt8] {
    [UInt8(value >> 24), UInt8(value >> 16 & 0xff), UInt8(value >> 8 & 0xff), UInt8(value & 0xff)]
}

private func bigEndian(_ bytes: some Collection<UInt8>) -> UInt32 {
    bytes.reduce(0) { $0 << 8 | UInt32($1) }
}
