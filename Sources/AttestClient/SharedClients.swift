import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

extension AppAttestClient {
    /// The process's one client for `clientID`, made on first use. Two clients for one client ID
    /// would each register a key and overwrite each other's stored credential; going through
    /// `shared` makes every caller in the process share one registration and one refresh.
    /// Later calls return the existing client and ignore the other arguments.
    public static func shared(clientID: String, baseURL: URL, attester: any DeviceAttester, store: any CredentialStore,
                              transport: any HTTPTransport = URLSessionTransport()) -> AppAttestClient {
        SharedClients.instance.client(clientID) {
            AppAttestClient(clientID: clientID, baseURL: baseURL, attester: attester, store: store, transport: transport)
        }
    }
}

private final class SharedClients: Sendable {
    static let instance = SharedClients()
    private let clients = LockedValueBox([String: AppAttestClient]())

    func client(_ clientID: String, make: () -> AppAttestClient) -> AppAttestClient {
        clients.withLock { clients in
            if let existing = clients[clientID] { return existing }
            let client = make()
            clients[clientID] = client
            return client
        }
    }
}
