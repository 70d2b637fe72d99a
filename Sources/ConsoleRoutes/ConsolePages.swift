import Foundation
import TokenService

/// The console's frame (head, header, navigation) and its small pages: sign-in outcomes,
/// notices, refusals.
enum ConsolePages {
    enum Section { case integrations, settings }

    /// A whole page. With a request: the signed-in header (workspace, member, role, sign out).
    static func layout(title: String, request: ConsoleRequest?, nav: Section?, _ content: HTML) -> HTML {
        var header: HTML = HTML.element("a", [("class", "brand"), ("href", "/console/")], "App Attest Console")
        if let request {
            let link = { (section: Section, href: String, label: String) -> HTML in
                HTML.element("a", [("href", href), ("aria-current", nav == section ? "page" : nil)], HTML.text(label))
            }
            header += HTML.element("nav", [("aria-label", "Workspace")],
                                   link(.integrations, "/console/", "App integrations") + link(.settings, "/console/settings", "Workspace settings"))
            header += HTML.element("div", [("class", "who")],
                HTML.element("span", [], HTML.text(request.session.email) + " · " + HTML.text(roleName(request.session.role))
                             + " in " + HTML.text(request.session.workspace.name))
                + HTML.element("form", [("method", "post"), ("action", "/console/sign-out")],
                               csrfField(request) + HTML.element("button", [("type", "submit"), ("class", "link")], "Sign out")))
        }
        let document: HTML = """
            <!doctype html>
            <html lang="en">
            <head>
            <meta charset="utf-8">
            <meta name="viewport" content="width=device-width, initial-scale=1">
            <title>
            """
        return document + HTML.text(title) + " · App Attest Console</title>\n"
            + "<link rel=\"stylesheet\" href=\"/console/static/console.css\">\n"
            + "<script src=\"/console/static/console.js\" defer></script>\n</head>\n<body>\n"
            + HTML.element("header", [("class", "top")], header) + "\n"
            + HTML.element("main", [("id", "main")], content) + "\n</body>\n</html>\n"
    }

    static func message(_ title: String, _ text: String) -> HTML {
        layout(title: title, request: nil, nav: nil, HTML.element("h1", [], HTML.text(title)) + HTML.element("p", [], HTML.text(text)))
    }

    static func notice(_ text: String, kind: String = "info") -> HTML {
        HTML.element("p", [("class", "notice \(kind)"), ("role", kind == "error" ? "alert" : "status")], HTML.text(text))
    }

    static func csrfField(_ request: ConsoleRequest) -> HTML {
        HTML.void("input", [("type", "hidden"), ("name", "csrf"), ("value", request.csrf)])
    }

    static func roleName(_ role: Role) -> String {
        switch role {
        case .primaryOwner: "Primary owner"
        case .owner: "Owner"
        case .admin: "Admin"
        case .developer: "Developer"
        case .user: "User"
        }
    }

    // MARK: Signing in

    static let howToSignIn = "Ask for a sign-in link on the server: attestctl console-login --actor you@example.com (it is valid 10 minutes, once)."

    static func signInNeeded() -> HTML {
        layout(title: "Sign in", request: nil, nav: nil,
               HTML.element("h1", [], "Sign in") + HTML.element("p", [], "You are not signed in, or your session has ended (after 30 minutes idle or 12 hours).")
               + HTML.element("p", [], HTML.text(howToSignIn)))
    }

    static func signedIn(_ session: ConsoleSession) -> HTML {
        // Continued by a link (and a refresh): a same-site navigation, so the SameSite=Strict cookie
        // goes with it even when the link was opened from a mail client or chat.
        let text = HTML.element("h1", [], "Signed in")
            + HTML.element("p", [], "Signed in as " + HTML.text(session.email) + " (" + HTML.text(roleName(session.role)) + ") in workspace "
                           + HTML.text(session.workspace.name) + ".")
            + HTML.element("p", [], HTML.element("a", [("href", "/console/"), ("id", "continue")], "Continue to App integrations"))
        let page = layout(title: "Signed in", request: nil, nav: nil, text)
        return HTML(raw: page.raw.replacingOccurrences(of: "<meta charset=\"utf-8\">",
                                                       with: "<meta charset=\"utf-8\">\n<meta http-equiv=\"refresh\" content=\"0; url=/console/\">"))
    }

    /// The sign-in link's page: one button posts the link's token (a preview's GET spends nothing).
    static func signInButton(token: String) -> HTML {
        let form = HTML.element("form", [("method", "post"), ("action", "/console/sign-in")],
                                HTML.void("input", [("type", "hidden"), ("name", "token"), ("value", token)])
                                + HTML.element("div", [("class", "actions")],
                                               HTML.element("button", [("type", "submit"), ("class", "primary"), ("id", "sign-in")], "Sign in")))
        return layout(title: "Sign in", request: nil, nav: nil,
                      HTML.element("h1", [], "Sign in to the console")
                      + HTML.element("p", [], "This link signs you in once, within 10 minutes of being made.") + form)
    }

    static func signInRefused(_ state: SignInLinkState) -> HTML {
        let reason = switch state {
        case .alreadyUsed: "This sign-in link has already been used. Each link signs in once."
        case .expired: "This sign-in link has expired. Links are valid for 10 minutes."
        case .unknown, .redeemed: "This sign-in link is not valid. Check that it was copied whole."
        }
        return layout(title: "Sign-in link not valid", request: nil, nav: nil,
                      HTML.element("h1", [], "Sign-in link not valid") + HTML.element("p", [("role", "alert")], HTML.text(reason))
                      + HTML.element("p", [], HTML.text(howToSignIn))
                      + HTML.element("p", [], "Already signed in? " + HTML.element("a", [("href", "/console/"), ("id", "to-console")], "Go to the console")))
    }

    static func signedOut() -> HTML {
        layout(title: "Signed out", request: nil, nav: nil,
               HTML.element("h1", [], "Signed out") + HTML.element("p", [], "Your session has ended. " + HTML.text(howToSignIn)))
    }

    // MARK: Building blocks

    /// A table with a caption; cells are already HTML.
    static func table(caption: String, id: String? = nil, headers: [String], rows: [[HTML]], empty: String) -> HTML {
        guard !rows.isEmpty else { return HTML.element("p", [("class", "empty"), ("id", id)], HTML.text(empty)) }
        let head = HTML.element("tr", [], HTML.join(headers.map { HTML.element("th", [("scope", "col")], HTML.text($0)) }))
        let body = HTML.join(rows.map { row in HTML.element("tr", [], HTML.join(row.map { HTML.element("td", [], $0) })) })
        return HTML.element("div", [("class", "table-wrap")],
                            HTML.element("table", [("id", id)], HTML.element("caption", [], HTML.text(caption))
                                         + HTML.element("thead", [], head) + HTML.element("tbody", [], body)))
    }

    /// A labelled field, its error (if any) beside it, and a hint.
    static func field(_ label: String, name: String, value: String, type: String = "text", error: String? = nil, hint: String? = nil,
                      attributes: [(String, String?)] = [], multiline: Bool = false) -> HTML {
        let errorID = "\(name)-error", hintID = "\(name)-hint"
        let described = [error == nil ? nil : errorID, hint == nil ? nil : hintID].compactMap { $0 }.joined(separator: " ")
        let common: [(String, String?)] = [("id", name), ("name", name), ("aria-invalid", error == nil ? nil : "true"),
                                           ("aria-describedby", described.isEmpty ? nil : described)] + attributes
        let input = multiline
            // Browsers post a textarea's lines with CRLF; a bare CR would show as U+FFFD when put back.
            ? HTML.element("textarea", common + [("rows", "6")], HTML.text(value.replacingOccurrences(of: "\r\n", with: "\n")))
            : HTML.void("input", [("type", type), ("value", type == "password" ? nil : value)] + common)
        var out = HTML.element("label", [("for", name)], HTML.text(label))
        if let hint { out += HTML.element("p", [("class", "hint"), ("id", hintID)], HTML.text(hint)) }
        out += input
        if let error { out += HTML.element("p", [("class", "field-error"), ("id", errorID)], HTML.text(error)) }
        return HTML.element("div", [("class", "field" + (error == nil ? "" : " invalid"))], out)
    }

    static func checkbox(_ label: String, name: String, checked: Bool, disabled: Bool = false) -> HTML {
        HTML.element("div", [("class", "check")],
                     HTML.void("input", [("type", "checkbox"), ("id", name), ("name", name), ("value", "on"), ("checked", checked ? "" : nil),
                                         ("disabled", disabled ? "" : nil)])
                     + HTML.element("label", [("for", name)], HTML.text(label)))
    }

    /// A definition list of label and value.
    static func facts(_ pairs: [(String, HTML)], id: String? = nil) -> HTML {
        HTML.element("dl", [("class", "facts"), ("id", id)],
                     HTML.join(pairs.map { HTML.element("dt", [], HTML.text($0.0)) + HTML.element("dd", [], $0.1) }))
    }
}
