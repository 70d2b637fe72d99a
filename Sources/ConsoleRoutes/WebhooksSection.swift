import Foundation
import TokenService

/// Workspace settings' webhooks: each endpoint with its events, thresholds and last delivery
/// (pending, delivered or failed, the receiver's status, attempts). Added and removed with
/// `attestctl webhooks` (the signing secret is shown there, once).
enum WebhooksSection {
    static func render(_ request: ConsoleRequest, _ admin: AdminService) throws -> HTML {
        let endpoints = try admin.webhooks(workspace: request.session.workspace.name)
        let rows: [[HTML]] = endpoints.map { endpoint in
            var last: HTML = "None yet"
            if let delivery = endpoint.lastDelivery {
                let label = switch delivery.state {
                case .delivered: "Delivered"
                case .failed: "Failed"
                case .pending: delivery.attempts == 0 ? "Pending" : "Retrying"
                }
                last = HTML.element("span", [("class", "delivery \(delivery.state.rawValue)")], HTML.text(label))
                    + HTML.text(delivery.lastStatus.map { " (HTTP \($0))" } ?? (delivery.attempts > 0 ? " (no answer)" : ""))
                    + (delivery.lastAttemptAt.map { " " + ConsoleTime.html($0) } ?? "")
            }
            return [HTML.element("code", [("class", "url")], HTML.text(endpoint.url)), HTML.text(WebhookEndpoint.column(endpoint.events)),
                    HTML.text(endpoint.thresholds.map { "\($0)%" }.joined(separator: ", ")), last,
                    HTML.text(endpoint.lastDelivery?.attempts ?? 0)]
        }
        return HTML.element("section", [("aria-labelledby", "webhooks-heading")],
            HTML.element("h2", [("id", "webhooks-heading")], "Webhooks")
            + HTML.element("p", [("class", "hint")],
                           "Budget alerts are POSTed to these endpoints, signed, once per threshold and period. "
                           + "Add or remove one with attestctl webhooks add|remove; its signing secret is shown there, once.")
            + ConsolePages.table(caption: "Webhook endpoints of \(request.session.workspace.name) and their last delivery", id: "webhooks",
                                 headers: ["URL", "Events", "Thresholds", "Last delivery", "Attempts"], rows: rows, empty: "No webhooks."))
    }
}
