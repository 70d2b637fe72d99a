import AttestCrypto
import Foundation
import HTTPRouting
import TokenService

/// Workspace settings: the upstream API key (set or replaced, never shown: only whether it is
/// set, when, by whom and its last 4 characters) and the members with their roles.
enum SettingsPage {
    static func render(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        let query = request.query
        let notice: HTML = query["key"] != nil ? ConsolePages.notice("Upstream API key saved. Relayed requests use it from now on.")
            : query["added"] != nil ? ConsolePages.notice("Member added.")
            : query["removed"] != nil ? ConsolePages.notice("Member removed; their sessions have ended.") : ""
        return try page(request, admin, notice: notice, errors: [:], status: 200)
    }

    static func page(_ request: ConsoleRequest, _ admin: AdminService, notice: HTML, errors: [String: String], status: Int,
                     typed: (email: String, role: String) = ("", "developer")) throws -> RouteOutcome {
        let workspace = request.session.workspace
        let (_, key) = try admin.workspaceDetails(workspace.name)
        var content = HTML.element("h1", [], "Workspace settings") + HTML.element("p", [], "Workspace " + HTML.element("strong", [], HTML.text(workspace.name)))
            + notice

        // The upstream key.
        var keySection = HTML.element("h2", [("id", "key-heading")], "Upstream API key")
            + HTML.element("p", [], "The workspace's key for the Messages API. The relay uses it for every app of this workspace; apps never see it.")
        if let key {
            keySection += ConsolePages.facts([("Status", "Set"), ("Ends in", HTML.element("code", [("id", "key-last4")], HTML.text(key.last4))),
                                              ("Set", ConsoleTime.html(key.setAt) + " by " + HTML.text(key.setBy))], id: "upstream-key")
        } else {
            keySection += ConsolePages.facts([("Status", "Not set: relayed requests are refused until a key is set")], id: "upstream-key")
        }
        if request.isOwner {
            keySection += HTML.element("form", [("method", "post"), ("action", "/console/settings/upstream-key"), ("novalidate", "")],
                ConsolePages.csrfField(request)
                + ConsolePages.field(key == nil ? "Upstream API key" : "New upstream API key", name: "upstream_key", value: "", type: "password",
                                     error: errors["upstream_key"], hint: "Stored sealed; only its last 4 characters are ever shown.",
                                     attributes: [("required", ""), ("autocomplete", "off"), ("spellcheck", "false")])
                + HTML.element("div", [("class", "actions")],
                               HTML.element("button", [("type", "submit"), ("class", "primary")], key == nil ? "Set key" : "Replace key")))
        } else {
            keySection += HTML.element("p", [("class", "hint")], "Setting the key needs the owner or primary owner role.")
        }
        content += HTML.element("section", [("aria-labelledby", "key-heading")], keySection)

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
                HTML.element("option", [("value", $0.rawValue), ("selected", typed.role == $0.rawValue ? "" : nil)], HTML.text(ConsolePages.roleName($0)))
            })
            membersSection += HTML.element("form", [("method", "post"), ("action", "/console/settings/members"), ("class", "inline-form"), ("novalidate", "")],
                ConsolePages.csrfField(request) + HTML.element("h3", [], "Add a member")
                + ConsolePages.field("Email", name: "email", value: typed.email, type: "email", error: errors["email"], attributes: [("required", "")])
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

    static func setUpstreamKey(_ request: ConsoleRequest, _ admin: AdminService, _ secrets: SecretsKeySource?) throws -> RouteOutcome {
        guard request.isOwner else {
            throw AdminError("\(request.session.email) is \(request.session.role.rawValue) in \(request.session.workspace.name) and may not set the upstream key: "
                             + "that needs the owner or primary owner role.", kind: .forbidden)
        }
        guard let box = secrets?.current() else {
            return try page(request, admin, notice: "", errors: ["upstream_key": "The deployment's secrets key file is missing, so the key cannot be sealed: run attestctl init on the server."],
                            status: 503)
        }
        do {
            try admin.setUpstreamKey(actor: request.session.email, workspace: request.session.workspace.name, key: request.form["upstream_key"] ?? "",
                                     secrets: box)
        } catch let error as AdminError where error.kind == .invalid {
            return try page(request, admin, notice: "", errors: ["upstream_key": error.description], status: 422)
        }
        return RouteOutcome(ConsoleRoutes.redirect("/console/settings?key=1"))
    }

    static func addMember(_ request: ConsoleRequest, _ admin: AdminService) throws -> RouteOutcome {
        try request.requireManager("add members")
        let email = request.form["email"] ?? "", roleText = request.form["role"] ?? ""
        guard let role = Role(rawValue: roleText), role != .primaryOwner else {
            return try page(request, admin, notice: "", errors: ["email": "Choose a role: owner, admin, developer or user."], status: 422, typed: (email, roleText))
        }
        do {
            try admin.addMember(actor: request.session.email, email: email, role: role, workspace: request.session.workspace.name)
        } catch let error as AdminError where error.kind == .invalid {
            return try page(request, admin, notice: "", errors: ["email": error.description], status: 422, typed: (email, roleText))
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
