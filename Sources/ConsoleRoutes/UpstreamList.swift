import Foundation
import HTTPRouting
import TokenService

/// Workspace settings' list of upstreams: each, in the order requests try them, with its kind,
/// models and state on this attestd (ready, cooling down after a failed try, or unavailable; the
/// cool-downs are each instance's own), and for owners a form to move it up or down or remove it.
/// Labelled upstreams are added with attestctl (`set-upstream-… --upstream LABEL`).
enum UpstreamList {
    static func section(_ request: ConsoleRequest, _ admin: AdminService, health: UpstreamHealth?, error: String?) throws -> HTML {
        let (workspace, upstreams) = try admin.upstreams(workspace: request.session.workspace.name)
        var out = HTML.element("h2", [("id", "upstreams-heading")], "Upstreams")
            + HTML.element("p", [], "Requests go to the first upstream whose models include theirs, and to the next when it answers 429, 529 or "
                           + "a server error, cannot be reached or refuses its credentials before anything reached the app.")
        if let error { out += ConsolePages.notice(error, kind: "error") }
        let code = { (text: String) in HTML.element("code", [], HTML.text(text)) }
        let rows: [[HTML]] = upstreams.enumerated().map { index, upstream in
            let state = health?.state(workspace: workspace.id, label: upstream.label)
            let stateText = switch state?.state ?? .ready {
            case .ready: "Ready"
            case .coolingDown: "Cooling down" + (state?.coolsFor.map { " (\(max(1, Int($0.components.seconds))) s left)" } ?? " (to be tried again)")
            case .unavailable: "Unavailable: its credentials or settings cannot be used"
            }
            let models = upstream.key.settings.map { $0.models.sorted { $0.key < $1.key }.map(\.key).joined(separator: ", ") } ?? "any"
            var row: [HTML] = [HTML.text(String(index + 1)), code(upstream.label), HTML.text(UpstreamSettings.name(upstream.key)), HTML.text(models),
                               HTML.element("span", [("class", "upstream-state"), ("data-label", upstream.label)], HTML.text(stateText))]
            if request.isOwner {
                func action(_ name: String, _ value: String, _ text: String, danger: Bool = false) -> HTML {
                    HTML.element("form", [("method", "post"), ("action", "/console/settings/upstreams/\(name)"), ("class", "inline")],
                                 ConsolePages.csrfField(request) + HTML.void("input", [("type", "hidden"), ("name", "label"), ("value", upstream.label)])
                                 + HTML.void("input", [("type", "hidden"), ("name", "direction"), ("value", value)])
                                 + HTML.element("button", [("type", "submit"), ("class", danger ? "link danger" : "link"),
                                                           ("aria-label", "\(text) \(upstream.label)")], HTML.text(text)))
                }
                var actions: HTML = ""
                if index > 0 { actions += action("move", "up", "Move up") }
                if index < upstreams.count - 1 { actions += action("move", "down", "Move down") }
                actions += action("remove", "", "Remove", danger: true)
                row.append(actions)
            }
            return row
        }
        out += ConsolePages.table(caption: "Upstreams of \(workspace.name), in the order they are tried", id: "upstreams",
                                  headers: ["Order", "Label", "Upstream", "Models", "State"] + (request.isOwner ? ["Actions"] : []), rows: rows,
                                  empty: "No upstream: relayed requests use attestd's --upstream-key-file, if given.")
        return out
    }

    /// Moves one upstream a place up or down (owners only, audited).
    static func move(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let label = request.form["label"] ?? "", up = request.form["direction"] == "up"
        var labels = try admin.upstreams(workspace: request.session.workspace.name).upstreams.map(\.label)
        guard let index = labels.firstIndex(of: label) else { return try SettingsPage.page(request, admin, notice: "", errors: ["upstreams": "No such upstream."], status: 422) }
        let other = up ? index - 1 : index + 1
        if labels.indices.contains(other) { labels.swapAt(index, other) }
        do {
            try admin.orderUpstreams(actor: request.session.email, workspace: request.session.workspace.name, labels: labels)
        } catch let error as AdminError where error.kind == .invalid {
            return try SettingsPage.page(request, admin, notice: "", errors: ["upstreams": error.description], status: 422)
        }
        return RouteOutcome(ConsoleRoutes.redirect("/console/settings?upstreams=1"))
    }

    /// Removes one upstream (owners only, audited).
    static func remove(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        do {
            try admin.removeUpstream(actor: request.session.email, workspace: request.session.workspace.name, label: request.form["label"] ?? "")
        } catch let error as AdminError where error.kind == .invalid {
            return try SettingsPage.page(request, admin, notice: "", errors: ["upstreams": error.description], status: 422)
        }
        return RouteOutcome(ConsoleRoutes.redirect("/console/settings?upstreams=1"))
    }
}
