import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Sends one HTTP request; any status is a response, not an error.
public protocol HTTPTransport: Sendable {
    func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse)
}

/// The default transport, on `URLSession` (FoundationNetworking on Linux).
public struct URLSessionTransport: HTTPTransport {
    // URLSession is thread-safe; it is not marked Sendable on every platform.
    private let session: URLSession

    public init(session: URLSession = .shared) {
        self.session = session
    }

    public func send(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let (data, response) = try await session.data(for: request)
        guard let http = response as? HTTPURLResponse else {
            throw AttestClientError.invalidResponse("not an HTTP response")
        }
        return (data, http)
    }
}
