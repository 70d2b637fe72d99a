import CloudUpstreams
import Foundation

/// Where a workspace's Messages requests go. The Anthropic API is the default; a workspace that
/// buys Claude through its cloud sets Amazon Bedrock or Google Vertex AI instead.
public enum UpstreamKind: String, Sendable, Codable, CaseIterable {
    case anthropic, bedrock, vertex
}

/// What a cloud upstream needs besides its credentials, stored in the clear (shown by
/// `attestctl workspaces show` and the console). The credentials are sealed apart.
public struct CloudUpstreamSettings: Sendable, Equatable, Codable {
    /// AWS region (Bedrock) or Google Cloud location (Vertex).
    public var region: String
    /// Google Cloud project (Vertex only).
    public var project: String?
    /// Replaces the cloud API's scheme, host and port (tests, private endpoints).
    public var endpointURL: String?
    /// Replaces the service account's `token_uri` (Vertex only; tests, private endpoints).
    public var tokenURL: String?
    /// The API model a device names → the cloud's model ID. A model without one is refused.
    public var models: [String: String]
    /// The service account (Vertex only): who the calls are billed as, shown to operators.
    public var clientEmail: String?

    public init(region: String, project: String? = nil, endpointURL: String? = nil, tokenURL: String? = nil,
                models: [String: String], clientEmail: String? = nil) {
        self.region = region
        self.project = project
        self.endpointURL = endpointURL
        self.tokenURL = tokenURL
        self.models = models
        self.clientEmail = clientEmail
    }

    enum CodingKeys: String, CodingKey {
        case region, project, models
        case endpointURL = "endpoint_url"
        case tokenURL = "token_url"
        case clientEmail = "client_email"
    }

    /// The stored form (the `settings` column): JSON with sorted keys.
    public func encoded() -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(self)) ?? Data("{}".utf8), as: UTF8.self)
    }

    public static func decode(_ text: String) throws -> CloudUpstreamSettings {
        try JSONDecoder().decode(CloudUpstreamSettings.self, from: Data(text.utf8))
    }
}

/// A Bedrock workspace's AWS credentials, as sealed (their JSON).
public typealias AWSAccessKey = AWSCredentials
