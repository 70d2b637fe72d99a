// No imports: the event-stream fuzzer compiles this file with the Bedrock translator.

/// Standard base64 in (Bedrock's chunk bytes), base64url without padding out (JWTs). Kept here
/// rather than taken from AttestWire so that the target needs only OpenSSL and AttestCrypto.
enum CloudBase64 {
    private static let standardAlphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let urlAlphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Six-bit values of the standard alphabet; 0xff for every other byte.
    private static let standardValues: [UInt8] = {
        var values = [UInt8](repeating: 0xff, count: 256)
        for (value, symbol) in standardAlphabet.enumerated() { values[Int(symbol)] = UInt8(value) }
        return values
    }()

    /// Decodes standard base64, padded or not. Nil for any other byte, misplaced padding, or
    /// unused bits that are not zero (a spelling no encoder produces).
    static func decode(_ text: [UInt8]) -> [UInt8]? {
        var length = text.count
        if length % 4 == 0, length >= 4 {
            if text[length - 1] == UInt8(ascii: "=") { length -= 1 }
            if text[length - 1] == UInt8(ascii: "=") { length -= 1 }
        }
        guard length % 4 != 1 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(length * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        for index in 0..<length {
            let value = standardValues[Int(text[index])]
            guard value != 0xff else { return nil }
            accumulator = accumulator << 6 | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
                accumulator &= (1 << UInt32(bits)) - 1
            }
        }
        return accumulator == 0 ? out : nil
    }

    static func encodeURL(_ bytes: [UInt8]) -> String {
        encodeURL(bytes[...])
    }

    /// Base64url without padding (RFC 7515's encoding for JWS).
    static func encodeURL(_ bytes: ArraySlice<UInt8>) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var index = bytes.startIndex
        while index < bytes.endIndex {
            let count = min(3, bytes.endIndex - index)
            var group: UInt32 = 0
            for offset in 0..<3 { group = group << 8 | (offset < count ? UInt32(bytes[index + offset]) : 0) }
            for symbol in 0..<(count + 1) { out.append(urlAlphabet[Int(group >> UInt32(18 - 6 * symbol) & 0x3f)]) }
            index += count
        }
        return String(decoding: out, as: UTF8.self)
    }
}
