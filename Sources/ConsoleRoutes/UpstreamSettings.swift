import AttestCrypto
import Foundation
import HTTPRouting
import TokenService

/// Workspace settings' upstream: where relayed requests go (the Anthropic API, Amazon Bedrock or
/// Google Vertex AI), its region or project, the model mapping, when and by whom it was set, and
/// for owners one form per kind. Credentials are never shown nor put back in a form.
enum UpstreamSettings {
    static func name(_ kind: UpstreamKind) -> String {
        switch kind {
        case .anthropic: "Anthropic API"
        case .bedrock: "Amazon Bedrock"
        case .vertex: "Google Vertex AI"
        case .compatible: "Anthropic-compatible API"
        }
    }

    /// The name an upstream goes by: its service's, for an Anthropic-compatible one.
    static func name(_ key: SealedUpstreamKey) -> String {
        key.settings?.compatible.map { $0.service.name.prefix(1).uppercased() + $0.service.name.dropFirst() } ?? name(key.kind)
    }

    /// The form that failed (`errors[kind.rawValue]`) keeps what was typed, secrets excepted.
    static func section(_ request: ConsoleRequest, _ key: SealedUpstreamKey?, errors: [String: String], typed: [String: String]) -> HTML {
        var out = HTML.element("h2", [("id", "key-heading")], "Upstream")
            + HTML.element("p", [], "Where the relay sends this workspace's Messages requests, with the workspace's credentials; apps never see them.")
        out += ConsolePages.facts(facts(key), id: "upstream-key")
        guard request.isOwner else {
            return out + HTML.element("p", [("class", "hint")], "Changing the upstream needs the owner or primary owner role.")
        }
        out += anthropicForm(request, key, error: errors[UpstreamKind.anthropic.rawValue])
        for kind in [UpstreamKind.bedrock, .vertex] {
            let error = errors[kind.rawValue]
            // What was typed after an error; else the current settings when this is the kind in use.
            let current = key?.kind == kind ? key?.settings : nil
            let values = error == nil ? defaults(kind, current) : typed
            out += HTML.element("details", [("id", "\(kind.rawValue)-settings"), ("open", error == nil ? nil : "")],
                                HTML.element("summary", [], HTML.text((key?.kind == kind ? "Change " : "Use ") + name(kind)))
                                + cloudForm(request, kind, values: values, error: error))
        }
        return out
    }

    static func facts(_ key: SealedUpstreamKey?) -> [(String, HTML)] {
        guard let key else { return [("Status", "Not set: relayed requests are refused until an upstream is set")] }
        var facts: [(String, HTML)] = [("Upstream", HTML.element("span", [("id", "upstream-kind")], HTML.text(name(key))))]
        if let settings = key.settings {
            let code = { (text: String) in HTML.element("code", [], HTML.text(text)) }
            if let project = settings.project { facts.append(("Project", code(project))) }
            facts.append(("Region", code(settings.region)))
            if let account = settings.clientEmail { facts.append(("Service account", code(account))) }
            // Where the credentials come from (the kind and its non-secret parameters), never a secret.
            facts.append(("Credentials from", HTML.element("code", [("id", "credential-source")], HTML.text(settings.credentialSource?.rawValue ?? "static"))))
            if let role = settings.assumeRole { facts.append(("Assumes role", code(role))) }
            if let tenant = settings.tenantID { facts.append(("Tenant", code(tenant))) }
            if let client = settings.clientID { facts.append(("Client ID", code(client))) }
            if let scope = settings.scope { facts.append(("Scope", code(scope))) }
            if let compatible = settings.compatible {
                facts.append(("Base URL", code(compatible.baseURL)))
                facts.append(("Auth", code(compatible.auth.rawValue + (compatible.signingService.map { " (\($0))" } ?? ""))))
            }
            if let endpoint = settings.endpointURL { facts.append(("Endpoint", code(endpoint))) }
            if let token = settings.tokenURL { facts.append(("Token URL", code(token))) }
            let models = settings.models.sorted { $0.key < $1.key }.map { HTML.element("li", [], code($0.key) + " → " + code($0.value)) }
            facts.append(("Models", HTML.element("ul", [("id", "upstream-models")], HTML.join(models))))
        }
        facts.append((key.kind == .anthropic ? "Key ends in" : "Credentials end in", HTML.element("code", [("id", "key-last4")], HTML.text(key.last4))))
        facts.append(("Set", ConsoleTime.html(key.setAt) + " by " + HTML.text(key.setBy)))
        return facts
    }

    static func anthropicForm(_ request: ConsoleRequest, _ key: SealedUpstreamKey?, error: String?) -> HTML {
        let replacing = key?.kind == .anthropic
        return HTML.element("form", [("method", "post"), ("action", "/console/settings/upstream-key"), ("novalidate", "")],
            ConsolePages.csrfField(request)
            + ConsolePages.field(replacing ? "New Anthropic API key" : "Anthropic API key", name: "upstream_key", value: "", type: "password",
                                 error: error, hint: "Stored sealed; only its last 4 characters are ever shown.",
                                 attributes: secretAttributes + [("required", "")])
            + HTML.element("div", [("class", "actions")],
                           HTML.element("button", [("type", "submit"), ("class", "primary")], replacing ? "Replace key" : "Set key")))
    }

    static let secretAttributes: [(String, String?)] = [("autocomplete", "off"), ("spellcheck", "false")]

    /// The form's Bedrock API: messages unless it says invoke.
    static func bedrockAPI(_ text: String?) throws -> BedrockAPI {
        let value = (text ?? "").trimmingCharacters(in: .whitespaces).lowercased()
        if value.isEmpty { return .messages }
        guard let api = BedrockAPI(rawValue: value) else { throw AdminError("API must be messages or invoke") }
        return api
    }

    static func betas(_ text: String?) -> [String] {
        (text ?? "").split(whereSeparator: { $0 == "," || $0.isWhitespace }).map(String.init)
    }

    /// The form's fields, named `<kind>_<field>`: what the page shows in them.
    static func defaults(_ kind: UpstreamKind, _ settings: CloudUpstreamSettings?) -> [String: String] {
        guard let settings else { return [:] }
        let p = kind.rawValue + "_"
        return [p + "region": settings.region, p + "project": settings.project ?? "", p + "endpoint_url": settings.endpointURL ?? "",
                p + "token_url": settings.tokenURL ?? "", p + "api": (settings.api ?? .invoke).rawValue,
                p + "cloud_betas": (settings.extraBetas ?? []).joined(separator: ","),
                p + "models": settings.models.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "\n")]
    }

    static func cloudForm(_ request: ConsoleRequest, _ kind: UpstreamKind, values: [String: String], error: String?) -> HTML {
        let p = kind.rawValue + "_"
        func text(_ label: String, _ field: String, hint: String? = nil, required: Bool = true) -> HTML {
            ConsolePages.field(label, name: p + field, value: values[p + field] ?? "", hint: hint,
                               attributes: [("required", required ? "" : nil), ("spellcheck", "false")])
        }
        func secret(_ label: String, _ field: String, hint: String, required: Bool = true) -> HTML {
            ConsolePages.field(label, name: p + field, value: "", type: "password", hint: hint, attributes: secretAttributes + [("required", required ? "" : nil)])
        }
        var fields: HTML = error.map { HTML.element("p", [("class", "notice error"), ("role", "alert"), ("id", p + "error")], HTML.text($0)) } ?? ""
        let endpointHint = "Optional: https://host[:port] instead of the cloud's own (http:// only to a loopback address)."
        switch kind {
        case .bedrock:
            fields += text("Region", "region", hint: "The AWS region, such as us-east-1.")
                + text("Access key ID", "access_key_id")
                + secret("Secret access key", "secret_key", hint: "Stored sealed with the access key ID; never shown again.")
                + secret("Session token", "session_token", hint: "Only for temporary credentials.", required: false)
                + text("Endpoint URL", "endpoint_url", hint: endpointHint, required: false)
                + text("API", "api", hint: "messages (the Messages API, for the newest models and inference profiles) or invoke (InvokeModel, "
                       + "for ARN-versioned legacy models). Empty: messages.", required: false)
                + text("Extra betas", "cloud_betas", hint: "Optional: betas Bedrock has accepted since, comma-separated.", required: false)
        case .vertex:
            fields += text("Project", "project", hint: "The Google Cloud project ID.")
                + text("Region", "region", hint: "The Vertex AI location, such as us-east5 or global.")
                + ConsolePages.field("Service account key (JSON)", name: p + "service_account", value: "",
                                     hint: "Paste the key file Google Cloud made. Stored sealed; only the account and its key ID's last 4 characters are shown.",
                                     attributes: secretAttributes + [("required", "")], multiline: true)
                + text("Endpoint URL", "endpoint_url", hint: endpointHint, required: false)
                + text("Token URL", "token_url", hint: "Optional: https://host[:port] instead of the key file's token_uri.", required: false)
                + text("Extra betas", "cloud_betas", hint: "Optional: betas Vertex AI has accepted since, comma-separated.", required: false)
        case .anthropic, .compatible:
            break
        }
        fields += ConsolePages.field("Models", name: p + "models", value: values[p + "models"] ?? "",
                                     hint: "One API_MODEL=CLOUD_MODEL a line: the model apps name, then the cloud's ID for it. Any other model is refused.",
                                     attributes: [("required", ""), ("spellcheck", "false")], multiline: true)
        return HTML.element("form", [("method", "post"), ("action", "/console/settings/upstream-\(kind.rawValue)"), ("novalidate", "")],
            ConsolePages.csrfField(request) + fields
            + HTML.element("div", [("class", "actions")], HTML.element("button", [("type", "submit"), ("class", "primary")], HTML.text("Use \(name(kind))"))))
    }

    /// One of the three forms: owners only, validated and audited by `AdminService`; a refusal
    /// shows the page again with the error beside its form.
    static func set(_ request: ConsoleRequest, _ admin: AdminService, _ secrets: SecretsKeySource?, _ kind: UpstreamKind) throws -> RouteOutcome {
        let what = kind == .anthropic ? "set the upstream key" : "set the upstream"
        guard request.isOwner else {
            throw AdminError("\(request.session.email) is \(request.session.role.rawValue) in \(request.session.workspace.name) and may not \(what): "
                             + "that needs the owner or primary owner role.", kind: .forbidden)
        }
        let form = request.form
        // Sealed under the key the files hold now (a rotation may have just made a new one).
        guard let box = secrets?.keyring(refresh: .now)?.current else {
            return try SettingsPage.page(request, admin, notice: "", errors: [kind.rawValue: "The deployment's secrets key file is missing, so "
                                         + "the credentials cannot be sealed: run attestctl init on the server."], status: 503, typed: form)
        }
        let actor = request.session.email, workspace = request.session.workspace.name
        let models = (form["\(kind.rawValue)_models"] ?? "").split(whereSeparator: \.isNewline)
            .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        do {
            switch kind {
            case .anthropic:
                try admin.setUpstreamKey(actor: actor, workspace: workspace, key: form["upstream_key"] ?? "", secrets: box)
            case .bedrock:
                try admin.setUpstreamBedrock(actor: actor, workspace: workspace, region: form["bedrock_region"] ?? "",
                                             accessKeyID: form["bedrock_access_key_id"] ?? "", secretKey: form["bedrock_secret_key"] ?? "",
                                             sessionToken: form["bedrock_session_token"], endpointURL: form["bedrock_endpoint_url"], models: models,
                                             api: try bedrockAPI(form["bedrock_api"]), extraBetas: betas(form["bedrock_cloud_betas"]), secrets: box)
            case .compatible:
                throw AdminError("Anthropic-compatible upstreams (Microsoft Foundry, Claude Platform on AWS) are set with attestctl workspaces "
                                 + "set-upstream-foundry or set-upstream-claude-platform-aws")
            case .vertex:
                try admin.setUpstreamVertex(actor: actor, workspace: workspace, project: form["vertex_project"] ?? "", region: form["vertex_region"] ?? "",
                                            serviceAccountJSON: form["vertex_service_account"] ?? "", endpointURL: form["vertex_endpoint_url"],
                                            tokenURL: form["vertex_token_url"], models: models, extraBetas: betas(form["vertex_cloud_betas"]),
                                            secrets: box)
            }
        } catch let error as AdminError where error.kind == .invalid {
            return try SettingsPage.page(request, admin, notice: "", errors: [kind.rawValue: error.description], status: 422, typed: form)
        }
        return RouteOutcome(ConsoleRoutes.redirect(kind == .anthropic ? "/console/settings?key=1" : "/console/settings?upstream=\(kind.rawValue)"))
    }
}
