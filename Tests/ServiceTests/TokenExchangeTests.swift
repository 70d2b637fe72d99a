import AttestWire
import AppAttest
import AttestCrypto
import Foundation
@testable import HTTPRouting
import Testing
import TestAuthority
import TokenService
import ServiceRoutes

/// The token service driven over loopback HTTP, as a device and an operator would.
@Suite struct TokenExchangeTests {
    @Test func fullFlowRegisterRefreshMessagesRevoke() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)

        // Register: challenge → attestation → first token.
        let registered = try await http.registerFresh(device)
        #expect(registered.status == 200)
        #expect(registered.json["token_type"] as? String == "Bearer")
        #expect(registered.json["expires_in"] as? Int == 3600)
        #expect(registered.header("cache-control") == "no-store")
        let first = try #require(registered.json["access_token"] as? String)
        let next = try #require((registered.json["next_challenge"] as? String).flatMap { Data(base64Encoded: $0) })
        #expect(next.count == 32)
        #expect((registered.json["next_challenge_expires_in"] as? Int ?? 0) > 0)

        // The token authorizes the Messages API (503 here: no upstream) and nothing else.
        let messages = try await http.messages(token: first)
        #expect(messages.status == 503)
        #expect((messages.json["error"] as? [String: Any])?["type"] as? String == "api_error")
        // Its hour is read on the service's clock, as everywhere else.
        service.clock.advance(3601)
        #expect(try await http.messages(token: first).status == 401)
        service.clock.advance(-3601)
        let other = try await http.send("GET", "/v1/models", headers: ["authorization": "Bearer \(first)"])
        #expect(other.status == 403)
        #expect((other.json["error"] as? [String: Any])?["type"] as? String == "permission_error")

        // Refresh by assertion with the pre-issued challenge.
        let refreshed = try await http.token(device, assertion: try device.assertion(challenge: Array(next)))
        #expect(refreshed.status == 200)
        let second = try #require(refreshed.json["access_token"] as? String)
        #expect(second != first)
        #expect(try await http.messages(token: second).status == 503)

        // Revocation: outstanding tokens die at once; the device can never mint again.
        try service.admin.revokeIntegration(actor: service.owner, clientID: integration.clientID)
        for token in [first, second] {
            let rejected = try await http.messages(token: token)
            #expect(rejected.status == 401)
            #expect((rejected.json["error"] as? [String: Any])?["type"] as? String == "authentication_error")
        }
        let challenge = try await http.challenge(device)
        #expect(challenge.status == 401)
        #expect(challenge.error == "invalid_client")
        let token = try await http.token(device, assertion: try device.assertion(challenge: Array(next)))
        #expect(token.status == 401)
        #expect(token.error == "invalid_client")
    }

    @Test func pendingChallengeIsReissuedWithItsRemainingTTLAndIsSingleUse() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)

        let first = try await http.challenge(device)
        #expect(first.status == 200)
        #expect(first.json["expires_in"] as? Int == 300)
        service.clock.advance(100)
        let again = try await http.challenge(device)
        #expect(again.json["challenge"] as? String == first.json["challenge"] as? String)
        #expect(again.json["expires_in"] as? Int == 200)

        // Used once (successfully), it cannot be used again.
        let challenge = Array(Data(base64Encoded: first.json["challenge"] as! String)!)
        let attestation = try device.attestation(challenge: challenge)
        #expect(try await http.register(device, attestation: attestation).status == 200)
        let reuse = try await http.register(device, attestation: attestation)
        #expect(reuse.status == 401)
        #expect(reuse.error == "invalid_grant")

        // After expiry a new challenge is minted.
        service.clock.advance(301)
        let fresh = try await http.challenge(device)
        #expect(fresh.json["challenge"] as? String != first.json["challenge"] as? String)
    }

    @Test func expiredChallengeIsRefused() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        let challenge = try await http.challengeBytes(device)
        service.clock.advance(301)
        let late = try await http.register(device, attestation: try device.attestation(challenge: challenge))
        #expect(late.status == 401)
        #expect(late.error == "invalid_grant")
        #expect(try service.store.auditEvents(limit: 1).first?.reason == RejectionReason.noPendingChallenge.rawValue)
    }

    @Test func failedAttemptUsesTheChallengeUp() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        let challenge = try await http.challengeBytes(device)
        let wrong = try await http.register(device, attestation: try device.attestation(challenge: Array("not the challenge".utf8)))
        #expect(wrong.status == 401)
        // The right attestation for the same challenge is now too late.
        let right = try await http.register(device, attestation: try device.attestation(challenge: challenge))
        #expect(right.status == 401)
        #expect(right.error == "invalid_grant")
    }

    /// The challenge is pending when a registration or a refresh begins and has expired by the
    /// time it commits (here the clock moves 10 minutes while the request is verified): refused,
    /// and the next attempt with a new challenge succeeds.
    @Test func aChallengeThatExpiresWhileItsRequestIsVerifiedIsRefused() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        let challenge = try await http.challengeBytes(device)
        // The request begins on time; its commit is 10 minutes later, past the challenge's 5.
        service.clock.jump(600)
        let late = try await http.register(device, attestation: try device.attestation(challenge: challenge))
        #expect(late.status == 401 && late.error == "invalid_grant")
        #expect(try service.store.auditEvents(limit: 1).first?.reason == RejectionReason.noPendingChallenge.rawValue)
        #expect(try service.store.device(clientID: integration.clientID, keyID: device.key.keyID) == nil)
        let registered = try await http.registerFresh(device)
        #expect(registered.status == 200)
        // The same for a refresh, with the next challenge the registration handed out (its
        // lifetime is the token's plus 5 minutes).
        let next = Array(Data(base64Encoded: registered.json["next_challenge"] as! String)!)
        service.clock.jump(3600 + 301)
        let refresh = try await http.token(device, assertion: try device.assertion(challenge: next))
        #expect(refresh.status == 401 && refresh.error == "invalid_grant")
        #expect(try service.store.device(clientID: integration.clientID, keyID: device.key.keyID)?.counter == 0)
        let retried = try await http.token(device, assertion: try device.assertion(challenge: try await http.challengeBytes(device)))
        #expect(retried.status == 200)
    }

    /// Ten fresh installs register at once against a quota of 4 an hour: exactly 4 get tokens,
    /// the other 6 get 429 with a Retry-After, however the requests interleave.
    @Test func theRegistrationQuotaHoldsWhenInstallsRegisterAtOnce() async throws {
        let service = try TestService { $0.registrationQuotaPerHour = 4 }
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let devices = try (0..<10).map { _ in try ManualDevice(clientID: integration.clientID) }
        // Challenges first, so that every registration passes the early check before any commits.
        var attestations: [String] = []
        for device in devices { attestations.append(try device.attestation(challenge: try await http.challengeBytes(device))) }
        let statuses = try await withThrowingTaskGroup(of: (Int, String?).self) { group in
            for (device, attestation) in zip(devices, attestations) {
                group.addTask { let r = try await http.register(device, attestation: attestation); return (r.status, r.header("retry-after")) }
            }
            return try await group.reduce(into: [(Int, String?)]()) { $0.append($1) }
        }
        #expect(statuses.filter { $0.0 == 200 }.count == 4, "\(statuses)")
        #expect(statuses.filter { $0.0 == 429 }.count == 6, "\(statuses)")
        #expect(statuses.filter { $0.0 == 429 }.allSatisfy { (Int($0.1 ?? "") ?? 0) > 0 })
        #expect(try service.store.registrationsSince(clientID: integration.clientID, since: service.clock.now - 3600).count == 4)
    }

    /// Every rejection case of PROTOCOL.md's table, with the exact reason recorded in the audit trail.
    @Test func protocolRejectionTable() async throws {
        let service = try TestService { $0.mintLimitPerMinute = 3; $0.registrationQuotaPerHour = 2 }
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        func lastReason() throws -> String? { try service.store.auditEvents(limit: 1).first?.reason }

        // 401 invalid_client for an unknown client, on every endpoint; never 404.
        let stranger = try ManualDevice(clientID: "clid_doesnotexist")
        let unknown = try await http.challenge(stranger)
        #expect(unknown.status == 401 && unknown.error == "invalid_client")
        #expect(try lastReason() == RejectionReason.unknownClient.rawValue)
        let unknownToken = try await http.token(stranger, assertion: "AAAA")
        #expect(unknownToken.status == 401 && unknownToken.error == "invalid_client")

        // 400 for malformed bodies and missing fields.
        #expect(try await http.postJSON("/v1/oauth/app-attest/challenge", ["client_id": integration.clientID]).status == 400)
        #expect(try await http.send("POST", "/v1/oauth/app-attest/challenge", body: Data("{".utf8), contentType: "application/json").json["error"] as? String == "invalid_request")
        #expect(try await http.postJSON("/v1/oauth/app-attest/challenge", ["client_id": integration.clientID, "key_id": "AAAA"]).status == 400)
        #expect(try await http.postForm("/v1/oauth/token", [("grant_type", "password"), ("client_id", integration.clientID)]).status == 400)
        #expect(try await http.postJSON("/v1/oauth/app-attest/register", ["client_id": integration.clientID, "key_id": 5, "attestation_object": "x"]).status == 400)

        // Register: attestation for another app → 401 invalid_grant (rpIDMismatch).
        let otherApp = try ManualDevice(clientID: integration.clientID, appID: AppID(teamID: "ABCDE12345", bundleID: "com.example.other"))
        let rejected = try await http.registerFresh(otherApp)
        #expect(rejected.status == 401 && rejected.error == "invalid_grant")
        #expect(try lastReason() == VerificationReason.rpIDMismatch.rawValue)

        // A registered device; then the token endpoint's failure modes.
        let device = try ManualDevice(clientID: integration.clientID)
        let registered = try await http.registerFresh(device)
        #expect(registered.status == 200)
        var next = Array(Data(base64Encoded: registered.json["next_challenge"] as! String)!)

        // Bad signature (assertion over another challenge).
        let badSignature = try await http.token(device, assertion: try device.assertion(challenge: Array(repeating: 9, count: 32)))
        #expect(badSignature.status == 401 && badSignature.error == "invalid_grant")
        #expect(try lastReason() == VerificationReason.signatureInvalid.rawValue)

        // Replayed counter.
        next = try await http.challengeBytes(device)
        let replay = try await http.token(device, assertion: try device.assertion(challenge: next, counter: 0))
        #expect(replay.status == 401 && replay.error == "invalid_grant")
        #expect(try lastReason() == VerificationReason.counterNotIncreasing.rawValue)

        // Unknown key.
        let unregistered = try ManualDevice(clientID: integration.clientID)
        let unknownKey = try await http.token(unregistered, assertion: try unregistered.assertion(challenge: try await http.challengeBytes(unregistered)))
        #expect(unknownKey.status == 401 && unknownKey.error == "invalid_grant")
        #expect(try lastReason() == RejectionReason.unknownKey.rawValue)

        // No pending challenge.
        let noChallenge = try await http.token(device, assertion: try device.assertion(challenge: next))
        #expect(noChallenge.status == 401 && noChallenge.error == "invalid_grant")
        #expect(try lastReason() == RejectionReason.noPendingChallenge.rawValue)

        // Key registered twice.
        let again = try await http.register(device, attestation: try device.attestation(challenge: try await http.challengeBytes(device)))
        #expect(again.status == 401 && again.error == "invalid_grant")
        #expect(try lastReason() == RejectionReason.keyAlreadyRegistered.rawValue)

        // 429 mint limit with Retry-After (3 a minute; the failures above count as attempts).
        var limited: HTTPResult?
        for _ in 0..<4 {
            let result = try await http.token(device, assertion: try device.assertion(challenge: try await http.challengeBytes(device)))
            if result.status == 429 { limited = result; break }
            #expect(result.status == 200)
        }
        let mintLimited = try #require(limited)
        #expect(mintLimited.error == "rate_limit_error")
        #expect(Int(mintLimited.header("retry-after") ?? "") ?? 0 > 0)
        #expect(try lastReason() == RejectionReason.mintLimit.rawValue)

        // 429 registration quota: 2 successful registrations an hour (refused ones do not count).
        #expect(try await http.registerFresh(try ManualDevice(clientID: integration.clientID)).status == 200)
        let quota = try await http.registerFresh(try ManualDevice(clientID: integration.clientID))
        #expect(quota.status == 429 && quota.error == "rate_limit_error")
        #expect(Int(quota.header("retry-after") ?? "") ?? 0 > 60)
        #expect(try lastReason() == RejectionReason.registrationQuota.rawValue)

        // Unknown routes are 404, wrong methods 405 — but never 404 for an unknown client or key.
        #expect(try await http.send("GET", "/nope").status == 404)
        #expect(try await http.send("GET", "/v1/oauth/token").status == 405)
    }

    @Test func hostileClientIDsAndJunkAttemptsCannotGetAroundLimits() async throws {
        let service = try TestService { $0.mintLimitPerMinute = 2 }
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        #expect(try await http.registerFresh(device).status == 200)

        // A NUL byte (or any character outside clid_ + base64url) names no integration.
        for hostile in [integration.clientID + "\u{0}x", integration.clientID + " ", integration.clientID + "%"] {
            let result = try await http.postJSON("/v1/oauth/app-attest/challenge", ["client_id": hostile, "key_id": device.keyIDBase64])
            #expect(result.status == 401 && result.error == "invalid_client")
        }
        let form = try await http.send("POST", "/v1/oauth/token", body: Data("grant_type=urn%3Aanthropic%3Aparams%3Aoauth%3Agrant-type%3Aapp-attest&client_id=\(integration.clientID)%00x&key_id=\(device.keyIDBase64.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)&assertion=AAAA".utf8),
                                       contentType: "application/x-www-form-urlencoded")
        #expect(form.status == 401 && form.error == "invalid_client")

        // Junk assertions from someone who knows the key ID do not use up the device's mint limit…
        for _ in 0..<5 {
            let junk = try await http.token(device, assertion: Data([0xa0]).base64EncodedString())
            #expect(junk.status == 401)
            _ = try await http.challengeBytes(device)
        }
        // …but each one used its challenge up, malformed or not.
        let challenge = try await http.challengeBytes(device)
        let malformed = try await http.postForm("/v1/oauth/token", [("grant_type", "urn:anthropic:params:oauth:grant-type:app-attest"),
                                                                    ("client_id", integration.clientID), ("key_id", device.keyIDBase64), ("assertion", "!!!")])
        #expect(malformed.status == 400)
        let late = try await http.token(device, assertion: try device.assertion(challenge: challenge))
        #expect(late.status == 401 && late.error == "invalid_grant")
        // The genuine device still mints its 2 a minute.
        for _ in 0..<2 {
            #expect(try await http.token(device, assertion: try device.assertion(challenge: try await http.challengeBytes(device))).status == 200)
        }
        #expect(try await http.token(device, assertion: try device.assertion(challenge: try await http.challengeBytes(device))).status == 429)
    }

    @Test func challengeLimitIsPerCaller() async throws {
        let service = try TestService { $0.challengeLimitPerMinute = 3 }
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        for _ in 0..<3 { #expect(try await http.challenge(try ManualDevice(clientID: integration.clientID)).status == 200) }
        let limited = try await http.challenge(try ManualDevice(clientID: integration.clientID))
        #expect(limited.status == 429 && limited.error == "rate_limit_error")
        #expect(limited.header("retry-after") != nil)
        // Another caller is unaffected (the service, called directly, as another address).
        #expect(throws: Never.self) { _ = try service.service.challenge(clientID: integration.clientID, keyID: [UInt8](repeating: 3, count: 32), caller: "192.0.2.7") }
    }

    @Test func unknownClientIDsSpendABudgetOfTheirOwn() async throws {
        let service = try TestService { $0.challengeLimitPerMinute = 3 }
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        // Junk client IDs from this address are limited on their own…
        for _ in 0..<3 { #expect(try await http.challenge(try ManualDevice(clientID: "clid_doesNotExist")).error == "invalid_client") }
        #expect(try await http.challenge(try ManualDevice(clientID: "clid_doesNotExist")).status == 429)
        // …and a real device at the same address still gets its challenges.
        for _ in 0..<3 { #expect(try await http.challenge(try ManualDevice(clientID: integration.clientID)).status == 200) }
        #expect(try await http.challenge(try ManualDevice(clientID: integration.clientID)).status == 429)
    }

    @Test func callersBehindTrustedProxiesComeFromForwardingHeadersAndOnlyThen() {
        let resolver = CallerResolver(trustedProxies: [CIDR("10.0.0.0/8")!, CIDR("::1")!])
        let chain: [(name: String, value: String)] = [("x-forwarded-for", "203.0.113.9, 198.51.100.7, 10.1.2.3")]
        #expect(resolver.caller(peer: "10.0.0.1", headers: chain) == "198.51.100.7")   // right-most untrusted hop
        #expect(resolver.caller(peer: "192.0.2.1", headers: chain) == "192.0.2.1")      // untrusted peer: headers ignored
        let viaForwarded = CallerResolver(trustedProxies: [CIDR("10.0.0.0/8")!, CIDR("::1")!], header: .forwarded)
        #expect(viaForwarded.caller(peer: "::1", headers: [("forwarded", #"for="[2001:db8::1]:4711";proto=https"#)]) == "2001:db8::1")
        #expect(viaForwarded.caller(peer: "::1", headers: [("forwarded", "for=192.0.2.60:80, for=10.9.9.9")]) == "192.0.2.60")
        #expect(resolver.caller(peer: "10.0.0.1", headers: [("x-forwarded-for", "not-an-address")]) == "10.0.0.1")
        #expect(resolver.caller(peer: "10.0.0.1", headers: []) == "10.0.0.1")
        #expect(CIDR("10.0.0.0/33") == nil && CIDR("bogus") == nil)
        // Only the header the proxy writes counts: a client's Forwarded after the proxy's
        // X-Forwarded-For (the review's attack) does not choose the caller, nor the other way round.
        let mixed: [(name: String, value: String)] = [("x-forwarded-for", "198.51.100.7"), ("forwarded", "for=203.0.113.77")]
        #expect(resolver.caller(peer: "10.0.0.1", headers: mixed) == "198.51.100.7")
        let forwardedOnly = CallerResolver(trustedProxies: [CIDR("10.0.0.0/8")!], header: .forwarded)
        #expect(forwardedOnly.caller(peer: "10.0.0.1", headers: mixed) == "203.0.113.77")
        #expect(forwardedOnly.caller(peer: "10.0.0.1", headers: [("x-forwarded-for", "198.51.100.7")]) == "10.0.0.1")
        #expect(CIDR("::ffff:10.0.0.1") != nil)
    }

    @Test func concurrentRequestsWithOneCounterMintExactlyOneToken() async throws {
        let service = try TestService { $0.mintLimitPerMinute = 0 }
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        let registered = try await http.registerFresh(device)
        let next = Array(Data(base64Encoded: registered.json["next_challenge"] as! String)!)
        // 64 distinct assertions, all signed with counter 1 over the same challenge.
        let assertions = try (0..<64).map { _ in try device.assertion(challenge: next, counter: 1) }
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for assertion in assertions { group.addTask { try await http.token(device, assertion: assertion).status } }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(statuses.filter { $0 == 200 }.count == 1)
        #expect(statuses.filter { $0 == 401 }.count == 63)
        #expect(try service.store.counts(clientID: integration.clientID, at: service.clock.now).liveTokens == 2)
        #expect(try service.store.device(clientID: integration.clientID, keyID: device.key.keyID)?.counter == 1)
    }

    @Test func concurrentCounterRaceAtTheStoreLevel() async throws {
        // Even with a challenge each, two assertions with one counter cannot both advance it.
        let service = try TestService { $0.mintLimitPerMinute = 0 }
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        _ = try await http.registerFresh(device)
        let record: @Sendable (UInt8) -> TokenRecord = { n in TokenRecord(tokenHash: sha256([n]), clientID: integration.clientID, workspaceID: integration.workspaceID,
                                                  keyID: device.key.keyID, issuedAt: Date(), expiresAt: Date() + 60) }
        let challenge = IssuedChallenge(bytes: [UInt8](repeating: 1, count: 32), expiresAt: Date() + 60)
        let wins = await withTaskGroup(of: Bool.self) { group in
            for n in 0..<32 {
                group.addTask {
                    (try? service.store.advanceCounter(clientID: integration.clientID, keyID: device.key.keyID, from: 0, to: 5,
                                                       token: record(UInt8(n)), nextChallenge: challenge, at: Date())) ?? false
                }
            }
            return await group.reduce(into: 0) { $0 += $1 ? 1 : 0 }
        }
        #expect(wins == 1)
    }

    @Test func aDeviceKeepsOnlyItsTwoNewestTokens() async throws {
        let service = try TestService { $0.mintLimitPerMinute = 0 }
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        var tokens = [try #require(try await http.registerFresh(device).json["access_token"] as? String)]
        for counter in 1...4 {
            let challenge = try await http.challengeBytes(device)
            let minted = try await http.token(device, assertion: try device.assertion(challenge: challenge, counter: UInt32(counter)))
            tokens.append(try #require(minted.json["access_token"] as? String))
            service.clock.advance(1)
        }
        // The newest and the one before it (for requests in flight) work; every older one was
        // revoked by the mint that made it the third.
        for (index, token) in tokens.enumerated() {
            #expect(try await http.messages(token: token).status == (index >= tokens.count - 2 ? 503 : 401), "token \(index)")
        }
        #expect(try service.store.counts(clientID: integration.clientID, at: service.clock.now).liveTokens == 2)
    }

    @Test func tokensExpireAfterTheirTTL() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        let token = try #require(try await http.registerFresh(device).json["access_token"] as? String)
        service.clock.advance(3599)
        #expect(try await http.messages(token: token).status == 503)
        service.clock.advance(2)
        #expect(try await http.messages(token: token).status == 401)
    }

    @Test func base64InAllFourAlphabetsAndFieldsInAnyOrder() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        let urlSafeUnpadded = device.keyIDBase64.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
        let challenge = try await http.postJSON("/v1/oauth/app-attest/challenge", ["client_id": integration.clientID, "key_id": urlSafeUnpadded])
        #expect(challenge.status == 200)
        let bytes = Array(Data(base64Encoded: challenge.json["challenge"] as! String)!)
        let registered = try await http.register(device, attestation: try device.attestation(challenge: bytes))
        #expect(registered.status == 200)
        let next = Array(Data(base64Encoded: registered.json["next_challenge"] as! String)!)
        let assertion = try device.assertion(challenge: next).replacingOccurrences(of: "=", with: "")
        let refreshed = try await http.postForm("/v1/oauth/token", [("key_id", urlSafeUnpadded), ("grant_type", "urn:anthropic:params:oauth:grant-type:app-attest"),
                                                                    ("assertion", assertion), ("client_id", integration.clientID)])
        #expect(refreshed.status == 200)
    }

    @Test func introspectionForGateways() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        let token = try #require(try await http.registerFresh(device).json["access_token"] as? String)
        let key = ["authorization": "Bearer \(TestService.introspectionKey)"]

        let active = try await http.postForm("/v1/oauth/introspect", [("token", token)], headers: key)
        #expect(active.status == 200)
        #expect(active.json["active"] as? Bool == true)
        #expect(active.json["scope"] as? String == "messages")
        #expect(active.json["client_id"] as? String == integration.clientID)
        #expect(active.json["workspace"] as? String == "default")
        #expect(active.json["token_type"] as? String == "Bearer")
        #expect((active.json["exp"] as? Int ?? 0) - (active.json["iat"] as? Int ?? 0) == 3600)

        #expect(try await http.postForm("/v1/oauth/introspect", [("token", "aat_nope")], headers: key).json["active"] as? Bool == false)
        #expect(try await http.postForm("/v1/oauth/introspect", [("token", token)]).status == 401)
        #expect(try await http.postForm("/v1/oauth/introspect", [("token", token)], headers: ["authorization": "Bearer wrong"]).status == 401)
        try service.admin.revokeIntegration(actor: service.owner, clientID: integration.clientID)
        #expect(try await http.postForm("/v1/oauth/introspect", [("token", token)], headers: key).json["active"] as? Bool == false)
    }

    @Test func environmentRestrictionIsEnforced() async throws {
        let service = try TestService()
        let integration = try service.createIntegration(environments: [.production])
        let http = TestHTTP(baseURL: service.baseURL)
        let device = try ManualDevice(clientID: integration.clientID)
        let result = try await http.registerFresh(device)   // the test authority attests in development by default
        #expect(result.status == 401)
        #expect(try service.store.auditEvents(limit: 1).first?.reason == VerificationReason.environmentNotAllowed.rawValue)
    }

    @Test func untrustedAuthorityIsRejected() async throws {
        let service = try TestService(trustTestAuthority: false)
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let result = try await http.registerFresh(try ManualDevice(clientID: integration.clientID))
        #expect(result.status == 401 && result.error == "invalid_grant")
        #expect(try service.store.auditEvents(limit: 1).first?.reason == VerificationReason.certificateChainInvalid.rawValue)
    }

    @Test func everyResponseCarriesARequestIDThatTheLogAndErrorBodiesShare() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        let answers = [
            try await http.challenge(try ManualDevice(clientID: integration.clientID)),   // 200
            try await http.challenge(try ManualDevice(clientID: "clid_unknown")),         // 401 invalid_client
            try await http.postJSON(WireProtocol.challengePath, ["client_id": integration.clientID]),   // 400
            try await http.messages(token: "aat_not-a-token"),                           // 401, Messages API shape
            try await http.send("GET", "/healthz"),
            try await http.send("GET", "/nowhere"),                                     // 404
        ]
        var seen: Set<String> = []
        for answer in answers {
            let id = try #require(answer.header("request-id"), "status \(answer.status) without request-id")
            #expect(id.hasPrefix("req_") && id.count >= 20)
            seen.insert(id)
            #expect(service.logs.lines.withLock { $0 }.contains { $0.contains(#""request_id":"\#(id)""#) }, "no log line for \(id)")
        }
        #expect(seen.count == answers.count, "request IDs are unique")
        // Errors in the Messages API's shape carry it in the body too, as the real API does.
        let unauthenticated = answers[3]
        #expect(unauthenticated.status == 401)
        #expect(unauthenticated.json["request_id"] as? String == unauthenticated.header("request-id"))
        #expect((unauthenticated.json["error"] as? [String: Any])?["type"] as? String == "authentication_error")
    }

    @Test func everyVerificationReasonIsARejectionReason() {
        for reason in VerificationReason.allCases { #expect(RejectionReason(reason).rawValue == reason.rawValue) }
    }

    @Test func metricsCountRequestsRejectionsAndTokens() async throws {
        let service = try TestService()
        let integration = try service.createIntegration()
        let http = TestHTTP(baseURL: service.baseURL)
        _ = try await http.registerFresh(try ManualDevice(clientID: integration.clientID))
        _ = try await http.challenge(try ManualDevice(clientID: "clid_unknown"))
        let text = String(decoding: try await http.send("GET", "/metrics").body, as: UTF8.self)
        #expect(text.contains(#"attestd_tokens_issued_total{grant="registration"} 1"#))
        #expect(text.contains(#"attestd_rejections_total{endpoint="challenge",reason="unknownClient"} 1"#))
        #expect(text.contains(#"attestd_http_requests_total{route="/v1/oauth/app-attest/register",status="200"} 1"#))
        #expect(text.contains(#"attestd_verification_seconds_count{kind="attestation"} 1"#))
        #expect(try await http.send("GET", "/healthz").status == 200)
    }
}
