import AppAttest
import AttestCrypto
import AttestWire
import Foundation
import Synchronization
import TestAuthority
import UpstreamStub

/// A stand-in for Apple's App Attest data service: a real HTTPS server on loopback (its own CA,
/// passed to attestd with --apple-data-ca-file) that checks the provider token as Apple does
/// (ES256 with the public half of the test .p8; alg, kid, iss, iat) and answers each receipt with a
/// RECEIPT one signed by the test receipt authority, or with the status a test asks for.
final class AppleDataStub: Sendable {
    static let teamID = "ABCDE12345"
    static let keyID = "TESTKEY123"
    static let keyFile = ServerProcess.packageRoot.appendingPathComponent("Fixtures/test-receipt-authority/test-apple-key.p8").path
    /// The test receipt root and, after it, its intermediate (pinned).
    static let receiptRoot = ServerProcess.packageRoot.appendingPathComponent("Fixtures/test-receipt-authority/anchor.pem").path

    enum Answer: Sendable, Equatable {
        /// 200 with a refreshed receipt carrying this metric.
        case refreshed(metric: Int)
        case status(Int)
    }

    struct Seen: Sendable {
        let environment: String
        /// The attested certificate the posted receipt names (one per device).
        let certificate: [UInt8]
        let status: Int
    }

    private struct State {
        var answer: Answer = .refreshed(metric: 3)
        var seen: [Seen] = []
        var held = false
        /// Valid requests that reached the answer, held or not.
        var arrivals = 0
    }

    /// Shared with the stub's handler, which runs on connection threads.
    private final class Shared: Sendable {
        let state: Mutex<State>
        init(_ state: State) { self.state = Mutex(state) }
    }

    let certificates: StubCertificates
    let server: UpstreamStubServer
    private let shared: Shared
    private let release = DispatchSemaphore(value: 0)

    init(answer: Answer = .refreshed(metric: 3)) throws {
        certificates = try StubCertificates.generate()
        let shared = Shared(State(answer: answer))
        self.shared = shared
        let publicKey = try ECPrivateKey(pem: String(contentsOfFile: Self.keyFile, encoding: .utf8)).publicKey()
        let release = self.release
        var configuration = UpstreamStubConfiguration(tls: certificates.tlsFiles)
        configuration.handler = { request in
            let environment: String
            switch request.path {
            case "/v1/attestationData": environment = "production"
            case "/development/v1/attestationData": environment = "sandbox"
            default: return StubResponse(status: 404)
            }
            guard request.method == "POST" else { return StubResponse(status: 405) }
            guard let der = Data(base64Encoded: String(decoding: request.body, as: UTF8.self)).map(Array.init),
                  let old = try? TestReceiptAuthority.shared.verifier().read(der, at: Date()) else {
                return StubResponse(status: 400, body: Array("bad payload".utf8))
            }
            guard old.environment.rawValue == environment else { return StubResponse(status: 400, body: Array("wrong environment".utf8)) }
            guard let token = request.header("authorization"), Self.tokenIsValid(token, publicKey: publicKey) else {
                shared.state.withLock { $0.seen.append(Seen(environment: environment, certificate: old.attestedCertificate, status: 401)) }
                return StubResponse(status: 401, body: Array("invalid provider token".utf8))
            }
            // A test may hold the answer (to kill attestd while a refresh is in flight).
            let held = shared.state.withLock { s -> Bool in
                s.arrivals += 1
                return s.held
            }
            if held { release.wait() }
            let answer = shared.state.withLock { $0.answer }
            let status: Int
            var body: [UInt8] = []
            switch answer {
            case .refreshed(let metric):
                var fields = TestReceiptAuthority.Fields(appID: old.appID, attestedCertificate: old.attestedCertificate, clientHash: nil,
                                                         createdAt: Date())
                fields.environment = old.environment.rawValue
                fields = fields.refreshed(at: Date(), riskMetric: metric)
                guard let receipt = try? TestReceiptAuthority.shared.receipt(fields) else { return StubResponse(status: 500) }
                status = 200
                body = Array(Data(receipt).base64EncodedString().utf8)
            case .status(let code):
                status = code
            }
            shared.state.withLock { $0.seen.append(Seen(environment: environment, certificate: old.attestedCertificate, status: status)) }
            return StubResponse(status: status, body: body)
        }
        server = try UpstreamStubServer(configuration)
    }

    /// The checks Apple makes on a provider token: ES256, the key ID, the team, a recent iat.
    static func tokenIsValid(_ token: String, publicKey: ECPublicKey) -> Bool {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, let headerBytes = Base64.decode(parts[0]), let claimBytes = Base64.decode(parts[1]),
              let raw = Base64.decode(parts[2]), raw.count == 64, let der = ECDSASignature.der(fromRaw: raw),
              let header = try? JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any],
              let claims = try? JSONSerialization.jsonObject(with: Data(claimBytes)) as? [String: Any],
              header["alg"] as? String == "ES256", header["kid"] as? String == keyID, claims["iss"] as? String == teamID,
              let iat = claims["iat"] as? Int, abs(Double(iat) - Date().timeIntervalSince1970) < 3600
        else { return false }
        return publicKey.isValidSignature(der, sha256Of: Array((parts[0] + "." + parts[1]).utf8))
    }

    var productionURL: String { server.baseURL + "/v1/attestationData" }
    var developmentURL: String { server.baseURL + "/development/v1/attestationData" }

    /// attestd's options for this stub and the test receipt authority.
    var serverArguments: [String] {
        ["--receipt-trust-anchor", Self.receiptRoot, "--apple-data-url-production", productionURL,
         "--apple-data-url-development", developmentURL, "--apple-data-ca-file", certificates.caPath]
    }

    func answer(_ answer: Answer) { shared.state.withLock { $0.answer = answer } }
    var seen: [Seen] { shared.state.withLock { $0.seen } }
    var arrivals: Int { shared.state.withLock { $0.arrivals } }
    /// Requests reaching the handler wait until `releaseHeld`.
    func hold() { shared.state.withLock { $0.held = true } }
    func releaseHeld() {
        shared.state.withLock { $0.held = false }
        for _ in 0..<16 { release.signal() }
    }

    func stop() {
        releaseHeld()
        server.stop()
        certificates.remove()
    }
}
