import Foundation
import CBOR
import Testing

@Suite struct CBORDecoderTests {
    @Test func decodesRFC8949AppendixAExamples() throws {
        let cases: [([UInt8], CBORValue)] = [
            ([0x00], .unsigned(0)), ([0x17], .unsigned(23)), ([0x18, 0x18], .unsigned(24)),
            ([0x19, 0x03, 0xe8], .unsigned(1000)), ([0x1b, 0, 0, 0, 0xe8, 0xd4, 0xa5, 0x10, 0], .unsigned(1_000_000_000_000)),
            ([0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], .unsigned(.max)),
            ([0x20], .int(-1)), ([0x38, 0x63], .int(-100)), ([0x3b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], .negative(.max)),
            ([0x40], .bytes([])), ([0x44, 1, 2, 3, 4], .bytes([1, 2, 3, 4])),
            ([0x60], .text("")), ([0x64, 0x49, 0x45, 0x54, 0x46], .text("IETF")), ([0x62, 0xc3, 0xbc], .text("ü")),
            ([0x83, 1, 2, 3], .array([.unsigned(1), .unsigned(2), .unsigned(3)])),
            ([0xa2, 0x61, 0x61, 0x01, 0x61, 0x62, 0x82, 0x02, 0x03],
             .map([CBORMapEntry("a", .unsigned(1)), CBORMapEntry("b", .array([.unsigned(2), .unsigned(3)]))])),
            ([0xf4], .bool(false)), ([0xf5], .bool(true)), ([0xf6], .null), ([0xf7], .undefined), ([0xf0], .simple(16)),
            ([0xf8, 0xff], .simple(255)), ([0xf9, 0x3c, 0x00], .float(1.0)), ([0xf9, 0x7b, 0xff], .float(65504.0)),
            ([0xfa, 0x47, 0xc3, 0x50, 0x00], .float(100000.0)), ([0xfb, 0x3f, 0xf1, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a], .float(1.1)),
            ([0xc1, 0x1a, 0x51, 0x4b, 0x67, 0xb0], .tagged(1, .unsigned(1_363_896_240))),
        ]
        for (bytes, expected) in cases {
            #expect(try CBORDecoder.decode(bytes) == expected, "\(bytes)")
        }
    }

    @Test func encoderUsesPreferredSerializationAndRoundTrips() throws {
        let value: CBORValue = .map([
            CBORMapEntry("fmt", "apple-appattest"),
            CBORMapEntry(.int(-7), .array([.bytes([UInt8](repeating: 7, count: 300)), .int(65_536), .int(-70_000), .null, .bool(true)])),
        ])
        let bytes = CBOREncoder.encode(value)
        #expect(try CBORDecoder.decode(bytes) == value)
        #expect(CBOREncoder.encode(.unsigned(23)) == [0x17])
        #expect(CBOREncoder.encode(.unsigned(24)) == [0x18, 0x18])
        #expect(CBOREncoder.encode(.unsigned(65_536)) == [0x1a, 0, 1, 0, 0])
    }

    @Test func truncatedInputsAreRejectedAtEveryLength() throws {
        let full = CBOREncoder.encode(.map([CBORMapEntry("a", .bytes([1, 2, 3])), CBORMapEntry("b", .array([.int(1000), "xyz"]))]))
        for length in 0..<full.count {
            #expect(throws: CBORError.self) { try CBORDecoder.decode(Array(full.prefix(length))) }
        }
    }

    @Test func trailingBytesAreRejected() {
        #expect(throws: CBORError.trailingBytes(offset: 1)) { try CBORDecoder.decode([0x01, 0x02]) }
    }

    @Test func lengthsLargerThanTheInputAllocateNothing() {
        // 2^64-1 byte string, 2^32-1 element array and map: refused before any allocation.
        #expect(throws: CBORError.lengthExceedsInput(offset: 0)) { try CBORDecoder.decode([0x5b] + [UInt8](repeating: 0xff, count: 8)) }
        #expect(throws: CBORError.lengthExceedsInput(offset: 0)) { try CBORDecoder.decode([0x9a, 0xff, 0xff, 0xff, 0xff, 0x00]) }
        #expect(throws: CBORError.lengthExceedsInput(offset: 0)) { try CBORDecoder.decode([0xba, 0xff, 0xff, 0xff, 0xff, 0x00]) }
        #expect(throws: CBORError.lengthExceedsInput(offset: 0)) { try CBORDecoder.decode([0x7a, 0x00, 0x01, 0x00, 0x00, 0x61]) }
    }

    @Test func nestingAndItemCountAreBounded() {
        let deep = [UInt8](repeating: 0x81, count: 100_000) + [0x00]
        #expect(throws: CBORError.tooDeep(limit: 16)) { try CBORDecoder.decode(deep) }
        let wide = [0x99, 0x27, 0x10] + [UInt8](repeating: 0x00, count: 10_000)
        #expect(throws: CBORError.tooManyItems(limit: 1024)) { try CBORDecoder.decode(wide) }
        #expect(throws: Never.self) { try CBORDecoder.decode(wide, limits: CBORLimits(maxDepth: 2, maxItems: 10_001)) }
    }

    @Test func duplicateKeysAreRejectedInSmallAndLargeMaps() {
        #expect(throws: CBORError.duplicateMapKey(offset: 4)) { try CBORDecoder.decode([0xa2, 0x61, 0x61, 0x01, 0x61, 0x61, 0x02]) }
        var large: [UInt8] = [0xb8, 20]
        for i in 0..<19 { large += [0x18, UInt8(30 + i), 0x00] }
        large += [0x18, 30, 0x00]
        #expect(throws: CBORError.self) { try CBORDecoder.decode(large) }
        // The same value in a longer encoding is the same key (found by the fuzzer).
        #expect(throws: CBORError.duplicateMapKey(offset: 7)) { try CBORDecoder.decode([0xa2, 0x1a, 0, 0, 0, 0, 0x00, 0x00, 0x00]) }
        // Equal-valued keys of different types are different keys.
        #expect(throws: Never.self) { try CBORDecoder.decode([0xa2, 0x01, 0x00, 0x21, 0x00]) }
    }

    @Test func indefiniteLengthsAndReservedValuesAreRefusedDeliberately() {
        #expect(throws: CBORError.indefiniteLengthNotSupported(offset: 0)) { try CBORDecoder.decode([0x5f, 0x41, 0x01, 0xff]) }
        #expect(throws: CBORError.indefiniteLengthNotSupported(offset: 0)) { try CBORDecoder.decode([0x9f, 0x01, 0xff]) }
        #expect(throws: CBORError.indefiniteLengthNotSupported(offset: 0)) { try CBORDecoder.decode([0xbf, 0xff]) }
        #expect(throws: CBORError.unexpectedBreak(offset: 0)) { try CBORDecoder.decode([0xff]) }
        #expect(throws: CBORError.reservedAdditionalInformation(offset: 0)) { try CBORDecoder.decode([0x1c]) }
        #expect(throws: CBORError.invalidSimpleValue(offset: 0)) { try CBORDecoder.decode([0xf8, 0x10]) }
        #expect(throws: CBORError.invalidUTF8(offset: 0)) { try CBORDecoder.decode([0x62, 0xc3, 0x28]) }
    }

    @Test func randomGarbageNeverCrashes() {
        // Seeded, and the seed printed, so a failure can be replayed (CBOR_TEST_SEED=…).
        let seed = ProcessInfo.processInfo.environment["CBOR_TEST_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64.max)
        print("randomGarbageNeverCrashes: CBOR_TEST_SEED=\(seed)")
        var generator = SplitMix64(seed: seed)
        for _ in 0..<20_000 {
            let length = Int.random(in: 0..<64, using: &generator)
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            _ = try? CBORDecoder.decode(bytes)
        }
    }
}

/// A small seeded generator (SplitMix64), so random inputs can be replayed from their seed.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
