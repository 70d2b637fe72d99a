import AppleDataService
import AttestCrypto
import AttestWire
import Foundation
import Testing
import UpstreamClient
import UpstreamStub

/// The provider token and the HTTPS client of Apple's data service, on their own.
struct AppleDataServiceTests {
    static let keyFile = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/test-receipt-authority/test-apple-key.p8").path

    static func key() throws -> AppleDataKey {
        try AppleDataKey(teamID: "ABCDE12345", keyID: "TESTKEY123", p8: String(contentsOfFile: keyFile, encoding: .utf8))
    }

    @Test func signaturesConvertBetweenDERAndRawBothWays() throws {
        let key = try ECPrivateKey.generate()
        for _ in 0..<64 {
            let message = Array("message \(UUID())".utf8)
            let der = try key.signSHA256(message)
            let raw = try #require(ECDSASignature.raw(fromDER: der))
            #expect(raw.count == 64)
            let back = try #require(ECDSASignature.der(fromRaw: raw))
            #expect(try key.publicKey().isValidSignature(back, sha256Of: message))
            #expect(back == der, "DER is canonical: minimal integers, so the round trip is exact")
        }
        // Not a signature: trailing bytes, a long form where a short one fits, a negative integer, odd raw lengths.
        #expect(ECDSASignature.raw(fromDER: [0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01, 0x00]) == nil)
        #expect(ECDSASignature.raw(fromDER: [0x30, 0x81, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01]) == nil)
        #expect(ECDSASignature.raw(fromDER: [0x30, 0x06, 0x02, 0x01, 0x81, 0x02, 0x01, 0x01]) == nil)
        #expect(ECDSASignature.raw(fromDER: [0x30, 0x80, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01, 0x00, 0x00]) == nil)
        #expect(ECDSASignature.der(fromRaw: [1, 2, 3]) == nil)
        #expect(ECDSASignature.raw(fromDER: [0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01]) == [UInt8](repeating: 0, count: 31) + [1]
                    + [UInt8](repeating: 0, count: 31) + [1])
    }

    @Test func theProviderTokenIsAnES256JWTApplesWay() throws {
        let key = try Self.key()
        let time = Date(timeIntervalSince1970: 1_780_000_000)
        let token = try ProviderToken.make(key, at: time)
        let parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        try #require(parts.count == 3)
        let headerBytes = try #require(Base64.decode(parts[0])), claimBytes = try #require(Base64.decode(parts[1]))
        let header = try #require(try JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any])
        let claims = try #require(try JSONSerialization.jsonObject(with: Data(claimBytes)) as? [String: Any])
        #expect(header["alg"] as? String == "ES256" && header["kid"] as? String == "TESTKEY123" && header.count == 2)
        #expect(claims["iss"] as? String == "ABCDE12345" && claims["iat"] as? Int == 1_780_000_000 && claims.count == 2)
        #expect(!token.contains("=") && !token.contains("+") && !token.contains("/"), "base64url without padding")
        let raw = try #require(Base64.decode(parts[2]))
        #expect(raw.count == 64, "JOSE's r || s, not DER")
        let der = try #require(ECDSASignature.der(fromRaw: raw))
        let signed = Array((parts[0] + "." + parts[1]).utf8)
        #expect(try key.privateKey.publicKey().isValidSignature(der, sha256Of: signed))
        // A flipped bit in the claims no longer verifies.
        var tampered = signed
        tampered[tampered.count - 3] ^= 1
        #expect(try !key.privateKey.publicKey().isValidSignature(der, sha256Of: tampered))
    }

    @Test func onlyApplesKeyShapesAreAccepted() throws {
        let pem = try String(contentsOfFile: Self.keyFile, encoding: .utf8)
        #expect(throws: AppleDataError.self) { try AppleDataKey(teamID: "ABCDE1234", keyID: "TESTKEY123", p8: pem) }
        #expect(throws: AppleDataError.self) { try AppleDataKey(teamID: "ABCDE12345", keyID: "TEST-KEY12", p8: pem) }
        #expect(throws: AppleDataError.self) { try AppleDataKey(teamID: "ABCDE12345", keyID: "TESTKEY123", p8: "not a key") }
        let p384 = try ECPrivateKey.generate(curve: "P-384").pem
        #expect(throws: AppleDataError.self) { try AppleDataKey(teamID: "ABCDE12345", keyID: "TESTKEY123", p8: p384) }
    }

    @Test func theClientPostsBase64OverTLSAndBoundsTheAnswer() throws {
        let certificates = try StubCertificates.generate()
        defer { certificates.remove() }
        var configuration = UpstreamStubConfiguration(tls: certificates.tlsFiles)
        configuration.handler = { request in
            switch request.path {
            case "/echo": StubResponse(status: 200, body: Array((request.header("authorization") ?? "") .utf8) + [0x0a] + request.body)
            case "/huge": StubResponse(status: 200, body: [UInt8](repeating: 0x41, count: AppleDataClient.maxResponseBytes + 1))
            default: StubResponse(status: 418)
            }
        }
        let stub = try UpstreamStubServer(configuration)
        defer { stub.stop() }
        let client = try AppleDataClient(caBundle: try CABundle.systemRoots(adding: certificates.caPath), timeoutSeconds: 10)
        let echoed = try client.post(url: stub.baseURL + "/echo", receipt: [0, 1, 2, 255], authorization: "a.b.c")
        #expect(echoed.status == 200)
        #expect(String(decoding: echoed.body, as: UTF8.self) == "a.b.c\nAAEC/w==")
        #expect(try client.post(url: stub.baseURL + "/other", receipt: [1], authorization: "x").status == 418)
        #expect(throws: AppleDataError.self) { try client.post(url: stub.baseURL + "/huge", receipt: [1], authorization: "x") }
        // Plain HTTP is never spoken, and a server the bundle does not vouch for is refused.
        #expect(throws: AppleDataError.self) {
            try client.post(url: stub.baseURL.replacingOccurrences(of: "https://", with: "http://") + "/echo", receipt: [1], authorization: "x")
        }
        let stranger = try AppleDataClient(caBundle: nil, timeoutSeconds: 10)
        #expect(throws: AppleDataError.self) { try stranger.post(url: stub.baseURL + "/echo", receipt: [1], authorization: "x") }
    }
}
