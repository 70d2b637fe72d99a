import COpenSSL
#if canImport(Glibc)
import Glibc
#endif

/// The stub's server-side TLS context (OpenSSL's SSL_CTX), shared by every connection.
final class TLSContext: @unchecked Sendable {
    // Safe: the SSL_CTX is configured once here and only read afterwards (SSL_new); OpenSSL
    // locks its shared parts internally.
    let context: OpaquePointer

    init(_ files: UpstreamStubConfiguration.TLSFiles) throws {
        guard let context = SSL_CTX_new(TLS_server_method()) else { throw StubError("SSL_CTX_new failed") }
        guard SSL_CTX_use_certificate_chain_file(context, files.certificateChainPath) == 1,
              SSL_CTX_use_PrivateKey_file(context, files.privateKeyPath, SSL_FILETYPE_PEM) == 1,
              SSL_CTX_check_private_key(context) == 1 else {
            SSL_CTX_free(context)
            throw StubError("cannot load TLS certificate \(files.certificateChainPath) and key \(files.privateKeyPath)")
        }
        self.context = context
    }

    deinit { SSL_CTX_free(context) }
}

/// A connection's byte stream: plain socket or TLS over it. Used by its connection's thread only.
protocol StubIO: AnyObject {
    var fd: Int32 { get }
    /// Bytes read (> 0), 0 at end of stream, < 0 on error or receive timeout.
    func read(into buffer: UnsafeMutableRawBufferPointer) -> Int
    func writeAll(_ bytes: UnsafeRawBufferPointer) -> Bool
    /// Decrypted bytes waiting inside the TLS layer (poll cannot see them).
    var hasBufferedInput: Bool { get }
    func finish()
}

final class PlainIO: StubIO {
    let fd: Int32
    init(fd: Int32) { self.fd = fd }

    func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        while true {
            let n = recv(fd, buffer.baseAddress, buffer.count, 0)
            if n < 0 && errno == EINTR { continue }
            return n
        }
    }

    func writeAll(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = send(fd, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            offset += n
        }
        return true
    }

    var hasBufferedInput: Bool { false }
    func finish() {}
}

final class TLSIO: StubIO {
    let fd: Int32
    private let ssl: OpaquePointer

    /// Runs the server handshake; nil when it fails (the client then sees a TLS error).
    init?(fd: Int32, context: TLSContext) {
        guard let ssl = SSL_new(context.context) else { return nil }
        self.fd = fd
        self.ssl = ssl
        guard SSL_set_fd(ssl, fd) == 1, SSL_accept(ssl) == 1 else {
            SSL_free(ssl)
            return nil
        }
    }

    func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        let n = SSL_read(ssl, buffer.baseAddress, Int32(min(buffer.count, Int(Int32.max))))
        if n > 0 { return Int(n) }
        return SSL_get_error(ssl, n) == SSL_ERROR_ZERO_RETURN ? 0 : -1
    }

    func writeAll(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = SSL_write(ssl, bytes.baseAddress! + offset, Int32(min(bytes.count - offset, 1 << 30)))
            if n <= 0 { return false }
            offset += Int(n)
        }
        return true
    }

    var hasBufferedInput: Bool { SSL_pending(ssl) > 0 }

    func finish() {
        SSL_shutdown(ssl)
        SSL_free(ssl)
    }
}
