// libFuzzer entry point for the CBOR decoder (`make fuzz`). Built by swiftc with
// -sanitize=fuzzer,address straight from Sources/CBOR, so it fuzzes the shipped code. Seeded
// with the real attestation and assertion objects, and the iOS 27 / macOS 27 extension maps.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCBOR(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    // The prefix decoder (the credential key inside authenticator data) agrees with the whole-item
    // decoder on the bytes it says it took, and takes everything when the whole input is one item.
    let prefix = try? CBORDecoder.decodePrefix(bytes[...])
    if let prefix {
        guard prefix.length > 0, prefix.length <= bytes.count else { fatalError("prefix length \(prefix.length) of \(bytes.count)") }
        guard let alone = try? CBORDecoder.decode(Array(bytes[..<prefix.length])) else { fatalError("the prefix alone does not decode") }
        if alone != prefix.value && !containsNaN(alone) { fatalError("the prefix decoded differently alone") }
    }
    guard let value = try? CBORDecoder.decode(bytes) else { return 0 }
    guard prefix?.length == bytes.count else { fatalError("a whole item was not taken whole by the prefix decoder") }
    // Whatever decodes must re-encode to something that decodes to the same value.
    let reencoded = CBOREncoder.encode(value)
    guard let again = try? CBORDecoder.decode(reencoded, limits: CBORLimits(maxDepth: 16, maxItems: 1024)) else {
        fatalError("re-encoded value failed to decode")
    }
    if again != value && !containsNaN(value) { fatalError("round trip changed the value") }
    return 0
}

private func containsNaN(_ value: CBORValue) -> Bool {
    switch value {
    case .float(let d): return d.isNaN
    case .array(let a): return a.contains(where: containsNaN)
    case .map(let m): return m.contains { containsNaN($0.key) || containsNaN($0.value) }
    case .tagged(_, let inner): return containsNaN(inner)
    default: return false
    }
}
