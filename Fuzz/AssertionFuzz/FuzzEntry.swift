// libFuzzer entry point for whole-assertion verification (`make fuzz-assertion`): CBOR decoding,
// authenticator data (the iOS 27 / macOS 27 extension map after the header, framed by position),
// the ECDSA signature over it, the RP ID and the counter, as the token
// endpoint runs them. Built with swiftc from the sources of CBOR, AttestCrypto, AttestWire and
// AppAttest compiled as one module (the Makefile gives their `import`s empty stand-ins).
//
// The key is a fixed throwaway one (fuzzing only), so a corpus stays valid from run to run;
// `ASSERTION_SEEDS=DIR` writes a valid assertion there (the seed mutations start from) and two
// that must fail. The input's first four bytes are the previous counter (big-endian, as in authenticator data, so
// libFuzzer's comparison tracing can swap in the value the check compared it with), so mutated
// counters, signatures and RP ID hashes all reach their checks.

import Foundation

final class Fixture: @unchecked Sendable {
    let key: ECPrivateKey
    let publicKey: ECPublicKey
    let verifier: AppAttestVerifier
    let appID = AppID(teamID: "ABCDE12345", bundleID: "com.example.fuzz")
    let clientDataHash = sha256(Array("fuzz client data".utf8))

    init() {
        key = try! ECPrivateKey(pem: Self.throwawayKey)
        publicKey = try! key.publicKey()
        verifier = AppAttestVerifier(anchors: [])
    }

    /// Made for this fuzzer alone with `openssl ecparam -name prime256v1 -genkey`; it signs nothing else.
    static let throwawayKey = """
        -----BEGIN PRIVATE KEY-----
        MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgrAYoAgstfgF9vPUp
        gqzID59mCMqlSc8VtS/ldm8rWQmhRANCAATO71YFAz8gqnCib2doyEJ+3Emaz3zj
        YqjS7alQEsK98bd4d4gmPAPP3SFvBbdcPzx3HSqySsU9DqupNSmlfBkp
        -----END PRIVATE KEY-----
        """

    /// A valid assertion with counter 7 for this key; with `map`, the iOS 27 extension map after
    /// the header (and AT and ED set, as shipping devices set them).
    func validAssertion(map: Bool = false) -> [UInt8] {
        let extensions = CBOREncoder.encode(.map([CBORMapEntry("apple_bundle_version_01", "1314"),
                                                  CBORMapEntry("apple_validation_category_01", .bytes([3, 0, 0, 0]))]))
        let authData = appID.rpIDHash + [map ? 0xc0 : 0x40, 0x00, 0x00, 0x00, 0x07] + (map ? extensions : [])
        let signature = try! key.signSHA256(sha256(authData, clientDataHash))
        return CBOREncoder.encode(.map([CBORMapEntry(.text("signature"), .bytes(signature)),
                                        CBORMapEntry(.text("authenticatorData"), .bytes(authData))]))
    }
}

let fixture = Fixture()

@_cdecl("LLVMFuzzerInitialize")
public func fuzzInitialize(_ argc: UnsafeMutablePointer<CInt>?, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>?) -> CInt {
    if let directory = ProcessInfo.processInfo.environment["ASSERTION_SEEDS"] {
        // The assertion after three previous counters: under its 7 (verifies), equal and above (must
        // not): a counter check that lets an equal counter through fails on the seeds themselves.
        let assertion = fixture.validAssertion()
        for (name, previous) in [("valid", 6), ("same-counter", 7), ("older-counter", 8)] as [(String, UInt8)] {
            FileManager.default.createFile(atPath: directory + "/" + name, contents: Data([0, 0, 0, previous] + assertion))
        }
        let mapped = fixture.validAssertion(map: true)
        FileManager.default.createFile(atPath: directory + "/valid-with-map", contents: Data([0, 0, 0, 6] + mapped))
        guard let verified = try? fixture.verifier.verifyAssertion(mapped, publicKey: fixture.publicKey, clientDataHash: fixture.clientDataHash,
                                                                   appID: fixture.appID, previousCounter: 6),
              verified.app.bundleVersion == "1314", verified.app.validationCategory == 3 else {
            fatalError("the seed assertion with a map does not verify or is misread")
        }
        if (try? fixture.verifier.verifyAssertion(assertion, publicKey: fixture.publicKey, clientDataHash: fixture.clientDataHash,
                                                  appID: fixture.appID, previousCounter: 6)) == nil {
            fatalError("the seed assertion does not verify")
        }
    }
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzAssertion(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size >= 4 else { return 0 }
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let previous = UInt32(bytes[0]) << 24 | UInt32(bytes[1]) << 16 | UInt32(bytes[2]) << 8 | UInt32(bytes[3])
    let object = Array(bytes.dropFirst(4))
    if let verified = try? fixture.verifier.verifyAssertion(object, publicKey: fixture.publicKey, clientDataHash: fixture.clientDataHash,
                                                             appID: fixture.appID, previousCounter: previous) {
        // Whatever verifies must really be signed by the key and newer than the previous counter.
        precondition(verified.counter > previous, "a counter that did not increase was accepted")
        // And was framed by position: a map was read exactly when bytes follow the 37-byte header.
        if let authData = (try? CBORDecoder.decode(object))?["authenticatorData"]?.bytesValue {
            precondition((authData.count > 37) == (verified.app.extensions != nil), "a tail was ignored or a map invented")
        }
    }
    return 0
}
