import AppAttest
import AttestClient
import CommandLineSupport
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import SimulatedDevice
import TestAuthority
import Synchronization

/// `attest-sim simulate-device`: one simulated install (test-authority keys, so only a server
/// trusting `Fixtures/test-authority/root.pem` accepts it) whose key, counter and token live in
/// its state directory, authenticating exactly as an app would through `AppAttestClient`.
enum SimulateDeviceCommand {
    static let usage = """
        usage: attest-sim simulate-device --base-url URL --client-id CLID --state-dir DIR [--app-id TEAMID.bundle]
                 [--platform ios|macos] [--distribution NAME] [--environment development|production] [--bundle-version V]
                 [--no-extensions] [--mac-security-posture on|off] [--receipt KIND] [--refresh] [--messages [--prompt TEXT] [--model ID] [--max-tokens N] [--stream]]
          One simulated install kept in DIR: prints {"client_id","key_id","token_expires_at","source","exchange_ms"}
          (source: registered, refreshed or cached), never the token. --app-id is needed on the first
          run and remembered in DIR/app-id. --messages then sends one Messages API request through the
          service with the token (default prompt "Say hello.", model \(defaultModel)), prints the reply's
          text (with --stream: as it arrives) and then {"messages_status": N, …}. On failure:
          {"error": "<AttestClientError case>", "detail": …}, exit 1.
          What the device says about the build, as iOS 27 and macOS 27 do (each run says it again, so a
          later run with another --bundle-version is the app after an update):
            --platform macos      a Mac: the code-directory hash in the map, Apple's Mac aclBlob, no bundle version
            --distribution NAME   app-store, testflight, development (default), enterprise, developer-id, other,
                                  os, invalid or restricted: the validation category written
            --environment ENV     the App Attest environment (default: development for development builds,
                                  production for the others)
            --bundle-version V    default 1 on iOS, none on a Mac
            --no-extensions       write no extension map, as iOS 26 and earlier
            --mac-security-posture off   a Mac whose aclBlob is not Apple's value (SIP or Full Security off)
            --receipt KIND        the attestation's receipt, signed by Fixtures/test-receipt-authority: valid (default),
                                  none, bad-signature, wrong-app-id, other-certificate, stale (an hour old),
                                  rogue-intermediate, key-agreement-signer or far-future-not-before
            --refresh             drop the cached token first, so the run refreshes by assertion
        """

    static func run(_ argv: [String]) throws -> Int32 {
        let arguments = try Arguments(argv, options: ["base-url", "client-id", "state-dir", "app-id", "prompt", "model", "max-tokens",
                                                      "platform", "distribution", "environment", "bundle-version", "mac-security-posture", "receipt"],
                                      flags: ["messages", "stream", "help", "no-extensions", "refresh"])
        if arguments.has("help") { print(usage); return 0 }
        guard arguments.positional.isEmpty else { throw UsageError("unexpected argument \(arguments.positional[0])\n\(usage)") }
        let baseURL = try parseBaseURL(try arguments.required("base-url"), option: "base-url")
        let clientID = try arguments.required("client-id")
        guard !clientID.isEmpty else { throw UsageError("--client-id is empty") }
        let statePath = try arguments.required("state-dir")
        guard !statePath.isEmpty else { throw UsageError("--state-dir is empty") }
        let stateDirectory = URL(fileURLWithPath: statePath, isDirectory: true)
        let appIDFile = stateDirectory.appendingPathComponent("app-id")

        // Decide the App ID before anything is created: a usage error changes nothing.
        var remembered: String?
        if FileManager.default.fileExists(atPath: appIDFile.path) {
            guard let data = FileManager.default.contents(atPath: appIDFile.path),
                  let text = String(data: data, encoding: .utf8)?.trimmingCharacters(in: .whitespacesAndNewlines),
                  AppID(text) != nil
            else { throw UsageError("\(appIDFile.path) does not hold an App ID (TEAMID.bundle.id)") }
            remembered = text
        }
        let appID: AppID
        if let text = try arguments.value("app-id") {
            guard let parsed = AppID(text) else { throw UsageError("--app-id must be TEAMID.bundle.id, got \(text)") }
            // An install belongs to one app: its key was attested for that App ID.
            if let remembered, remembered != parsed.description {
                throw UsageError("\(statePath) is an install of \(remembered), not \(parsed): use another --state-dir")
            }
            appID = parsed
        } else if let remembered, let parsed = AppID(remembered) {
            appID = parsed
        } else {
            throw UsageError("--app-id TEAMID.bundle.id is needed on the first run with --state-dir \(statePath)")
        }

        let build = try simulatedBuild(arguments)
        let store = try FileCredentialStore(directory: stateDirectory)
        if remembered == nil {
            try Data("\(appID)\n".utf8).write(to: appIDFile, options: .atomic)
        }
        if arguments.has("refresh") { try store.setToken(nil, for: clientID) }
        let attester = SoftwareAttester(appID: appID, keyDirectory: stateDirectory.appendingPathComponent("keys"), build: build)
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = 30
        configuration.timeoutIntervalForResource = 60
        let transport = URLSessionTransport(session: URLSession(configuration: configuration))
        let client = AppAttestClient(clientID: clientID, baseURL: baseURL, attester: attester, store: store, transport: transport)
        let sendMessage = arguments.has("messages")
        let message = MessageRequest(prompt: try arguments.value("prompt") ?? "Say hello.", model: try arguments.value("model") ?? defaultModel,
                                     maxTokens: try arguments.integer("max-tokens", default: 256, range: 1...64_000)!,
                                     stream: arguments.has("stream"))

        return try waitFor {
            let source: AuthenticationSource
            let started = DispatchTime.now().uptimeNanoseconds
            do {
                source = try await client.authenticateIfNeeded()
            } catch {
                printJSON(["error": errorName(error), "detail": errorDetail(error)])
                return 1
            }
            let keyID = (try? store.keyID(for: clientID)) ?? nil
            // The exchange as the device saw it (its own key generation and signing included),
            // without the process's start-up: what a benchmark's legitimate client measures.
            let milliseconds = Double(DispatchTime.now().uptimeNanoseconds - started) / 1e6
            var summary: [String: Any] = ["client_id": clientID, "source": source.rawValue, "exchange_ms": (milliseconds * 10).rounded() / 10]
            summary["key_id"] = keyID ?? NSNull()
            if let expiry = await client.currentTokenExpiry() {
                summary["token_expires_at"] = ISO8601DateFormatter().string(from: expiry)
            }
            printJSON(summary)
            guard sendMessage else { return 0 }

            do {
                // As the published client does: a 401 drops that token and retries once with a
                // fresh one (which, for a revoked integration, fails with attestationFailed).
                var reply = MessageReply(status: 0)
                for attempt in 0..<2 {
                    let token = try await client.currentToken()
                    reply = try await MessagesCall.send(message, token: token, baseURL: baseURL)
                    guard reply.status == 401, attempt == 0 else { break }
                    await client.invalidateToken(usedToken: token)
                }
                if reply.printedText { print("") }
                printJSON(reply.summary)
                return 0
            } catch {
                printJSON(["error": errorName(error), "detail": errorDetail(error)])
                return 1
            }
        }
    }

    static let defaultModel = "claude-sonnet-4-5"

    /// The build the flags describe; checked before anything is written.
    static func simulatedBuild(_ arguments: Arguments) throws -> SimulatedBuild {
        var platform = DevicePlatform.ios
        if let text = try arguments.value("platform") {
            guard let parsed = DevicePlatform(rawValue: text) else { throw UsageError("--platform \(text): use ios or macos") }
            platform = parsed
        }
        var distribution = Distribution.development
        if let text = try arguments.value("distribution") {
            guard let parsed = Distribution(rawValue: text), parsed != .unknown else {
                throw UsageError("--distribution \(text): use " + Distribution.allCases.filter { $0 != .unknown }.map(\.rawValue).joined(separator: ", "))
            }
            distribution = parsed
        }
        var build = SimulatedBuild(platform: platform, distribution: distribution)
        if let text = try arguments.value("environment") {
            guard let parsed = AttestationEnvironment(rawValue: text) else { throw UsageError("--environment \(text): use development or production") }
            build.environment = parsed
        }
        if let version = try arguments.value("bundle-version") {
            guard !version.isEmpty, version.utf8.count <= 64 else { throw UsageError("--bundle-version must be 1 to 64 bytes") }
            build.bundleVersion = version
        }
        build.extensions = !arguments.has("no-extensions")
        switch try arguments.value("mac-security-posture") {
        case nil, "on": break
        case "off":
            // Apple's value with its last byte changed: the policy of a Mac with a protection turned off.
            build.accessControlPolicy = Array(AccessControlExtension.applesMacValue.dropLast()) + [0x00]
        case let other?: throw UsageError("--mac-security-posture \(other): use on or off")
        }
        if let text = try arguments.value("receipt") {
            guard let kind = SimulatedReceipt(rawValue: text) else {
                throw UsageError("--receipt \(text): use " + SimulatedReceipt.allCases.map(\.rawValue).joined(separator: ", "))
            }
            build.receipt = kind
        }
        return build
    }

    // MARK: Helpers shared with `load`

    /// An http(s) base URL with a host; a trailing slash is harmless.
    static func parseBaseURL(_ text: String, option: String) throws -> URL {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
              let host = url.host, !host.isEmpty, url.query == nil, url.fragment == nil
        else { throw UsageError("--\(option) must be an http(s) URL such as http://127.0.0.1:8080, got \(text)") }
        return url
    }

    /// Runs `body` on the concurrency pool and blocks this (main) thread until it finishes.
    static func waitFor<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
        let outcome = Mutex<Result<T, Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task {
            let result: Result<T, Error>
            do { result = .success(try await body()) } catch { result = .failure(error) }
            outcome.withLock { $0 = result }
            done.signal()
        }
        done.wait()
        return try outcome.withLock { $0! }.get()
    }

    /// The `AttestClientError` case name, or a short name for anything else.
    static func errorName(_ error: Error) -> String {
        guard let error = error as? AttestClientError else { return error is URLError ? "network" : "error" }
        switch error {
        case .attestationUnsupported: return "attestationUnsupported"
        case .attestationFailed: return "attestationFailed"
        case .missingCredential: return "missingCredential"
        case .endpointsNotDeployed: return "endpointsNotDeployed"
        case .invalidResponse: return "invalidResponse"
        case .rateLimited: return "rateLimited"
        case .backingOff: return "backingOff"
        case .serverError: return "serverError"
        case .network: return "network"
        case .storeFailed: return "storeFailed"
        }
    }

    /// A one-line explanation for operators.
    static func errorDetail(_ error: Error?) -> String {
        guard let error else { return "no further detail" }
        guard let clientError = error as? AttestClientError else {
            if let urlError = error as? URLError { return "\(urlError.code) (\(urlError.errorCode)): \(urlError.localizedDescription)" }
            return "\(error)"
        }
        switch clientError {
        case .attestationUnsupported: return "this device cannot attest"
        case .attestationFailed(let underlying):
            if let underlying = underlying as? AttestClientError, case .serverError(let status, let code) = underlying {
                // The simulated device's certificates come from the project's test authority: a
                // server that does not trust it refuses every attestation, and only its log says why.
                let meaning = code == "invalid_client" ? " (client ID unknown or revoked)"
                    : code == "invalid_grant" ? " (attestation or assertion rejected; the server's log has the reason. A simulated"
                        + " device's attestation verifies only on an attestd started with --trust-anchor Fixtures/test-authority/root.pem)"
                    : ""
                return "server answered \(status) \(code ?? "without an error code")\(meaning)"
            }
            return underlying.map { "attester failed: \(errorDetail($0))" } ?? "attestation failed"
        case .missingCredential: return "the attester no longer holds the registered key"
        case .endpointsNotDeployed: return "the host answered 404: App Attest endpoints not deployed at this base URL"
        case .invalidResponse(let message): return message
        case .rateLimited(let delay): return "rate limited; retry after \(Int(delay.rounded(.up))) s"
        case .backingOff(let delay, let last): return "backing off \(Int(delay.rounded(.up))) s after: \(errorDetail(last))"
        case .serverError(let status, let code): return "server answered \(status) \(code ?? "without an error code")"
        case .network(let underlying): return errorDetail(underlying)
        case .storeFailed(let underlying): return "credential store: \(underlying)"
        }
    }
}

