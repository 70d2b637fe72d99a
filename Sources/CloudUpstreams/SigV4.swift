// AWS Signature Version 4 for requests to a non-S3 service (Bedrock), header-signed.
import AttestCrypto
import COpenSSL
import Foundation

/// An AWS access key; its Codable form (snake-case members) is what a Bedrock workspace seals.
public struct AWSCredentials: Sendable, Equatable, Codable, CustomStringConvertible {
    public var accessKeyID: String
    public var secretAccessKey: String
    public var sessionToken: String?

    public init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil) {
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
        self.sessionToken = sessionToken
    }

    enum CodingKeys: String, CodingKey {
        case accessKeyID = "access_key_id"
        case secretAccessKey = "secret_access_key"
        case sessionToken = "session_token"
    }

    /// Never the secret or the token: credentials reach log lines by accident.
    public var description: String {
        "AWSCredentials(accessKeyID: \(accessKeyID), secretAccessKey: <redacted>\(sessionToken == nil ? "" : ", sessionToken: <redacted>"))"
    }
}

/// One signature and what it was computed from: the intermediate strings are what AWS echoes
/// back in a SignatureDoesNotMatch error, so they are kept for diagnosis and tests.
public struct SigV4Signature: Sendable {
    public let canonicalRequest: String
    public let stringToSign: String
    /// Lowercase hex.
    public let signature: String
    public let authorization: String
    /// The headers to add to the request, names lowercase: `x-amz-date`, `x-amz-security-token`
    /// (with a session token), `x-amz-content-sha256` (when asked for), `authorization`.
    public let headers: [(name: String, value: String)]
}

public struct SigV4Signer: Sendable {
    public var service: String
    public var region: String
    public var credentials: AWSCredentials

    public init(service: String, region: String, credentials: AWSCredentials) {
        self.service = service
        self.region = region
        self.credentials = credentials
    }

    /// The headers to add to a request (see `SigV4Signature.headers`).
    /// - Parameters:
    ///   - path: the path exactly as sent on the wire, already percent-encoded.
    ///   - query: the query string as sent, without `?`; may be empty.
    ///   - headers: the headers to sign, `host` among them. Any of the headers this returns are
    ///     left out: the signer sets those itself.
    ///   - includeContentSHA256: also sign and send `x-amz-content-sha256` (S3 needs it; Bedrock does not).
    public func sign(method: String, path: String, query: String = "", headers: [(name: String, value: String)], body: [UInt8],
                     date: Date, includeContentSHA256: Bool = false) -> [(name: String, value: String)] {
        signature(method: method, path: path, query: query, headers: headers, body: body,
                  secondsSinceEpoch: Int(date.timeIntervalSince1970.rounded(.down)), includeContentSHA256: includeContentSHA256).headers
    }

    public func sign(method: String, path: String, query: String = "", headers: [(name: String, value: String)], body: [UInt8],
                     secondsSinceEpoch: Int, includeContentSHA256: Bool = false) -> [(name: String, value: String)] {
        signature(method: method, path: path, query: query, headers: headers, body: body,
                  secondsSinceEpoch: secondsSinceEpoch, includeContentSHA256: includeContentSHA256).headers
    }

    /// The whole computation, intermediate strings included.
    public func signature(method: String, path: String, query: String = "", headers: [(name: String, value: String)], body: [UInt8],
                          secondsSinceEpoch: Int, includeContentSHA256: Bool = false) -> SigV4Signature {
        let amzDate = Self.amzDate(secondsSinceEpoch: secondsSinceEpoch)
        let payloadHash = hexString(sha256(body))
        var added: [(name: String, value: String)] = [("x-amz-date", amzDate)]
        if let token = credentials.sessionToken { added.append(("x-amz-security-token", token)) }
        if includeContentSHA256 { added.append(("x-amz-content-sha256", payloadHash)) }
        let setBySigner: Set<String> = ["x-amz-date", "x-amz-security-token", "x-amz-content-sha256", "authorization"]
        let signed = headers.filter { !setBySigner.contains($0.name.lowercased()) } + added
        let result = signature(method: method, path: path, query: query, signedHeaders: signed, payloadHash: payloadHash, amzDate: amzDate)
        return SigV4Signature(canonicalRequest: result.canonicalRequest, stringToSign: result.stringToSign, signature: result.signature,
                              authorization: result.authorization, headers: added + [("authorization", result.authorization)])
    }

    /// Signs exactly `signedHeaders` (the caller has added `x-amz-date` or `date`): the core that
    /// the test suite's older vectors, signed without `x-amz-date`, are checked against.
    func signature(method: String, path: String, query: String, signedHeaders: [(name: String, value: String)], payloadHash: String,
                   amzDate: String) -> SigV4Signature {
        let (canonicalHeaders, signedHeaderList) = Self.canonicalHeaders(signedHeaders)
        let canonicalRequest = [method, Self.canonicalURI(path), Self.canonicalQuery(query), canonicalHeaders, signedHeaderList, payloadHash]
            .joined(separator: "\n")
        let dateStamp = String(amzDate.prefix(8))
        let scope = "\(dateStamp)/\(region)/\(service)/aws4_request"
        let stringToSign = ["AWS4-HMAC-SHA256", amzDate, scope, hexString(sha256(Array(canonicalRequest.utf8)))].joined(separator: "\n")
        var key = Array("AWS4\(credentials.secretAccessKey)".utf8)
        for part in [dateStamp, region, service, "aws4_request"] { key = hmacSHA256(key: key, message: Array(part.utf8)) }
        let signature = hexString(hmacSHA256(key: key, message: Array(stringToSign.utf8)))
        let authorization = "AWS4-HMAC-SHA256 Credential=\(credentials.accessKeyID)/\(scope), SignedHeaders=\(signedHeaderList), Signature=\(signature)"
        return SigV4Signature(canonicalRequest: canonicalRequest, stringToSign: stringToSign, signature: signature,
                              authorization: authorization, headers: [])
    }

    // MARK: - Canonical forms

    /// The wire path normalised as botocore does for every service but S3 (empty and `.`
    /// segments dropped, `..` removing the one before; the suite's normalize-path vectors agree),
    /// then each byte but the unreserved ones and `/` percent-encoded again: `%3A` becomes `%253A`.
    static func canonicalURI(_ path: String) -> String {
        var segments: [Substring] = []
        for segment in path.split(separator: "/", omittingEmptySubsequences: true) where segment != "." {
            if segment == ".." {
                _ = segments.popLast()
            } else {
                segments.append(segment)
            }
        }
        var normalized = segments.joined(separator: "/")
        if path.hasPrefix("/") { normalized = "/" + normalized }
        if path.hasSuffix("/"), !segments.isEmpty { normalized += "/" }
        if normalized.isEmpty { return "/" }
        return uriEncode(normalized.utf8, keepSlash: true)
    }

    /// Each name and value decoded from the wire form and encoded again strictly (so a literal
    /// `:` or `+` is signed as AWS will see it), sorted by encoded name, then value.
    static func canonicalQuery(_ query: String) -> String {
        guard !query.isEmpty else { return "" }
        var pairs: [(name: [UInt8], value: [UInt8])] = []
        for component in query.utf8.split(separator: UInt8(ascii: "&"), omittingEmptySubsequences: true) {
            let equals = component.firstIndex(of: UInt8(ascii: "="))
            let name = component[..<(equals ?? component.endIndex)]
            let value = equals.map { component[component.index(after: $0)...] } ?? component[component.endIndex...]
            pairs.append((Array(uriEncode(percentDecode(name), keepSlash: false).utf8), Array(uriEncode(percentDecode(value), keepSlash: false).utf8)))
        }
        pairs.sort { $0.name == $1.name ? $0.value.lexicographicallyPrecedes($1.value) : $0.name.lexicographicallyPrecedes($1.name) }
        return pairs.map { String(decoding: $0.name + [UInt8(ascii: "=")] + $0.value, as: UTF8.self) }.joined(separator: "&")
    }

    /// The canonical header block (each `name:value` line ending in a newline) and the signed
    /// header list. Names lowercased; values trimmed with inner runs of spaces and tabs made one
    /// space; a repeated name's values joined with commas in the order given.
    static func canonicalHeaders(_ headers: [(name: String, value: String)]) -> (block: String, signed: String) {
        var order: [String] = []
        var values: [String: [String]] = [:]
        for (name, value) in headers {
            let lower = name.lowercased()
            if values[lower] == nil { order.append(lower) }
            values[lower, default: []].append(trimAll(value))
        }
        order.sort { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
        let block = order.map { "\($0):\(values[$0]!.joined(separator: ","))\n" }.joined()
        return (block, order.joined(separator: ";"))
    }

    /// `yyyyMMdd'T'HHmmss'Z'` in UTC.
    static func amzDate(secondsSinceEpoch seconds: Int) -> String {
        let days = seconds >= 0 ? seconds / 86400 : (seconds - 86399) / 86400
        let secondOfDay = seconds - days * 86400
        // Days to a proleptic Gregorian date, counting 400-year eras from 0000-03-01.
        let shifted = days + 719_468
        let era = (shifted >= 0 ? shifted : shifted - 146_096) / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153  // March is 0
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        func pad(_ value: Int, _ width: Int) -> String {
            let digits = String(value)
            return String(repeating: "0", count: max(0, width - digits.count)) + digits
        }
        return pad(year, 4) + pad(month, 2) + pad(day, 2) + "T" + pad(secondOfDay / 3600, 2) + pad(secondOfDay / 60 % 60, 2)
            + pad(secondOfDay % 60, 2) + "Z"
    }
}

/// Trims spaces and tabs at both ends and turns each inner run of them into one space.
private func trimAll(_ value: String) -> String {
    var out: [UInt8] = []
    var pendingSpace = false
    for byte in value.utf8 {
        if byte == 0x20 || byte == 0x09 {
            pendingSpace = !out.isEmpty
        } else {
            if pendingSpace { out.append(0x20) }
            pendingSpace = false
            out.append(byte)
        }
    }
    return String(decoding: out, as: UTF8.self)
}

/// RFC 3986 percent-encoding: unreserved bytes (A–Z a–z 0–9 - _ . ~) kept, and `/` when asked.
private func uriEncode(_ bytes: some Sequence<UInt8>, keepSlash: Bool) -> String {
    let hexDigits = Array("0123456789ABCDEF".utf8)
    var out: [UInt8] = []
    for byte in bytes {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"):
            out.append(byte)
        case UInt8(ascii: "/") where keepSlash:
            out.append(byte)
        default:
            out += [UInt8(ascii: "%"), hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0xf)]]
        }
    }
    return String(decoding: out, as: UTF8.self)
}

/// Percent-decodes; a `%` not followed by two hex digits stays literal (and is encoded as `%25`).
/// `+` stays a plus: AWS reads query strings by RFC 3986, not as HTML forms.
private func percentDecode(_ bytes: some Collection<UInt8>) -> [UInt8] {
    let input = Array(bytes)
    var out: [UInt8] = []
    out.reserveCapacity(input.count)
    var index = 0
    while index < input.count {
        if input[index] == UInt8(ascii: "%"), index + 2 < input.count, let high = hexValue(input[index + 1]), let low = hexValue(input[index + 2]) {
            out.append(high << 4 | low)
            index += 3
        } else {
            out.append(input[index])
            index += 1
        }
    }
    return out
}

private func hexValue(_ byte: UInt8) -> UInt8? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
    default: nil
    }
}

func hexString(_ bytes: [UInt8]) -> String {
    let hexDigits = Array("0123456789abcdef".utf8)
    var out: [UInt8] = []
    out.reserveCapacity(bytes.count * 2)
    for byte in bytes { out += [hexDigits[Int(byte >> 4)], hexDigits[Int(byte & 0xf)]] }
    return String(decoding: out, as: UTF8.self)
}
