import AttestDaemon
import CMalloc
import Foundation
import HTTPRouting

/// attestd: the App Attest token service. `attestd serve [options]`; the wiring is `Daemon`'s.

// glibc hands freed memory back to the kernel as soon as 128 KiB sit free at the top of a thread's
// arena (madvise), and the next request faults those pages in again, zeroed: under load that was
// about 8% of the service's CPU. Keep up to 16 MiB per arena, and map only blocks of 4 MiB or more
// on their own (each such map and unmap is a TLB shootdown on every core).
_ = attest_malloc_keep_free(16 << 20, 4 << 20)

// Lines are written by a thread of their own, so the request path only formats and queues.
let logger = Logger.standardErrorWithWriterThread()

func serve(_ options: ServeOptions) throws -> Never {
    let daemon = try Daemon(options, logger: logger)
    // SIGINT/SIGTERM: stop in order within --shutdown-grace, then exit 0. A service that ends on
    // its own stops the rest the same way, and the exit status says so (systemd restarts it).
    daemon.stopOnSignals()
    try daemon.start()
    let outcome = daemon.wait()
    if case .failed(let service, let detail) = outcome {
        logger.error("stopped_after_failure", [("service", service), ("error", detail)])
    }
    logger.drain()
    exit(outcome.exitStatus)
}

let arguments = Array(CommandLine.arguments.dropFirst())
do {
    guard arguments.first == "serve" else {
        if ["help", "--help", "-h"].contains(arguments.first ?? "") { print(serveUsage); exit(0) }
        if ["--version", "version"].contains(arguments.first ?? "") { print(Daemon.versionLine); exit(0) }
        throw StartupError(serveUsage)
    }
    let options = Array(arguments.dropFirst())
    if options.contains(where: { ["--help", "-h", "help"].contains($0) }) { print(serveUsage); exit(0) }
    try serve(try ServeOptions(options))
} catch {
    logger.error("startup_failed", [("error", String(describing: error))])
    logger.drain()
    exit(2)
}
