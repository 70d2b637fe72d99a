import Foundation
import HTTPRouting
import TokenService

/// Workspace settings: the upstream (`UpstreamSettings`: its kind and settings, never its
/// credentials) and the members with their roles.
enum SettingsPage {
    static func render(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let query = request.query
        var notice: HTML = ""
        if query["key"] != nil {
            notice = ConsolePages.notice("Upstream API key saved. Relayed requests use it from now on.")
        } else if let kind = query["upstream"].flatMap(UpstreamKind.init(rawValue:)) {
            notice = ConsolePages.notice("Upstream set to \(UpstreamSettings.name(kind)). Relayed requests use it from now on.")
        } else if query["upstreams"] != nil {
            notice = ConsolePages.notice("Upstreams changed. Relayed requests follow the new list from now on.")
        } else if query["budget"] != nil {
            notice = ConsolePages.notice("Budgets saved. Every instance applies them to the next request.")
        } else if query["added"] != nil {
            notice = ConsolePages.notice("Member added.")
        } else if query["removed"] != nil {
            notice = ConsolePages.notice("Member removed; their sessions have ended.")
        }
        return try page(request, admin, notice: notice, errors: [:], status: 200)
    }

    static func page(_ request: ConsoleRequest, _ admin: AdminService, notice: HTML, errors: [String: String], status: Int,
                     typed: [String: String] = [:]) throws -> RouteOutcome {
        let workspace = request.session.workspace
        let (_, key) = try admin.workspaceDetails(workspace.name)
        var content = HTML.element("h1", [], "Workspace settings") + HTML.element("p", [], "Workspace " + HTML.element("strong", [], HTML.text(workspace.name)))
            + notice

        content += HTML.element("section", [("aria-labelledby", "key-heading")], UpstreamSettings.section(request, key, errors: errors, typed: typed))
        content += HTML.element("section", [("aria-labelledby", "upstreams-heading")],
                                try UpstreamList.section(request, admin, health: request.health, error: errors["upstreams"]))

        content += try WorkspaceBudgetSection.render(request, admin, errors: errors, typed: typed)
        content += try WebhooksSection.render(request, admin)

        // Members.
        let members = try admin.members(workspace: workspace.name)
        let rows: [[HTML]] = members.map { member in
            var row: [HTML] = [HTML.text(member.email), HTML.text(ConsolePages.roleName(member.role)), ConsoleTime.html(member.addedAt)]
            if request.canManage {
                row.append(removable(request, member) ? HTML.element("form", [("method", "post"), ("action", "/console/settings/members/remove")],
                    ConsolePages.csrfField(request) + HTML.void("input", [("type", "hidden"), ("name", "email"), ("value", member.email)])
                    + HTML.element("button", [("type", "submit"), ("class", "link danger"), ("aria-label", "Remove \(member.email)")], "Remove")) : "")
            }
            return row
        }
        var membersSection = HTML.element("h2", [("id", "members-heading")], "Members")
        if let error = errors["members"] { membersSection += ConsolePages.notice(error, kind: "error") }
        membersSection += ConsolePages.table(caption: "Members of \(workspace.name)", id: "members",
                                             headers: ["Email", "Role", "Added"] + (request.canManage ? ["Actions"] : []), rows: rows, empty: "No members.")
        if request.canManage {
            let roles: [Role] = request.isOwner ? [.owner, .admin, .developer, .user] : [.developer, .user]
            let options = HTML.join(roles.map {
                HTML.element("option", [("value", $0.rawValue), ("selected", (typed["role"] ?? "developer") == $0.rawValue ? "" : nil)], HTML.text(ConsolePages.roleName($0)))
            })
            membersSection += HTML.element("form", [("method", "post"), ("action", "/console/settings/members"), ("class", "inline-form"), ("novalidate", "")],
                ConsolePages.csrfField(request) + HTML.element("h3", [], "Add a member")
                + ConsolePages.field("Email", name: "email", value: typed["email"] ?? "", type: "email", error: errors["email"], attributes: [("required", "")])
                + HTML.element("div", [("class", "field")], HTML.element("label", [("for", "role")], "Role")
                               + HTML.element("select", [("id", "role"), ("name", "role")], options))
                + HTML.element("div", [("class", "actions")], HTML.element("button", [("type", "submit")], "Add member")))
        } else {
            membersSection += HTML.element("p", [("class", "hint")], "Managing members needs the admin, owner or primary owner role.")
        }
        content += HTML.element("section", [("aria-labelledby", "members-heading")], membersSection)
        let html = ConsolePages.layout(title: "Workspace settings", request: request, nav: .settings, content)
        return RouteOutcome(ConsoleRoutes.finish(html, status: status), reason: errors.isEmpty ? nil : "console_invalid_form")
    }

    /// Whom this member may remove (the service decides; this only spares the page a button that always fails).
    static func removable(_ request: ConsoleRequest, _ member: Member) -> Bool {
        guard member.role != .primaryOwner, member.email != request.session.email else { return false }
        return request.isOwner || member.role == .developer || member.role == .user
    }

    static func addMember(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        try request.requireManager("add members")
        let email = request.form["email"] ?? "", roleText = request.form["role"] ?? ""
        guard let role = Role(rawValue: roleText), role != .primaryOwner else {
            return try page(request, admin, notice: "", errors: ["email": "Choose a role: owner, admin, developer or user."], status: 422, typed: request.form)
        }
        do {
            try admin.addMember(actor: request.session.email, email: email, role: role, workspace: request.session.workspace.name)
        } catch let error as AdminError where error.kind == .invalid {
            return try page(request, admin, notice: "", errors: ["email": error.description], status: 422, typed: request.form)
        }
        return RouteOutcome(ConsoleRoutes.redirect("/console/settings?added=1"))
    }

    static func removeMember(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        try request.requireManager("remove members")
        let email = request.form["email"] ?? ""
        guard (try? Validate.email(email)) != request.session.email else {
            return try page(request, admin, notice: "", errors: ["members": "You cannot remove yourself; ask an owner."], status: 422)
        }
        try admin.removeMember(actor: request.session.email, email: email, workspace: request.session.workspace.name)
        return RouteOutcome(ConsoleRoutes.redirect("/console/settings?removed=1"))
    }
}
