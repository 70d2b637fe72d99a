import COpenSSL

/// HMAC-SHA256 of `message` under `key`, through OpenSSL's one-shot `HMAC()`: signs webhook
/// deliveries (`X-Attestd-Signature`).
public func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: 32)
    var length: UInt32 = 0
    let ok = key.withUnsafeBufferPointer { key in
        message.withUnsafeBufferPointer { message in
            out.withUnsafeMutableBufferPointer { out in
                HMAC(EVP_sha256(), key.baseAddress, Int32(key.count), message.baseAddress, message.count, out.baseAddress, &length) != nil
            }
        }
    }
    // Fails only without memory: a MAC of the right length is the contract here.
    guard ok, length == 32 else { fatalError("HMAC-SHA256 failed") }
    return out
}
