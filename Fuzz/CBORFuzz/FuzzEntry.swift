// libFuzzer entry point for the CBOR decoder (`make fuzz`). Built by swiftc with
// -sanitize=fuzzer,address straight from Sources/CBOR, so it fuzzes the shipped code.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCBOR(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    guard let value = try? CBORDecoder.decode(bytes) else { return 0 }
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
