import COpenSSL

/// SHA-256 of `bytes` (OpenSSL's one-shot, no allocation beyond the result).
public func sha256(_ bytes: [UInt8]) -> [UInt8] { oneShot(bytes, length: 32, SHA256) }

/// SHA-384 of `bytes`.
public func sha384(_ bytes: [UInt8]) -> [UInt8] { oneShot(bytes, length: 48, SHA384) }

private func oneShot(_ bytes: [UInt8], length: Int,
                     _ digest: (UnsafePointer<UInt8>?, Int, UnsafeMutablePointer<UInt8>?) -> UnsafeMutablePointer<UInt8>?) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: length)
    bytes.withUnsafeBufferPointer { input in
        out.withUnsafeMutableBufferPointer { output in _ = digest(input.baseAddress, input.count, output.baseAddress) }
    }
    return out
}

/// SHA-256 of the concatenation of `parts`, without building the concatenation.
public func sha256(_ parts: [UInt8]...) -> [UInt8] {
    sha256Parts(parts)
}

public func sha256Parts(_ parts: [[UInt8]]) -> [UInt8] {
    // Concatenating the few short parts and hashing once beats an EVP_MD_CTX round trip.
    var joined: [UInt8] = []
    joined.reserveCapacity(parts.reduce(0) { $0 + $1.count })
    for part in parts { joined.append(contentsOf: part) }
    return sha256(joined)
}

/// Cryptographically secure random bytes from OpenSSL's DRBG. Traps only if the DRBG itself
/// cannot be seeded, when continuing would hand out predictable secrets.
public func secureRandomBytes(_ count: Int) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: count)
    let ok = out.withUnsafeMutableBufferPointer { RAND_bytes($0.baseAddress, Int32($0.count)) }
    precondition(ok == 1, "OpenSSL RAND_bytes failed: no secure randomness available")
    return out
}

/// Compares two byte strings in time that depends only on their lengths.
public func constantTimeEquals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    guard a.count == b.count else { return false }
    return a.withUnsafeBufferPointer { pa in
        b.withUnsafeBufferPointer { pb in CRYPTO_memcmp(pa.baseAddress, pb.baseAddress, pa.count) == 0 }
    }
}

/// The most recent OpenSSL error as text, for diagnostics (and clears the queue).
func openSSLErrorText() -> String {
    let code = ERR_get_error()
    ERR_clear_error()
    guard code != 0 else { return "no OpenSSL error queued" }
    var buffer = [CChar](repeating: 0, count: 256)
    ERR_error_string_n(code, &buffer, buffer.count)
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
