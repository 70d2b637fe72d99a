import Foundation
import HTTPServer
import MessagesBody
import TokenService
import UpstreamClient

extension CloudRoute {
    /// A request to an Anthropic-compatible upstream: the Messages API's own path under the base
    /// URL's (`/anthropic/v1/messages` on Foundry and Bedrock, `/v1/messages` on Claude Platform
    /// on AWS), the body shaped by the service's table with the mapped model (a Foundry
    /// deployment's name) in `model`, the request's `anthropic-version`, the checked betas in one
    /// `anthropic-beta`, the static headers (`anthropic-workspace-id`), and an API key in
    /// `x-api-key`. Any other auth (SigV4, a bearer token) is added once the credential is at
    /// hand (`authorized`), after every other header: SigV4 signs them all.
    static func compatible(_ request: HTTPRequest, api: CloudAPI, settings: CloudUpstreamSettings, compatible: CompatibleSettings, modelID: String,
                           streams: Bool, countsTokens: Bool, betas: [String], apiKey: String?) throws -> UpstreamRequest {
        let origin = settings.origin(kind: .compatible) ?? ""
        let body = try shaped(request, api, model: modelID, betas: betas, adding: [("model", CloudRequestBody.quoted(modelID))])
        let path = compatible.basePath + (countsTokens ? "/v1/messages/count_tokens" : "/v1/messages")
        var headers: [(name: String, value: String)] = [("host", authority(of: origin)), ("content-type", "application/json"),
                                                       ("accept", streams ? "text/event-stream" : "application/json"),
                                                       ("anthropic-version", request.header("anthropic-version") ?? MessagesRelay.defaultAnthropicVersion)]
        if !betas.isEmpty { headers.append(("anthropic-beta", betas.joined(separator: ","))) }
        for (name, value) in compatible.headers.sorted(by: { $0.key < $1.key }) { headers.append((name, value)) }
        if let apiKey { headers.append(("x-api-key", apiKey)) }
        return UpstreamRequest(method: "POST", path: path, headers: headers, body: body, origin: origin)
    }
}
