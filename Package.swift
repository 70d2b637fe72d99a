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
        .systemLibrary(name: "CPostgres", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),

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
        // `TokenStore` on PostgreSQL through libpq, for several attestd instances on one database.
        .target(name: "PostgresStore", dependencies: ["TokenService", "AttestCrypto", "CPostgres"],
                swiftSettings: [.swiftLanguageMode(.v6)]),
        .target(name: "HTTPServer", dependencies: ["CMicroHTTPD"]),
        // The service's HTTP API: routes from HTTP requests to the token service and back.
        .target(name: "ServiceRoutes", dependencies: ["TokenService", "HTTPServer", "AttestCrypto"]),

        // Device side: the client module, and a simulated device on the test authority (never shipped in apps).
        .target(name: "AttestClient", dependencies: ["AttestCrypto"]),
        .target(name: "SimulatedDevice", dependencies: ["AttestClient", "TestAuthority", "AttestCrypto", "AppAttest"]),

        .executableTarget(name: "attestd", dependencies: ["ServiceRoutes", "TokenService", "SQLiteStore", "HTTPServer", "AppAttest", "AttestCrypto"]),
        .executableTarget(name: "attestctl", dependencies: ["TokenService", "SQLiteStore", "AppAttest", "TestAuthority", "AttestClient", "SimulatedDevice", "CBOR"]),

        .testTarget(name: "CBORTests", dependencies: ["CBOR"]),
        .testTarget(name: "AppAttestTests", dependencies: ["AppAttest", "TestAuthority", "AttestCrypto", "CBOR"]),
        .testTarget(name: "TokenServiceTests", dependencies: ["TokenService", "SQLiteStore", "TestAuthority", "AttestCrypto"]),
        .testTarget(name: "ServiceTests", dependencies: ["ServiceRoutes", "TokenService", "SQLiteStore", "HTTPServer", "TestAuthority", "AttestClient", "SimulatedDevice", "AppAttest"]),
        .testTarget(name: "AttestClientTests", dependencies: ["AttestClient"]),
        .testTarget(name: "HTTPServerTests", dependencies: ["HTTPServer"]),
        .testTarget(name: "CLITests", dependencies: ["SQLiteStore", "TokenService"]),
        // A throwaway PostgreSQL cluster (initdb + pg_ctl) for any test target that needs a real server.
        .target(name: "PostgresTestSupport", dependencies: ["PostgresStore"], path: "Tests/Support/PostgresCluster",
                swiftSettings: [.swiftLanguageMode(.v6)]),
        // One store suite over both backends, against a throwaway PostgreSQL cluster it starts itself.
        .testTarget(name: "StoreTests", dependencies: ["SQLiteStore", "PostgresStore", "PostgresTestSupport", "TokenService", "AttestCrypto"],
                    swiftSettings: [.swiftLanguageMode(.v6)]),
    ],
    swiftLanguageModes: [.v5]
)
