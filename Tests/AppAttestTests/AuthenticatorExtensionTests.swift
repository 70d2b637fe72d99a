import AppAttest
import AttestCrypto
import CBOR
import Foundation
import Testing
import TestAuthority

/// The iOS 27 / macOS 27 authenticator data: framing by position, the extension map's rules, the
/// Mac's aclBlob, and what the verifier reports. Test-authority inputs are validly signed, so a
/// refusal here is the framing or policy check itself, not a broken nonce or signature.
@Suite struct AuthenticatorExtensionTests {
    let verifier = AppAttestVerifier(anchors: [TestAuthority.shared.root])
    let appID = AppID(teamID: "ABCDE12345", bundleID: "com.example.app")
    let hash = sha256(Array("challenge".utf8))

    func attest(_ options: TestAuthority.AttestationOptions, key: DeviceKey? = nil) throws -> VerifiedAttestation {
        let key = try key ?? DeviceKey.generate()
        let object = try TestAuthority.shared.attestation(key: key, appID: appID, clientDataHash: hash, options: options)
        return try verifier.verifyAttestation(object, keyID: key.keyID, clientDataHash: hash, allowedAppIDs: [appID], at: Date())
    }

    func assert(map: [CBORMapEntry]?, tail: [UInt8]? = nil, flags: UInt8? = nil) throws -> VerifiedAssertion {
        let key = try DeviceKey.generate()
        var object = try TestAuthority.shared.assertion(key: key, appID: appID, clientDataHash: hash, counter: 1, extensionMap: map, flags: flags)
        if let tail {
            // Re-sign authenticator data with an arbitrary tail.
            let authData = appID.rpIDHash + [flags ?? 0x40, 0, 0, 0, 1] + tail
            let signature = try key.privateKey.signSHA256(sha256(authData, hash))
            object = CBOREncoder.encode(.map([CBORMapEntry("signature", .bytes(signature)), CBORMapEntry("authenticatorData", .bytes(authData))]))
        }
        return try verifier.verifyAssertion(object, publicKey: key.publicKey, clientDataHash: hash, appID: appID, previousCounter: 0)
    }

    static func category(_ n: UInt32) -> CBORValue { .bytes([UInt8(n & 0xff), UInt8(n >> 8 & 0xff), UInt8(n >> 16 & 0xff), UInt8(n >> 24)]) }
    static let iosMap = [CBORMapEntry("apple_bundle_version_01", "1314"), CBORMapEntry("apple_validation_category_01", category(3))]

    // MARK: Reading the map

    @Test func iPhoneBuildIsReadWhateverTheFlagsSay() throws {
        for flags: UInt8 in [0xc0, 0x40, 0x00, 0x41] {
            var options = SimulatedBuild().attestationOptions(appID: appID)
            options.extensionMap = Self.iosMap
            options.flags = flags
            let result = try attest(options)
            #expect(result.app.flags == flags)
            #expect(result.app.validationCategory == 3)
            #expect(result.app.distribution == .development)
            #expect(result.app.bundleVersion == "1314")
            #expect(result.platform == .ios)
            #expect(result.macSecurityPostureOK == false)   // the iPhone policy is not the Mac value, and is not checked
            #expect(result.osInformation?.platform == "iphoneos")
        }
    }

    @Test func macBuildIsAcceptedWithApplesACLOnly() throws {
        let mac = SimulatedBuild(platform: .macos, distribution: .developerID)
        let result = try attest(mac.attestationOptions(appID: appID))
        #expect(result.platform == .macos)
        #expect(result.app.distribution == .developerID)
        #expect(result.app.bundleVersion == nil)
        #expect(result.app.extensions?.codeDirectoryHash?.count == 32)
        #expect(result.app.extensions?.codeDirectoryHashType == 2)
        #expect(result.macSecurityPostureOK)
        #expect(result.environment == .production)

        var sipOff = mac.attestationOptions(appID: appID)
        sipOff.accessControlPolicy = Array(AccessControlExtension.applesMacValue.dropLast()) + [0x00]
        expectReason(.macSecurityPosture) { _ = try attest(sipOff) }
        var iPhonePolicy = mac.attestationOptions(appID: appID)
        iPhonePolicy.accessControlPolicy = TestAuthority.iPhoneAccessControlPolicy
        expectReason(.macSecurityPosture) { _ = try attest(iPhonePolicy) }
        var none = mac.attestationOptions(appID: appID)
        none.accessControlPolicy = nil
        expectReason(.macSecurityPosture) { _ = try attest(none) }
        var wrongShape = mac.attestationOptions(appID: appID)
        // [1] where the aclBlob has [3]: the nonce extension's shape, not the aclBlob's.
        wrongShape.accessControlExtensionValue = DERWriter.tlv(0x30, DERWriter.tlv(0xa1, DERWriter.tlv(0x04, AccessControlExtension.applesMacValue)))
        expectReason(.macSecurityPosture) { _ = try attest(wrongShape) }
    }

    @Test func iPhoneWithAnyACLIsAccepted() throws {
        var options = SimulatedBuild().attestationOptions(appID: appID)
        for policy in [TestAuthority.iPhoneAccessControlPolicy, [0x30, 0x00], AccessControlExtension.applesMacValue] {
            options.accessControlPolicy = policy
            #expect(try attest(options).platform == .ios)
        }
        options.accessControlExtensionValue = [0x05, 0x00]   // unreadable: reported as none, not refused on iOS
        #expect(try attest(options).accessControlPolicy == nil)
    }

    @Test func olderDevicesWriteNoMap() throws {
        var build = SimulatedBuild()
        build.extensions = false
        let result = try attest(build.attestationOptions(appID: appID))
        #expect(result.app.extensions == nil)
        #expect(result.app.flags == 0x40)
        #expect(result.platform == .ios)
        #expect(try assert(map: nil).app.extensions == nil)
    }

    @Test func categoryAsAnIntegerAndUnknownKeysAreAccepted() throws {
        var options = SimulatedBuild().attestationOptions(appID: appID)
        options.extensionMap = [CBORMapEntry("apple_validation_category_01", .unsigned(4)), CBORMapEntry("apple_future_key_02", .array([.unsigned(1)]))]
        let result = try attest(options)
        #expect(result.app.distribution == .appStore)
        #expect(result.app.extensions?.entries.count == 2)
        let later = try assert(map: [CBORMapEntry("apple_validation_category_01", Self.category(12))])
        #expect(later.app.validationCategory == 12)
        #expect(later.app.distribution == .unknown)
    }

    @Test func distributionNamesFollowApplesTable() {
        let names = (0...11).map { Distribution(category: UInt32($0)).rawValue }
        #expect(names == ["invalid", "os", "testflight", "development", "app-store", "enterprise", "developer-id",
                          "restricted", "restricted", "restricted", "other", "unknown"])
        #expect(Distribution.admissible.map(\.rawValue) == ["testflight", "development", "app-store", "enterprise", "developer-id", "other"])
    }

    @Test func assertionMapIsReadWhateverTheFlagsSay() throws {
        for flags: UInt8 in [0xc0, 0x40, 0x00] {
            let result = try assert(map: Self.iosMap, flags: flags)
            #expect(result.app.bundleVersion == "1314")
            #expect(result.app.validationCategory == 3)
            #expect(result.app.flags == flags)
        }
    }

    // MARK: Framing, each rule broken with a valid signature

    /// Every bad tail: (bytes after the credential key or the header, what the detail must say).
    static let badTails: [(String, [UInt8], String)] = {
        let map = CBOREncoder.encode(.map(iosMap))
        let duplicate = [0xa2] + CBOREncoder.encode("apple_bundle_version_01") + CBOREncoder.encode("1")
            + CBOREncoder.encode("apple_bundle_version_01") + CBOREncoder.encode("2")
        return [
            ("a byte after the map", map + [0x00], "follow the extension map"),
            ("two maps", map + map, "follow the extension map"),
            ("a duplicate key", duplicate, "duplicate map key"),
            ("a category of three bytes", CBOREncoder.encode(.map([CBORMapEntry("apple_validation_category_01", .bytes([3, 0, 0]))])), "apple_validation_category_01"),
            ("a category as text", CBOREncoder.encode(.map([CBORMapEntry("apple_validation_category_01", "3")])), "apple_validation_category_01"),
            ("a negative category", CBOREncoder.encode(.map([CBORMapEntry("apple_validation_category_01", .int(-3))])), "apple_validation_category_01"),
            ("a category above 2^32", CBOREncoder.encode(.map([CBORMapEntry("apple_validation_category_01", .unsigned(1 << 33))])), "apple_validation_category_01"),
            ("a bundle version as bytes", CBOREncoder.encode(.map([CBORMapEntry("apple_bundle_version_01", .bytes([0x31]))])), "apple_bundle_version_01"),
            ("an integer key", CBOREncoder.encode(.map([CBORMapEntry(.unsigned(1), "x")])), "not a text string"),
            ("an array, not a map", CBOREncoder.encode(.array([.unsigned(1)])), "not an extension map"),
            ("a truncated map", Array(map.dropLast(2)), "not one CBOR item"),
            ("an indefinite-length map", [0xbf, 0x61, 0x61, 0x01, 0xff], "not one CBOR item"),
            ("a map nested too deep", CBOREncoder.encode(.map([CBORMapEntry("k", .array([.array([.array([.array([.unsigned(1)])])])]))])), "not one CBOR item"),
            ("a map of 33 entries", CBOREncoder.encode(.map((0..<33).map { CBORMapEntry(.text("k\($0)"), .unsigned(1)) })), "limit 32"),
        ]
    }()

    @Test(arguments: 0..<badTails.count) func attestationTailBreaksFramingAlone(_ index: Int) {
        let (what, tail, detail) = Self.badTails[index]
        var options = SimulatedBuild().attestationOptions(appID: appID)
        options.authDataTail = tail
        expectMalformed(what, detail) { _ = try attest(options) }
    }

    @Test(arguments: 0..<badTails.count) func assertionTailBreaksFramingAlone(_ index: Int) {
        let (what, tail, detail) = Self.badTails[index]
        expectMalformed(what, detail) { _ = try assert(map: nil, tail: tail) }
    }

    @Test func credentialKeyMustBeOneCOSEMap() throws {
        // The credential public key replaced by a byte string: framing refuses it before any map.
        let key = try DeviceKey.generate()
        let object = try TestAuthority.shared.attestation(key: key, appID: appID, clientDataHash: hash)
        let authData = try #require(CBORDecoder.decode(object)["authData"]?.bytesValue)
        let cutAfterID = Array(authData.prefix(55 + 32))
        for (what, bytes) in [("nothing", cutAfterID), ("a byte string", cutAfterID + CBOREncoder.encode(.bytes([1, 2]))),
                              ("a truncated key", Array(authData.dropLast(3)))] {
            let changed = try rewrite(object) { entries in entries[entries.firstIndex { $0.key == "authData" }!].value = .bytes(bytes) }
            expectMalformed(what, "credential") {
                _ = try verifier.verifyAttestation(changed, keyID: key.keyID, clientDataHash: hash, allowedAppIDs: [appID], at: Date())
            }
        }
    }

    @Test func rawClientDataHashOfAnyLength() throws {
        for length in [0, 1, 21, 24, 33, 1024] {
            let raw = [UInt8](repeating: 7, count: length)
            let key = try DeviceKey.generate()
            let object = try TestAuthority.shared.attestation(key: key, appID: appID, clientDataHash: raw)
            _ = try verifier.verifyAttestation(object, keyID: key.keyID, clientDataHash: raw, allowedAppIDs: [appID], at: Date())
            let assertion = try TestAuthority.shared.assertion(key: key, appID: appID, clientDataHash: raw, counter: 1)
            _ = try verifier.verifyAssertion(assertion, publicKey: key.publicKey, clientDataHash: raw, appID: appID, previousCounter: 0)
        }
        expectReason(.malformed) {
            _ = try verifier.verifyAssertion([], publicKey: try DeviceKey.generate().publicKey, clientDataHash: [UInt8](repeating: 0, count: 1025),
                                             appID: appID, previousCounter: 0)
        }
    }

    @Test func osInformationIsParsedAndIgnoredWhenOdd() {
        let value = OSInformation.extensionValue([(1400, "27.0.1"), (1403, "24A446"), (1026, "iphoneos"), (30, "x")])
        let info = OSInformation(extensionValue: value)
        #expect(info?.version == "27.0.1")
        #expect(info?.build == "24A446")
        #expect(info?.platform == "iphoneos")
        #expect(info?.fields[30] == "x")
        #expect(OSInformation(extensionValue: value + [0]) == nil)
        #expect(OSInformation(extensionValue: [0x30, 0x03, 0x04, 0x01, 0x41]) == nil)
        // A four-byte tag number is beyond what the reader takes.
        #expect(OSInformation(extensionValue: DERWriter.tlv(0x30, [0xbf, 0x81, 0x80, 0x80, 0x00, 0x03, 0x04, 0x01, 0x41])) == nil)
    }

    func expectMalformed(_ what: String, _ detail: String, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) {
        do {
            try body()
            Issue.record("\(what): accepted", sourceLocation: sourceLocation)
        } catch let error as VerificationError {
            #expect(error.reason == .malformed, "\(what): \(error)", sourceLocation: sourceLocation)
            #expect(error.detail.contains(detail), "\(what): \(error.detail)", sourceLocation: sourceLocation)
        } catch {
            Issue.record("\(what): \(error)", sourceLocation: sourceLocation)
        }
    }
}

/// The real samples changed by one rule each: never accepted, and the framing rules refuse them
/// as malformed before any signature is looked at.
@Suite(.enabled(if: AppleSample.available, AppleSample.skipReason))
struct AppleSampleMutationTests {
    let verifier = try! AppAttestVerifier()
    static let mapped = AppleSample.all().filter { $0.expectedAttestation?.extensions != nil }
    static let mappedAssertions = AppleSample.withAssertions().filter { $0.expectedAssertions?.extensions != nil }
    static let oldAssertions = AppleSample.withAssertions().filter { $0.expectedAssertions == nil }

    /// The changes: each is given the authenticator data and the offset where its map starts.
    static let changes: [(String, @Sendable ([UInt8], Int) -> [UInt8], VerificationReason)] = [
        ("a byte after the map", { data, _ in data + [0x00] }, .malformed),
        ("two maps", { data, start in data + data[start...] }, .malformed),
        ("a duplicate key", { data, start in
            // The map's first entry written twice, the count raised by one.
            var map = Array(data[start...])
            guard case .map(let entries)? = try? CBORDecoder.decode(map), let first = entries.first else { return data }
            map = [map[0] + 1] + CBOREncoder.encode(first.key) + CBOREncoder.encode(first.value) + map.dropFirst()
            return Array(data[..<start]) + map
        }, .malformed),
        ("a category of the wrong length", { data, start in
            replaceCategory(data, start, .bytes([3, 0, 0, 0, 0]))
        }, .malformed),
        ("a category of the wrong type", { data, start in replaceCategory(data, start, "3") }, .malformed),
    ]

    static func replaceCategory(_ data: [UInt8], _ start: Int, _ value: CBORValue) -> [UInt8] {
        guard case .map(var entries)? = try? CBORDecoder.decode(Array(data[start...])),
              let i = entries.firstIndex(where: { $0.key == "apple_validation_category_01" }) else { return data }
        entries[i].value = value
        return Array(data[..<start]) + CBOREncoder.encode(.map(entries))
    }

    /// Where the map starts: after the COSE key in an attestation, after 37 bytes in an assertion.
    static func mapStart(_ data: [UInt8], attested: Bool) throws -> Int {
        guard attested else { return 37 }
        let idLength = Int(data[53]) << 8 | Int(data[54])
        return 55 + idLength + (try CBORDecoder.decodePrefix(data[(55 + idLength)...]).length)
    }

    @Test(arguments: mapped) func attestationMutationsAreRefused(_ sample: AppleSample) throws {
        let attestation = try #require(sample.attestation)
        let authData = try #require(CBORDecoder.decode(attestation.object)["authData"]?.bytesValue)
        let start = try Self.mapStart(authData, attested: true)
        for (what, change, reason) in Self.changes {
            let mutated = change(authData, start)
            #expect(mutated != authData, "\(what) changed nothing")
            let object = try rewrite(attestation.object) { $0[$0.firstIndex { $0.key == "authData" }!].value = .bytes(mutated) }
            do {
                _ = try verifier.verifyAttestation(object, keyID: try #require(sample.keyID), clientDataHash: attestation.clientDataHash,
                                                   allowedAppIDs: [sample.appID], at: attestation.time)
                Issue.record("\(sample) with \(what): accepted")
            } catch let error as VerificationError {
                #expect(error.reason == reason, "\(sample) with \(what): \(error)")
            }
        }
    }

    @Test(arguments: mappedAssertions) func assertionMutationsAreRefused(_ sample: AppleSample) throws {
        let key = try ECPublicKey(pem: sample.publicKeyPEM!)
        for assertion in sample.assertions {
            let authData = try #require(CBORDecoder.decode(assertion.object)["authenticatorData"]?.bytesValue)
            for (what, change, reason) in Self.changes {
                let mutated = change(authData, 37)
                #expect(mutated != authData, "\(what) changed nothing")
                let object = try rewrite(assertion.object) { $0[$0.firstIndex { $0.key == "authenticatorData" }!].value = .bytes(mutated) }
                do {
                    _ = try verifier.verifyAssertion(object, publicKey: key, clientDataHash: assertion.clientDataHash, appID: sample.appID,
                                                     previousCounter: assertion.previousCounter)
                    Issue.record("\(sample) with \(what): accepted")
                } catch let error as VerificationError {
                    #expect(error.reason == reason, "\(sample) with \(what): \(error)")
                }
            }
        }
    }

    /// A map added to an assertion of the 2020 format frames well, and then the signature fails.
    @Test(arguments: oldAssertions) func mapInAnOldAssertionIsASignatureFailure(_ sample: AppleSample) throws {
        let key = try ECPublicKey(pem: sample.publicKeyPEM!)
        let assertion = try #require(sample.assertions.first)
        let authData = try #require(CBORDecoder.decode(assertion.object)["authenticatorData"]?.bytesValue)
        #expect(authData.count == 37)
        let object = try rewrite(assertion.object) {
            $0[$0.firstIndex { $0.key == "authenticatorData" }!].value = .bytes(authData + CBOREncoder.encode(.map(AuthenticatorExtensionTests.iosMap)))
        }
        expectReason(.signatureInvalid) {
            _ = try verifier.verifyAssertion(object, publicKey: key, clientDataHash: assertion.clientDataHash, appID: sample.appID, previousCounter: 0)
        }
    }
}
