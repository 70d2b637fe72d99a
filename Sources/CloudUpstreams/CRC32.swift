// No imports: the event-stream fuzzer compiles this file on its own (`make fuzz-eventstream`).

/// CRC-32 as zlib computes it (IEEE 802.3, reflected polynomial 0xEDB88320), the checksum of AWS
/// event-stream frames. `crc32(b, continuing: crc32(a))` equals `crc32(a + b)`.
func crc32(_ bytes: UnsafeRawBufferPointer, continuing crc: UInt32 = 0) -> UInt32 {
    var value = ~crc
    crc32Table.withUnsafeBufferPointer { table in
        for byte in bytes {
            value = table[Int((value ^ UInt32(byte)) & 0xff)] ^ (value >> 8)
        }
    }
    return ~value
}

func crc32(_ bytes: [UInt8], continuing crc: UInt32 = 0) -> UInt32 {
    bytes.withUnsafeBytes { crc32($0, continuing: crc) }
}

/// One entry per low byte: the register after shifting that byte through eight rounds.
private let crc32Table: [UInt32] = (0..<256).map { index in
    var value = UInt32(index)
    for _ in 0..<8 {
        value = value & 1 == 1 ? (value >> 1) ^ 0xEDB8_8320 : value >> 1
    }
    return value
}
