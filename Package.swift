// swift-tools-version:6.0
// App Attest token service: verification core, token service, HTTP server, client module.
import PackageDescription

let package = Package(
    name: "AppAttestService",
    platforms: [.macOS(.v13), .iOS(.v16)],
    products: [
        .library(name: "AttestClient", targets: ["AttestClient"]),
        .executable(name: "attestd", targets: ["attestd"]),
        .executable(name: "attestctl", targets: ["attestctl"]),
    ],
    targets: [
        // System libraries from Debian (`make deps` installs them).
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CMicroHTTPD", pkgConfig: "libmicrohttpd", providers: [.apt(["libmicrohttpd-dev"])]),
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),

        // Verification core.
        .target(name: "CBOR"),
        .target(name: "AttestCrypto", dependencies: ["COpenSSL"]),
        .target(name: "AppAttest", dependencies: ["CBOR", "AttestCrypto"]),
        // The project's own test authority: issues Apple-format attestations for tests and simulation.
        .target(name: "TestAuthority", dependencies: ["CBOR", "AttestCrypto", "AppAttest"],
                path: "Fixtures/TestAuthority"),

        // Service.
        .target(name: "TokenService", dependencies: ["AppAttest", "AttestCrypto"]),
        .target(name: "SQLiteStore", dependencies: ["TokenService", "AttestCrypto", "CSQLite"]),
        .target(name: "HTTPServer", dependencies: ["CMicroHTTPD"]),
        // Client for the upstream Messages API: libcurl multi on one event thread.
        .target(name: "UpstreamClient", dependencies: ["CCurl"], swiftSettings: [.swiftLanguageMode(.v6)]),
        // The service's HTTP API: routes from HTTP requests to the token service and back.
        .target(name: "ServiceRoutes", dependencies: ["TokenService", "HTTPServer", "AttestCrypto"]),

        // Device side: the client module, and a simulated device on the test authority (never shipped in apps).
        .target(name: "AttestClient", dependencies: ["AttestCrypto"]),
        .target(name: "SimulatedDevice", dependencies: ["AttestClient", "TestAuthority", "AttestCrypto", "AppAttest"]),

        .executableTarget(name: "attestd", dependencies: ["ServiceRoutes", "TokenService", "SQLiteStore", "HTTPServer", "AppAttest", "AttestCrypto"]),
        .executableTarget(name: "attestctl", dependencies: ["TokenService", "SQLiteStore", "AppAttest", "TestAuthority", "AttestClient", "SimulatedDevice", "CBOR"]),

        // Test support, never linked into the shipped binaries: a stub of the upstream Messages
        // API on raw sockets, and the same as a stand-alone executable for scripts and benchmarks.
        .target(name: "UpstreamStub", dependencies: ["COpenSSL"], path: "Tests/Support/UpstreamStub",
                swiftSettings: [.swiftLanguageMode(.v6)]),
        .executableTarget(name: "upstream-stub", dependencies: ["UpstreamStub"], path: "Tests/Support/upstream-stub",
                          swiftSettings: [.swiftLanguageMode(.v6)]),

        .testTarget(name: "CBORTests", dependencies: ["CBOR"]),
        .testTarget(name: "AppAttestTests", dependencies: ["AppAttest", "TestAuthority", "AttestCrypto", "CBOR"]),
        .testTarget(name: "TokenServiceTests", dependencies: ["TokenService", "SQLiteStore", "TestAuthority", "AttestCrypto"]),
        .testTarget(name: "ServiceTests", dependencies: ["ServiceRoutes", "TokenService", "SQLiteStore", "HTTPServer", "TestAuthority", "AttestClient", "SimulatedDevice", "AppAttest"]),
        .testTarget(name: "AttestClientTests", dependencies: ["AttestClient"]),
        .testTarget(name: "HTTPServerTests", dependencies: ["HTTPServer"]),
        .testTarget(name: "CLITests", dependencies: ["SQLiteStore", "TokenService"]),
        .testTarget(name: "UpstreamClientTests", dependencies: ["UpstreamClient", "UpstreamStub"],
                    swiftSettings: [.swiftLanguageMode(.v6)]),
    ],
    swiftLanguageModes: [.v5]
)
