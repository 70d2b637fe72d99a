// No imports: the relay fuzzer (`make fuzz-relay`) compiles this file with JSONScan.swift and
// GoogleTokenResponse.swift, so every credential endpoint's answer is fuzzed as shipped.
//
// The answers of the endpoints a renewing credential comes from, read as bytes: AWS STS's XML
// (AssumeRole, AssumeRoleWithWebIdentity), the JSON of ECS/EKS container credentials and of EC2's
// instance metadata (IMDSv2), and Microsoft Entra ID's token JSON (client credentials, managed
// identity on a VM and on App Service). Google's metadata server answers as its token endpoint
// does (`GoogleTokenResponse`). Each reader bounds what it takes and checks every number.

/// Why a credential endpoint's answer cannot be used: in words for the operator's log, never with
/// a secret in them (only the endpoint's own error code and message, cut short).
public struct CredentialReplyError: Error, Equatable, Sendable, CustomStringConvertible {
    public let description: String

    public init(_ description: String) { self.description = description }
}

/// Temporary AWS keys and when they end (seconds since 1970, UTC).
public struct TemporaryAWSKeys: Equatable, Sendable {
    public let accessKeyID: String
    public let secretAccessKey: String
    public let sessionToken: String?
    public let expiration: Int64
}

public enum CredentialReplies {
    /// The largest answer read from any credential endpoint (an STS answer is about 1.5 KiB).
    public static let maxReply = 65_536
    /// The longest token taken (Entra's are 1.5 to 4 KiB; AWS's session tokens under 2 KiB).
    public static let maxToken = 16_384

    // MARK: AWS

    /// STS's answer to AssumeRole or AssumeRoleWithWebIdentity: the `<Credentials>` element's
    /// keys and expiration, or the `<Error>`'s code and message.
    public static func stsCredentials(_ body: [UInt8]) throws(CredentialReplyError) -> TemporaryAWSKeys {
        guard body.count <= maxReply else { throw CredentialReplyError("STS's answer is larger than \(maxReply) bytes") }
        if let error = XMLText.element("Error", in: body[...]) {
            let code = XMLText.element("Code", in: error).map { printable($0, limit: 100) } ?? "?"
            let message = XMLText.element("Message", in: error).map { printable($0, limit: 300) } ?? ""
            throw CredentialReplyError("STS refused: \(code)" + (message.isEmpty ? "" : " (\(message))"))
        }
        guard let credentials = XMLText.element("Credentials", in: body[...]) else {
            throw CredentialReplyError("STS's answer has no <Credentials> element")
        }
        func field(_ name: String) throws(CredentialReplyError) -> [UInt8] {
            guard let raw = XMLText.element(name, in: credentials), let value = XMLText.unescaped(raw) else {
                throw CredentialReplyError("STS's <Credentials> has no readable <\(name)>")
            }
            return value
        }
        let keys = try awsKeys(id: try field("AccessKeyId"), secret: try field("SecretAccessKey"), token: try field("SessionToken"),
                               expiration: try field("Expiration"), source: "STS")
        guard keys.sessionToken != nil else { throw CredentialReplyError("STS's <SessionToken> is empty") }
        return keys
    }

    /// The JSON that ECS/EKS container credentials and EC2's instance metadata answer:
    /// `AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration` (and IMDS's `Code`, which must be
    /// `Success` when present).
    public static func awsJSONCredentials(_ body: [UInt8], source: String) throws(CredentialReplyError) -> TemporaryAWSKeys {
        guard body.count <= maxReply else { throw CredentialReplyError("\(source)'s answer is larger than \(maxReply) bytes") }
        var id: [UInt8]?, secret: [UInt8]?, token: [UInt8]?, expiration: [UInt8]?, code: [UInt8]?, message: [UInt8]?
        let isObject = body.withUnsafeBytes { bytes in
            JSONScan.forEachMember(of: bytes) { name, value in
                switch String(decoding: name, as: UTF8.self) {
                case "AccessKeyId": id = JSONScan.string(bytes, value)
                case "SecretAccessKey": secret = JSONScan.string(bytes, value)
                case "Token": token = JSONScan.string(bytes, value)
                case "Expiration": expiration = JSONScan.string(bytes, value)
                case "Code": code = JSONScan.string(bytes, value)
                case "Message": message = JSONScan.string(bytes, value)
                default: break
                }
            }
        }
        guard isObject else { throw CredentialReplyError("\(source)'s answer is not a JSON object") }
        if let code, code != Array("Success".utf8) {
            throw CredentialReplyError("\(source) answered Code \(printable(code[...], limit: 100))"
                                       + (message.map { " (\(printable($0[...], limit: 300)))" } ?? ""))
        }
        guard let id, let secret, let expiration else {
            throw CredentialReplyError("\(source)'s answer lacks AccessKeyId, SecretAccessKey or Expiration")
        }
        return try awsKeys(id: id, secret: secret, token: token ?? [], expiration: expiration, source: source)
    }

    static func awsKeys(id: [UInt8], secret: [UInt8], token: [UInt8], expiration: [UInt8], source: String) throws(CredentialReplyError) -> TemporaryAWSKeys {
        guard (16...128).contains(id.count), id.allSatisfy({ (0x41...0x5a).contains($0) || (0x30...0x39).contains($0) }) else {
            throw CredentialReplyError("\(source)'s access key ID is not 16 to 128 uppercase letters and digits")
        }
        guard (1...256).contains(secret.count), secret.allSatisfy(isTokenByte) else {
            throw CredentialReplyError("\(source)'s secret access key is not 1 to 256 printable characters")
        }
        guard token.count <= maxToken, token.allSatisfy(isTokenByte) else {
            throw CredentialReplyError("\(source)'s session token is not at most \(maxToken) printable characters")
        }
        guard let expires = epochSeconds(iso8601: expiration[...]) else {
            throw CredentialReplyError("\(source)'s Expiration is not an ISO 8601 UTC time")
        }
        return TemporaryAWSKeys(accessKeyID: String(decoding: id, as: UTF8.self), secretAccessKey: String(decoding: secret, as: UTF8.self),
                                sessionToken: token.isEmpty ? nil : String(decoding: token, as: UTF8.self), expiration: expires)
    }

    // MARK: Microsoft Entra ID

    /// Entra ID's token answer, from its v2.0 token endpoint (`expires_in` a number) or from a
    /// managed identity endpoint (`expires_in` and `expires_on` as strings of digits, App Service
    /// giving only `expires_on`, seconds since 1970): the token and its lifetime in seconds from
    /// `now` (seconds since 1970). An OAuth error is thrown with its code and description.
    public static func entraToken(_ body: [UInt8], now: Int64) throws(CredentialReplyError) -> (accessToken: String, expiresIn: Int) {
        guard body.count <= maxReply else { throw CredentialReplyError("the token endpoint's answer is larger than \(maxReply) bytes") }
        var token: [UInt8]?, expiresIn: Int64?, expiresOn: Int64?, tokenType: [UInt8]?, error: [UInt8]?, errorDescription: [UInt8]?
        let isObject = body.withUnsafeBytes { bytes in
            JSONScan.forEachMember(of: bytes) { name, value in
                switch String(decoding: name, as: UTF8.self) {
                case "access_token": token = JSONScan.string(bytes, value)
                case "expires_in": expiresIn = number(bytes, value)
                case "expires_on": expiresOn = number(bytes, value)
                case "token_type": tokenType = JSONScan.string(bytes, value)
                case "error": error = JSONScan.string(bytes, value)
                case "error_description": errorDescription = JSONScan.string(bytes, value)
                default: break
                }
            }
        }
        guard isObject else { throw CredentialReplyError("the token endpoint's answer is not a JSON object") }
        if let error {
            throw CredentialReplyError("the token endpoint refused: \(printable(error[...], limit: 100))"
                                       + (errorDescription.map { " (\(printable($0[...], limit: 300)))" } ?? ""))
        }
        guard let token, (1...maxToken).contains(token.count), token.allSatisfy(isTokenByte) else {
            throw CredentialReplyError("the token endpoint's answer has no access_token of 1 to \(maxToken) printable characters")
        }
        if let tokenType, tokenType.count != 6 || !zip(tokenType, "bearer".utf8).allSatisfy({ $0 | 0x20 == $1 }) {
            throw CredentialReplyError("the token endpoint's token_type is not Bearer")
        }
        let lifetime: Int64
        if let expiresIn {
            lifetime = expiresIn
        } else if let expiresOn {
            let (difference, overflow) = expiresOn.subtractingReportingOverflow(now)
            guard !overflow else { throw CredentialReplyError("the token endpoint's expires_on is out of range") }
            lifetime = difference
        } else {
            throw CredentialReplyError("the token endpoint's answer has neither expires_in nor expires_on")
        }
        guard lifetime > 0 else { throw CredentialReplyError("the token endpoint gave a token that has already expired") }
        // The caller caps it further; here it only has to fit an Int on every platform.
        return (String(decoding: token, as: UTF8.self), Int(min(lifetime, Int64(Int32.max))))
    }

    /// A non-negative integer written as a JSON number or as a string of 1 to 18 digits.
    static func number(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Int64? {
        if let value = JSONScan.integer(bytes, range) { return value >= 0 ? Int64(value) : nil }
        guard let text = JSONScan.string(bytes, range) else { return nil }
        return digits(text[...])
    }

    static func digits(_ text: ArraySlice<UInt8>) -> Int64? {
        guard (1...18).contains(text.count) else { return nil }
        var value: Int64 = 0
        for byte in text {
            guard (0x30...0x39).contains(byte) else { return nil }
            value = value * 10 + Int64(byte - 0x30)
        }
        return value
    }

    // MARK: Shared

    /// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+00:00)` as seconds since 1970; nil for anything else,
    /// a year outside 1970...9999 included.
    public static func epochSeconds(iso8601 text: ArraySlice<UInt8>) -> Int64? {
        let bytes = Array(text)
        guard bytes.count >= 20, bytes[4] == 0x2d, bytes[7] == 0x2d, bytes[10] == 0x54 || bytes[10] == 0x74,
              bytes[13] == 0x3a, bytes[16] == 0x3a else { return nil }
        guard let year = digits(bytes[0..<4]), let month = digits(bytes[5..<7]), let day = digits(bytes[8..<10]),
              let hour = digits(bytes[11..<13]), let minute = digits(bytes[14..<16]), let second = digits(bytes[17..<19]) else { return nil }
        var rest = bytes[19...]
        if rest.first == 0x2e {
            rest = rest.dropFirst()
            let fraction = rest.prefix { (0x30...0x39).contains($0) }
            guard (1...9).contains(fraction.count) else { return nil }
            rest = rest.dropFirst(fraction.count)
        }
        guard rest.elementsEqual("Z".utf8) || rest.elementsEqual("z".utf8) || rest.elementsEqual("+00:00".utf8) else { return nil }
        guard (1970...9999).contains(year), (1...12).contains(month), hour < 24, minute < 60, second < 61 else { return nil }
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
        let monthDays: [Int64] = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard (1...monthDays[Int(month) - 1]).contains(day) else { return nil }
        // Days since 1970-01-01 (Howard Hinnant's days-from-civil), all in range for years to 9999.
        let y = month <= 2 ? year - 1 : year
        let era = y / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let days = era * 146_097 + dayOfEra - 719_468
        return days * 86_400 + hour * 3_600 + minute * 60 + second
    }

    /// A byte of a header-safe secret or token: printable ASCII, no space.
    static func isTokenByte(_ byte: UInt8) -> Bool { byte > 0x20 && byte < 0x7f }

    /// Printable ASCII of an endpoint's words, cut to `limit` (anything else as `?`).
    static func printable(_ bytes: ArraySlice<UInt8>, limit: Int) -> String {
        String(decoding: bytes.prefix(limit).map { $0 >= 0x20 && $0 < 0x7f ? $0 : 0x3f }, as: UTF8.self)
    }
}

/// The little of XML that STS's answers need: the text of the first element of a name (no
/// attributes on it, as STS writes them), and the five predefined entities.
enum XMLText {
    /// The bytes between `<name>` and the next `</name>` in `body`, or nil.
    static func element(_ name: String, in body: ArraySlice<UInt8>) -> ArraySlice<UInt8>? {
        let open = Array("<\(name)>".utf8), close = Array("</\(name)>".utf8)
        guard let start = find(open, in: body) else { return nil }
        let inner = body[(start + open.count)...]
        guard let end = find(close, in: inner) else { return nil }
        return body[(start + open.count)..<end]
    }

    static func find(_ needle: [UInt8], in haystack: ArraySlice<UInt8>) -> Int? {
        guard let first = needle.first, haystack.count >= needle.count else { return nil }
        var index = haystack.startIndex
        let last = haystack.endIndex - needle.count
        while index <= last {
            if haystack[index] == first, haystack[index..<(index + needle.count)].elementsEqual(needle) { return index }
            index += 1
        }
        return nil
    }

    /// Text with `&amp;` `&lt;` `&gt;` `&quot;` `&apos;` decoded; nil for any other `&` or a `<`
    /// (an element inside: not a text value).
    static func unescaped(_ text: ArraySlice<UInt8>) -> [UInt8]? {
        var out: [UInt8] = []
        out.reserveCapacity(text.count)
        var index = text.startIndex
        while index < text.endIndex {
            let byte = text[index]
            if byte == 0x3c { return nil }
            guard byte == 0x26 else {
                out.append(byte)
                index += 1
                continue
            }
            let entities: [(String, UInt8)] = [("&amp;", 0x26), ("&lt;", 0x3c), ("&gt;", 0x3e), ("&quot;", 0x22), ("&apos;", 0x27)]
            guard let (entity, value) = entities.first(where: { text[index...].starts(with: $0.0.utf8) }) else { return nil }
            out.append(value)
            index += entity.utf8.count
        }
        return out
    }
}
