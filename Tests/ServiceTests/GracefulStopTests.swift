import AttestCrypto
import AttestWire
import Foundation
import RawHTTP
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// SIGTERM under load: 16 clients refreshing and registering as fast as they can, each request on
/// a new connection with `Connection: close`. No request that reached attestd whole goes
/// unanswered (its answer, or 503 with `Connection: close`), and the process exits within its
/// grace. Ten rounds.
@Suite(.serialized) struct GracefulStopTests {
    enum Outcome: Equatable { case answered(Int), refused, cutBeforeSent, unanswered }

    /// One request on a new connection, and its answer.
    static func send(_ port: UInt16, _ path: String, _ contentType: String, _ body: String) -> (Outcome, RawResponse?) {
        guard let connection = try? RawConnection(port: port, timeout: 15) else { return (.refused, nil) }
        let request = "POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.utf8.count)\r\n"
            + "Connection: close\r\n\r\n" + body
        guard connection.sendAll(request) else { return (.cutBeforeSent, nil) }
        guard let response = connection.readResponse() else { return (.unanswered, nil) }
        return (.answered(response.status), response)
    }

    static func form(_ fields: [(String, String)]) -> String {
        fields.map { "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? $0.1)" }.joined(separator: "&")
    }

    /// A client: registers a device, then refreshes it, and registers another every fourth
    /// exchange, until the listener refuses it.
    static func client(_ port: UInt16, _ clientID: String, record: @escaping @Sendable (Outcome) -> Void) {
        var registered: ManualDevice?
        var step = 0
        while true {
            step += 1
            let refreshing = registered != nil && step % 4 != 0
            guard let device = refreshing ? registered : try? ManualDevice(clientID: clientID) else { return }
            let (challenged, reply) = send(port, WireProtocol.challengePath, "application/json",
                                           #"{"client_id":"\#(clientID)","key_id":"\#(device.keyIDBase64)"}"#)
            record(challenged)
            guard case .answered = challenged else { return }
            guard let text = reply?.json?["challenge"] as? String, let challenge = Data(base64Encoded: text) else { continue }
            let outcome: Outcome
            if refreshing {
                guard let assertion = try? device.assertion(challenge: Array(challenge)) else { return }
                outcome = send(port, WireProtocol.tokenPath, "application/x-www-form-urlencoded",
                               form([("assertion", assertion), ("client_id", clientID), ("grant_type", WireProtocol.grantType),
                                     ("key_id", device.keyIDBase64)])).0
            } else {
                guard let attestation = try? device.attestation(challenge: Array(challenge)) else { return }
                outcome = send(port, WireProtocol.registerPath, "application/json",
                               #"{"client_id":"\#(clientID)","key_id":"\#(device.keyIDBase64)","attestation_object":"\#(attestation)"}"#).0
                if outcome == .answered(200), registered == nil { registered = device }
            }
            record(outcome)
            guard case .answered = outcome else { return }
        }
    }

    @Test func aSigtermUnderLoadAnswersEveryRequestThatArrivedAndExitsWithinTheGrace() async throws {
        var totals: [String] = []
        for round in 1...10 {
            let (directory, db, clientID) = try DurabilityTests().makeDatabase()
            defer { try? FileManager.default.removeItem(at: directory) }
            let server = try ServerProcess(db: db, extraArguments: ["--mint-limit", "0", "--registration-quota", "0", "--registration-limit-per-address", "0", "--challenge-limit", "0",
                                                                    "--shutdown-grace", "10"])
            let outcomes = Mutex<[Outcome]>([])
            let finished = DispatchGroup()
            let port = server.port
            for _ in 0..<16 {
                finished.enter()
                Thread {
                    Self.client(port, clientID) { outcome in outcomes.withLock { $0.append(outcome) } }
                    finished.leave()
                }.start()
            }
            // Under load: 100 answers in, then the signal.
            let deadline = Date() + 30
            while outcomes.withLock({ $0.count }) < 100, Date() < deadline { try await Task.sleep(for: .milliseconds(5)) }
            let signalled = Date()
            kill(server.process.processIdentifier, SIGTERM)
            server.process.waitUntilExit()
            let exitedAfter = Date().timeIntervalSince(signalled)
            #expect(finished.wait(timeout: .now() + 30) == .success, "round \(round): clients still running")
            #expect(server.process.terminationStatus == 0, "round \(round): exit status \(server.process.terminationStatus)")
            #expect(exitedAfter < 10, "round \(round): exited \(exitedAfter) s after SIGTERM")
            // The server's own account: no whole request closed without an answer.
            let stopped = server.log.split(separator: "\n").filter { $0.contains(#""event":"listener_stopped""#) && $0.contains("public-listener") }
            let line = try #require(stopped.first, "round \(round): no listener_stopped line in \(server.log.suffix(2000))")
            let fields = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            #expect(fields["unanswered"] as? Int == 0, "round \(round): \(line)")
            let seen = outcomes.withLock { $0 }
            let answered = seen.filter { if case .answered = $0 { true } else { false } }.count
            let unavailable = seen.filter { $0 == .answered(503) }.count
            let cut = seen.filter { $0 == .unanswered }.count
            // A request sent on a connection the kernel had queued but attestd had not taken when
            // its listener closed is reset by the kernel (a window of microseconds; none in practice).
            #expect(cut <= 2, "round \(round): \(cut) requests cut")
            totals.append("round \(round): \(answered) answered (\(unavailable) with 503), \(seen.filter { $0 == .refused }.count) refused at connect, "
                          + "\(cut) reset after connect, exit \(String(format: "%.2f", exitedAfter)) s")
        }
        print(totals.joined(separator: "\n"))
    }
}
