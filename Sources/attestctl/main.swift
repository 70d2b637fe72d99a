import CommandLineSupport
import Foundation

/// attestctl: the operator's tool — administration of the service database and offline
/// verification. It links no test authority (simulation and benchmarks live in `attest-sim`).
let usage = """
usage: attestctl [--db PATH] [--secrets-key-file FILE] <command> …
  init | members add|list|remove           set up the organisation
  console-login --actor EMAIL [--base-url URL]  a single-use sign-in link (10 minutes) to the console
  migrate                                  apply the schema's migrations (SQLite or PostgreSQL)
  backup --to FILE                         an online copy of a SQLite database while attestd serves
  workspaces create|show|set-upstream-key|set-upstream-bedrock|set-upstream-vertex|set-upstream-foundry|set-upstream-claude-platform-aws
             |upstreams|remove-upstream      workspaces and their upstreams: the Anthropic API's key, Amazon Bedrock, Google Vertex AI,
                                           Microsoft Foundry, Claude Platform on AWS; several per workspace, with failover
  cloud-endpoints show|allow               the only hosts cloud credentials may be sent to, for the whole deployment
  apple-keys set|list                      each Apple team's App Attest data-service key (for the risk metric)
  integrations create|list|show|update|revoke  manage app integrations, which builds they admit and what they may spend
  devices list --client-id CLID [--risk-over N] | show KEY_ID  the devices that registered: platform, distribution,
                                           versions, Apple's risk metric
  prices show|set|import                   the price table usage costs are computed with, per workspace
  usage [--workspace NAME] [--client-id CLID] [--since DATE] [--until DATE] [--by hour|day|model|integration|upstream|rule] [--json]
                                           what relayed Messages requests cost
  audit [--client-id CLID] [--limit N]     newest audit events
  webhooks add|list|remove                 where a workspace's budget alerts are POSTed, signed, with their last delivery
  secrets rotate|finish-rotation|status    a new secrets key, every sealed value re-sealed under it while attestd serves
  verify attestation|assertion|receipt …   verify an App Attest object or receipt offline
every command answers --help (attestctl COMMAND --help: that command alone); --version prints the version and commit; --db PATH|URL (a SQLite file or a postgresql:// URL; default: $ATTESTD_DB, else ./attestd.sqlite) and
--secrets-key-file FILE (default: $ATTESTD_SECRETS_KEY_FILE, else attestd.key beside the database)
may come before or after it
"""

runTool("attestctl") {
    let argv = try hoistGlobalOptions(Array(CommandLine.arguments.dropFirst()), options: ["db", "secrets-key-file"])
    let rest = Array(argv.dropFirst())
    switch argv.first {
    case "verify": return try VerifyCommand.run(rest)
    case "secrets": return try SecretsCommands.run(rest)
    case "webhooks": return try WebhookCommands.run(rest)
    case "init", "migrate", "backup", "members", "console-login", "workspaces", "apple-keys", "integrations", "devices", "audit", "usage", "cloud-endpoints", "prices": return try AdminCommands.run(argv[0], rest)
    case "help", "--help", "-h": print(usage); return 0
    case "--version", "version": print(BuildInfo.line("attestctl")); return 0
    default: throw UsageError(usage)
    }
}
