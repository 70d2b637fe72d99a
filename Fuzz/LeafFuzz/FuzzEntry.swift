// libFuzzer entry point for the strict credential-certificate parser (`make fuzz-leaf`), built
// with swiftc from Sources/AttestCrypto. Whatever parses must also survive the end-entity checks.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzLeafCertificate(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    guard let leaf = try? LeafCertificate(der: bytes) else { return 0 }
    _ = try? leaf.checkEndEntityExtensions()
    _ = leaf.extensionValue(oid: "1.2.840.113635.100.8.2")
    if leaf.notAfter < leaf.notBefore && leaf.publicKeyIsP256 { _ = leaf.publicKeyPoint.count }
    return 0
}
