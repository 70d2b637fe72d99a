// upstream-stub: the stub Messages API as a process, for scripts and benchmarks.
// Prints {"port":N,"base_url":"…"} on one line of stdout, then serves until killed.
import Foundation
import UpstreamStub

let usage = """
usage: upstream-stub [--host 127.0.0.1] [--port 0] [--latency-ms N] [--deltas N] [--delta-interval-ms N]
                     [--stream-seconds N] [--retry-after N] [--api-key KEY]... [--tls-cert PEM --tls-key PEM]
                     [--tls-self-signed]

Answers POST /v1/messages and /v1/messages/count_tokens in the Messages API's shapes. Per request,
the header x-stub-behavior or a model named stub-<tokens> picks errors and pacing:
error-<status>, drop-mid-stream, stream-error, slow-stream-<s>, latency-<ms>, deltas-<n>,
delta-interval-<ms>, cache-<creation>-<read> (joined with , or +).
--tls-self-signed generates a throwaway CA and prints its path as "ca_file".
"""

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("upstream-stub: \(message)\n\(usage)\n".utf8))
    exit(2)
}

func serve() -> Never {
    // A parent may have started us with these blocked (posix_spawn keeps the spawning
    // thread's mask, and dispatch's worker threads block them): the usual way to stop a
    // stub is SIGTERM or Ctrl-C.
    var unblocked = sigset_t()
    sigemptyset(&unblocked)
    for signal in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&unblocked, signal) }
    sigprocmask(SIG_UNBLOCK, &unblocked, nil)
    var configuration = UpstreamStubConfiguration()
    var apiKeys: Set<String> = []
    var certificate: String?
    var key: String?
    var selfSigned = false
    var arguments = CommandLine.arguments.dropFirst()

    func value(_ option: String) -> String {
        guard let next = arguments.popFirst() else { fail("\(option) needs a value") }
        return next
    }

    func number(_ option: String) -> Int {
        guard let n = Int(value(option)), n >= 0 else { fail("\(option) needs a non-negative integer") }
        return n
    }

    while let argument = arguments.popFirst() {
        switch argument {
        case "--host": configuration.host = value(argument)
        case "--port": configuration.port = UInt16(clamping: number(argument))
        case "--latency-ms": configuration.latency = .milliseconds(number(argument))
        case "--deltas": configuration.deltaCount = max(1, number(argument))
        case "--delta-interval-ms": configuration.deltaInterval = .milliseconds(number(argument))
        case "--stream-seconds": configuration.streamDuration = .seconds(number(argument))
        case "--retry-after": configuration.retryAfterSeconds = number(argument)
        case "--api-key": apiKeys.insert(value(argument))
        case "--tls-cert": certificate = value(argument)
        case "--tls-key": key = value(argument)
        case "--tls-self-signed": selfSigned = true
        case "-h", "--help":
            print(usage)
            exit(0)
        default: fail("unknown option \(argument)")
        }
    }
    if !apiKeys.isEmpty { configuration.apiKeys = apiKeys }

    var caFile: String?
    do {
        if selfSigned {
            let generated = try StubCertificates.generate()
            configuration.tls = generated.tlsFiles
            caFile = generated.caPath
        } else if let certificate, let key {
            configuration.tls = .init(certificateChainPath: certificate, privateKeyPath: key)
        } else if certificate != nil || key != nil {
            fail("--tls-cert and --tls-key go together")
        }
        let server = try UpstreamStubServer(configuration)
        var line = "{\"port\":\(server.port),\"base_url\":\"\(server.baseURL)\""
        if let caFile { line += ",\"ca_file\":\"\(caFile)\"" }
        FileHandle.standardOutput.write(Data((line + "}\n").utf8))
        while true { sleep(3600) }
    } catch {
        fail("\(error)")
    }
}

serve()
