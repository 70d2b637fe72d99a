import HTTPServer
import MessagesBody
import TokenService

/// What the policy needs from a Messages request: the body's `model`, `max_tokens`, `fallbacks`,
/// `tools`, `stream` and `anthropic_beta` (`MessagesRequestBody`, one bounded scan), and the betas
/// and user profile from its headers. The body itself goes upstream byte for byte.
public enum MessagesRequestFields {
    public static let profileHeader = "anthropic-user-profile-id"

    /// The policy's input (from the body and the headers) and whether the request asks for a
    /// stream, from one scan of the body.
    public static func read(_ request: HTTPRequest, spendsTokens: Bool) -> (input: PolicyInput, streams: Bool) {
        var (input, streams) = MessagesRequestBody.read(request.body, spendsTokens: spendsTokens)
        var profiles = 0
        for header in request.headers {
            if header.name == "anthropic-beta" {
                input.betaHeaderValues.append(header.value)
            } else if header.name == profileHeader {
                profiles += 1
                input.profile = header.value
            }
        }
        if profiles > 1 {
            input.malformed = input.malformed ?? "\(profileHeader) appears more than once"
            input.profile = nil
        } else if let profile = input.profile, !IntegrationPolicy.isValidProfileID(profile) {
            input.malformed = input.malformed ?? "\(profileHeader) must be uprof_ followed by letters, digits, _ or -, at most 128 bytes"
            input.profile = nil
        }
        return (input, streams)
    }

    public static func policyInput(_ body: [UInt8], spendsTokens: Bool) -> PolicyInput {
        MessagesRequestBody.read(body, spendsTokens: spendsTokens).input
    }

    /// Whether the request asks for an SSE stream: `MessagesRequestBody.asksForStream`.
    public static func asksForStream(_ body: [UInt8]) -> Bool? { MessagesRequestBody.asksForStream(body) }
}
