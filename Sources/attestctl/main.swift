import Foundation

/// attestctl: the operator's tool — offline verification, benchmarks, administration, device simulation.
let usage = """
usage: attestctl <command> …
  verify attestation|assertion …   verify an App Attest object offline
  bench verify [--seconds S] [--sample FILE]
  init | members add | workspaces create   set up the organisation (any of these --help: usage)
  integrations create|list|show|revoke     manage app integrations
  audit [--client-id CLID] [--limit N]     newest audit events
  simulate-device --base-url URL --client-id CLID --state-dir DIR [--app-id TEAMID.bundle] [--messages]
  load --base-url URL --client-id CLID --devices N --seconds S [--concurrency C] [--app-id TEAMID.bundle]
"""

let argv = Array(CommandLine.arguments.dropFirst())
do {
    let rest = Array(argv.dropFirst())
    let status: Int32
    switch argv.first {
    case "verify": status = try VerifyCommand.run(rest)
    case "bench": status = try BenchCommand.run(rest)
    case "init", "members", "workspaces", "integrations", "audit": status = try AdminCommands.run(argv[0], rest)
    case "simulate-device": status = try SimulateDeviceCommand.run(rest)
    case "load": status = try LoadCommand.run(rest)
    case "help", "--help", "-h": print(usage); status = 0
    default: throw UsageError(usage)
    }
    exit(status)
} catch let error as UsageError {
    FileHandle.standardError.write(Data("attestctl: \(error.description)\n".utf8))
    exit(2)
} catch {
    FileHandle.standardError.write(Data("attestctl: \(error)\n".utf8))
    exit(1)
}
