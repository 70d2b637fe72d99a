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
    /// One walk over the members: each kept one is copied as it stands (its name, colon and
    /// value) and the separators are written anew, so a removed member's comma is never shared
    /// with another's, whatever the order, spacing or count. A removed name written with escapes,
    /// or given twice, is refused: another parser would read it as the plain name.
    static func edit(_ body: [UInt8], removing removed: JSONMemberScan.Names, adding added: [(String, String)]) throws -> [UInt8] {
        try body.withUnsafeBytes { raw throws -> [UInt8] in
            let bytes = raw.bindMemory(to: UInt8.self)
            var scanner = JSONMemberScan.Scanner(bytes: bytes)
            var kept: [Range<Int>] = []
            var seen = [Bool](repeating: false, count: removed.bytes.count)
            try scanner.eachMember { name, quote, value throws(JSONMemberScan.Failure) in
                if name.contains(0x5c) { throw .escapedName(at: quote) }
                if let slot = removed.bytes.firstIndex(where: { $0.elementsEqual(name) }) {
                    guard !seen[slot] else { throw .duplicate(removed.names[slot]) }
                    seen[slot] = true
                } else {
                    kept.append(quote..<value.upperBound)
                }
            }
            scanner.skipWhitespace()
            guard scanner.index == bytes.count else { throw JSONMemberScan.Failure.malformed(at: scanner.index) }
            var out: [UInt8] = [UInt8(ascii: "{")]
            out.reserveCapacity(body.count + 128)
            var first = true
            for (name, value) in added {
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                out.append(contentsOf: "\"\(name)\":\(value)".utf8)
            }
            for range in kept {
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[range]))
            }
            out.append(UInt8(ascii: "}"))
            return out
        }
    }

    /// A JSON string literal.
    static func quoted(_ text: String) -> String { JSONText.string(text) }

    /// Betas as a JSON array of strings; nil when there are none.
    static func betasArray(_ betas: [String]) -> String? {
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
    /// What a cloud reads from the path or sets itself (`model`, `stream`), what this relay
    /// writes (`anthropic_version`), and the body's betas, which are sent again as one checked
    /// list with the header's.
    static let removedForBedrock = JSONMemberScan.Names("model", "stream", "anthropic_version", "anthropic_beta")
    static let removedForVertex = JSONMemberScan.Names("model", "anthropic_version", "anthropic_beta")

    /// The Bedrock request, signed with SigV4 for the service `bedrock`. `betas` are every beta
    /// the request named, in its headers and its body, after the policy checked them.
    static func bedrock(_ request: HTTPRequest, modelID: String, streams: Bool, settings: CloudUpstreamSettings,
                        betas: [String], credentials: AWSCredentials, at date: Date) throws -> UpstreamRequest {
        var added = [("anthropic_version", CloudRequestBody.quoted(bedrockVersion))]
        if let betas = CloudRequestBody.betasArray(betas) { added.append(("anthropic_beta", betas)) }
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

    /// The Vertex AI request, with the service account's access token; `betas` (header and body
    /// ones, checked) go in one `anthropic-beta` header.
    static func vertex(body: [UInt8], model: String, streams: Bool, settings: CloudUpstreamSettings,
                       betas: [String], accessToken: String) -> UpstreamRequest {
        let origin = settings.endpointURL ?? "https://\(settings.region)-aiplatform.googleapis.com"
        let project = CloudRequestBody.pathSegment(settings.project ?? "")
        let region = CloudRequestBody.pathSegment(settings.region)
        let method = streams ? "streamRawPredict" : "rawPredict"
        let path = "/v1/projects/\(project)/locations/\(region)/publishers/anthropic/models/"
            + CloudRequestBody.pathSegment(model, keeping: [UInt8(ascii: "@")]) + ":" + method
        var headers: [(name: String, value: String)] = [("authorization", "Bearer " + accessToken), ("content-type", "application/json")]
        if !betas.isEmpty { headers.append(("anthropic-beta", betas.joined(separator: ","))) }
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
