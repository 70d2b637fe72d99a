import CCurl
import EventLoops
#if canImport(Glibc)
import Glibc
#endif

/// What an easy handle keeps from one transfer to the next besides curl's own state: its error
/// buffer, and the header list it last sent with the headers that list was built from. A relay's
/// requests mostly carry the same headers, and building the list anew was 11 of a relayed
/// request's 89 mallocs. Owned by whoever holds the easy handle (the driver's spares, or the
/// transfer running on it); `free()` when the easy handle is cleaned up.
struct EasyResources {
    let errorBuffer: UnsafeMutablePointer<CChar>
    /// The list CURLOPT_HTTPHEADER points to (curl does not copy it), and what it was built from.
    fileprivate(set) var headerList: UnsafeMutablePointer<curl_slist>?
    fileprivate(set) var listSource: [(name: String, value: String)] = []
    /// The path of the URL last set on the handle: what it still holds while its options are kept
    /// (`configure`'s `shared`), since any reset makes the next transfer set the URL again.
    fileprivate(set) var keptPath: String?
    /// A total timeout was set on the handle (a request with `totalTimeout`): the next transfer
    /// clears it, since kept handles keep their options.
    fileprivate(set) var keptTimeout = false

    init() {
        errorBuffer = .allocate(capacity: Int(CURL_ERROR_SIZE) + 1)
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
    }

    func free() {
        if let headerList { curl_slist_free_all(headerList) }
        errorBuffer.deallocate()
    }

    fileprivate mutating func replaceList(_ list: UnsafeMutablePointer<curl_slist>?, source: [(name: String, value: String)]) {
        if let headerList, headerList != list { curl_slist_free_all(headerList) }
        headerList = list
        listSource = source
    }

    /// Whether the kept list was built from exactly these headers (names, values and order),
    /// byte for byte: String's == would take a canonically equivalent value for the same one.
    fileprivate func listMatches(_ headers: [(name: String, value: String)]) -> Bool {
        headerList != nil && listSource.count == headers.count
            && zip(listSource, headers).allSatisfy { sameBytes($0.name, $1.name) && sameBytes($0.value, $1.value) }
    }
}

/// Whether two strings hold the same UTF-8 bytes (not merely canonically equivalent text).
private func sameBytes(_ a: String, _ b: String) -> Bool {
    var (a, b) = (a, b)
    return a.utf8.count == b.utf8.count && a.withUTF8 { x in b.withUTF8 { y in x.count == 0 || memcmp(x.baseAddress!, y.baseAddress!, x.count) == 0 } }
}

/// One transfer on the event thread: its curl easy handle, request body, response head and
/// flow-control state. curl's callbacks find it through an unretained pointer; the loop's
/// tables keep it alive until `release()`.
final class TransferState {
    let handle: UpstreamTransfer
    let delegate: any UpstreamDelegate
    let easy: UnsafeMutableRawPointer
    /// Method, path and headers (the body lives in `body`).
    private let request: UpstreamRequest
    /// The request body, until a response arrives (curl may rewind it before, never after).
    private var body: [UInt8]
    private var bodyOffset = 0
    /// A small body's copy, handed to curl as CURLOPT_POSTFIELDS (freed in `release`).
    private var postFields: UnsafeMutableRawBufferPointer?
    /// Bodies up to this size go out in the same send as the request head (curl's own limit for
    /// that, MAX_INITIAL_POST_SIZE): one system call and one loopback packet fewer than a body
    /// read through the callback, which curl always sends on its own.
    static let inlineBodyLimit = 64 << 10
    /// The easy handle's error buffer and header list, handed back by `release()`.
    private var resources: EasyResources
    /// A POST whose body goes to curl whole: after such a transfer the easy handle holds only
    /// options that the next such transfer sets again or shares, so it is kept without a reset.
    let isInlinePost: Bool

    private var status = 0
    private var headers: [(name: String, value: String)] = []
    private var headDelivered = false
    /// The delegate asked to stop delivery (the loop reads it to exempt the transfer from the
    /// idle time-out and to honour `resume`).
    var paused = false
    var lastActivity: UInt64

    init(handle: UpstreamTransfer, request: UpstreamRequest, delegate: any UpstreamDelegate, easy: UnsafeMutableRawPointer,
         resources: EasyResources) {
        self.handle = handle
        var head = request
        head.body = []
        self.request = head
        self.body = request.body
        isInlinePost = request.method == "POST" && request.body.count <= Self.inlineBodyLimit
        self.delegate = delegate
        self.easy = easy
        self.resources = resources
        lastActivity = monotonicNanoseconds()
    }

    /// Frees what the transfer allocated and hands back what the easy handle keeps; the transfer
    /// must already be out of the multi handle. The easy handle itself goes back to its driver
    /// (which resets it unless `isInlinePost`).
    func release() -> EasyResources {
        postFields?.deallocate()
        postFields = nil
        return resources
    }

    /// Sets the options; returns why the request cannot be sent, if it cannot.
    /// - Parameter shared: the handle still holds the options every transfer of this loop shares
    ///   (it last ran an inline POST and was not reset), so only this transfer's own are set.
    func configure(_ settings: LoopSettings, shared: Bool = false) -> String? {
        let method = request.method
        guard !method.isEmpty, method.utf8.allSatisfy(isTokenByte) else { return "invalid method \(method)" }
        guard request.path.hasPrefix("/"), !request.path.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F }) else {
            return "invalid path: it must start with / and hold no space or control character"
        }

        resources.errorBuffer[0] = 0
        if !resources.listMatches(request.headers) {
            do throws(HeaderListProblem) {
                resources.replaceList(try buildHeaderList(), source: request.headers)
            } catch {
                switch error {
                case .invalid(let problem): return problem
                case .outOfMemory: return "out of memory"
                }
            }
        }

        let me = Unmanaged.passUnretained(self).toOpaque()
        var ok = true
        func set(_ code: CURLcode) { if code != CURLE_OK { ok = false } }
        // A kept handle holds the last URL (curl copies it on every set).
        if let origin = request.origin {
            // Another host than the configured one (a workspace's cloud upstream).
            let lower = origin.lowercased()
            guard lower.hasPrefix("http://") || lower.hasPrefix("https://"),
                  !origin.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F }) else {
                return "invalid origin: it must be http:// or https:// and a host"
            }
            set(attest_curl_easy_setopt_string(easy, CURLOPT_URL, origin + request.path))
            resources.keptPath = nil
        } else if !(shared && resources.keptPath.map({ sameBytes($0, request.path) }) == true) {
            set(attest_curl_easy_setopt_string(easy, CURLOPT_URL, settings.baseURL + request.path))
            resources.keptPath = request.path
        }
        if let total = request.totalTimeout {
            set(attest_curl_easy_setopt_long(easy, CURLOPT_TIMEOUT_MS, max(1, Int(total.components.seconds) * 1000
                                                                               + Int(total.components.attoseconds / 1_000_000_000_000_000))))
            resources.keptTimeout = true
        } else if resources.keptTimeout {
            set(attest_curl_easy_setopt_long(easy, CURLOPT_TIMEOUT_MS, 0))
            resources.keptTimeout = false
        }
        set(attest_curl_easy_setopt_slist(easy, CURLOPT_HTTPHEADER, resources.headerList))
        set(attest_curl_easy_setopt_pointer(easy, CURLOPT_HEADERDATA, me))
        set(attest_curl_easy_setopt_pointer(easy, CURLOPT_WRITEDATA, me))
        if !shared {
            set(attest_curl_easy_setopt_pointer(easy, CURLOPT_ERRORBUFFER, resources.errorBuffer))
            setSharedOptions(settings, set)
        }

        switch method {
        case "GET" where body.isEmpty:
            set(attest_curl_easy_setopt_long(easy, CURLOPT_HTTPGET, 1))
        case "HEAD":
            set(attest_curl_easy_setopt_long(easy, CURLOPT_NOBODY, 1))
        default:
            set(attest_curl_easy_setopt_long(easy, CURLOPT_POST, 1))
            set(attest_curl_easy_setopt_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.count)))
            if body.count <= Self.inlineBodyLimit {
                // A copy curl reads in place (and again if a reused connection turns out dead).
                let copy = UnsafeMutableRawBufferPointer.allocate(byteCount: max(1, body.count), alignment: 1)
                body.withUnsafeBytes { if let base = $0.baseAddress { copy.baseAddress!.copyMemory(from: base, byteCount: $0.count) } }
                postFields = copy
                body = []
                set(attest_curl_easy_setopt_pointer(easy, CURLOPT_POSTFIELDS, copy.baseAddress))
            } else {
                // A large body streams from the request's own array (no copy); the seek callback
                // lets curl send it again when a reused connection turns out to be dead.
                set(attest_curl_easy_setopt_read_function(easy, readCallback))
                set(attest_curl_easy_setopt_pointer(easy, CURLOPT_READDATA, me))
                set(attest_curl_easy_setopt_seek_function(easy, seekCallback))
                set(attest_curl_easy_setopt_pointer(easy, CURLOPT_SEEKDATA, me))
            }
            if method != "POST" { set(attest_curl_easy_setopt_string(easy, CURLOPT_CUSTOMREQUEST, method)) }
        }
        return ok ? nil : "curl refused an option"
    }

    private enum HeaderListProblem: Error { case invalid(String), outOfMemory }

    /// The request's headers as a curl list. Each line is built as C bytes in one reusable buffer
    /// and copied by curl: a Swift String per line, converted, was a quarter of a relay's mallocs.
    private func buildHeaderList() throws(HeaderListProblem) -> UnsafeMutablePointer<curl_slist>? {
        var built: UnsafeMutablePointer<curl_slist>?
        // A list left half-built by a refused header is freed.
        var complete = false
        defer { if !complete, let built { curl_slist_free_all(built) } }
        var line: [UInt8] = []
        line.reserveCapacity(256)
        func append(_ parts: String...) -> Bool {
            line.removeAll(keepingCapacity: true)
            for var part in parts { part.withUTF8 { line.append(contentsOf: $0) } }
            line.append(0)
            let list = line.withUnsafeBufferPointer { bytes in
                bytes.withMemoryRebound(to: CChar.self) { curl_slist_append(built, $0.baseAddress) }
            }
            guard let list else { return false }
            built = list
            return true
        }
        var has = (accept: false, expect: false, contentType: false)
        for (name, value) in request.headers {
            guard !name.isEmpty, name.utf8.allSatisfy(isTokenByte) else { throw .invalid("invalid header name \(name)") }
            guard !value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0x00 }) else {
                throw .invalid("header \(name) holds CR, LF or NUL")
            }
            if asciiCaseInsensitiveEquals(name, "content-length") || asciiCaseInsensitiveEquals(name, "transfer-encoding") {
                continue  // curl frames the body
            }
            if asciiCaseInsensitiveEquals(name, "accept") { has.accept = true }
            if asciiCaseInsensitiveEquals(name, "expect") { has.expect = true }
            if asciiCaseInsensitiveEquals(name, "content-type") { has.contentType = true }
            // "Name:" would tell curl to remove its own header; "Name;" sends an empty value.
            guard value.isEmpty ? append(name, ";") : append(name, ": ", value) else { throw .outOfMemory }
        }
        // Headers curl adds by itself unless told not to: none of them was asked for.
        if !has.accept, !append("Accept:") { throw .outOfMemory }
        if !has.expect, !append("Expect:") { throw .outOfMemory }
        if !has.contentType, !append("Content-Type:") { throw .outOfMemory }
        complete = true
        return built
    }

    /// The options that are the same for every transfer of a loop: set on a new or reset handle.
    private func setSharedOptions(_ settings: LoopSettings, _ set: (CURLcode) -> Void) {
        set(attest_curl_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1))
        // Only the configured URL: no proxy from the environment, no redirects, no other protocol.
        set(attest_curl_easy_setopt_string(easy, CURLOPT_PROXY, ""))
        set(attest_curl_easy_setopt_string(easy, CURLOPT_PROTOCOLS_STR, "http,https"))
        set(attest_curl_easy_setopt_long(easy, CURLOPT_FOLLOWLOCATION, 0))
        set(attest_curl_easy_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, settings.connectTimeoutMilliseconds))
        set(attest_curl_easy_setopt_long(easy, CURLOPT_TCP_KEEPALIVE, 1))
        set(attest_curl_easy_setopt_long(easy, CURLOPT_HTTP_VERSION,
                                         settings.allowHTTP2 ? attest_CURL_HTTP_VERSION_2TLS : attest_CURL_HTTP_VERSION_1_1))
        if settings.isTLS && settings.allowHTTP2 {
            // Wait for a connection being set up to say whether it multiplexes, rather than
            // opening a second one.
            set(attest_curl_easy_setopt_long(easy, CURLOPT_PIPEWAIT, 1))
        }
        if let connectTo = settings.connectTo {
            set(attest_curl_easy_setopt_slist(easy, CURLOPT_CONNECT_TO, connectTo.list))
        }
        if let bundle = settings.caBundle {
            set(bundle.withUnsafeBytes { attest_curl_easy_setopt_blob_copy(easy, CURLOPT_CAINFO_BLOB, $0.baseAddress, $0.count) })
        }
        set(attest_curl_easy_setopt_write_function(easy, CURLOPT_HEADERFUNCTION, headerCallback))
        set(attest_curl_easy_setopt_write_function(easy, CURLOPT_WRITEFUNCTION, writeCallback))
    }

    // MARK: Callbacks (on the event thread, inside curl)

    /// One header line as curl hands it over, read as bytes: Character-by-Character String work
    /// here cost more than the rest of the relay's request parsing together.
    fileprivate func didReceiveHeaderLine(_ bytes: UnsafeRawBufferPointer) {
        guard !headDelivered else {  // trailers
            lastActivity = monotonicNanoseconds()
            return
        }
        func isBlank(_ b: UInt8) -> Bool { b == 0x20 || b == 0x09 }
        func text(_ range: Range<Int>) -> String { String(decoding: UnsafeRawBufferPointer(rebasing: bytes[range]), as: UTF8.self) }
        func trimmed(_ range: Range<Int>) -> Range<Int> {
            var (start, end) = (range.lowerBound, range.upperBound)
            while start < end, isBlank(bytes[start]) { start += 1 }
            while end > start, isBlank(bytes[end - 1]) { end -= 1 }
            return start..<end
        }
        var end = bytes.count
        while end > 0, bytes[end - 1] == 0x0a || bytes[end - 1] == 0x0d { end -= 1 }
        // The clock is read on the head's first and last lines: a head arrives in one piece, and
        // reading it for every line was a tenth of the relay's clock reads.
        if end == 0 {
            lastActivity = monotonicNanoseconds()
            if status >= 200 { deliverHeadIfNeeded() }
        } else if end >= 5, bytes[0] == 0x48, bytes[1] == 0x54, bytes[2] == 0x54, bytes[3] == 0x50, bytes[4] == 0x2f {  // "HTTP/"
            // A new response head (after a 1xx, a fresh one starts): the three digits after the first space.
            var index = 5
            while index < end, bytes[index] != 0x20 { index += 1 }
            while index < end, bytes[index] == 0x20 { index += 1 }
            var code = 0, digits = 0
            while index < end, digits < 3, bytes[index] >= 0x30, bytes[index] <= 0x39 {
                code = code * 10 + Int(bytes[index] - 0x30)
                index += 1
                digits += 1
            }
            status = digits == 3 ? code : 0
            lastActivity = monotonicNanoseconds()
            headers.removeAll(keepingCapacity: true)
            headers.reserveCapacity(16)
        } else if isBlank(bytes[0]) {
            // Obsolete line folding: a continuation of the previous value.
            if !headers.isEmpty { headers[headers.count - 1].value += " " + text(trimmed(0..<end)) }
        } else if let colon = (0..<end).first(where: { bytes[$0] == 0x3a }) {
            let name = trimmed(0..<colon)
            // ASCII lowercase, byte by byte.
            let lowered = String(unsafeUninitializedCapacity: name.count) { buffer in
                for (offset, index) in name.enumerated() {
                    let b = bytes[index]
                    buffer[offset] = b >= 0x41 && b <= 0x5a ? b | 0x20 : b
                }
                return name.count
            }
            headers.append((name: lowered, value: text(trimmed((colon + 1)..<end))))
        }
    }

    func deliverHeadIfNeeded() {
        guard !headDelivered, !handle.cancelRequested.load(ordering: .relaxed) else { return }
        headDelivered = true
        if bodyOffset == body.count { body = [] }  // a 32 MB upload need not live as long as its stream
        if status == 0 {
            var code = 0
            attest_curl_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &code)
            status = code
        }
        let delivered = headers
        headers = []
        delegate.upstreamDidReceiveHead(status: status, headers: delivered)
    }

    fileprivate func didReceiveBody(_ chunk: UnsafeRawBufferPointer) {
        lastActivity = monotonicNanoseconds()
        // Cancelled on another thread: swallow until the loop removes the handle.
        guard !handle.cancelRequested.load(ordering: .relaxed) else { return }
        deliverHeadIfNeeded()
        if !delegate.upstreamDidReceive(chunk) {
            paused = true
            curl_easy_pause(easy, attest_CURLPAUSE_RECV)
        }
    }

    fileprivate func readBody(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        lastActivity = monotonicNanoseconds()
        let count = min(buffer.count, body.count - bodyOffset)
        guard count > 0 else { return 0 }
        body.withUnsafeBytes { body in
            buffer.baseAddress!.copyMemory(from: body.baseAddress! + bodyOffset, byteCount: count)
        }
        bodyOffset += count
        return count
    }

    fileprivate func seekBody(to offset: Int) -> Bool {
        guard offset >= 0, offset <= body.count else { return false }
        bodyOffset = offset
        return true
    }

    // MARK: Errors

    func error(for code: CURLcode) -> UpstreamError {
        let message = String(cString: resources.errorBuffer)
        let detail = message.isEmpty ? String(cString: curl_easy_strerror(code)) : message
        return UpstreamError(kind: Self.kind(of: code), detail: detail, curlCode: Int(code.rawValue))
    }

    static func kind(of code: CURLcode) -> UpstreamError.Kind {
        switch code {
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY, CURLE_COULDNT_CONNECT:
            return .connect
        case CURLE_OPERATION_TIMEDOUT:
            // The connect timeout, or a request's own total timeout (`totalTimeout`).
            return .timeout
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER,
             CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH,
             CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CRL_BADFILE, CURLE_SSL_ENGINE_NOTFOUND,
             CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_ENGINE_INITFAILED, CURLE_USE_SSL_FAILED:
            return .tls
        case CURLE_RECV_ERROR, CURLE_SEND_ERROR, CURLE_GOT_NOTHING, CURLE_PARTIAL_FILE, CURLE_HTTP2,
             CURLE_HTTP2_STREAM, CURLE_HTTP3:
            return .reset
        default:
            return .other
        }
    }
}

/// ASCII case-insensitive comparison with a lowercase literal, without allocating.
private func asciiCaseInsensitiveEquals(_ text: String, _ lowercase: StaticString) -> Bool {
    let bytes = text.utf8
    guard bytes.count == lowercase.utf8CodeUnitCount else { return false }
    return lowercase.withUTF8Buffer { expected in
        zip(bytes, expected).allSatisfy { actual, wanted in
            (actual >= 0x41 && actual <= 0x5A ? actual | 0x20 : actual) == wanted
        }
    }
}

/// RFC 9110 token characters (method and header names).
private func isTokenByte(_ byte: UInt8) -> Bool {
    switch byte {
    case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
        return true
    default:
        return "!#$%&'*+-.^_`|~".utf8.contains(byte)
    }
}

private let headerCallback: curl_write_callback = { buffer, size, count, context in
    let length = size * count
    Unmanaged<TransferState>.fromOpaque(context!).takeUnretainedValue()
        .didReceiveHeaderLine(UnsafeRawBufferPointer(start: buffer, count: length))
    return length
}

private let writeCallback: curl_write_callback = { buffer, size, count, context in
    let length = size * count
    Unmanaged<TransferState>.fromOpaque(context!).takeUnretainedValue()
        .didReceiveBody(UnsafeRawBufferPointer(start: buffer, count: length))
    return length
}

private let readCallback: curl_read_callback = { buffer, size, count, context in
    guard let buffer else { return attest_CURL_READFUNC_ABORT }
    return Unmanaged<TransferState>.fromOpaque(context!).takeUnretainedValue()
        .readBody(into: UnsafeMutableRawBufferPointer(start: buffer, count: size * count))
}

private let seekCallback: curl_seek_callback = { context, offset, origin in
    guard origin == SEEK_SET else { return CURL_SEEKFUNC_CANTSEEK }
    return Unmanaged<TransferState>.fromOpaque(context!).takeUnretainedValue().seekBody(to: Int(offset))
        ? CURL_SEEKFUNC_OK : CURL_SEEKFUNC_FAIL
}
