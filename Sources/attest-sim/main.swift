import CommandLineSupport
import Foundation

/// attest-sim: the developer's tool — simulated devices on the project's test authority, load
/// generation and verification benchmarks. Never an operator's binary: it carries the test CA.
let usage = """
usage: attest-sim <command> …
  simulate-device --base-url URL --client-id CLID --state-dir DIR [--app-id TEAMID.bundle] [--messages]
  load --base-url URL --client-id CLID --devices N --seconds S [--concurrency C] [--app-id TEAMID.bundle]
  bench verify [--seconds S] [--sample FILE] [--breakdown]
  bench scan [--megabytes N] [--seconds S]
every command answers --help
"""

runTool("attest-sim") {
    let argv = Array(CommandLine.arguments.dropFirst())
    let rest = Array(argv.dropFirst())
    switch argv.first {
    case "simulate-device": return try SimulateDeviceCommand.run(rest)
    case "load": return try LoadCommand.run(rest)
    case "bench": return try BenchCommand.run(rest)
    case "help", "--help", "-h": print(usage); return 0
    case "--version", "version": print(BuildInfo.line("attest-sim")); return 0
    default: throw UsageError(usage)
    }
}
