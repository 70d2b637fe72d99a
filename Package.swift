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
        .executable(name: "attest-sim", targets: ["attest-sim"]),
    ],
    targets: [
        // System libraries from Debian (`make deps` installs them).
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CMicroHTTPD", pkgConfig: "libmicrohttpd", providers: [.apt(["libmicrohttpd-dev"])]),
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),
        .systemLibrary(name: "CPostgres", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),

        // The wire protocol alone (paths, client-data hashes, encodings, JSON shapes): no
        // dependencies, so it builds for iOS along with the client module.
        .target(name: "AttestWire"),

        // The Messages API's JSON read and edited as bytes, no dependencies (fuzzed by `make
        // fuzz-relay`): the member scan, the policy's fields, usage from replies and streams, the
        // cloud body edit, and the values they produce (`PolicyInput`, `TokenUsage`).
        .target(name: "MessagesBody"),

        // Verification core.
        .target(name: "CBOR"),
        .target(name: "AttestCrypto", dependencies: ["COpenSSL", "AttestWire"]),
        .target(name: "AppAttest", dependencies: ["CBOR", "AttestCrypto", "AttestWire"]),
        // The project's own test authority: issues Apple-format attestations for tests and simulation.
        .target(name: "TestAuthority", dependencies: ["CBOR", "AttestCrypto", "AppAttest", "AttestWire"],
                path: "Fixtures/TestAuthority"),

        // Service.
        // Services that run in the background and stop in order (listeners, flushes, jobs).
        .target(name: "Lifecycle"),
        .target(name: "TokenService", dependencies: ["AppAttest", "AttestCrypto", "AttestWire", "Lifecycle", "CloudUpstreams", "MessagesBody"]),
        .target(name: "StoreRecords", dependencies: ["TokenService", "AttestCrypto", "AppAttest", "AttestWire"]),
        .target(name: "SQLiteStore", dependencies: ["TokenService", "StoreRecords", "AttestCrypto", "AttestWire", "CSQLite", "Lifecycle"]),
        // `TokenStore` on PostgreSQL through libpq, for several attestd instances on one database.
        .target(name: "PostgresStore", dependencies: ["TokenService", "StoreRecords", "AttestCrypto", "AttestWire", "CPostgres", "EventLoops"]),
        // The store a --db value names: PostgreSQL for a connection URL, SQLite for a path.
        .target(name: "Stores", dependencies: ["TokenService", "SQLiteStore", "PostgresStore", "EventLoops"]),
        // Event loops (one thread, one epoll set each) that the HTTP server and the upstream
        // client share, so that a relayed request never changes threads.
        .target(name: "CEventLoop"),
        .target(name: "CMalloc"),
        .target(name: "EventLoops", dependencies: ["CEventLoop"]),
        .target(name: "HTTPServer", dependencies: ["CMicroHTTPD", "CEventLoop", "EventLoops"]),
        // Client for the upstream Messages API: a libcurl multi handle on each event loop.
        .target(name: "UpstreamClient", dependencies: ["CCurl", "EventLoops"]),
        // Cloud upstreams' protocols, no I/O: AWS SigV4 and event streams (Bedrock), Google service-account grants (Vertex AI).
        .target(name: "CloudUpstreams", dependencies: ["COpenSSL", "AttestCrypto", "AttestWire"]),
        // Apple's App Attest data service: the ES256 provider token and one blocking HTTPS POST.
        .target(name: "AppleDataService", dependencies: ["CCurl", "UpstreamClient", "AttestCrypto", "AttestWire"]),
        // The background job that posts due receipts to Apple and stores the refreshed ones and their metric.
        .target(name: "ReceiptRefresh", dependencies: ["AppleDataService", "TokenService", "AppAttest", "AttestCrypto", "Lifecycle"]),
        // Routing, domain-free: one route table (pattern, listener, body limit, executor, error
        // shape, metric and log name per route), middleware, the access log's logger.
        .target(name: "HTTPRouting", dependencies: ["HTTPServer", "EventLoops", "AttestWire", "AttestCrypto"]),
        // The route groups, each a few lines per route: decode, call one service method, encode.
        .target(name: "ExchangeRoutes", dependencies: ["HTTPRouting", "TokenService", "AttestWire"]),
        .target(name: "TokenAuthentication", dependencies: ["HTTPRouting", "HTTPServer", "TokenService", "AttestWire"]),
        .target(name: "RelayRoutes", dependencies: ["HTTPRouting", "TokenAuthentication", "TokenService", "AttestWire", "AttestCrypto", "UpstreamClient",
                                                    "EventLoops", "CloudUpstreams", "MessagesBody"]),
        .target(name: "AdminRoutes", dependencies: ["HTTPRouting", "TokenAuthentication", "TokenService", "AttestWire", "AttestCrypto"]),
        // The operator's console at /console/ on the admin listener: server-rendered pages and
        // forms over the same AdminService as attestctl.
        .target(name: "ConsoleRoutes", dependencies: ["HTTPRouting", "HTTPServer", "TokenService", "AppAttest", "AttestWire", "AttestCrypto"]),
        // The service's HTTP API: the groups in one table, with the middleware every request runs.
        .target(name: "ServiceRoutes", dependencies: ["HTTPRouting", "ExchangeRoutes", "RelayRoutes", "AdminRoutes", "TokenService", "HTTPServer",
                                                      "AttestWire", "EventLoops"]),

        // Device side: the client module (Foundation and the wire module only; SHA-256 from
        // CryptoKit on Apple platforms, from AttestCrypto on Linux), and a simulated device on the
        // test authority (never linked into apps, nor into the operator's attestctl).
        .target(name: "AttestClient", dependencies: [
            "AttestWire",
            .target(name: "AttestCrypto", condition: .when(platforms: [.linux])),
        ]),
        .target(name: "SimulatedDevice", dependencies: ["AttestClient", "TestAuthority", "AttestCrypto", "AppAttest", "AttestWire"]),

        // Tools: a plain HTTP/1.1 client on POSIX sockets (load generator, tests) and the
        // argument parsing the command-line tools share.
        .target(name: "HTTPClient"),
        .target(name: "CommandLineSupport", dependencies: ["AttestWire", "CBuildInfo"]),
        // The version (VERSION) and the commit the binaries were built from: headers that
        // scripts/embed-version.sh writes (`--version`, the start-up log, /metrics).
        .target(name: "CBuildInfo"),

        // The daemon's wiring, as a library: a test starts the whole of attestd in process.
        .target(name: "AttestDaemon", dependencies: ["ServiceRoutes", "ConsoleRoutes", "HTTPRouting", "RelayRoutes", "TokenService", "Stores", "HTTPServer", "AppAttest",
                                                     "AttestCrypto", "EventLoops", "AttestWire", "UpstreamClient", "Lifecycle", "ReceiptRefresh", "CBuildInfo"]),
        .executableTarget(name: "attestd", dependencies: ["AttestDaemon", "CMalloc", "HTTPRouting"]),
        // The operator's tool: administration and offline verification. No test authority.
        .executableTarget(name: "attestctl", dependencies: ["TokenService", "Stores", "AppAttest", "AttestCrypto", "AttestWire", "CBOR", "CommandLineSupport"]),
        // The developer's tool: simulated devices, load generation, verification benchmarks.
        .executableTarget(name: "attest-sim", dependencies: ["AppAttest", "AttestCrypto", "AttestWire", "TestAuthority", "AttestClient",
                                                             "SimulatedDevice", "CBOR", "HTTPClient", "CommandLineSupport", "RelayRoutes",
                                                             // bench refresh: the job, a store, a TLS stub of Apple's data service
                                                             "ReceiptRefresh", "AppleDataService", "SQLiteStore", "TokenService", "UpstreamClient",
                                                             "UpstreamStub", "ProcessCPU"]),
        // attest-sim load --cpu-of: other processes' CPU (with their children) from /proc.
        .target(name: "ProcessCPU"),

        // Test support, never linked into the shipped binaries: a stub of the upstream Messages
        // API on raw sockets, and the same as a stand-alone executable for scripts and benchmarks.
        .target(name: "UpstreamStub", dependencies: ["COpenSSL"], path: "Tests/Support/UpstreamStub"),
        .executableTarget(name: "upstream-stub", dependencies: ["UpstreamStub"], path: "Tests/Support/upstream-stub"),
        // A throwaway PostgreSQL cluster that the tests start and stop themselves.
        .target(name: "PostgresTestSupport", dependencies: ["PostgresStore"], path: "Tests/Support/PostgresCluster"),
        // A raw HTTP/1.1 client on loopback sockets (every byte the server frames, any source
        // address) and a forwarding proxy that names its clients in X-Forwarded-For.
        .target(name: "RawHTTP", path: "Tests/Support/RawHTTP"),
        // A small W3C WebDriver client: the console's tests drive Debian's headless Chromium with it.
        .target(name: "WebDriver", dependencies: ["RawHTTP"], path: "Tests/Support/WebDriver"),

        .testTarget(name: "CBORTests", dependencies: ["CBOR"]),
        .testTarget(name: "AppAttestTests", dependencies: ["AppAttest", "TestAuthority", "AttestCrypto", "CBOR", "AttestWire"]),
        .testTarget(name: "TokenServiceTests", dependencies: ["TokenService", "SQLiteStore", "TestAuthority", "AttestCrypto", "AttestWire", "AppAttest", "CBOR",
                                                            "UpstreamStub"]),
        .testTarget(name: "ServiceTests", dependencies: ["ServiceRoutes", "HTTPRouting", "RelayRoutes", "MessagesBody", "ExchangeRoutes", "AdminRoutes", "AttestDaemon", "Lifecycle", "TokenService", "SQLiteStore", "HTTPServer", "TestAuthority", "AttestClient",
                                                         "SimulatedDevice", "AppAttest", "AttestWire", "HTTPClient", "UpstreamStub", "PostgresTestSupport",
                                                         "RawHTTP", "EventLoops", "WebDriver"]),
        .testTarget(name: "AttestClientTests", dependencies: ["AttestClient", "AttestWire"]),
        .testTarget(name: "AttestWireTests", dependencies: ["AttestWire"]),
        .testTarget(name: "HTTPServerTests", dependencies: ["HTTPServer", "RawHTTP", "EventLoops"]),
        .testTarget(name: "EventLoopsTests", dependencies: ["EventLoops"]),
        .testTarget(name: "HTTPClientTests", dependencies: ["HTTPClient", "HTTPServer"]),
        .testTarget(name: "CLITests", dependencies: ["SQLiteStore", "TokenService", "ProcessCPU", "UpstreamStub"]),
        .testTarget(name: "UpstreamClientTests", dependencies: ["UpstreamClient", "UpstreamStub"]),
        .testTarget(name: "CloudUpstreamsTests", dependencies: ["CloudUpstreams", "COpenSSL"]),
        .testTarget(name: "AppleDataServiceTests", dependencies: ["AppleDataService", "AttestCrypto", "AttestWire", "UpstreamClient", "UpstreamStub"]),
        .testTarget(name: "StoreTests", dependencies: ["SQLiteStore", "PostgresStore", "StoreRecords", "PostgresTestSupport", "TokenService", "AttestCrypto", "CSQLite",
                                                       "AttestWire", "EventLoops"]),
    ]
)
