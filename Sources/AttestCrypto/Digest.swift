import COpenSSL

/// SHA-256 of `bytes`.
public func sha256(_ bytes: [UInt8]) -> [UInt8] { oneShot(bytes, length: 32, fetchedSHA256.pointer) }

/// SHA-384 of `bytes`.
public func sha384(_ bytes: [UInt8]) -> [UInt8] { oneShot(bytes, length: 48, fetchedSHA384.pointer) }

/// SHA-512 of `bytes`.
public func sha512(_ bytes: [UInt8]) -> [UInt8] { oneShot(bytes, length: 64, fetchedSHA512.pointer) }

/// An algorithm fetched from OpenSSL's default provider once per process. OpenSSL 3's one-shot
/// `SHA256()` fetches it on every call, which was half the cost of hashing a token (every
/// relayed request hashes one).
private struct FetchedDigest: @unchecked Sendable {
    // @unchecked: an EVP_MD is immutable once fetched and OpenSSL allows sharing it across threads.
    let pointer: OpaquePointer
    init(_ name: String) {
        guard let fetched = EVP_MD_fetch(nil, name, nil) else { fatalError("OpenSSL has no \(name)") }
        pointer = fetched
    }
}
private let fetchedSHA256 = FetchedDigest("SHA256")
private let fetchedSHA384 = FetchedDigest("SHA384")
private let fetchedSHA512 = FetchedDigest("SHA512")

private func oneShot(_ bytes: [UInt8], length: Int, _ type: OpaquePointer) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: length)
    bytes.withUnsafeBufferPointer { input in
        out.withUnsafeMutableBufferPointer { output in
            // Fails only without memory: a digest of the right length is the contract here.
            guard EVP_Digest(input.baseAddress, input.count, output.baseAddress, nil, type, nil) == 1 else {
                fatalError("EVP_Digest failed")
            }
        }
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
