import Foundation
import Testing
import UpstreamClient
import UpstreamStub

/// `UpstreamConfiguration.connectTo` (CURLOPT_CONNECT_TO): a request for a cloud's real host name
/// lands on a stub on 127.0.0.1, while `Host`, SNI and the certificate check keep the real name.
@Suite struct ConnectToTests {
    static let bedrockHost = "bedrock-runtime.us-east-1.amazonaws.com"

    @Test func aRealHostNameLandsOnTheStubAndItsCertificateIsCheckedAgainstThatName() async throws {
        let certificates = try StubCertificates.generate(dnsNames: StubCertificates.cloudHostNames)
        defer { certificates.remove() }
        let stub = try UpstreamStubServer(.init(tls: certificates.tlsFiles))
        defer { stub.stop() }

        let configuration = UpstreamConfiguration(baseURL: "https://\(Self.bedrockHost)", caFile: certificates.caPath,
                                                  connectTo: ["\(Self.bedrockHost):443:127.0.0.1:\(stub.port)"])
        let client = try UpstreamClient(configuration)
        defer { client.shutdown() }

        // By the configured base URL, and by a request's own origin (a workspace's cloud upstream).
        for origin in [nil, "https://\(Self.bedrockHost)"] {
            var request = messagesRequest(stream: true)
            request.origin = origin
            let recorder = Recorder()
            client.start(request, delegate: recorder)
            #expect(await recorder.waitForFinish())
            #expect(recorder.snapshot.error == nil, "\(String(describing: recorder.snapshot.error))")
            #expect(recorder.snapshot.status == 200)
            #expect(events(in: recorder.text).map(\.event).last == "message_stop")
        }
        // The stub saw the real name as the Host.
        #expect(stub.requests.count == 2)
        #expect(stub.requests.allSatisfy { $0.header("host") == Self.bedrockHost }, "\(stub.requests.map { $0.header("host") ?? "-" })")

        // An entry for another host leaves this one alone: it goes nowhere it was not sent.
        let other = try UpstreamClient(UpstreamConfiguration(baseURL: "https://\(Self.bedrockHost)", caFile: certificates.caPath,
                                                             connectTimeout: .seconds(2),
                                                             connectTo: ["aiplatform.googleapis.com:443:127.0.0.1:\(stub.port)"]))
        defer { other.shutdown() }
        var elsewhere = messagesRequest()
        elsewhere.origin = "https://aiplatform.googleapis.com"
        let landed = Recorder()
        other.start(elsewhere, delegate: landed)
        #expect(await landed.waitForFinish())
        #expect(landed.snapshot.status == 200)
        #expect(stub.requests.last?.header("host") == "aiplatform.googleapis.com")
    }

    @Test func aCertificateWithoutTheRealNameIsRefused() async throws {
        // 127.0.0.1 and localhost only: the connection reaches the stub, TLS refuses it.
        let certificates = try StubCertificates.generate()
        defer { certificates.remove() }
        let stub = try UpstreamStubServer(.init(tls: certificates.tlsFiles))
        defer { stub.stop() }
        let client = try UpstreamClient(UpstreamConfiguration(baseURL: "https://\(Self.bedrockHost)", caFile: certificates.caPath,
                                                              connectTo: ["\(Self.bedrockHost):443:127.0.0.1:\(stub.port)"]))
        defer { client.shutdown() }
        let refused = Recorder()
        client.start(messagesRequest(), delegate: refused)
        #expect(await refused.waitForFinish())
        let error = try #require(refused.snapshot.error)
        #expect(error.kind == .tls, "\(error)")
        #expect(error.detail.contains(Self.bedrockHost), "\(error)")
        #expect(refused.snapshot.heads == 0)
        #expect(stub.requests.isEmpty)

        // A certificate for another cloud host is refused the same way.
        let vertexOnly = try StubCertificates.generate(dnsNames: ["aiplatform.googleapis.com"])
        defer { vertexOnly.remove() }
        let vertexStub = try UpstreamStubServer(.init(tls: vertexOnly.tlsFiles))
        defer { vertexStub.stop() }
        let wrongName = try UpstreamClient(UpstreamConfiguration(baseURL: "https://\(Self.bedrockHost)", caFile: vertexOnly.caPath,
                                                                 connectTo: ["\(Self.bedrockHost):443:127.0.0.1:\(vertexStub.port)"]))
        defer { wrongName.shutdown() }
        let alsoRefused = Recorder()
        wrongName.start(messagesRequest(), delegate: alsoRefused)
        #expect(await alsoRefused.waitForFinish())
        #expect(alsoRefused.snapshot.error?.kind == .tls)
        #expect(vertexStub.requests.isEmpty)
    }

    @Test(arguments: ["", "bedrock-runtime.us-east-1.amazonaws.com", "bedrock-runtime.us-east-1.amazonaws.com:443",
                      "bedrock-runtime.us-east-1.amazonaws.com:443:127.0.0.1", ":443:127.0.0.1:8443",
                      "bedrock-runtime.us-east-1.amazonaws.com:0:127.0.0.1:8443", "bedrock-runtime.us-east-1.amazonaws.com:443:127.0.0.1:70000",
                      "bedrock-runtime.us-east-1.amazonaws.com:443:[::1:8443", "host name:443:127.0.0.1:8443",
                      "bedrock-runtime.us-east-1.amazonaws.com:443:127.0.0.1:8443\n"])
    func aMalformedEntryIsRefusedWhenTheClientIsMade(entry: String) {
        #expect(throws: UpstreamClientError.self) {
            _ = try UpstreamClient(UpstreamConfiguration(baseURL: "https://\(Self.bedrockHost)", connectTo: [entry]))
        }
    }

    @Test func wellFormedEntriesParse() {
        #expect(ConnectToEntry.parse("bedrock-runtime.us-east-1.amazonaws.com:443:127.0.0.1:8443")
                == .init(host: "bedrock-runtime.us-east-1.amazonaws.com", port: 443, address: "127.0.0.1", addressPort: 8443))
        #expect(ConnectToEntry.parse("oauth2.googleapis.com:443:[::1]:9000")
                == .init(host: "oauth2.googleapis.com", port: 443, address: "[::1]", addressPort: 9000))
        #expect(ConnectToEntry.parse("10.0.0.1:80:localhost:8080")?.address == "localhost")
    }
}
