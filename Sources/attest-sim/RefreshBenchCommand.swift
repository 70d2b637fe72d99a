import AppAttest
import AppleDataService
import AttestCrypto
import CommandLineSupport
import Foundation
import ReceiptRefresh
import SQLiteStore
import TestAuthority
import TokenService
import UpstreamClient
import UpstreamStub

/// `attest-sim bench refresh`: the receipt-refresh job against a TLS stub of Apple's data service
/// on loopback, with N devices due in a SQLite database: at the default rate cap, then uncapped,
/// and the baseline of the same HTTPS posts made by one client with no database and no validation.
enum RefreshBenchCommand {
    static let usage = """
        usage: attest-sim bench refresh [--devices N] [--seconds S] [--rate PER_SECOND]
          N devices due (default 100000), the job run S seconds (default 20) at --rate (default the job's cap,
          20/s) and S seconds uncapped, against S seconds of bare HTTPS posts to the same stub
        """

    static func run(_ argv: [String]) throws -> Int32 {
        if wantsHelp(argv) { print(usage); return 0 }
        let arguments = try Arguments(argv, options: ["devices", "seconds", "rate"])
        let devices = try arguments.integer("devices", default: 100_000, range: 1...10_000_000)!
        let seconds = Double(try arguments.integer("seconds", default: 20, range: 1...3600)!)
        let rate = Double(try arguments.integer("rate", default: Int(ReceiptRefreshConfiguration().requestsPerSecond), range: 1...100_000)!)
        BenchCommand.warnIfDebugBuild()

        // One device's receipt and certificate, shared by every row: the stub answers each post
        // with a refreshed receipt for that certificate, which the job validates as for a real device.
        let authority = TestReceiptAuthority.shared
        let certificate = Array("bench credential certificate".utf8)
        let appID = "ABCDE12345.com.example.bench"
        var attest = TestReceiptAuthority.Fields(appID: appID, attestedCertificate: certificate, clientHash: Array(repeating: 1, count: 32),
                                                 createdAt: Date())
        attest.environment = "production"
        let receipt = try authority.receipt(attest)
        let fields = attest

        let certificates = try StubCertificates.generate()
        defer { certificates.remove() }
        var configuration = UpstreamStubConfiguration(tls: certificates.tlsFiles)
        configuration.handler = { _ in
            guard let refreshed = try? authority.receipt(fields.refreshed(at: Date(), riskMetric: 2)) else { return StubResponse(status: 500) }
            return StubResponse(status: 200, body: Array(Data(refreshed).base64EncodedString().utf8))
        }
        let stub = try UpstreamStubServer(configuration)
        defer { stub.stop() }
        let url = stub.baseURL + "/v1/attestationData"
        let bundle = try CABundle.systemRoots(adding: certificates.caPath)

        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("refresh-bench-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteTokenStore(path: directory.appendingPathComponent("bench.sqlite").path, synchronous: "NORMAL")
        let secrets = try SecretBox(key: secureRandomBytes(SecretBox.keyLength))
        let admin = AdminService(store: store)
        _ = try admin.initialize(owner: "bench@example.com")
        let integration = try admin.createIntegration(actor: "bench@example.com", name: "Bench", teamID: "ABCDE12345", bundleIDs: ["com.example.bench"])
        let p8 = try ECPrivateKey.generate().pem
        try admin.setAppleKey(actor: "bench@example.com", teamID: "ABCDE12345", keyID: "BENCHKEY01", p8: p8, secrets: secrets)

        let start = Date()
        let fill = DispatchTime.now().uptimeNanoseconds
        for _ in 0..<devices {
            let keyID = secureRandomBytes(32)
            let device = Device(keyID: keyID, clientID: integration.clientID, publicKey: [4] + secureRandomBytes(64), counter: 0,
                                environment: .production, appID: appID)
            let token = TokenRecord(tokenHash: secureRandomBytes(32), clientID: integration.clientID, workspaceID: integration.workspaceID,
                                    keyID: keyID, issuedAt: start, expiresAt: start + 3600)
            _ = try store.registerDevice(device, receipt: DeviceReceipt(der: receipt, credentialCertificate: certificate,
                                                                        risk: DeviceRisk(receiptCreatedAt: start, receiptExpiresAt: start + 90 * 86_400),
                                                                        refreshDueAt: start - 1),
                                         firstToken: token, redeeming: nil, nextChallenge: IssuedChallenge(bytes: secureRandomBytes(32), expiresAt: start + 300),
                                         quota: nil, at: start, commitTime: { start })
        }
        print("devices_due: \(devices) (stored in \(String(format: "%.1f", Double(DispatchTime.now().uptimeNanoseconds - fill) / 1e9)) s)")
        let claimStart = DispatchTime.now().uptimeNanoseconds
        let probe = try store.claimDueReceipts(at: Date(), lease: 1, limit: 100, claim: "probe")
        print("claim_100_of_\(devices)_ms: \(String(format: "%.2f", Double(DispatchTime.now().uptimeNanoseconds - claimStart) / 1e6))")
        for item in probe { _ = try store.finishReceiptRefresh(ReceiptRefreshOutcome(keyID: item.keyID, claim: item.claim, receipt: nil,
                                                                                   checkedAt: Date(), nextDue: start - 1)) }

        // The bare client: the same HTTPS posts, nothing else.
        let client = try AppleDataClient(caBundle: bundle)
        let token = try ProviderToken.make(try AppleDataKey(teamID: "ABCDE12345", keyID: "BENCHKEY01", p8: p8), at: Date())
        var posts = 0
        let bareStart = DispatchTime.now().uptimeNanoseconds
        while Double(DispatchTime.now().uptimeNanoseconds - bareStart) / 1e9 < seconds {
            guard try client.post(url: url, receipt: receipt, authorization: token).status == 200 else { throw UsageError("the stub refused a post") }
            posts += 1
        }
        let bareRate = Double(posts) / (Double(DispatchTime.now().uptimeNanoseconds - bareStart) / 1e9)

        func job(rate: Double) throws -> (perSecond: Double, cpuMicroseconds: Double) {
            var settings = ReceiptRefreshConfiguration()
            settings.productionURL = url
            settings.developmentURL = url
            settings.caBundle = bundle
            settings.requestsPerSecond = rate
            let metrics = Metrics()
            let job = ReceiptRefreshJob(store: store, verifier: authority.verifier(),
                                        secrets: SecretsKeySource(path: "", loaded: secrets),
                                        configuration: settings, metrics: metrics, report: { event, fields, isError in
                if isError { FileHandle.standardError.write(Data("\(event) \(fields)\n".utf8)) }
            })
            let cpuBefore = cpuSeconds()
            let begin = DispatchTime.now().uptimeNanoseconds
            try job.run()
            Thread.sleep(forTimeInterval: seconds)
            job.stop(by: .now + .seconds(30))
            let elapsed = Double(DispatchTime.now().uptimeNanoseconds - begin) / 1e9
            let done = metrics.prometheusText().split(separator: "\n")
                .first { $0.hasPrefix(#"attestd_receipt_refreshes_total{outcome="refreshed"}"#) }
                .flatMap { Double($0.split(separator: " ").last ?? "") } ?? 0
            return (done / elapsed, done > 0 ? (cpuSeconds() - cpuBefore) / done * 1e6 : 0)
        }
        let capped = try job(rate: rate)
        let uncapped = try job(rate: 100_000)
        print("bare_https_posts_per_second: \(BenchCommand.format(bareRate))")
        print("refreshes_per_second_at_cap_\(Int(rate)): \(BenchCommand.format(capped.perSecond))")
        print("refreshes_per_second_uncapped: \(BenchCommand.format(uncapped.perSecond))")
        print("uncapped_ratio_to_bare_posts: \(String(format: "%.3f", uncapped.perSecond / bareRate))")
        print("cpu_microseconds_per_refresh_uncapped: \(BenchCommand.format(uncapped.cpuMicroseconds))")
        print("hours_to_refresh_\(devices)_at_cap: \(String(format: "%.2f", Double(devices) / capped.perSecond / 3600))")
        return 0
    }

    /// User plus system CPU time of this process (the stub's threads included).
    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }
}
