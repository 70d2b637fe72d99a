// libFuzzer entry point for receipts (`make fuzz-receipt`): the input's first byte picks the
// target. Even: the payload parser alone (Apple's unsorted SET of typed fields, read with the
// bounded DER reader). Odd: the whole receipt as the registration and the refresh read it, the
// CMS SignedData on OpenSSL (one signer, no trailing bytes, the chain to Apple Root CA - G3 at a
// fixed time within the 2021 samples' validity) and then the payload. Built with swiftc from the
// sources of CBOR, AttestCrypto, AttestWire and AppAttest compiled as one module.

import Foundation

let verifier = try! ReceiptVerifier.apple()
let verificationTime = Date(timeIntervalSince1970: 1_613_000_000)   // 2021-02-10

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzReceipt(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let mode = data[0]
    let input = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    if mode & 1 == 0 {
        if let receipt = try? ReceiptPayload.parse(input, der: input) {
            // What was read lies inside the input, and the texts within their bounds.
            precondition(receipt.attestedCertificate.count < input.count && receipt.appID.utf8.count <= 1024)
            precondition((receipt.clientHash?.count ?? 0) < input.count && (receipt.riskMetric ?? 0) >= 0)
        }
    } else if let receipt = try? verifier.read(input, at: verificationTime) {
        precondition(receipt.der == input)
    }
    return 0
}
