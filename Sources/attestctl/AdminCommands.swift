import AppAttest
import AttestCrypto
import AttestWire
import CommandLineSupport
import Foundation
import SQLiteStore
import Stores
import TokenService

/// `attestctl init|members|workspaces|integrations|audit`: administration on the service database.
/// Arguments are checked before the database is opened, and `AdminService` refuses before it
/// writes, so every exit-2 path leaves the database as it was.
enum AdminCommands {
    static let usage = """
    usage: attestctl init --owner EMAIL
           attestctl migrate   (apply the schema's migrations; attestd serve --no-migrate only checks them)
           attestctl backup --to FILE   (an online, consistent copy of a SQLite database while attestd serves;
             mode 0600, written whole or not at all; PostgreSQL: pg_dump)
           attestctl members add --actor EMAIL --email EMAIL --role owner|admin|developer|user [--workspace NAME]
           attestctl members list [--workspace NAME] [--json]
           attestctl members remove --actor EMAIL --email EMAIL [--workspace NAME]   (their console sessions end with it)
           attestctl console-login --actor EMAIL [--workspace NAME] [--base-url URL]
             prints a sign-in link for the console (on attestd's admin listener, /console/): single use, valid 10
             minutes, for a member of the workspace. The link goes to the console of the attestd started last on
             this database (on this host first), as it recorded itself: its first --base-url, else its admin
             listener; http://127.0.0.1:9090 when none has started yet. --base-url: how the member's browser
             reaches the admin listener, whatever attestd recorded
           attestctl workspaces create --actor EMAIL --name NAME
           attestctl workspaces show NAME [--json]
           attestctl workspaces set-upstream-key --actor EMAIL --workspace NAME --key-file FILE|- [--base-url URL --model API_MODEL=MODEL…]
             (--base-url: the Anthropic API at another base URL, such as a second organisation's gateway, through the
             Anthropic-compatible kind, with its own model map)
           attestctl workspaces set-upstream-bedrock --actor EMAIL --workspace NAME --region REGION (--access-key-id ID
             --secret-key-file FILE [--session-token-file FILE] | --bedrock-api-key-file FILE | --aws-credentials web-identity|container|instance)
             [--assume-role ARN] [--endpoint-url URL] [--api messages|invoke|mantle] [--cloud-beta BETA]…
             --model API_MODEL=BEDROCK_MODEL_ID [--model …]
           attestctl workspaces set-upstream-vertex --actor EMAIL --workspace NAME --project PROJECT --region REGION
             (--service-account-file FILE | --metadata-server) [--endpoint-url URL] [--token-url URL] [--cloud-beta BETA]… --model API_MODEL=VERTEX_MODEL [--model …]
             the workspace's requests go to Amazon Bedrock or Google Vertex AI instead of the Anthropic API (set-upstream-key
             switches back); --model maps each model devices may name to the cloud's ID (1 to 64; any other is refused);
             --api: Bedrock's Messages API (messages, the default: the newest models, inference profiles such as global.anthropic.…)
             or InvokeModel (invoke, for ARN-versioned legacy models); --cloud-beta: a beta the cloud has accepted since this
             service's table (docs/relay.md) was written, allowed for this workspace; --project also takes a project number;
             --endpoint-url and --token-url: https://host[:port] (http:// only to a loopback address). The credentials
             are sealed like an upstream key; show prints the kind, region or project, models and key_last4, never them.
             The credentials are sealed together with these settings: settings changed in the database alone no longer
             open them (the relay answers 503 and logs the workspace)
           attestctl workspaces set-upstream-foundry --actor EMAIL --workspace NAME (--resource NAME | --base-url URL)
             (--api-key-file FILE | --tenant-id ID --client-id ID (--client-secret-file FILE | --client-certificate-file PEM) [--scope SCOPE]
             | --managed-identity [--client-id ID]) [--endpoint-url URL] [--cloud-beta BETA]… --model API_MODEL=DEPLOYMENT [--model …]
           attestctl workspaces set-upstream-claude-platform-aws --actor EMAIL --workspace NAME --region REGION --anthropic-workspace-id ID
             (--api-key-file FILE | --access-key-id ID --secret-key-file FILE [--session-token-file FILE] | --aws-credentials …)
             [--assume-role ARN] [--endpoint-url URL] [--cloud-beta BETA]… --model API_MODEL=MODEL [--model …]
             Anthropic-compatible upstreams: Microsoft Foundry (https://NAME.services.ai.azure.com/anthropic/v1/messages, the
             model named as the deployment, the API key as x-api-key or an Entra ID token) and Claude Platform on AWS
             (https://aws-external-anthropic.REGION.api.aws/v1/messages with anthropic-workspace-id; SigV4 for
             aws-external-anthropic, or an API key); what each service refuses is refused before anything is sent
           attestctl workspaces upstreams NAME [--json]   the list in the order it is tried, each with its state
             every set-upstream-… takes --upstream LABEL [--priority N]: it adds or replaces that upstream of the workspace's
             list instead of the workspace's own (listed as default, priority 0; a new label gets 100 unless --priority says
             otherwise, a replaced one keeps its own); requests go to the first upstream (lowest priority)
             whose models include theirs, and to the next on 429, 529, 5xx, no connection or refused credentials before
             anything reached the device; one that fails is skipped for a while (attestd --upstream-cooldown)
           attestctl workspaces upstreams NAME add --kind key|bedrock|vertex|foundry|claude-platform-aws --upstream LABEL [--priority N] …
           attestctl workspaces upstreams NAME remove --actor EMAIL --upstream LABEL
           attestctl workspaces upstreams NAME order --actor EMAIL --upstream LABEL [--upstream LABEL]…   (every label, first tried first)
           attestctl workspaces remove-upstream --actor EMAIL --workspace NAME --upstream LABEL
           attestctl workspaces set-budget --actor EMAIL --workspace NAME [--monthly-budget-usd N] [--daily-budget-usd N]
             the workspace's budgets in US dollars, over all its integrations (owners; audited; 0 removes one)
           attestctl prices show [--workspace NAME] [--json]
           attestctl prices set --actor EMAIL --workspace NAME --model MODEL [--input P] [--output P] [--cache-write-5m P]
             [--cache-write-1h P] [--cache-read P]
           attestctl prices import --actor EMAIL --workspace NAME FILE
             the price table each relayed request's cost (usage's cost_micro_usd, the budgets in money) is computed
             with: the shipped table (dated, from the Claude pricing page) unless the workspace overrides it, from the
             moment of the change on (rows already recorded keep their cost). P: USD per million tokens; import reads
             the JSON `prices show --json` prints (admin or above; audited)
           attestctl workspaces bind-upstream-settings --actor EMAIL --workspace NAME
             seals a cloud upstream set before settings were bound (attestd refuses it until then) with the settings it
             holds now: check them first with workspaces show
           attestctl cloud-endpoints show [--json]
           attestctl cloud-endpoints allow --actor EMAIL (--cloud-endpoint-allow HOST [--cloud-endpoint-allow HOST]… | --any)
             the only hosts cloud credentials may be sent to, for the whole deployment (owners of the default workspace):
             endpoint and token URLs and the clouds' own hosts; *.DOMAIN allows its subdomains; --any removes the pin.
             Checked when an upstream is set and by every attestd (within 10 s) before it sends credentials
           attestctl apple-keys set --actor EMAIL [--workspace NAME] --team-id TEAMID --key-id KEYID --key-file AuthKey_KEYID.p8
             the team's App Attest data-service key (DeviceCheck enabled), with which attestd asks Apple for each
             device's fraud-risk metric; owners and above, audited, sealed under the secrets key like upstream keys
           attestctl apple-keys list [--json]   (team, key ID, when and by whom; never the key)
             (owner or primary owner; the key is stored sealed with AES-256-GCM under the secrets key file,
              never printed: show tells only whether one is set, when, by whom, and its last 4 characters)
           attestctl integrations create --actor EMAIL [--workspace NAME] --name NAME --team-id TEAMID
             --bundle-id ID [--bundle-id ID]… [--environments development,production] [DEVICES] [POLICY] [--json]
             (for a Mac app, --bundle-id is its signing identifier: App Attest on macOS hashes that into the App ID)
           attestctl integrations update CLIENT_ID --actor EMAIL [DEVICES] [POLICY] [--json]   (admin or above; audited)
             DEVICES: which builds may register and refresh (iOS 27 and macOS 27 say where a build came from):
               --distribution ENV=NAME,…       the channels admitted per environment, repeatable; NAME: app-store, testflight,
                                               development, enterprise, developer-id, other (defaults: production=app-store,testflight
                                               and development=development; invalid, os and restricted builds are always refused)
               --min-bundle-version V          refuse devices whose bundle version is lower (dotted numbers), at
                                               registration and at every refresh ('none' removes it)
               --require-extensions            refuse devices that write no extension map (iOS 26 and earlier);
                                               recommended when the app's minimum OS is 27 (--no-require-extensions undoes it)
               --platforms ios,macos           which platforms may attest (default both)
               --risk-limit N                  refuse a device at its next token refresh once Apple's risk metric for it
                                               (keys attested on that device lately) is above N (default 0: no limit);
                                               tokens it holds stay valid until they expire
             POLICY: what the app's installs may spend through the Messages relay; 0 means no limit.
               --models ID,…                   model IDs the app may call (default any; '*' allows any again)
               --max-tokens N                  ceiling on a request's max_tokens (default none)
               --device-requests-per-minute N  relayed requests per device key (default 60)
               --monthly-token-budget N        input + output tokens per calendar month, UTC (default none)
               --server-tools LIST             server tools a request may carry: web_search,web_fetch,code_execution;
                                               '*' any (default) or 'none' (a tool whose type names another is refused)
               --max-server-tool-uses N        every server tool must set max_uses of at most N (default 0: no cap)
               --betas LIST                    anthropic-beta values a request may name, comma-separated ('*' any, the default)
               --profile-requests-per-minute N relayed requests per user profile (anthropic-user-profile-id) per minute (default none)
               --profile-monthly-token-budget N tokens per user profile per calendar month, UTC (default none)
               --monthly-budget-usd N          US dollars per calendar month (UTC) for the whole app, at the workspace's
               --daily-budget-usd N            prices (attestctl prices show) and per day (UTC); `0` removes one
               --profile-monthly-budget-usd N  US dollars per user profile per calendar month, and per day, within the app;
               --profile-daily-budget-usd N    a request over any budget is answered 429 rate_limit_error, retry-after
                                               at the period's end (see docs/usage-and-policy.md for the overshoot bound)
             --rule-mode RULE=monitor|enforce  (repeatable) a monitored rule refuses nothing: the request or registration
                                               goes through as if it were absent and is counted as would_refuse
                                               (attestctl usage --by rule); RULE is the rule's flag without the dashes:
                                               models, max-tokens, device-requests-per-minute, monthly-budget-usd,
                                               distribution, min-bundle-version, platforms, risk-limit, …
             every attestd applies a change on its next request, without a restart
           attestctl integrations list [--workspace NAME] [--json]
           attestctl integrations show CLIENT_ID [--json]
           attestctl integrations revoke CLIENT_ID --actor EMAIL --yes
           attestctl devices list --client-id CLIENT_ID [--limit N] [--risk-over N] [--json]
             (--risk-over N: only devices whose latest Apple risk metric is above N)
           attestctl devices show KEY_ID [--json]   (KEY_ID in base64 or hex)
           attestctl audit [--client-id CLIENT_ID] [--limit N] [--json]
           attestctl usage [--workspace NAME] [--client-id CLID] [--since DATE] [--until DATE]
             [--by hour|day|model|integration|profile|rule] [--json]
             what relayed requests cost: requests, tokens, server-tool uses, errors by status, cut streams, policy
             refusals; by the model that served. --by profile: rows carry user_profile (null: no profile).
             --by rule: what each policy rule refused and would have refused (monitor), by integration and day:
             {"rule", "mode", "refused", "would_refuse", "day", "client_id", "workspace"}.
             DATE: 2026-12-01 or 2026-12-01T13:00:00Z (UTC); the ledger is hourly, so every hour that
             overlaps [since, until) counts whole. Without them: everything, the current hour included
             (attestd writes usage every second). --json: one object per line.
         every command takes --db PATH|URL (a SQLite file or a postgresql:// URL; default: $ATTESTD_DB, else ./attestd.sqlite) and --secrets-key-file FILE
         (default: $ATTESTD_SECRETS_KEY_FILE, else attestd.key beside the database; init creates it, 32 random bytes, 0600)
    """

    static let help = CommandHelp(usage, tool: "attestctl")

    static func run(_ command: String, _ argv: [String]) throws -> Int32 {
        if wantsHelp(argv) {
            // That command alone (and, for a group such as `integrations`, its subcommands).
            print(help.text(for: [command] + argv) ?? usage)
            return 0
        }
        do {
            switch (command, argv.first) {
            case ("init", _): try initialize(argv)
            case ("migrate", _): try migrate(argv)
            case ("backup", _): try backup(argv)
            case ("members", "add"): try addMember(Array(argv.dropFirst()))
            case ("members", "list"): try listMembers(Array(argv.dropFirst()))
            case ("members", "remove"): try removeMember(Array(argv.dropFirst()))
            case ("console-login", _): try consoleLogin(argv)
            case ("workspaces", "create"): try createWorkspace(Array(argv.dropFirst()))
            case ("workspaces", "show"): try showWorkspace(Array(argv.dropFirst()))
            // Every set-upstream-… takes --upstream LABEL [--priority N]: that upstream of the workspace's list.
            case ("workspaces", "set-upstream-key"): try placed(Array(argv.dropFirst()), setUpstreamKey)
            case ("workspaces", "set-upstream-bedrock"): try placed(Array(argv.dropFirst()), setUpstreamBedrock)
            case ("workspaces", "set-upstream-vertex"): try placed(Array(argv.dropFirst()), setUpstreamVertex)
            case ("workspaces", "set-upstream-foundry"): try placed(Array(argv.dropFirst()), setUpstreamFoundry)
            case ("workspaces", "set-upstream-claude-platform-aws"): try placed(Array(argv.dropFirst()), setUpstreamClaudePlatformAWS)
            case ("workspaces", "upstreams"): try upstreams(Array(argv.dropFirst()))
            case ("workspaces", "remove-upstream"): try removeUpstream(Array(argv.dropFirst()))
            case ("workspaces", "bind-upstream-settings"): try bindUpstreamSettings(Array(argv.dropFirst()))
            case ("workspaces", "set-budget"): try PriceCommands.setBudget(Array(argv.dropFirst()))
            case ("prices", "show"): try PriceCommands.show(Array(argv.dropFirst()))
            case ("prices", "set"): try PriceCommands.set(Array(argv.dropFirst()))
            case ("prices", "import"): try PriceCommands.importFile(Array(argv.dropFirst()))
            case ("cloud-endpoints", "show"): try showCloudEndpoints(Array(argv.dropFirst()))
            case ("cloud-endpoints", "allow"): try allowCloudEndpoints(Array(argv.dropFirst()))
            case ("apple-keys", "set"): try setAppleKey(Array(argv.dropFirst()))
            case ("apple-keys", "list"): try listAppleKeys(Array(argv.dropFirst()))
            case ("integrations", "create"): try createIntegration(Array(argv.dropFirst()))
            case ("integrations", "list"): try listIntegrations(Array(argv.dropFirst()))
            case ("integrations", "show"): try showIntegration(Array(argv.dropFirst()))
            case ("integrations", "revoke"): try revokeIntegration(Array(argv.dropFirst()))
            case ("integrations", "update"): try updateIntegration(Array(argv.dropFirst()))
            case ("devices", "list"): try DeviceCommands.list(try parse(Array(argv.dropFirst()), options: ["client-id", "limit", "risk-over"], flags: ["json"]))
            case ("devices", "show"): try DeviceCommands.show(try parse(Array(argv.dropFirst()), options: [], flags: ["json"], positional: 1))
            case ("audit", _): try audit(argv)
            case ("usage", _): try UsageCommand.run(try parse(argv, options: UsageCommand.options, flags: ["json"]))
            default: throw UsageError(usage)
            }
            return 0
        } catch let error as AdminError {
            // A refusal by the domain is the operator's to fix, like a usage error: exit 2.
            throw UsageError(error.description)
        }
    }

    // MARK: Commands

    static func initialize(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["owner"])
        let owner = try arguments.required("owner")
        let (service, _) = try open(arguments, creating: true)
        let keyFile = try secretsKeyPath(arguments)
        if try SecretsKeyFile.createIfAbsent(keyFile) {
            print("created the secrets key \(keyFile) (32 random bytes, mode 0600): every attestd of this deployment reads it")
        } else {
            // One already there must be one attestd takes: a key, only its owner's to read.
            _ = try secretBox(arguments)
        }
        switch try service.initialize(owner: owner) {
        case .created:
            print("initialised \(Stores.redacted(try databasePath(arguments))): workspace \(AdminService.defaultWorkspace), primary owner \(try Validate.email(owner))")
        case .unchanged(let existing):
            print("already initialised \(Stores.redacted(try databasePath(arguments))): primary owner \(existing); nothing changed")
        }
    }

    /// Applies the schema's migrations, for operators who do not let services alter schemas
    /// (`attestd serve --no-migrate` then only checks them).
    static func migrate(_ argv: [String]) throws {
        let arguments = try parse(argv, options: [])
        _ = try open(arguments, mode: .apply, creating: true)
        print("migrated \(Stores.redacted(try databasePath(arguments))): the schema is current")
    }

    /// An online copy of the SQLite database (SQLite's backup API): consistent while attestd
    /// serves, 0600, renamed into place once whole.
    static func backup(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["to"])
        let destination = try arguments.required("to")
        let database = try databasePath(arguments)
        guard !Stores.isPostgres(database) else {
            throw UsageError("attestctl backup copies a SQLite database; for PostgreSQL use pg_dump -Fc (and pg_restore to restore)")
        }
        guard FileManager.default.fileExists(atPath: database) else {
            throw UsageError("no database at \(database): run from where you ran init, or pass --db / ATTESTD_DB")
        }
        let result = try SQLiteBackup.copy(database: database, to: destination)
        print("backed up \(database) to \(destination): \(result.pages) pages (\(result.bytes) bytes) in "
              + String(format: "%.3f", result.seconds) + " s")
    }

    static func addMember(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "email", "role", "workspace"])
        let actor = try arguments.required("actor"), email = try arguments.required("email")
        let roleText = try arguments.required("role")
        guard let role = Role(rawValue: roleText) else { throw UsageError("--role \(roleText): use owner, admin, developer or user") }
        let workspace = try arguments.value("workspace") ?? AdminService.defaultWorkspace
        let (service, _) = try open(arguments)
        try service.addMember(actor: try Validate.email(actor), email: email, role: role, workspace: workspace)
        print("added \(try Validate.email(email)) as \(role.rawValue) in \(workspace)")
    }

    static func listMembers(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["workspace"], flags: ["json"])
        let workspace = try arguments.value("workspace") ?? AdminService.defaultWorkspace
        let (service, _) = try open(arguments)
        for member in try service.members(workspace: workspace) {
            if arguments.has("json") {
                print(JSONText.object([("email", member.email), ("role", member.role.rawValue), ("added_at", iso8601(member.addedAt))]))
            } else {
                print("\(member.email)  \(member.role.rawValue)  added \(iso8601(member.addedAt))")
            }
        }
    }

    static func removeMember(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "email", "workspace"])
        let actor = try arguments.required("actor"), email = try arguments.required("email")
        let workspace = try arguments.value("workspace") ?? AdminService.defaultWorkspace
        let (service, _) = try open(arguments)
        try service.removeMember(actor: try Validate.email(actor), email: email, workspace: workspace)
        print("removed \(try Validate.email(email)) from \(workspace); their console sessions have ended")
    }

    /// The link alone on stdout (a script can take it); what it is, on stderr.
    static func consoleLogin(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "workspace", "base-url"])
        let actor = try arguments.required("actor")
        let workspace = try arguments.value("workspace") ?? AdminService.defaultWorkspace
        let given = try arguments.value("base-url")
        if let given { _ = try consoleBase(given) }
        let (service, store) = try open(arguments)
        // Where the console is: what the operator said, else what the running attestd recorded.
        var base: String, whence: String
        if let given {
            (base, whence) = (try consoleBase(given), "")
        } else {
            let here = SecretsKeyRead.hostName()
            if let instance = AttestdInstance.likelyConsole(among: try store.attestdInstances(), host: here) {
                guard let recorded = instance.consoleBaseURL else {
                    throw UsageError("the attestd started last (on \(instance.host) at \(iso8601(instance.startedAt))) has no admin listener "
                                     + "(--admin-listen none): restart it with --admin-listen HOST:PORT, or pass --base-url")
                }
                base = (try? consoleBase(recorded)) ?? recorded
                whence = "; the console of the attestd started on \(instance.host) at \(iso8601(instance.startedAt))"
                    + (instance.host == here ? "" : " (another host: reach it through an SSH tunnel or a proxy, and pass its address as --base-url)")
            } else {
                base = "http://127.0.0.1:9090"
                whence = "; no attestd has started on this database yet, so this is the default admin listener"
            }
        }
        let token = try service.createSignInLink(for: actor, workspace: workspace)
        print("\(base)/console/sign-in?token=\(token)")
        FileHandle.standardError.write(Data("sign-in link for \(try Validate.email(actor)) in \(workspace): single use, valid 10 minutes; open it in a browser\(whence)\n".utf8))
    }

    /// A console origin as given (`--base-url`, or recorded by attestd), without `/` or `/console` at its end.
    static func consoleBase(_ text: String) throws -> String {
        var base = text
        guard let url = URL(string: base), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https", url.host != nil,
              url.query == nil, url.fragment == nil else {
            throw UsageError("--base-url \(base.prefix(100)): use the admin listener's address as the browser reaches it, such as http://127.0.0.1:9090")
        }
        while base.hasSuffix("/") { base.removeLast() }
        if base.hasSuffix("/console") { base.removeLast("/console".count) }
        return base
    }

    static func createWorkspace(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "name"])
        let actor = try Validate.email(try arguments.required("actor"))
        let name = try arguments.required("name")
        let (service, _) = try open(arguments)
        let workspace = try service.createWorkspace(actor: actor, name: name)
        print("created workspace \(workspace.name); primary owner \(actor)")
    }

    static func showWorkspace(_ argv: [String]) throws {
        let arguments = try parse(argv, options: [], flags: ["json"], positional: 1)
        let (service, _) = try open(arguments)
        let (workspace, key) = try service.workspaceDetails(arguments.positional[0])
        var upstreamKey: [String: Any] = ["set": key != nil]
        if let key {
            upstreamKey["set_at"] = iso8601(key.setAt)
            upstreamKey["set_by"] = key.setBy
            upstreamKey["last4"] = key.last4
        }
        let upstream = upstreamRecord(key)
        if arguments.has("json") {
            printJSON(["workspace": workspace.name, "upstream_key": upstreamKey, "upstream": upstream])
            return
        }
        if let key {
            let what = key.kind == .anthropic ? "upstream key" : "upstream \(key.kind.rawValue)"
            print("workspace \(workspace.name): \(what) set \(iso8601(key.setAt)) by \(key.setBy), ending in \(key.last4)")
        } else {
            print("workspace \(workspace.name): no upstream key (attestd uses --upstream-key-file, if given)")
        }
        // The same fields as --json's "upstream", one a line, those that are set.
        for name in ["kind", "api", "region", "project", "endpoint_url", "token_url", "client_email", "models", "extra_betas", "credential_source", "assume_role", "tenant_id",
                     "client_id", "scope", "key_last4", "set_at", "set_by"] {
            switch upstream[name] {
            case let models as [String: String]: print("models: " + models.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
            case let list as [String]: print("\(name): " + list.joined(separator: ","))
            case let value as String: print("\(name): \(value)")
            default: break
            }
        }
    }

    /// `workspaces show`'s "upstream": where requests go and what may be shown of the key; never a credential.
    static func upstreamRecord(_ key: SealedUpstreamKey?) -> [String: Any] {
        let settings = key?.settings
        func value(_ text: String?) -> Any { text ?? NSNull() }
        return ["kind": (key?.kind ?? .anthropic).rawValue, "region": value(settings?.region), "project": value(settings?.project),
                "endpoint_url": value(settings?.endpointURL), "token_url": value(settings?.tokenURL), "client_email": value(settings?.clientEmail),
                "models": settings?.models ?? NSNull(), "api": value(key?.kind == .bedrock ? (settings?.api ?? .invoke).rawValue : nil),
                "extra_betas": settings?.extraBetas ?? NSNull(), "key_last4": value(key?.last4), "set_at": value(key.map { iso8601($0.setAt) }),
                "set_by": value(key?.setBy),
                // Where the credentials come from (static: the sealed keys or key file), never the credential itself.
                "credential_source": value(key?.kind == .anthropic ? nil : settings?.credentialSource?.rawValue ?? (settings == nil ? nil : "static")),
                "assume_role": value(settings?.assumeRole), "tenant_id": value(settings?.tenantID), "client_id": value(settings?.clientID),
                "scope": value(settings?.scope),
                // An Anthropic-compatible upstream's service, base URL, auth mode and static headers.
                "service": value(settings?.compatible?.service.rawValue), "base_url": value(settings?.compatible?.baseURL),
                "auth": value(settings?.compatible?.auth.rawValue), "signing_service": value(settings?.compatible?.signingService),
                "headers": settings?.compatible?.headers ?? NSNull()]
    }

    static func setUpstreamKey(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "workspace", "key-file", "base-url", "model"])
        let actor = try Validate.email(try arguments.required("actor"))
        let workspace = try arguments.required("workspace")
        let key = try readSecretFile(arguments, "key-file")
        let (service, _) = try open(arguments)
        if let baseURL = try arguments.value("base-url") {
            // The Anthropic API at another base URL, through the Anthropic-compatible kind.
            try service.setUpstreamAnthropicCompatible(actor: actor, workspace: workspace, baseURL: baseURL, apiKey: key, models: arguments.all("model"),
                                                       secrets: try secretBox(arguments))
            return try printUpstreamSet(service, workspace)
        }
        guard arguments.all("model").isEmpty else { throw UsageError("--model goes with --base-url (the Anthropic API's own takes any model)") }
        try service.setUpstreamKey(actor: actor, workspace: workspace, key: key, secrets: try secretBox(arguments))
        let (_, sealed) = try service.workspaceDetails(workspace)
        print("set the upstream key of \(workspace), ending in \(sealed?.last4 ?? "?")")
    }

    static func setUpstreamBedrock(_ argv: [String]) throws {
        let arguments = try parse(argv, options: Set(["actor", "workspace", "region", "endpoint-url", "model", "api", "cloud-beta"]).union(awsCredentialOptions))
        // `--api mantle`: bedrock-mantle's Messages API, through the Anthropic-compatible kind.
        if try arguments.value("api") == "mantle" { return try setUpstreamBedrockMantle(arguments) }
        let api = try arguments.value("api").map { text in
            guard let api = BedrockAPI(rawValue: text) else { throw UsageError("--api must be messages, invoke or mantle") }
            return api
        } ?? .messages
        let actor = try Validate.email(try arguments.required("actor"))
        let workspace = try arguments.required("workspace")
        let region = try arguments.required("region")
        let (credentials, assumeRole) = try awsCredentials(arguments)
        let (service, _) = try open(arguments)
        try service.setUpstreamBedrock(actor: actor, workspace: workspace, region: region, credentials: credentials, assumeRole: assumeRole,
                                       endpointURL: try arguments.value("endpoint-url"), models: arguments.all("model"),
                                       api: api, extraBetas: arguments.all("cloud-beta"), secrets: try secretBox(arguments))
        try printUpstreamSet(service, workspace)
    }

    static func setUpstreamVertex(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "workspace", "project", "region", "service-account-file", "endpoint-url", "token-url",
                                                  "model", "cloud-beta"], flags: ["metadata-server"])
        let actor = try Validate.email(try arguments.required("actor"))
        let workspace = try arguments.required("workspace")
        let project = try arguments.required("project"), region = try arguments.required("region")
        guard arguments.has("metadata-server") != arguments.has(option: "service-account-file") else {
            throw UsageError("give one of --service-account-file and --metadata-server")
        }
        if arguments.has("metadata-server") {
            guard !arguments.has(option: "token-url") else { throw UsageError("--token-url goes with --service-account-file (the metadata server is GCE_METADATA_HOST)") }
            let (service, _) = try open(arguments)
            try service.setUpstreamVertexFromMetadataServer(actor: actor, workspace: workspace, project: project, region: region,
                                                            endpointURL: try arguments.value("endpoint-url"), models: arguments.all("model"),
                                                            extraBetas: arguments.all("cloud-beta"), secrets: try secretBox(arguments))
            try printUpstreamSet(service, workspace)
            return
        }
        let account = try readSecretFile(arguments, "service-account-file")
        let (service, _) = try open(arguments)
        try service.setUpstreamVertex(actor: actor, workspace: workspace, project: project, region: region, serviceAccountJSON: account,
                                      endpointURL: try arguments.value("endpoint-url"), tokenURL: try arguments.value("token-url"),
                                      models: arguments.all("model"), extraBetas: arguments.all("cloud-beta"), secrets: try secretBox(arguments))
        try printUpstreamSet(service, workspace)
    }

    static func bindUpstreamSettings(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "workspace"])
        let actor = try Validate.email(try arguments.required("actor"))
        let workspace = try arguments.required("workspace")
        let (service, _) = try open(arguments)
        let keyring = try? SecretsKeyring.load(try secretsKeyPath(arguments))
        let bound = try service.bindUpstreamSettings(actor: actor, workspace: workspace, secrets: try secretBox(arguments), keyring: keyring)
        guard let settings = bound.settings else { return }
        print("sealed the \(bound.kind.rawValue) credentials of \(workspace) with these settings: \(AdminService.describe(bound.kind, settings))")
    }

    static func showCloudEndpoints(_ argv: [String]) throws {
        let arguments = try parse(argv, options: [], flags: ["json"])
        let (service, _) = try open(arguments)
        let pins = try service.cloudEndpointPins()
        if arguments.has("json") {
            printJSON(["hosts": pins.hosts, "any": pins.hosts.isEmpty])
        } else {
            print(pins.hosts.isEmpty ? "cloud credentials may go to any host the URL rules allow (no pin)"
                  : "cloud credentials may go only to: " + pins.hosts.joined(separator: ", "))
        }
    }

    static func allowCloudEndpoints(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "cloud-endpoint-allow"], flags: ["any"])
        let actor = try Validate.email(try arguments.required("actor"))
        let hosts = arguments.all("cloud-endpoint-allow")
        guard hosts.isEmpty == arguments.has("any") else {
            throw UsageError("give either --cloud-endpoint-allow HOST (repeatable) or --any")
        }
        let (service, _) = try open(arguments)
        let refused = try service.setCloudEndpointPins(actor: actor, hosts: hosts)
        let pins = try service.cloudEndpointPins()
        print(pins.hosts.isEmpty ? "removed the pin: cloud credentials may go to any host the URL rules allow"
              : "cloud credentials may go only to: " + pins.hosts.joined(separator: ", "))
        if !refused.isEmpty {
            SecretsCommands.printError("these upstreams are on other hosts and are refused until an owner sets them again: " + refused.joined(separator: ", "))
        }
    }

    static func printUpstreamSet(_ service: AdminService, _ workspace: String) throws {
        guard let key = try service.workspaceDetails(workspace).upstreamKey, let settings = key.settings else { return }
        let label = UpstreamPlacement.current.map { " (upstream \($0.label))" } ?? ""
        print("set the upstream of \(workspace)\(label): \(AdminService.describe(key.kind, settings)); key ending in \(key.last4)")
    }

    /// A credential file named by `--flag` (`-`: standard input, so that a key need not be written
    /// to disk): at most 64 KiB, its trailing newline dropped.
    static func readSecretFile(_ arguments: Arguments, _ flag: String) throws -> String {
        let path = try arguments.required(flag)
        let limit = 64 << 10
        let handle = path == "-" ? FileHandle.standardInput : FileHandle(forReadingAtPath: path)
        guard let handle else {
            throw UsageError("--\(flag): cannot read \(path) (give a file holding it, or - to read it from standard input)")
        }
        defer { if path != "-" { try? handle.close() } }
        // One byte over the limit tells a file that is too large without reading all of it.
        guard let data = try? handle.read(upToCount: limit + 1) ?? Data() else { throw UsageError("--\(flag): cannot read \(path)") }
        guard data.count <= limit else { throw UsageError("--\(flag): \(path) is larger than 64 KiB") }
        var text = String(decoding: data, as: UTF8.self)
        while text.hasSuffix("\n") || text.hasSuffix("\r") { text.removeLast() }
        return text
    }

    /// The deployment's secrets key, which seals upstream credentials.
    static func secretBox(_ arguments: Arguments) throws -> SecretBox {
        do { return try SecretsKeyFile.load(try secretsKeyPath(arguments)) } catch { throw UsageError("\(error)") }
    }

    static func setAppleKey(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor", "workspace", "team-id", "key-id", "key-file"])
        let actor = try Validate.email(try arguments.required("actor"))
        let teamID = try arguments.required("team-id"), keyID = try arguments.required("key-id")
        let keyPath = try arguments.required("key-file")
        guard let data = FileManager.default.contents(atPath: keyPath), data.count <= 16 << 10 else {
            throw UsageError("--key-file: cannot read \(keyPath) (or it is larger than a .p8 key)")
        }
        let (service, _) = try open(arguments)
        try service.setAppleKey(actor: actor, workspace: try arguments.value("workspace") ?? AdminService.defaultWorkspace, teamID: teamID,
                                keyID: keyID, p8: String(decoding: data, as: UTF8.self), secrets: try secretBox(arguments))
        print("set the App Attest data-service key \(keyID) of team \(teamID)")
    }

    static func listAppleKeys(_ argv: [String]) throws {
        let arguments = try parse(argv, options: [], flags: ["json"])
        let (service, _) = try open(arguments)
        let keys = try service.appleKeys()
        let records: [[String: Any]] = keys.map { ["team_id": $0.teamID, "key_id": $0.keyID, "set_at": iso8601($0.setAt), "set_by": $0.setBy] }
        if arguments.has("json") {
            printJSON(["apple_keys": records])
        } else if keys.isEmpty {
            print("no Apple keys: devices of every team show risk unknown")
        } else {
            for key in keys { print("team=\(key.teamID)  key_id=\(key.keyID)  set_at=\(iso8601(key.setAt))  set_by=\(key.setBy)") }
        }
    }

    static func createIntegration(_ argv: [String]) throws {
        let arguments = try parse(argv, options: Set(["actor", "workspace", "name", "team-id", "bundle-id", "environments"]).union(policyOptions)
                                    .union(devicePolicyOptions), flags: Set(["json"]).union(devicePolicyFlags))
        let actor = try Validate.email(try arguments.required("actor"))
        let name = try arguments.required("name"), teamID = try arguments.required("team-id")
        let environments = try arguments.value("environments").map(Validate.environments) ?? [.development, .production]
        let workspace = try arguments.value("workspace") ?? AdminService.defaultWorkspace
        var policy = IntegrationPolicy()
        try applyPolicyOptions(arguments, to: &policy)
        var devicePolicy = DevicePolicy()
        try applyDevicePolicyOptions(arguments, to: &devicePolicy)
        let (service, _) = try open(arguments)
        let integration = try service.createIntegration(actor: actor, workspace: workspace, name: name, teamID: teamID,
                                                        bundleIDs: arguments.all("bundle-id"), environments: environments, policy: policy,
                                                        devicePolicy: devicePolicy)
        if arguments.has("json") {
            printJSON(record(integration))
        } else {
            print("created integration \(integration.name) in \(integration.workspaceName): client ID \(integration.clientID)")
            print("devices: \(integration.devicePolicy.summary)")
            print("policy: \(AdminService.describe(integration.policy))")
        }
    }

    static let devicePolicyOptions: Set<String> = ["distribution", "min-bundle-version", "platforms", "risk-limit"]
    static let devicePolicyFlags: Set<String> = ["require-extensions", "no-require-extensions"]

    static func givesDevicePolicy(_ arguments: Arguments) -> Bool {
        devicePolicyOptions.contains { arguments.has(option: $0) } || devicePolicyFlags.contains { arguments.has($0) }
    }

    /// The device-policy options given; the others keep their value. Each `--distribution`
    /// replaces the list of the environment it names.
    static func applyDevicePolicyOptions(_ arguments: Arguments, to policy: inout DevicePolicy) throws {
        do {
            for text in arguments.all("distribution") {
                let (environment, set) = try Validate.distribution(text)
                policy.distribution[environment] = set
            }
            if let text = try arguments.value("min-bundle-version") {
                policy.minBundleVersion = text.lowercased() == "none" ? nil : try Validate.bundleVersion(text)
            }
            if let text = try arguments.value("platforms") { policy.platforms = try Validate.platforms(text) }
        } catch let error as AdminError { throw UsageError(error.description) }
        if let n = try arguments.integer("risk-limit", range: 0...1_000_000_000) { policy.riskLimit = n }
        if arguments.has("require-extensions") && arguments.has("no-require-extensions") {
            throw UsageError("give one of --require-extensions and --no-require-extensions")
        }
        if arguments.has("require-extensions") { policy.requireExtensions = true }
        if arguments.has("no-require-extensions") { policy.requireExtensions = false }
    }

    static let policyOptions = Set(["models", "max-tokens", "device-requests-per-minute", "monthly-token-budget", "server-tools",
                                    "max-server-tool-uses", "betas", "profile-requests-per-minute", "profile-monthly-token-budget"])
        .union(moneyBudgetOptions)

    /// The policy options given; the others keep their value.
    static func applyPolicyOptions(_ arguments: Arguments, to policy: inout IntegrationPolicy) throws {
        if let models = try arguments.value("models") {
            let ids = models.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            policy.models = models.trimmingCharacters(in: .whitespaces) == "*" ? nil : ids
        }
        let most = 1_000_000_000_000_000
        if let n = try arguments.integer("max-tokens", range: 0...most) { policy.maxTokens = n }
        if let n = try arguments.integer("device-requests-per-minute", range: 0...most) { policy.deviceRequestsPerMinute = n }
        if let n = try arguments.integer("monthly-token-budget", range: 0...most) { policy.monthlyTokenBudget = n }
        do {
            if let text = try arguments.value("server-tools") { policy.serverTools = try Validate.serverTools(text) }
            if let text = try arguments.value("betas") { policy.betas = try Validate.betas(text) }
        } catch let error as AdminError { throw UsageError(error.description) }
        if let n = try arguments.integer("max-server-tool-uses", range: 0...most) { policy.maxServerToolUses = n }
        if let n = try arguments.integer("profile-requests-per-minute", range: 0...most) { policy.profileRequestsPerMinute = n }
        if let n = try arguments.integer("profile-monthly-token-budget", range: 0...most) { policy.profileMonthlyTokenBudget = n }
        if let n = try usd(arguments, "monthly-budget-usd") { policy.monthlyBudgetMicroUSD = n }
        if let n = try usd(arguments, "daily-budget-usd") { policy.dailyBudgetMicroUSD = n }
        if let n = try usd(arguments, "profile-monthly-budget-usd") { policy.profileMonthlyBudgetMicroUSD = n }
        if let n = try usd(arguments, "profile-daily-budget-usd") { policy.profileDailyBudgetMicroUSD = n }
    }

    /// The budgets in money `integrations create|update` take, in USD (`0` removes one).
    static let moneyBudgetOptions: Set<String> = ["monthly-budget-usd", "daily-budget-usd", "profile-monthly-budget-usd", "profile-daily-budget-usd"]

    /// `--NAME N` in USD (`2000`, `1.50`), as micro-dollars.
    static func usd(_ arguments: Arguments, _ name: String) throws -> Int64? {
        guard let text = try arguments.value(name) else { return nil }
        guard let value = MoneyText.microUSD(text.trimmingCharacters(in: .whitespaces)) else {
            throw UsageError("--\(name) \(text.prefix(40)): expected US dollars, such as 2000 or 1.50 (at most 6 decimals; 0 removes the budget)")
        }
        return value
    }

    static func updateIntegration(_ argv: [String]) throws {
        let arguments = try parse(argv, options: Set(["actor", "rule-mode"]).union(policyOptions).union(devicePolicyOptions),
                                  flags: Set(["json"]).union(devicePolicyFlags), positional: 1)
        let clientID = arguments.positional[0]
        let actor = try Validate.email(try arguments.required("actor"))
        let changesPolicy = policyOptions.contains(where: arguments.has(option:))
        let ruleModes = try ruleModes(arguments.all("rule-mode"))
        guard changesPolicy || givesDevicePolicy(arguments) || !ruleModes.isEmpty else {
            throw UsageError("nothing to change: give one or more of "
                             + (policyOptions.union(devicePolicyOptions).union(devicePolicyFlags)).union(["rule-mode"]).sorted()
                                .map { "--" + $0 }.joined(separator: ", "))
        }
        var change = IntegrationPolicy()
        try applyPolicyOptions(arguments, to: &change)
        // Checked before anything is written: a bad device option leaves the usage policy as it was too.
        var probe = DevicePolicy()
        try applyDevicePolicyOptions(arguments, to: &probe)
        let (service, _) = try open(arguments)
        var integration = try service.integration(clientID)
        if givesDevicePolicy(arguments) {
            integration = try service.updateDevicePolicy(actor: actor, clientID: clientID) { policy in
                // Already checked on `probe`: applying the same options again cannot fail.
                try? applyDevicePolicyOptions(arguments, to: &policy)
            }
        }
        if changesPolicy {
            integration = try service.updatePolicy(actor: actor, clientID: clientID) { policy in
                if arguments.has(option: "models") { policy.models = change.models }
                if arguments.has(option: "max-tokens") { policy.maxTokens = change.maxTokens }
                if arguments.has(option: "device-requests-per-minute") { policy.deviceRequestsPerMinute = change.deviceRequestsPerMinute }
                if arguments.has(option: "monthly-token-budget") { policy.monthlyTokenBudget = change.monthlyTokenBudget }
                if arguments.has(option: "server-tools") { policy.serverTools = change.serverTools }
                if arguments.has(option: "max-server-tool-uses") { policy.maxServerToolUses = change.maxServerToolUses }
                if arguments.has(option: "betas") { policy.betas = change.betas }
                if arguments.has(option: "profile-requests-per-minute") { policy.profileRequestsPerMinute = change.profileRequestsPerMinute }
                if arguments.has(option: "profile-monthly-token-budget") { policy.profileMonthlyTokenBudget = change.profileMonthlyTokenBudget }
                if arguments.has(option: "monthly-budget-usd") { policy.monthlyBudgetMicroUSD = change.monthlyBudgetMicroUSD }
                if arguments.has(option: "daily-budget-usd") { policy.dailyBudgetMicroUSD = change.dailyBudgetMicroUSD }
                if arguments.has(option: "profile-monthly-budget-usd") { policy.profileMonthlyBudgetMicroUSD = change.profileMonthlyBudgetMicroUSD }
                if arguments.has(option: "profile-daily-budget-usd") { policy.profileDailyBudgetMicroUSD = change.profileDailyBudgetMicroUSD }
            }
        }
        if !ruleModes.isEmpty { integration = try service.setRuleModes(actor: actor, clientID: clientID, ruleModes) }
        if arguments.has("json") {
            printJSON(record(integration))
        } else {
            print("updated \(clientID): devices: \(integration.devicePolicy.summary); policy: \(AdminService.describe(integration.policy))")
        }
    }

    /// `--rule-mode RULE=monitor|enforce`, each given once at most.
    static func ruleModes(_ texts: [String]) throws -> [PolicyRule: RuleMode] {
        var modes: [PolicyRule: RuleMode] = [:]
        for text in texts {
            let parts = text.split(separator: "=", maxSplits: 1).map { String($0).trimmingCharacters(in: .whitespaces) }
            guard parts.count == 2, let rule = PolicyRule(rawValue: parts[0].hasPrefix("--") ? String(parts[0].dropFirst(2)) : parts[0]),
                  let mode = RuleMode(rawValue: parts[1]) else {
                throw UsageError("--rule-mode \(text.prefix(80)): use RULE=monitor or RULE=enforce, RULE one of "
                                 + PolicyRule.allCases.map(\.rawValue).joined(separator: ", "))
            }
            guard modes.updateValue(mode, forKey: rule) == nil else { throw UsageError("--rule-mode names \(rule.rawValue) twice") }
        }
        return modes
    }

    static func listIntegrations(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["workspace"], flags: ["json"])
        let (service, _) = try open(arguments)
        let integrations = try service.integrations(workspace: try arguments.value("workspace"))
        let records = try integrations.map { try detailedRecord($0, service) }
        if arguments.has("json") {
            printJSON(["integrations": records])
        } else if records.isEmpty {
            print("no integrations")
        } else {
            for record in records { print(summaryLine(record)) }
        }
    }

    static func showIntegration(_ argv: [String]) throws {
        let arguments = try parse(argv, options: [], flags: ["json"], positional: 1)
        let (service, _) = try open(arguments)
        let record = try detailedRecord(try service.integration(arguments.positional[0]), service)
        if arguments.has("json") {
            printJSON(record)
        } else {
            for key in ["client_id", "name", "workspace", "team_id", "bundle_ids", "environments", "created_at", "revoked_at", "devices", "live_tokens"] {
                print("\(key): \(text(record[key]))")
            }
            let integration = try service.integration(arguments.positional[0])
            let counts = try service.deviceCounts(integration.clientID)
            for (label, values) in [("devices_by_platform", counts.byPlatform), ("devices_by_category", counts.byCategory),
                                    ("devices_by_bundle_version", counts.byBundleVersion), ("devices_by_risk", counts.byRisk)] {
                print("\(label): " + (values.isEmpty ? "-" : values.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")))
            }
            print("device policy: \(integration.devicePolicy.summary)")
            print("policy: \(AdminService.describe(integration.policy))")
        }
    }

    static func revokeIntegration(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["actor"], flags: ["yes"], positional: 1)
        let clientID = arguments.positional[0]
        let actor = try Validate.email(try arguments.required("actor"))
        guard arguments.has("yes") else {
            throw UsageError("revoking \(clientID) is permanent: its tokens stop working and its devices can never mint again; add --yes to confirm")
        }
        let (service, _) = try open(arguments)
        let liveTokens = try service.counts(clientID).liveTokens
        // Both stores commit before returning, so the revocation is durable once this returns.
        try service.revokeIntegration(actor: actor, clientID: clientID)
        print("revoked \(clientID) permanently (\(liveTokens) live tokens revoked)")
    }

    static func audit(_ argv: [String]) throws {
        let arguments = try parse(argv, options: ["client-id", "limit"], flags: ["json"])
        let limit = try arguments.integer("limit", default: 50, range: 1...100_000)!
        let (_, store) = try open(arguments)
        let events = try store.auditEvents(limit: limit, clientID: try arguments.value("client-id")).map { event -> [String: Any] in
            ["at": iso8601(event.at), "actor": event.actor ?? NSNull(), "action": event.action,
             "client_id": event.clientID ?? NSNull(), "key_id": event.keyID.map { Data($0).base64EncodedString() } ?? NSNull(),
             "reason": event.reason ?? NSNull(), "detail": event.detail ?? NSNull(), "count": event.count]
        }
        if arguments.has("json") {
            printJSON(["events": events])
        } else {
            for event in events {
                let fields = ["actor", "client_id", "key_id", "reason"].compactMap { key in (event[key] as? String).map { "\(key)=\($0)" } }
                print(([text(event["at"]), text(event["action"])] + fields + [(event["detail"] as? String) ?? ""]).joined(separator: "  "))
            }
        }
    }

    // MARK: Helpers

    /// Parses with `--db` allowed everywhere and an exact number of positional arguments.
    static func parse(_ argv: [String], options: Set<String>, flags: Set<String> = [], positional: Int = 0) throws -> Arguments {
        let arguments = try Arguments(argv, options: options.union(["db", "secrets-key-file"]), flags: flags)
        guard arguments.positional.count == positional else {
            throw UsageError(positional == 0 ? "unexpected argument \(arguments.positional[0])"
                                             : "expected \(positional) argument(s), got \(arguments.positional.count)")
        }
        return arguments
    }

    /// Opening migrates the database, so it happens only after the arguments are known to be good.
    /// Only `init` and `migrate` create a SQLite file: any other command run away from it would
    /// otherwise make an empty one and then fail on something else.
    static func open(_ arguments: Arguments, mode: MigrationMode = .apply, creating: Bool = false) throws -> (AdminService, any Database) {
        let database = try databasePath(arguments)
        if !creating, !Stores.isPostgres(database), !FileManager.default.fileExists(atPath: database) {
            throw UsageError("no initialised database at \(database): run from where you ran init, or pass --db / ATTESTD_DB")
        }
        let store = try Stores.open(database, connections: 1, mode: mode, busyTimeoutMilliseconds: 10_000)
        return (AdminService(store: store), store)
    }

    static func databasePath(_ arguments: Arguments) throws -> String {
        let environment = ProcessInfo.processInfo.environment["ATTESTD_DB"].flatMap { $0.isEmpty ? nil : $0 }
        return try arguments.value("db") ?? environment ?? "./attestd.sqlite"
    }

    static func secretsKeyPath(_ arguments: Arguments) throws -> String {
        let database = try databasePath(arguments)
        return try arguments.value("secrets-key-file") ?? SecretsKeyFile.defaultPath(database: database, isFile: !Stores.isPostgres(database))
    }

    /// What `integrations create --json` prints.
    static func record(_ integration: Integration) -> [String: Any] {
        ["client_id": integration.clientID, "name": integration.name, "workspace": integration.workspaceName,
         "team_id": integration.teamID, "bundle_ids": integration.bundleIDs,
         "environments": integration.environments.map(\.rawValue).sorted(), "created_at": iso8601(integration.createdAt),
         "policy": policyRecord(integration.policy),
         "device_policy": devicePolicyRecord(integration.devicePolicy)]
    }

    /// The spending policy as `--json` prints it: lists as arrays (`["*"]` for any), limits as numbers (0: none).
    static func policyRecord(_ policy: IntegrationPolicy) -> [String: Any] {
        ["models": policy.models ?? ["*"], "max_tokens": policy.maxTokens, "device_requests_per_minute": policy.deviceRequestsPerMinute,
         "monthly_token_budget": policy.monthlyTokenBudget, "server_tools": policy.serverTools.map { $0.sorted() } ?? ["*"],
         "max_server_tool_uses": policy.maxServerToolUses, "betas": policy.betas ?? ["*"],
         "profile_requests_per_minute": policy.profileRequestsPerMinute, "profile_monthly_token_budget": policy.profileMonthlyTokenBudget,
         "monitored_rules": policy.monitored.sorted().map(\.rawValue),
         "monthly_budget_micro_usd": policy.monthlyBudgetMicroUSD, "daily_budget_micro_usd": policy.dailyBudgetMicroUSD,
         "profile_monthly_budget_micro_usd": policy.profileMonthlyBudgetMicroUSD, "profile_daily_budget_micro_usd": policy.profileDailyBudgetMicroUSD]
    }

    static func devicePolicyRecord(_ policy: DevicePolicy) -> [String: Any] {
        ["distribution": Dictionary(uniqueKeysWithValues: AttestationEnvironment.allCases.map { ($0.rawValue, policy.admitted($0).sorted().map(\.rawValue)) }),
         "min_bundle_version": policy.minBundleVersion?.description ?? NSNull(), "require_extensions": policy.requireExtensions,
         "platforms": policy.platforms.map(\.rawValue).sorted(), "risk_limit": policy.riskLimit]
    }

    /// The record plus usage counts and revocation time, for list and show.
    static func detailedRecord(_ integration: Integration, _ service: AdminService) throws -> [String: Any] {
        let counts = try service.counts(integration.clientID)
        var result = record(integration)
        result["devices"] = counts.devices
        result["live_tokens"] = counts.liveTokens
        result["revoked_at"] = integration.revokedAt.map(iso8601) ?? NSNull()
        let inventory = try service.deviceCounts(integration.clientID)
        result["device_counts"] = ["by_platform": inventory.byPlatform, "by_category": inventory.byCategory,
                                   "by_bundle_version": inventory.byBundleVersion, "by_risk": inventory.byRisk]
        return result
    }

    static func summaryLine(_ record: [String: Any]) -> String {
        var line = "\(text(record["client_id"]))  \(text(record["name"]))  workspace=\(text(record["workspace"]))"
            + "  team=\(text(record["team_id"]))  bundles=\(text(record["bundle_ids"]))  environments=\(text(record["environments"]))"
            + "  devices=\(text(record["devices"]))  live_tokens=\(text(record["live_tokens"]))"
        if record["revoked_at"] is String { line += "  revoked_at=\(text(record["revoked_at"]))" }
        return line
    }

    static func text(_ value: Any?) -> String {
        switch value {
        case let list as [String]: return list.joined(separator: ",")
        case nil, is NSNull: return "-"
        case let value?: return "\(value)"
        }
    }

    static func iso8601(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.string(from: date)
    }
}
