import AttestWire
import CloudUpstreams
import Foundation
import HTTPServer
import TokenService
import UpstreamClient

/// The Messages request as a cloud upstream takes it: the same JSON with a few top-level members
/// taken out and a few put in, edited as bytes (the body may be a 30 MB image; nothing else in
/// it is decoded or rewritten).
enum CloudRequestBody {
    /// `body` without the top-level members `removed`, with `added` (name, raw JSON value) first.
    static func edit(_ body: [UInt8], removing removed: JSONMemberScan.Names, adding added: [(String, String)]) throws -> [UInt8] {
        let ranges = try body.withUnsafeBytes { bytes throws -> [Range<Int>] in
            let values = try JSONMemberScan.members(of: removed, in: bytes)
            return try values.compactMap { $0 }.map { try memberSpan(of: $0, in: bytes) }.sorted { $0.lowerBound < $1.lowerBound }
        }
        guard let open = body.firstIndex(where: { !isBlank($0) }), body[open] == UInt8(ascii: "{") else {
            throw JSONMemberScan.Failure.notAnObject
        }
        var kept: [UInt8] = []
        kept.reserveCapacity(body.count + 128)
        var cursor = open + 1
        for range in ranges {
            kept.append(contentsOf: body[cursor..<range.lowerBound])
            cursor = range.upperBound
        }
        kept.append(contentsOf: body[cursor...])
        // What is left after `{`: empty when every member was removed.
        let restIsEmpty = kept.first(where: { !isBlank($0) }) == UInt8(ascii: "}")
        var out: [UInt8] = [UInt8(ascii: "{")]
        out.reserveCapacity(kept.count + 128)
        for (index, (name, value)) in added.enumerated() {
            out.append(contentsOf: Array("\"\(name)\":\(value)".utf8))
            if index < added.count - 1 || !restIsEmpty { out.append(UInt8(ascii: ",")) }
        }
        out.append(contentsOf: kept)
        return out
    }

    /// The bytes of the member whose value is at `value` (its name, colon and value) and of one
    /// comma beside it, so that what is left is still an object.
    private static func memberSpan(of value: Range<Int>, in bytes: UnsafeRawBufferPointer) throws -> Range<Int> {
        var start = value.lowerBound - 1
        while start >= 0, isBlank(bytes[start]) { start -= 1 }
        guard start >= 0, bytes[start] == UInt8(ascii: ":") else { throw JSONMemberScan.Failure.malformed(at: start) }
        start -= 1
        while start >= 0, isBlank(bytes[start]) { start -= 1 }
        // The name: the scanner refuses escaped names, so the opening quote is the previous one.
        guard start > 0, bytes[start] == UInt8(ascii: "\"") else { throw JSONMemberScan.Failure.malformed(at: start) }
        start -= 1
        while start >= 0, bytes[start] != UInt8(ascii: "\"") { start -= 1 }
        guard start >= 0 else { throw JSONMemberScan.Failure.malformed(at: 0) }
        var before = start - 1
        while before >= 0, isBlank(bytes[before]) { before -= 1 }
        var after = value.upperBound
        while after < bytes.count, isBlank(bytes[after]) { after += 1 }
        if before >= 0, bytes[before] == UInt8(ascii: ",") { return before..<value.upperBound }   // `, "name": value`
        if after < bytes.count, bytes[after] == UInt8(ascii: ",") { return start..<(after + 1) }  // `"name": value,`
        return start..<value.upperBound                                                           // the only member
    }

    private static func isBlank(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 }

    /// A JSON string literal.
    static func quoted(_ text: String) -> String { JSONText.string(text) }

    /// The request's betas (`anthropic-beta`, comma-separated, any number of headers) as a JSON array.
    static func betasArray(_ request: HTTPRequest) -> String? {
        let betas = request.headers.filter { $0.name == "anthropic-beta" }
            .flatMap { $0.value.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty }
        guard !betas.isEmpty else { return nil }
        return "[" + betas.map(quoted).joined(separator: ",") + "]"
    }

    /// A path segment with everything but RFC 3986's unreserved characters (and `extra`) percent-encoded.
    static func pathSegment(_ text: String, keeping extra: Set<UInt8> = []) -> String {
        var out = ""
        for byte in text.utf8 {
            let unreserved = (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte) || (0x30...0x39).contains(byte)
                || byte == 0x2D || byte == 0x2E || byte == 0x5F || byte == 0x7E || extra.contains(byte)
            if unreserved { out.unicodeScalars.append(Unicode.Scalar(byte)) } else { out += String(format: "%%%02X", byte) }
        }
        return out
    }
}

/// How a request reaches a workspace's cloud upstream.
enum CloudRoute {
    static let bedrockVersion = "bedrock-2023-05-31"
    static let vertexVersion = "vertex-2023-10-16"
    static let removedForBedrock = JSONMemberScan.Names("model", "stream")
    static let removedForVertex = JSONMemberScan.Names("model")

    /// The Bedrock request, signed with SigV4 for the service `bedrock`.
    static func bedrock(_ request: HTTPRequest, modelID: String, streams: Bool, settings: CloudUpstreamSettings,
                        credentials: AWSCredentials, at date: Date) throws -> UpstreamRequest {
        var added = [("anthropic_version", CloudRequestBody.quoted(bedrockVersion))]
        if let betas = CloudRequestBody.betasArray(request) { added.append(("anthropic_beta", betas)) }
        let body = try CloudRequestBody.edit(request.body, removing: removedForBedrock, adding: added)
        let origin = settings.endpointURL ?? "https://bedrock-runtime.\(settings.region).amazonaws.com"
        let path = "/model/\(CloudRequestBody.pathSegment(modelID))/" + (streams ? "invoke-with-response-stream" : "invoke")
        var headers: [(name: String, value: String)] = [
            ("host", authority(of: origin)),
            ("content-type", "application/json"),
            ("accept", streams ? "application/vnd.amazon.eventstream" : "application/json"),
        ]
        let signer = SigV4Signer(service: "bedrock", region: settings.region, credentials: credentials)
        headers.append(contentsOf: signer.sign(method: "POST", path: path, headers: headers, body: body, date: date))
        return UpstreamRequest(method: "POST", path: path, headers: headers, body: body, origin: origin)
    }

    /// The body as Vertex AI takes it: without `model`, with its `anthropic_version`.
    static func vertexBody(_ request: HTTPRequest) throws -> [UInt8] {
        try CloudRequestBody.edit(request.body, removing: removedForVertex, adding: [("anthropic_version", CloudRequestBody.quoted(vertexVersion))])
    }

    /// The Vertex AI request, with the service account's access token.
    static func vertex(body: [UInt8], model: String, streams: Bool, settings: CloudUpstreamSettings,
                       betas: [(name: String, value: String)], accessToken: String) -> UpstreamRequest {
        let origin = settings.endpointURL ?? "https://\(settings.region)-aiplatform.googleapis.com"
        let project = CloudRequestBody.pathSegment(settings.project ?? "")
        let region = CloudRequestBody.pathSegment(settings.region)
        let method = streams ? "streamRawPredict" : "rawPredict"
        let path = "/v1/projects/\(project)/locations/\(region)/publishers/anthropic/models/"
            + CloudRequestBody.pathSegment(model, keeping: [UInt8(ascii: "@")]) + ":" + method
        let headers: [(name: String, value: String)] = [("authorization", "Bearer " + accessToken), ("content-type", "application/json")] + betas
        return UpstreamRequest(method: "POST", path: path, headers: headers, body: body, origin: origin)
    }

    /// `host[:port]` of `scheme://host[:port]`, without the scheme's default port (as curl sends `Host`).
    static func authority(of origin: String) -> String {
        var rest = Substring(origin)
        let tls = rest.lowercased().hasPrefix("https://")
        if let range = rest.range(of: "://") { rest = rest[range.upperBound...] }
        if let slash = rest.firstIndex(of: "/") { rest = rest[..<slash] }
        if tls, rest.hasSuffix(":443") { rest = rest.dropLast(4) }
        if !tls, rest.hasSuffix(":80") { rest = rest.dropLast(3) }
        return String(rest)
    }
}
