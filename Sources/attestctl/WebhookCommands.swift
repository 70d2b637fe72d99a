import AttestCrypto
import CommandLineSupport
import Foundation
import TokenService

/// `attestctl webhooks add|list|remove`: where a workspace's budget alerts are POSTed.
enum WebhookCommands {
    static let usage = """
    usage: attestctl webhooks add --actor EMAIL --workspace NAME --url URL --events budget.threshold[,…] [--thresholds 50,80,100] [--json]
             a webhook endpoint of the workspace (admins and above; audited). Prints its signing secret once: store
             it with the receiver, it is kept sealed under the secrets key and never shown again. URL: https://…
             (http:// only to a loopback address). Each threshold (percent of a budget, default 50,80,100) fires
             once per budget and period. Deliveries are POSTs of JSON with X-Attestd-Event, X-Attestd-Delivery
             (the idempotency ID: a retry carries the same) and X-Attestd-Signature: t=UNIX,v1=HEX, the
             HMAC-SHA256 with the secret of "UNIX." followed by the body; retried with backoff (1 s doubling, at
             most 10 minutes, 16 attempts) until the receiver answers 2xx.
           attestctl webhooks list [--workspace NAME] [--json]
             each endpoint with its last delivery: its state (pending, delivered, failed), attempts, last status
           attestctl webhooks remove --actor EMAIL --workspace NAME --id N
             removes the endpoint; its undelivered events are given up (audited)
    """
    static let help = CommandHelp(usage, tool: "attestctl")

    static func run(_ argv: [String]) throws -> Int32 {
        if wantsHelp(argv) {
            print(help.text(for: ["webhooks"] + argv) ?? usage)
            return 0
        }
        do {
            switch argv.first {
            case "add": try add(Array(argv.dropFirst()))
            case "list": try list(Array(argv.dropFirst()))
            case "remove": try remove(Array(argv.dropFirst()))
            default: throw UsageError(usage)
            }
            return 0
        } catch let error as AdminError {
            throw UsageError(error.description)
        }
    }

    static func add(_ argv: [String]) throws {
        let arguments = try AdminCommands.parse(argv, options: ["actor", "workspace", "url", "events", "thresholds"], flags: ["json"])
        let actor = try Validate.email(try arguments.required("actor"))
        let events = try (try arguments.required("events")).split(separator: ",").map { name in
            let trimmed = name.trimmingCharacters(in: .whitespaces)
            guard let event = WebhookEvent(rawValue: trimmed) else {
                throw UsageError("--events \(trimmed.prefix(60)): use " + WebhookEvent.allCases.map(\.rawValue).joined(separator: ", "))
            }
            return event
        }
        var thresholds = WebhookEndpoint.defaultThresholds
        if let text = try arguments.value("thresholds") {
            thresholds = try text.split(separator: ",").map { part in
                guard let value = Int(part.trimmingCharacters(in: .whitespaces)) else { throw UsageError("--thresholds \(text.prefix(60)): use percents such as 50,80,100") }
                return value
            }
        }
        let (service, _) = try AdminCommands.open(arguments)
        let (endpoint, secret) = try service.addWebhook(actor: actor, workspace: try arguments.required("workspace"), url: try arguments.required("url"),
                                                        events: Array(events), thresholds: thresholds, secrets: try AdminCommands.secretBox(arguments))
        if arguments.has("json") {
            var record = self.record(endpoint)
            record["signing_secret"] = secret
            printJSON(record)
        } else {
            print("added webhook #\(endpoint.id) of \(endpoint.workspaceName): \(endpoint.url), events \(WebhookEndpoint.column(endpoint.events)), "
                  + "thresholds \(WebhookEndpoint.column(endpoint.thresholds))")
            print("signing secret (shown once; it is stored sealed and never printed again): \(secret)")
        }
    }

    static func list(_ argv: [String]) throws {
        let arguments = try AdminCommands.parse(argv, options: ["workspace"], flags: ["json"])
        let (service, _) = try AdminCommands.open(arguments)
        let endpoints = try service.webhooks(workspace: try arguments.value("workspace"))
        if arguments.has("json") {
            printJSON(["webhooks": endpoints.map(record)])
            return
        }
        guard !endpoints.isEmpty else { return print("no webhooks") }
        for endpoint in endpoints {
            let last = endpoint.lastDelivery.map { last in
                "\(last.state.rawValue) \(last.id) attempts=\(last.attempts) status=\(last.lastStatus.map(String.init) ?? "-")"
                    + (last.lastAttemptAt.map { " at " + AdminCommands.iso8601($0) } ?? "") + (last.lastError.map { " error=\($0)" } ?? "")
            } ?? "none"
            print("#\(endpoint.id)  workspace=\(endpoint.workspaceName)  \(endpoint.url)  events=\(WebhookEndpoint.column(endpoint.events))  "
                  + "thresholds=\(WebhookEndpoint.column(endpoint.thresholds))  last_delivery=\(last)")
        }
    }

    static func remove(_ argv: [String]) throws {
        let arguments = try AdminCommands.parse(argv, options: ["actor", "workspace", "id"])
        let actor = try Validate.email(try arguments.required("actor"))
        guard let id = try arguments.integer("id", range: 1...Int.max) else { throw UsageError("--id N: the webhook's number (webhooks list)") }
        let (service, _) = try AdminCommands.open(arguments)
        let workspace = try arguments.required("workspace")
        try service.removeWebhook(actor: actor, workspace: workspace, id: Int64(id))
        print("removed webhook #\(id) of \(workspace)")
    }

    /// What `--json` prints of an endpoint (never its secret).
    static func record(_ endpoint: WebhookEndpoint) -> [String: Any] {
        var last: Any = NSNull()
        if let delivery = endpoint.lastDelivery {
            last = ["id": delivery.id, "event": delivery.event, "state": delivery.state.rawValue, "attempts": delivery.attempts,
                    "created_at": AdminCommands.iso8601(delivery.createdAt), "last_attempt_at": delivery.lastAttemptAt.map(AdminCommands.iso8601) ?? NSNull(),
                    "last_status": delivery.lastStatus ?? NSNull(), "last_error": delivery.lastError ?? NSNull()] as [String: Any]
        }
        return ["id": endpoint.id, "workspace": endpoint.workspaceName, "url": endpoint.url, "events": endpoint.events.map(\.rawValue),
                "thresholds": endpoint.thresholds, "created_at": AdminCommands.iso8601(endpoint.createdAt), "created_by": endpoint.createdBy,
                "last_delivery": last]
    }
}
