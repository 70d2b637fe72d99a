import AppAttest
import CBOR
import Foundation
import Testing
import TokenService

/// The device policy's decisions, rule by rule (the end-to-end tests run the same rules through
/// the shipped binaries).
@Suite struct DevicePolicyTests {
    static func app(category: UInt32? = 3, version: String? = "1", mac: Bool = false, map: Bool = true) throws -> AttestedApp {
        guard map else { return AttestedApp(flags: 0x40, extensions: nil) }
        var entries: [CBORMapEntry] = []
        if mac { entries.append(CBORMapEntry("apple_cd_hash_type_01", .bytes([2]))) }
        if let version { entries.append(CBORMapEntry("apple_bundle_version_01", .text(version))) }
        if let category { entries.append(CBORMapEntry("apple_validation_category_01", .unsigned(UInt64(category)))) }
        return AttestedApp(flags: 0xc0, extensions: try AuthenticatorExtensions.decode(CBOREncoder.encode(.map(entries))))
    }

    static func device(category: UInt32? = 3, version: String? = "1", platform: DevicePlatform? = .ios,
                       environment: AttestationEnvironment = .development) -> Device {
        Device(keyID: [UInt8](repeating: 1, count: 32), clientID: "clid_x", publicKey: [], counter: 1, environment: environment, appID: "A.b",
               platform: platform, validationCategory: category, bundleVersion: version)
    }

    func reason(_ body: () throws -> Void) -> RejectionReason? {
        do { try body(); return nil } catch let rejection as Rejection { return rejection.reason } catch { return .internalError }
    }

    @Test func bundleVersionsCompareAsDottedNumbers() throws {
        func v(_ text: String) throws -> BundleVersion { try #require(BundleVersion(text)) }
        #expect(try v("1.2.10") > v("1.2.9"))
        #expect(try v("2") == v("2.0.0"))
        #expect(try v("10") > v("9.99"))
        #expect(try v("1314") > v("1313.9"))
        for bad in ["", "1..2", ".1", "1.", "1.a", "v1", "-1", "1 .2", "1.2.3.4.5.6.7.8.9", String(repeating: "9", count: 19)] {
            #expect(BundleVersion(bad) == nil, "\(bad)")
        }
    }

    @Test func registrationRulesInOrder() throws {
        let policy = DevicePolicy()
        #expect(reason { try policy.checkRegistration(try Self.app(), platform: .ios, environment: .development) } == nil)
        #expect(reason { try policy.checkRegistration(try Self.app(category: 4), platform: .ios, environment: .development) } == .distributionNotAllowed)
        #expect(reason { try policy.checkRegistration(try Self.app(category: 4), platform: .ios, environment: .production) } == nil)
        for never: UInt32 in [0, 1, 7, 8, 9, 11, 1000] {
            var open = DevicePolicy()
            open.distribution = [.production: Set(Distribution.allCases), .development: Set(Distribution.allCases)]
            #expect(reason { try open.checkRegistration(try Self.app(category: never), platform: .ios, environment: .production) } == .distributionNotAllowed,
                    "category \(never) must never be admitted")
        }
        var strict = DevicePolicy(minBundleVersion: BundleVersion("2"), requireExtensions: true, platforms: [.ios])
        #expect(reason { try strict.checkRegistration(try Self.app(map: false), platform: .ios, environment: .development) } == .extensionsMissing)
        #expect(reason { try strict.checkRegistration(try Self.app(version: "1.9"), platform: .ios, environment: .development) } == .bundleVersionTooOld)
        #expect(reason { try strict.checkRegistration(try Self.app(version: "2.0b"), platform: .ios, environment: .development) } == .bundleVersionTooOld)
        #expect(reason { try strict.checkRegistration(try Self.app(version: "2.0.1"), platform: .ios, environment: .development) } == nil)
        #expect(reason { try strict.checkRegistration(try Self.app(mac: true), platform: .macos, environment: .development) } == .platformNotAllowed)
        // A Mac writes no bundle version: a minimum holds only devices that report one.
        strict.platforms = [.ios, .macos]
        #expect(reason { try strict.checkRegistration(try Self.app(version: nil, mac: true), platform: .macos, environment: .development) } == nil)
    }

    @Test func refreshKeepsTheRegisteredCategory() throws {
        let policy = DevicePolicy()
        #expect(reason { try policy.checkRefresh(try Self.app(), device: Self.device()) } == nil)
        #expect(reason { try policy.checkRefresh(try Self.app(category: 2), device: Self.device()) } == .categoryChanged)
        #expect(reason { try policy.checkRefresh(try Self.app(map: false), device: Self.device()) } == .categoryChanged)
        // A device that registered without one (an older system) may start writing one, which the policy then judges.
        #expect(reason { try policy.checkRefresh(try Self.app(), device: Self.device(category: nil)) } == nil)
        #expect(reason { try policy.checkRefresh(try Self.app(category: 4), device: Self.device(category: nil)) } == .distributionNotAllowed)
        // The minimum applies to the version the device writes now, else to the one it registered with.
        let minimum = DevicePolicy(minBundleVersion: BundleVersion("5"))
        #expect(reason { try minimum.checkRefresh(try Self.app(version: "4"), device: Self.device(version: "5")) } == .bundleVersionTooOld)
        #expect(reason { try minimum.checkRefresh(try Self.app(version: nil), device: Self.device(version: "4")) } == .bundleVersionTooOld)
        #expect(reason { try minimum.checkRefresh(try Self.app(version: "5"), device: Self.device(version: "4")) } == nil)
        // The platform it registered as is the one judged.
        let iosOnly = DevicePolicy(platforms: [.ios])
        #expect(reason { try iosOnly.checkRefresh(try Self.app(mac: true), device: Self.device(platform: .macos)) } == .platformNotAllowed)
        #expect(reason { try iosOnly.checkRefresh(try Self.app(mac: true), device: Self.device(platform: nil)) } == .platformNotAllowed)
    }
}
