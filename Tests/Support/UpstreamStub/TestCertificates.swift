import Foundation

/// A throwaway CA and a server certificate for 127.0.0.1 and localhost (and any DNS names asked
/// for, such as a cloud's real host names), made with the `openssl` command line tool in a
/// temporary directory (no private key is committed).
public struct StubCertificates: Sendable {
    public let directory: String
    /// The CA certificate to trust (PEM).
    public let caPath: String
    /// Server certificate followed by nothing else (the CA is the direct issuer), and its key.
    public let certificatePath: String
    public let keyPath: String

    public var tlsFiles: UpstreamStubConfiguration.TLSFiles {
        .init(certificateChainPath: certificatePath, privateKeyPath: keyPath)
    }

    /// The hosts the Bedrock and Vertex AI stubs stand in for when attestd reaches a cloud by its
    /// real name (`attestd serve --upstream-connect-to`): a certificate for these lets TLS check
    /// the real name while the connection goes to a stub on 127.0.0.1.
    public static let cloudHostNames = [
        "bedrock-runtime.us-east-1.amazonaws.com", "bedrock-runtime.eu-west-1.amazonaws.com",
        "aiplatform.googleapis.com", "us-east5-aiplatform.googleapis.com", "europe-west1-aiplatform.googleapis.com",
        "aiplatform.us.rep.googleapis.com", "aiplatform.eu.rep.googleapis.com", "oauth2.googleapis.com",
    ]

    /// Generates the pair; throws with openssl's output when it fails. The certificate names
    /// 127.0.0.1 and localhost, and each of `dnsNames` (a host name, or `*.` and a domain).
    public static func generate(dnsNames: [String] = []) throws -> StubCertificates {
        for name in dnsNames {
            let label = name.hasPrefix("*.") ? name.dropFirst(2) : Substring(name)
            guard !label.isEmpty, label.utf8.allSatisfy({ $0 == 0x2E || $0 == 0x2D || (0x30...0x39).contains($0)
                    || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) }) else {
                throw StubError("not a DNS name for a certificate: \(name)")
            }
        }
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("upstream-stub-tls-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        func path(_ name: String) -> String { directory + "/" + name }
        let altNames = (["IP:127.0.0.1", "DNS:localhost"] + dnsNames.map { "DNS:" + $0 }).joined(separator: ",")
        try "subjectAltName=\(altNames)\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            .write(toFile: path("server.ext"), atomically: true, encoding: .utf8)
        try run(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", path("ca.key"), "-out", path("ca.pem"), "-days", "2", "-subj", "/CN=Upstream stub test CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        try run(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", path("server.key"), "-out", path("server.csr"), "-subj", "/CN=127.0.0.1"])
        try run(["x509", "-req", "-in", path("server.csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
                 "-CAcreateserial", "-out", path("server.pem"), "-days", "2", "-extfile", path("server.ext")])
        return StubCertificates(directory: directory, caPath: path("ca.pem"), certificatePath: path("server.pem"),
                                keyPath: path("server.key"))
    }

    /// A fresh RSA-2048 private key, PKCS#8 PEM, as a Google service-account key file holds one.
    public static func rsaPrivateKeyPEM() throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0, text.contains("PRIVATE KEY") else { throw StubError("openssl genpkey failed") }
        return text
    }

    public func remove() {
        try? FileManager.default.removeItem(atPath: directory)
    }

    private static func run(_ arguments: [String]) throws {
        let (status, text) = try runCombined("/usr/bin/env", ["openssl"] + arguments)
        guard status == 0 else {
            throw StubError("openssl \(arguments.prefix(2).joined(separator: " ")) failed: \(text)")
        }
    }
}

/// Runs a tool with its standard output and error in one pipe; returns (status, that text).
public func runCombined(_ executable: String, _ arguments: [String], in directory: URL? = nil) throws -> (Int32, String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    if let directory { process.currentDirectoryURL = directory }
    let output = Pipe()
    process.standardOutput = output
    process.standardError = output
    try process.run()
    let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    return (process.terminationStatus, text)
}
