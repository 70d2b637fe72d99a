import CMicroHTTPD
import EventLoops
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// Helpers for the callbacks: queueing answers, header validity, ASCII case, the request target.

// MARK: - Helpers for the callbacks

let internalError = HTTPResponse(
    status: 500, headers: [(name: "content-type", value: "text/plain")],
    body: Array("internal server error\n".utf8))

let serviceUnavailable = HTTPResponse(
    status: 503, headers: [(name: "content-type", value: "text/plain"), (name: "connection", value: "close")],
    body: Array("server stopping\n".utf8))

/// Queues `response`; if libmicrohttpd rejects it (bad status, bad header), queues a 500.
func queue(_ response: HTTPResponse, on connection: OpaquePointer, close: Bool) -> MHD_Result {
    if enqueue(response, on: connection, close: close) { return .YES }
    // Returning MHD_NO makes libmicrohttpd close the connection: the last resort.
    return enqueue(internalError, on: connection, close: close) ? .YES : .NO
}

func enqueue(_ response: HTTPResponse, on connection: OpaquePointer, close: Bool) -> Bool {
    guard (100...999).contains(response.status) else { return false }
    let created = response.body.withUnsafeBytes { bytes in
        MHD_create_response_from_buffer(bytes.count, UnsafeMutableRawPointer(mutating: bytes.baseAddress),
                                        .RESPMEM_MUST_COPY)
    }
    guard let mhdResponse = created else { return false }
    defer { MHD_destroy_response(mhdResponse) }  // MHD keeps its own reference once queued

    for (name, value) in response.headers {
        // MHD derives content-length from the body; it refuses a second one.
        if asciiCaseInsensitiveEquals(name, "content-length") { continue }
        if close, asciiCaseInsensitiveEquals(name, "connection") { continue }
        // withCString: a short Swift string passed as a C pointer would be copied to the heap.
        guard isValidHeader(name: name, value: value),
              name.withCString({ n in value.withCString { MHD_add_response_header(mhdResponse, n, $0) } }) == .YES else { return false }
    }
    if close, MHD_add_response_header(mhdResponse, "Connection", "close") != .YES { return false }
    return MHD_queue_response(connection, UInt32(response.status), mhdResponse) == .YES
}

/// Header names must be tokens and values must not contain CR, LF or NUL (which would
/// also be silently truncated on the way to C).
func isValidHeader(name: String, value: String) -> Bool {
    guard !name.isEmpty, name.utf8.allSatisfy(isTokenByte) else { return false }
    return !value.utf8.contains { $0 == 0 || $0 == 10 || $0 == 13 }
}

/// RFC 9110 tchar.
func isTokenByte(_ byte: UInt8) -> Bool {
    switch byte {
    case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
        return true
    case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
         UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
         UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
        return true
    default:
        return false
    }
}

func asciiCaseInsensitiveEquals(_ a: String, _ b: StaticString) -> Bool {
    let lhs = a.utf8
    guard lhs.count == b.utf8CodeUnitCount else { return false }
    return b.withUTF8Buffer { rhs in
        zip(lhs, rhs).allSatisfy { asciiLowercased($0) == asciiLowercased($1) }
    }
}

func asciiLowercased(_ byte: UInt8) -> UInt8 {
    (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z")) ? byte | 0x20 : byte
}

func trimmed(_ text: String) -> String {
    let bytes = Array(text.utf8)
    var start = 0, end = bytes.count
    while start < end, bytes[start] == 32 || bytes[start] == 9 || bytes[start] == 10 || bytes[start] == 13 { start += 1 }
    while end > start, bytes[end - 1] == 32 || bytes[end - 1] == 9 || bytes[end - 1] == 10 || bytes[end - 1] == 13 { end -= 1 }
    return String(decoding: bytes[start..<end], as: UTF8.self)
}

/// The path and query of a request target: origin form (`/p?q`) or absolute form
/// (`http://host/p?q`, whose scheme and authority are dropped). Byte by byte: the delimiters
/// are ASCII, and walking Characters cost 1% of a relayed request.
func splitTarget(_ target: String) -> (path: String, query: String?) {
    let bytes = target.utf8
    var start = bytes.startIndex
    if bytes.first != UInt8(ascii: "/"), let scheme = target.firstRange(of: "://") {
        guard let next = bytes[scheme.upperBound...].firstIndex(where: { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") }) else {
            return ("/", nil)
        }
        if bytes[next] == UInt8(ascii: "?") { return ("/", String(target[bytes.index(after: next)...])) }
        start = next
    }
    guard let mark = bytes[start...].firstIndex(of: UInt8(ascii: "?")) else { return (String(target[start...]), nil) }
    return (String(target[start..<mark]), String(target[bytes.index(after: mark)...]))
}

/// The request's headers, names lowercased. Sized up front from MHD's count, and each name
/// lowercased while it is copied: growing the array and lowercasing a copy were a quarter of
/// the allocations the server made per request.
func requestHeaders(_ connection: OpaquePointer) -> [(name: String, value: String)] {
    var headers: [(name: String, value: String)] = []
    headers.reserveCapacity(Int(max(0, MHD_get_connection_values(connection, .HEADER_KIND, nil, nil))))
    withUnsafeMutablePointer(to: &headers) { target in
        _ = MHD_get_connection_values(connection, .HEADER_KIND, { cls, _, key, value in
            guard let cls, let key else { return .YES }
            let length = strlen(key)
            let name = String(unsafeUninitializedCapacity: length) { out in
                for index in 0..<length { out[index] = asciiLowercased(UInt8(bitPattern: key[index])) }
                return length
            }
            cls.assumingMemoryBound(to: [(name: String, value: String)].self).pointee
                .append((name: name, value: value.map { String(cString: $0) } ?? ""))
            return .YES
        }, UnsafeMutableRawPointer(target))
    }
    return headers
}

func clientAddress(_ connection: OpaquePointer) -> String {
    attest_mhd_client_address(connection).flatMap(IPAddress.init)?.description ?? ""
}
