import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// systemd's readiness protocol (`Type=notify`): a datagram such as `READY=1` to the Unix socket
/// `$NOTIFY_SOCKET` names (a path, or `@name` in the abstract namespace). No library: it is one
/// `sendto`. Without the variable nothing is sent.
public enum SystemdNotify {
    /// Sends `state` (e.g. `READY=1`, `STOPPING=1`); false when there is no socket or it failed.
    @discardableResult
    public static func send(_ state: String, socketPath: String? = ProcessInfo.processInfo.environment["NOTIFY_SOCKET"]) -> Bool {
        guard let socketPath, !socketPath.isEmpty else { return false }
        var pathBytes = Array(socketPath.utf8)
        // An abstract socket's name starts with a NUL byte where systemd writes '@'.
        if pathBytes.first == UInt8(ascii: "@") { pathBytes[0] = 0 }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard pathBytes.count < capacity, pathBytes.first == 0 || pathBytes.first == UInt8(ascii: "/") else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: pathBytes)
        }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + pathBytes.count + (pathBytes.first == 0 ? 0 : 1))
        let bytes = Array(state.utf8)
        let sent = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sockaddrPointer in
                bytes.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), sockaddrPointer, length) }
            }
        }
        return sent == bytes.count
    }
}
