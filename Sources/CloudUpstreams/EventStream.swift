// AWS event-stream framing (application/vnd.amazon.eventstream), as Bedrock streams responses.
// No imports: the event-stream fuzzer compiles this file on its own with CRC32.swift.
//
// A message: total length (u32 BE), headers length (u32 BE), CRC-32 of those 8 bytes (u32 BE),
// the headers, the payload, and a CRC-32 of everything before it (u32 BE).

/// One header's value, by its wire type.
public enum EventStreamHeaderValue: Equatable, Sendable {
    case bool(Bool)  // types 0 (true) and 1 (false)
    case byte(Int8)  // 2
    case short(Int16)  // 3
    case integer(Int32)  // 4
    case long(Int64)  // 5
    case byteArray([UInt8])  // 6: u16 length, bytes
    case string(String)  // 7: u16 length, UTF-8
    case timestamp(Int64)  // 8: milliseconds since the epoch
    case uuid([UInt8])  // 9: 16 bytes
}

public struct EventStreamHeader: Equatable, Sendable {
    public var name: String
    public var value: EventStreamHeaderValue

    public init(_ name: String, _ value: EventStreamHeaderValue) {
        self.name = name
        self.value = value
    }
}

public struct EventStreamMessage: Equatable, Sendable {
    /// In wire order; names are unique (the decoder refuses duplicates).
    public var headers: [EventStreamHeader]
    public var payload: [UInt8]

    public init(headers: [EventStreamHeader], payload: [UInt8]) {
        self.headers = headers
        self.payload = payload
    }

    public func header(_ name: String) -> EventStreamHeaderValue? {
        headers.first { $0.name == name }?.value
    }

    /// The value of a string header (`:message-type`, `:event-type`, `:exception-type`), or nil
    /// when absent or of another type.
    public func stringHeader(_ name: String) -> String? {
        if case .string(let value) = header(name) { return value }
        return nil
    }
}

public enum EventStreamError: Error, Equatable, Sendable, CustomStringConvertible {
    case preludeChecksumMismatch(expected: UInt32, computed: UInt32)
    case messageChecksumMismatch(expected: UInt32, computed: UInt32)
    case messageTooShort(totalLength: UInt32)
    case messageTooLong(totalLength: UInt32, limit: Int)
    case headersTooLong(headersLength: UInt32, totalLength: UInt32)
    /// A header's name or value runs past the end of the headers section.
    case headerPastSection(offset: Int)
    case unknownHeaderType(UInt8, header: String)
    /// `what` names the field: a header name, or a named header's string value.
    case invalidUTF8(what: String)
    case duplicateHeader(String)

    public var description: String {
        switch self {
        case .preludeChecksumMismatch(let expected, let computed):
            "event-stream prelude CRC mismatch: frame says \(hex(expected)), bytes give \(hex(computed))"
        case .messageChecksumMismatch(let expected, let computed):
            "event-stream message CRC mismatch: frame says \(hex(expected)), bytes give \(hex(computed))"
        case .messageTooShort(let total):
            "event-stream message length \(total) is below the 16-byte minimum"
        case .messageTooLong(let total, let limit):
            "event-stream message length \(total) exceeds the \(limit)-byte limit"
        case .headersTooLong(let headers, let total):
            "event-stream headers length \(headers) does not fit in a \(total)-byte message"
        case .headerPastSection(let offset):
            "event-stream header at byte \(offset) of the headers section runs past its end"
        case .unknownHeaderType(let type, let header):
            "event-stream header \"\(header)\" has unknown type \(type)"
        case .invalidUTF8(let what):
            "event-stream \(what) is not valid UTF-8"
        case .duplicateHeader(let name):
            "event-stream message repeats header \"\(name)\""
        }
    }
}

private func hex(_ value: UInt32) -> String {
    let digits = String(value, radix: 16)
    return "0x" + String(repeating: "0", count: 8 - digits.count) + digits
}

/// Decodes messages from bytes that arrive in pieces of any size. After an error the stream is
/// out of step for good: every later `feed` throws the same error.
public struct EventStreamDecoder: Sendable {
    public let maxMessageBytes: Int
    /// The start of a message whose end has not arrived yet.
    private var pending: [UInt8] = []
    /// The length its prelude declared, once the prelude is there and checked.
    private var pendingTotal: Int?
    private var failure: EventStreamError?
    /// Set when a visitor asked for no more messages.
    private var stopped = false

    public init(maxMessageBytes: Int = 1 << 20) {
        precondition(maxMessageBytes >= 16 && maxMessageBytes <= Int(UInt32.max), "maxMessageBytes must be 16...UInt32.max")
        self.maxMessageBytes = maxMessageBytes
    }

    /// Whether bytes of an unfinished message are held: at the end of a stream, a truncated frame.
    public var hasPartialMessage: Bool { !pending.isEmpty }

    /// Every message that the bytes so far complete, in order.
    public mutating func feed(_ bytes: UnsafeRawBufferPointer) throws(EventStreamError) -> [EventStreamMessage] {
        var messages: [EventStreamMessage] = []
        try feed(bytes) { message in
            messages.append(message)
            return true
        }
        return messages
    }

    /// Hands each message to `body` as soon as it is decoded, so that a consumer can stop at a
    /// message that ends the stream before the bytes after it are checked. When `body` returns
    /// false the decoder stops for good: the rest of these bytes and all later ones are ignored.
    public mutating func feed(_ bytes: UnsafeRawBufferPointer, each body: (EventStreamMessage) -> Bool) throws(EventStreamError) {
        if let failure { throw failure }
        guard !stopped else { return }
        do {
            try decode(bytes, body)
        } catch {
            failure = error
            pending = []
            pendingTotal = nil
            throw error
        }
    }

    private mutating func decode(_ bytes: UnsafeRawBufferPointer, _ body: (EventStreamMessage) -> Bool) throws(EventStreamError) {
        var offset = 0
        if !pending.isEmpty {
            if pendingTotal == nil {
                offset = min(12 - pending.count, bytes.count)
                pending.append(contentsOf: bytes[0..<offset])
                guard pending.count == 12 else { return }
                pendingTotal = try withBytes(of: pending) { prelude throws(EventStreamError) in try checkPrelude(prelude) }
            }
            let total = pendingTotal!
            let take = min(total - pending.count, bytes.count - offset)
            pending.append(contentsOf: bytes[offset..<offset + take])
            offset += take
            guard pending.count == total else { return }
            let message = try withBytes(of: pending) { frame throws(EventStreamError) in try decodeMessage(frame) }
            // Keep a small buffer for the next straddling message, not a 1 MiB one.
            pending.removeAll(keepingCapacity: pending.capacity <= 64 * 1024)
            pendingTotal = nil
            guard body(message) else { return stop() }
        }
        // Whole messages straight from the input, without copying them first.
        while bytes.count - offset >= 12 {
            let rest = UnsafeRawBufferPointer(rebasing: bytes[offset...])
            let total = try checkPrelude(rest)
            guard rest.count >= total else {
                pendingTotal = total
                break
            }
            let message = try decodeMessage(UnsafeRawBufferPointer(rebasing: rest[0..<total]))
            offset += total
            guard body(message) else { return stop() }
        }
        if offset < bytes.count { pending.append(contentsOf: bytes[offset...]) }
    }

    private mutating func stop() {
        stopped = true
        pending = []
        pendingTotal = nil
    }

    /// Checks the 12-byte prelude at the start of `bytes` and returns the message's total length.
    private func checkPrelude(_ bytes: UnsafeRawBufferPointer) throws(EventStreamError) -> Int {
        let total = bigEndianUInt32(bytes, at: 0)
        let headersLength = bigEndianUInt32(bytes, at: 4)
        let expected = bigEndianUInt32(bytes, at: 8)
        // The CRC first: a corrupt length would otherwise read as a length error.
        let computed = crc32(UnsafeRawBufferPointer(rebasing: bytes[0..<8]))
        guard computed == expected else { throw .preludeChecksumMismatch(expected: expected, computed: computed) }
        guard total >= 16 else { throw .messageTooShort(totalLength: total) }
        guard total <= maxMessageBytes else { throw .messageTooLong(totalLength: total, limit: maxMessageBytes) }
        guard headersLength <= total - 16 else { throw .headersTooLong(headersLength: headersLength, totalLength: total) }
        return Int(total)
    }

    /// `frame` is one whole message whose prelude has been checked.
    private func decodeMessage(_ frame: UnsafeRawBufferPointer) throws(EventStreamError) -> EventStreamMessage {
        let total = frame.count
        let expected = bigEndianUInt32(frame, at: total - 4)
        let computed = crc32(UnsafeRawBufferPointer(rebasing: frame[0..<total - 4]))
        guard computed == expected else { throw .messageChecksumMismatch(expected: expected, computed: computed) }
        let headersEnd = 12 + Int(bigEndianUInt32(frame, at: 4))
        let headers = try decodeHeaders(UnsafeRawBufferPointer(rebasing: frame[12..<headersEnd]))
        return EventStreamMessage(headers: headers, payload: Array(frame[headersEnd..<total - 4]))
    }
}

private func decodeHeaders(_ section: UnsafeRawBufferPointer) throws(EventStreamError) -> [EventStreamHeader] {
    var headers: [EventStreamHeader] = []
    var seen: Set<String>?  // only for the rare message with many headers
    var index = 0
    while index < section.count {
        let start = index
        // Fails unless `count` more bytes of this header are inside the section.
        func need(_ count: Int) throws(EventStreamError) {
            guard section.count - index >= count else { throw .headerPastSection(offset: start) }
        }
        let nameLength = Int(section[index])
        index += 1
        try need(nameLength + 1)
        guard let name = validUTF8(UnsafeRawBufferPointer(rebasing: section[index..<index + nameLength])) else {
            throw .invalidUTF8(what: "header name at byte \(start) of the headers section")
        }
        index += nameLength
        let type = section[index]
        index += 1
        let value: EventStreamHeaderValue
        switch type {
        case 0: value = .bool(true)
        case 1: value = .bool(false)
        case 2:
            try need(1)
            value = .byte(Int8(bitPattern: section[index]))
            index += 1
        case 3:
            try need(2)
            value = .short(Int16(bitPattern: UInt16(section[index]) << 8 | UInt16(section[index + 1])))
            index += 2
        case 4:
            try need(4)
            value = .integer(Int32(bitPattern: bigEndianUInt32(section, at: index)))
            index += 4
        case 5, 8:
            try need(8)
            let raw = Int64(bitPattern: UInt64(bigEndianUInt32(section, at: index)) << 32 | UInt64(bigEndianUInt32(section, at: index + 4)))
            value = type == 5 ? .long(raw) : .timestamp(raw)
            index += 8
        case 6, 7:
            try need(2)
            let length = Int(section[index]) << 8 | Int(section[index + 1])
            index += 2
            try need(length)
            let bytes = UnsafeRawBufferPointer(rebasing: section[index..<index + length])
            if type == 6 {
                value = .byteArray(Array(bytes))
            } else {
                guard let string = validUTF8(bytes) else { throw .invalidUTF8(what: "value of header \"\(name)\"") }
                value = .string(string)
            }
            index += length
        case 9:
            try need(16)
            value = .uuid(Array(section[index..<index + 16]))
            index += 16
        default:
            throw .unknownHeaderType(type, header: name)
        }
        if headers.count < 16 {
            guard !headers.contains(where: { $0.name == name }) else { throw .duplicateHeader(name) }
        } else {
            if seen == nil { seen = Set(headers.map(\.name)) }
            guard seen!.insert(name).inserted else { throw .duplicateHeader(name) }
        }
        headers.append(EventStreamHeader(name, value))
    }
    return headers
}

/// Encodes one message; the decoder's inverse (tests, fuzz seeds, stubs). Traps on a header
/// that the format cannot carry (a name over 255 bytes, a value over 65,535, a UUID not 16 bytes).
public func encodeEventStreamMessage(headers: [EventStreamHeader], payload: [UInt8]) -> [UInt8] {
    var section: [UInt8] = []
    for header in headers {
        let name = Array(header.name.utf8)
        precondition(name.count <= 255, "event-stream header names are at most 255 bytes")
        section.append(UInt8(name.count))
        section += name
        switch header.value {
        case .bool(let value): section.append(value ? 0 : 1)
        case .byte(let value): section += [2, UInt8(bitPattern: value)]
        case .short(let value): section.append(3); appendBigEndian(value, to: &section)
        case .integer(let value): section.append(4); appendBigEndian(value, to: &section)
        case .long(let value): section.append(5); appendBigEndian(value, to: &section)
        case .byteArray(let bytes): section.append(6); appendShortArray(bytes, to: &section)
        case .string(let string): section.append(7); appendShortArray(Array(string.utf8), to: &section)
        case .timestamp(let value): section.append(8); appendBigEndian(value, to: &section)
        case .uuid(let bytes):
            precondition(bytes.count == 16, "an event-stream UUID is 16 bytes")
            section.append(9)
            section += bytes
        }
    }
    let total = 16 + section.count + payload.count
    precondition(total <= Int(UInt32.max), "event-stream message too long")
    var message: [UInt8] = []
    message.reserveCapacity(total)
    appendBigEndian(UInt32(total), to: &message)
    appendBigEndian(UInt32(section.count), to: &message)
    appendBigEndian(crc32(message), to: &message)
    message += section
    message += payload
    appendBigEndian(crc32(message), to: &message)
    return message
}

private func appendShortArray(_ bytes: [UInt8], to out: inout [UInt8]) {
    precondition(bytes.count <= 0xffff, "event-stream header values are at most 65,535 bytes")
    appendBigEndian(UInt16(bytes.count), to: &out)
    out += bytes
}

private func appendBigEndian<T: FixedWidthInteger>(_ value: T, to out: inout [UInt8]) {
    withUnsafeBytes(of: value.bigEndian) { out.append(contentsOf: $0) }
}

private func bigEndianUInt32(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> UInt32 {
    UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self))
}

/// The bytes as a String, or nil unless they are valid UTF-8 (`String(validating:)` needs macOS 15).
private func validUTF8(_ bytes: UnsafeRawBufferPointer) -> String? {
    let string = String(decoding: bytes, as: UTF8.self)
    return string.utf8.elementsEqual(bytes) ? string : nil
}

/// `body` over the array's bytes, with its typed error carried through the closure.
private func withBytes<R>(of array: [UInt8], _ body: (UnsafeRawBufferPointer) throws(EventStreamError) -> R) throws(EventStreamError) -> R {
    try array.withUnsafeBytes { bytes in Result { () throws(EventStreamError) in try body(bytes) } }.get()
}
