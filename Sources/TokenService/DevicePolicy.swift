import AppAttest
import Foundation

/// Which builds an integration admits, from what iOS 27 and macOS 27 devices say in their
/// authenticator data: where the build came from, its version, and the platform. Checked at
/// registration and again at every refresh, against the policy as it is then (the integration
/// row is read on every exchange, so a change applies on the next request of every instance).
public struct DevicePolicy: Sendable, Equatable {
    /// The distribution channels admitted, per environment. Categories that are never an app
    /// of the operator's (`invalid`, `os`, `restricted`, `unknown`) cannot be listed.
    public var distribution: [AttestationEnvironment: Set<Distribution>]
    /// Devices reporting a lower bundle version (compared as dotted numbers) are refused.
    public var minBundleVersion: BundleVersion?
    /// Refuse devices that write no extension map (iOS 26 and earlier).
    public var requireExtensions: Bool
    public var platforms: Set<DevicePlatform>
    /// A device whose latest Apple fraud-risk metric is above this is refused at its next token
    /// refresh (0: no limit). Its tokens in flight stay valid: Apple advises against blocking at once on one number.
    public var riskLimit: Int

    public static let defaultDistribution: [AttestationEnvironment: Set<Distribution>] =
        [.production: [.appStore, .testflight], .development: [.development]]

    public init(distribution: [AttestationEnvironment: Set<Distribution>] = defaultDistribution, minBundleVersion: BundleVersion? = nil,
                requireExtensions: Bool = false, platforms: Set<DevicePlatform> = Set(DevicePlatform.allCases), riskLimit: Int = 0) {
        self.distribution = distribution
        self.minBundleVersion = minBundleVersion
        self.requireExtensions = requireExtensions
        self.platforms = platforms
        self.riskLimit = riskLimit
    }

    public func admitted(_ environment: AttestationEnvironment) -> Set<Distribution> { distribution[environment] ?? [] }

    // MARK: Decisions

    /// A new device: its platform, its map, where its build came from and its version.
    /// - Parameters:
    ///   - monitored: the rules that only watch; what they would refuse is added to `watched`
    ///     and the device goes on as if the rule were absent.
    public func checkRegistration(_ app: AttestedApp, platform: DevicePlatform, environment: AttestationEnvironment,
                                  monitored: Set<PolicyRule> = [], watched: inout [Rejection]) throws {
        try Self.watching(monitored, &watched) { try checkPlatform(platform) }
        try checkBuild(app, environment: environment, bundleVersion: app.bundleVersion, monitored: monitored, watched: &watched)
    }

    public func checkRegistration(_ app: AttestedApp, platform: DevicePlatform, environment: AttestationEnvironment) throws {
        var watched: [Rejection] = []
        try checkRegistration(app, platform: platform, environment: environment, watched: &watched)
    }

    /// A registered device refreshing: the same rules against the policy as it is now, and the
    /// category it registered with must not change (never a rule to watch: always refused).
    public func checkRefresh(_ app: AttestedApp, device: Device, monitored: Set<PolicyRule> = [], watched: inout [Rejection]) throws {
        try Self.watching(monitored, &watched) { try checkPlatform(device.platform ?? app.platform) }
        if let registered = device.validationCategory, app.validationCategory != registered {
            let now = app.validationCategory.map { "\($0) (\(Distribution(category: $0).rawValue))" } ?? "none"
            throw Rejection(.invalidGrant, .categoryChanged,
                            "registered with validation category \(registered) (\(Distribution(category: registered).rawValue)), now \(now)")
        }
        // A device that wrote no version now (an older system) is held to the one it registered with.
        try checkBuild(app, environment: device.environment, bundleVersion: app.bundleVersion ?? device.bundleVersion,
                       monitored: monitored, watched: &watched)
        try Self.watching(monitored, &watched) { try checkRisk(device) }
    }

    public func checkRefresh(_ app: AttestedApp, device: Device) throws {
        var watched: [Rejection] = []
        try checkRefresh(app, device: device, watched: &watched)
    }

    /// Runs one rule's check: its rejection propagates when the rule is enforced, and is added to
    /// `watched` instead when it is monitored.
    static func watching(_ monitored: Set<PolicyRule>, _ watched: inout [Rejection], _ check: () throws -> Void) throws {
        do { try check() } catch let rejection as Rejection {
            guard let rule = PolicyRule(rejection.reason), monitored.contains(rule) else { throw rejection }
            watched.append(rejection)
        }
    }

    /// The metric of the device's latest refreshed receipt against the limit (no metric yet: admitted).
    public func checkRisk(_ device: Device) throws {
        guard riskLimit > 0, let metric = device.risk?.metric, metric > riskLimit else { return }
        throw Rejection(.invalidGrant, .riskMetricTooHigh, "Apple's risk metric for the device is \(metric), above the integration's limit \(riskLimit)")
    }

    func checkPlatform(_ platform: DevicePlatform) throws {
        guard platforms.contains(platform) else {
            throw Rejection(.invalidGrant, .platformNotAllowed,
                            "\(platform.rawValue) devices are not admitted (platforms \(Self.describe(platforms)))")
        }
    }

    /// The build's three rules (extension map, distribution channel, bundle version), each watched apart.
    func checkBuild(_ app: AttestedApp, environment: AttestationEnvironment, bundleVersion: String?,
                    monitored: Set<PolicyRule>, watched: inout [Rejection]) throws {
        try Self.watching(monitored, &watched) {
            guard app.extensions != nil || !requireExtensions else {
                throw Rejection(.invalidGrant, .extensionsMissing, "the device wrote no extension map (iOS 26 or earlier) and the policy requires one")
            }
        }
        if let category = app.validationCategory {
            let distribution = Distribution(category: category)
            func refusal() -> Rejection {
                Rejection(.invalidGrant, .distributionNotAllowed, "\(distribution.rawValue) (category \(category)) builds are not admitted in "
                          + "\(environment.rawValue) (admitted: \(Self.describe(admitted(environment))))")
            }
            // Builds that are never an app of the operator's (invalid, os, restricted, unknown) are
            // refused whatever the mode: watching must not open the door to them.
            if distribution.isAlwaysRefused { throw refusal() }
            try Self.watching(monitored, &watched) {
                guard admitted(environment).contains(distribution) else { throw refusal() }
            }
        }
        try Self.watching(monitored, &watched) {
            guard let minimum = minBundleVersion, let reported = bundleVersion else { return }
            guard let version = BundleVersion(reported) else {
                throw Rejection(.invalidGrant, .bundleVersionTooOld,
                                "bundle version '\(reported.prefix(64))' is not dotted numbers, so not known to be at least \(minimum)")
            }
            guard version >= minimum else {
                throw Rejection(.invalidGrant, .bundleVersionTooOld, "bundle version \(reported) is below the minimum \(minimum)")
            }
        }
    }

    // MARK: Text

    public static func describe(_ platforms: Set<DevicePlatform>) -> String {
        platforms.map(\.rawValue).sorted().joined(separator: ",")
    }

    public static func describe(_ set: Set<Distribution>) -> String {
        set.isEmpty ? "none" : set.sorted().map(\.rawValue).joined(separator: ",")
    }

    /// The policy in one line, for the audit trail and the CLI.
    public var summary: String {
        "distribution production=\(Self.describe(admitted(.production))) development=\(Self.describe(admitted(.development))), "
            + "min_bundle_version \(minBundleVersion?.description ?? "none"), require_extensions \(requireExtensions), "
            + "platforms \(Self.describe(platforms)), risk_limit \(riskLimit == 0 ? "none" : String(riskLimit))"
    }

    /// A column's comma-separated distribution names (unknown names are dropped: never admitted).
    public static func distributions(fromColumn text: String) -> Set<Distribution> {
        Set(text.split(separator: ",").compactMap { Distribution(rawValue: String($0)) }.filter { !$0.isAlwaysRefused })
    }

    public static func column(_ set: Set<Distribution>) -> String { set.sorted().map(\.rawValue).joined(separator: ",") }
}

/// A bundle version as dotted numbers (`1.2.10` > `1.2.9`; missing components count as 0).
public struct BundleVersion: Sendable, Comparable, CustomStringConvertible {
    public let components: [UInt64]
    public let description: String

    /// Nil unless the text is 1 to 8 dot-separated decimal numbers (each at most 18 digits).
    public init?(_ text: String) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...8).contains(parts.count) else { return nil }
        var components: [UInt64] = []
        for part in parts {
            guard (1...18).contains(part.count), part.utf8.allSatisfy({ (0x30...0x39).contains($0) }), let n = UInt64(part) else { return nil }
            components.append(n)
        }
        self.components = components
        description = text
    }

    public static func < (a: BundleVersion, b: BundleVersion) -> Bool {
        for i in 0..<max(a.components.count, b.components.count) {
            let x = i < a.components.count ? a.components[i] : 0
            let y = i < b.components.count ? b.components[i] : 0
            if x != y { return x < y }
        }
        return false
    }

    public static func == (a: BundleVersion, b: BundleVersion) -> Bool { !(a < b) && !(b < a) }
}
