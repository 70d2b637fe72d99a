import AttestWire
import CloudUpstreams
import Foundation
import HTTPServer
import MessagesBody
import TokenService
import UpstreamClient

/// The cloud body's pieces the relay writes: JSON string literals, the betas list, path segments.
/// (The edit itself, `CloudRequestBody.edit`, is in MessagesBody, where it is fuzzed.)
extension CloudRequestBody {
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
    /// The members each cloud's body loses: `CloudRequestBody.removedForBedrock` and `removedForVertex`.
    static var removedForBedrock: JSONMemberScan.Names { CloudRequestBody.removedForBedrock }
    static var removedForVertex: JSONMemberScan.Names { CloudRequestBody.removedForVertex }

    /// Why a body cannot go to a cloud: a member (or beta) the cloud does not take.
    struct Refused: Error {
        let what: String
    }

    /// The body shaped by `api`'s table, with `added` first; throws `Refused` naming a member the
    /// cloud cannot take, or the scanner's failure for a body that is not a JSON object.
    static func shaped(_ request: HTTPRequest, _ api: CloudAPI, model: String, betas: [String], adding added: [(String, String)]) throws -> [UInt8] {
        switch try CloudRequestBody.shape(request.body, rule: api.rules(model: model, betas: betas), adding: added) {
        case .shaped(let body): return body
        case .refused(let member): throw Refused(what: member)
        }
    }

    /// The Bedrock request, to be signed with SigV4 for the service `bedrock` (or to carry a
    /// Bedrock API key) once its credential is at hand (`authorized`): InvokeModel (the model in
    /// the path, `anthropic_version` and `anthropic_beta` in the body) or the Messages API (the
    /// mapped model in the body, the betas in `anthropic-beta`). `betas` are every beta the
    /// request named, in its headers and its body, checked by the policy and the cloud's table.
    static func bedrock(_ request: HTTPRequest, api: CloudAPI, modelID: String, streams: Bool, settings: CloudUpstreamSettings,
                        betas: [String]) throws -> UpstreamRequest {
        let origin = settings.origin(kind: .bedrock) ?? ""
        let body: [UInt8], path: String
        var headers: [(name: String, value: String)] = [("host", authority(of: origin)), ("content-type", "application/json")]
        if api == .bedrockMessages {
            body = try shaped(request, api, model: modelID, betas: betas, adding: [("model", CloudRequestBody.quoted(modelID))])
            path = "/anthropic/v1/messages"
            headers.append(("accept", streams ? "text/event-stream" : "application/json"))
            headers.append(("anthropic-version", request.header("anthropic-version") ?? MessagesRelay.defaultAnthropicVersion))
            if !betas.isEmpty { headers.append(("anthropic-beta", betas.joined(separator: ","))) }
        } else {
            var added = [("anthropic_version", CloudRequestBody.quoted(bedrockVersion))]
            if let betas = CloudRequestBody.betasArray(betas) { added.append(("anthropic_beta", betas)) }
            body = try shaped(request, api, model: modelID, betas: betas, adding: added)
            path = "/model/\(CloudRequestBody.pathSegment(modelID))/" + (streams ? "invoke-with-response-stream" : "invoke")
            headers.append(("accept", streams ? "application/vnd.amazon.eventstream" : "application/json"))
        }
        return UpstreamRequest(method: "POST", path: path, headers: headers, body: body, origin: origin)
    }

    /// Bedrock's CountTokens (`POST /model/{id}/count-tokens`, for either API): the InvokeModel
    /// body the request would send, base64 in `{"input":{"invokeModel":{"body":…}}}`, with a
    /// `max_tokens` of 1 when the request has none (InvokeModel requires one; it counts nothing).
    static func bedrockCountTokens(_ request: HTTPRequest, modelID: String, hasMaxTokens: Bool, settings: CloudUpstreamSettings,
                                   betas: [String]) throws -> UpstreamRequest {
        var added = [("anthropic_version", CloudRequestBody.quoted(bedrockVersion))]
        if let betas = CloudRequestBody.betasArray(betas) { added.append(("anthropic_beta", betas)) }
        if !hasMaxTokens { added.append(("max_tokens", "1")) }
        let invokeBody = try shaped(request, .bedrockInvoke, model: modelID, betas: betas, adding: added)
        let body = Array(#"{"input":{"invokeModel":{"body":"#.utf8) + Array(CloudRequestBody.quoted(Base64.encode(invokeBody)).utf8) + Array("}}}".utf8)
        let origin = settings.origin(kind: .bedrock) ?? ""
        let path = "/model/\(CloudRequestBody.pathSegment(modelID))/count-tokens"
        let headers: [(name: String, value: String)] = [("host", authority(of: origin)), ("content-type", "application/json"),
                                                       ("accept", "application/json")]
        return UpstreamRequest(method: "POST", path: path, headers: headers, body: body, origin: origin)
    }

    /// The body as Vertex AI takes it: without `model` (named in the URL), with its
    /// `anthropic_version`; a count-tokens body keeps the mapped model, as that endpoint reads it.
    static func vertexBody(_ request: HTTPRequest, model: String, betas: [String], countsTokens: Bool = false) throws -> [UInt8] {
        var added = [("anthropic_version", CloudRequestBody.quoted(vertexVersion))]
        if countsTokens { added.append(("model", CloudRequestBody.quoted(model))) }
        return try shaped(request, .vertex, model: model, betas: betas, adding: added)
    }

    /// The Vertex AI request, to carry the access token once it is at hand (`authorized`);
    /// `betas` (header and body ones, checked) go in one `anthropic-beta` header. `countsTokens`:
    /// the count-tokens endpoint.
    static func vertex(body: [UInt8], model: String, streams: Bool, countsTokens: Bool = false, settings: CloudUpstreamSettings,
                       betas: [String]) -> UpstreamRequest {
        let origin = settings.origin(kind: .vertex) ?? ""
        let project = CloudRequestBody.pathSegment(settings.project ?? "")
        let region = CloudRequestBody.pathSegment(settings.region)
        let target = countsTokens ? "count-tokens:rawPredict"
            : CloudRequestBody.pathSegment(model, keeping: [UInt8(ascii: "@")]) + ":" + (streams ? "streamRawPredict" : "rawPredict")
        let path = "/v1/projects/\(project)/locations/\(region)/publishers/anthropic/models/" + target
        var headers: [(name: String, value: String)] = [("content-type", "application/json")]
        if !betas.isEmpty { headers.append(("anthropic-beta", betas.joined(separator: ","))) }
        return UpstreamRequest(method: "POST", path: path, headers: headers, body: body, origin: origin)
    }

    /// The request with its credential: AWS keys sign it with SigV4 for `service` in `region` (a
    /// session token goes in `x-amz-security-token`, signed); a token goes in `Authorization: Bearer`.
    static func authorized(_ request: UpstreamRequest, with credential: CloudCredential, service: String, region: String, at date: Date) -> UpstreamRequest {
        var request = request
        switch credential {
        case .aws(let keys):
            let signer = SigV4Signer(service: service, region: region, credentials: keys)
            request.headers.append(contentsOf: signer.sign(method: request.method, path: request.path, headers: request.headers, body: request.body, date: date))
        case .bearer(let token):
            request.headers.append(("authorization", "Bearer " + token))
        }
        return request
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
