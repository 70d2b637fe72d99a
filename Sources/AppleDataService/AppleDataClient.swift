import CCurl
import Foundation
import UpstreamClient

/// Apple's App Attest data service, one blocking POST at a time on the caller's thread (the
/// refresh job's workers each own one client, so its connection is reused).
public final class AppleDataClient {
    public static let productionURL = "https://data.appattest.apple.com/v1/attestationData"
    public static let developmentURL = "https://data-development.appattest.apple.com/v1/attestationData"
    /// A receipt is a few kilobytes; anything much larger is not one.
    public static let maxResponseBytes = 64 << 10

    public struct Response: Sendable, Equatable {
        public let status: Int
        public let body: [UInt8]
    }

    private let easy: UnsafeMutableRawPointer
    private let caBundle: [UInt8]?
    private let timeoutSeconds: Int
    fileprivate var body: [UInt8] = []
    fileprivate var overflowed = false

    /// - Parameter caBundle: PEM roots trusted for the TLS connection (nil: the system's).
    /// - Parameter timeoutSeconds: a whole request's limit: short, so that a stop is not held up
    ///   long by a service that does not answer (the claim lapses, and the device is tried again).
    public init(caBundle: [UInt8]?, timeoutSeconds: Int = 15) throws {
        try CurlGlobal.ensureInitialized()
        guard let easy = curl_easy_init() else { throw AppleDataError("curl_easy_init failed") }
        self.easy = easy
        self.caBundle = caBundle
        self.timeoutSeconds = timeoutSeconds
    }

    deinit { curl_easy_cleanup(easy) }

    /// POSTs the receipt's Base64 text with the provider token; the status and body, or a
    /// transport error (DNS, TLS, timeout, an oversized answer).
    public func post(url: String, receipt: [UInt8], authorization: String) throws -> Response {
        body.removeAll(keepingCapacity: true)
        overflowed = false
        curl_easy_reset(easy)
        var failed: CURLcode = CURLE_OK
        func set(_ code: CURLcode) { if code != CURLE_OK && failed == CURLE_OK { failed = code } }
        set(attest_curl_easy_setopt_string(easy, CURLOPT_URL, url))
        set(attest_curl_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1))
        set(attest_curl_easy_setopt_string(easy, CURLOPT_PROTOCOLS_STR, "https"))   // never a redirect elsewhere, never plain text
        set(attest_curl_easy_setopt_long(easy, CURLOPT_TIMEOUT, timeoutSeconds))
        set(attest_curl_easy_setopt_long(easy, CURLOPT_CONNECTTIMEOUT, min(10, timeoutSeconds)))
        let text = Array(Data(receipt).base64EncodedString().utf8)
        set(attest_curl_easy_setopt_long(easy, CURLOPT_POSTFIELDSIZE, text.count))
        set(text.withUnsafeBytes { attest_curl_easy_setopt_string(easy, CURLOPT_COPYPOSTFIELDS, $0.baseAddress!.assumingMemoryBound(to: CChar.self)) })
        var headers: UnsafeMutablePointer<curl_slist>?
        headers = curl_slist_append(headers, "Authorization: " + authorization)
        headers = curl_slist_append(headers, "Content-Type: application/octet-stream")
        headers = curl_slist_append(headers, "Expect:")
        defer { curl_slist_free_all(headers) }
        set(attest_curl_easy_setopt_slist(easy, CURLOPT_HTTPHEADER, headers))
        if let caBundle {
            set(caBundle.withUnsafeBytes { attest_curl_easy_setopt_blob_copy(easy, CURLOPT_CAINFO_BLOB, $0.baseAddress, $0.count) })
        }
        set(attest_curl_easy_setopt_pointer(easy, CURLOPT_WRITEDATA, Unmanaged.passUnretained(self).toOpaque()))
        set(attest_curl_easy_setopt_write_function(easy, CURLOPT_WRITEFUNCTION, appleDataWrite))
        guard failed == CURLE_OK else { throw AppleDataError("curl setup: \(String(cString: curl_easy_strerror(failed)))") }
        let result = curl_easy_perform(easy)
        if overflowed { throw AppleDataError("the answer is larger than \(Self.maxResponseBytes) bytes") }
        guard result == CURLE_OK else { throw AppleDataError("request failed: \(String(cString: curl_easy_strerror(result)))") }
        var status = 0
        _ = attest_curl_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
        return Response(status: status, body: body)
    }
}

private let appleDataWrite: curl_write_callback = { buffer, size, count, context in
    let length = size * count
    let client = Unmanaged<AppleDataClient>.fromOpaque(context!).takeUnretainedValue()
    guard client.bodyCount + length <= AppleDataClient.maxResponseBytes else {
        client.markOverflow()
        return 0   // curl ends the transfer with CURLE_WRITE_ERROR
    }
    client.append(UnsafeRawBufferPointer(start: buffer, count: length))
    return length
}

extension AppleDataClient {
    fileprivate var bodyCount: Int { body.count }
    fileprivate func markOverflow() { overflowed = true }
    fileprivate func append(_ bytes: UnsafeRawBufferPointer) { body.append(contentsOf: bytes) }
}
