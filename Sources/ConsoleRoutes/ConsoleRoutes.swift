import AttestCrypto
import AttestWire
import Foundation
import HTTPRouting
import HTTPServer
import TokenService

/// The operator's console at `/console/` on the admin listener: server-rendered pages with
/// plain forms over the same `AdminService` as `attestctl` (so roles, validation, audit and
/// revocation are the same, and either sees the other's changes at once, on every instance).
/// Scripts are our own static file, for enhancements only.
public struct ConsoleRoutes: Sendable {
    let admin: AdminService
    /// Opens the workspaces' upstream keys' box (read once the file exists).
    let secrets: SecretsKeySource?
    let security: ConsoleSecurity
    /// Which upstreams of the workspaces' lists are cooling down on this attestd (its relay's).
    let health: UpstreamHealth?

    public static let root = "/console/"
    /// Form bodies: a page's fields, 32 bundle IDs of 155 characters at most.
    static let formLimit = 16_384
    /// A cloud upstream's form: a 16 KiB service-account key and 64 model mappings, percent-encoded.
    static let cloudFormLimit = 65_536

    public init(admin: AdminService, secrets: SecretsKeySource?, trustedProxies: [CIDR] = [], trustedProxyHeader: ForwardingHeader = .xForwardedFor,
                upstreamHealth: UpstreamHealth? = nil) {
        health = upstreamHealth
        self.admin = admin
        self.secrets = secrets
        security = ConsoleSecurity(callers: CallerResolver(trustedProxies: trustedProxies, header: trustedProxyHeader))
    }

    /// The console's own pages and assets, and its sign-in: no session needed.
    var shell: RouteGroup { RouteGroup("/console", on: [.admin], shape: .console) }
    /// Every page and form for a signed-in member: the session middleware in front, on workers.
    var member: RouteGroup {
        RouteGroup("/console", on: [.admin], shape: .console, executor: .worker, middleware: [ConsoleMemberSession(admin: admin, security: security, health: health)])
    }

    public var routes: [Route] {
        [
            shell.route(["GET"], "", name: "/console", handler: .answer { _ in RouteOutcome(Self.redirect(Self.root)) }),
            shell.route(["GET"], "/static/{file}", name: "/console/static", handler: .answer { context in
                RouteOutcome(ConsoleAssets.response(context.parameters["file"] ?? ""))
            }),
            // GET shows one "Sign in" button; only its POST uses the link up, so a chat app's or
            // mail client's link preview (a GET) cannot spend it.
            shell.route(["GET", "POST"], "/sign-in", bodyLimit: 4096, executor: .worker, handler: .answer { context in try signIn(context) }),
            route("/sign-out", post: { request in
                try admin.signOut(token: request.sessionToken, actor: request.session.email)
                return RouteOutcome(Self.finish(ConsolePages.signedOut(), status: 200, extra: [security.clearCookie(for: request.context.request)]))
            }),
            route("/", get: { request in try IntegrationPages.list(request, admin) }),
            route("/integrations", get: { request in try IntegrationPages.list(request, admin) },
                  post: { request in try IntegrationPages.create(request, admin) }),
            route("/integrations/new", get: { request in try IntegrationPages.createForm(request, admin) }),
            route("/integrations/{client_id}", get: { request in try IntegrationPages.overview(request, admin) }),
            route("/integrations/{client_id}/policy", get: { request in try IntegrationPages.policy(request, admin) },
                  post: { request in try IntegrationPages.updatePolicy(request, admin) }),
            route("/integrations/{client_id}/rule-mode", post: { request in try RuleModesSection.update(request, admin) }),
            route("/integrations/{client_id}/usage", get: { request in try UsagePage.render(request, admin) }),
            route("/integrations/{client_id}/devices", get: { request in try IntegrationPages.devices(request, admin) }),
            route("/integrations/{client_id}/audit", get: { request in try IntegrationPages.audit(request, admin) }),
            route("/integrations/{client_id}/revoke", get: { request in try IntegrationPages.revokeConfirmation(request, admin) },
                  post: { request in try IntegrationPages.revoke(request, admin) }),
            route("/settings", get: { request in try SettingsPage.render(request, admin) }),
            route("/settings/upstream-key", post: { request in try UpstreamSettings.set(request, admin, secrets, .anthropic) }),
            route("/settings/upstream-bedrock", bodyLimit: Self.cloudFormLimit, post: { request in try UpstreamSettings.set(request, admin, secrets, .bedrock) }),
            route("/settings/upstream-vertex", bodyLimit: Self.cloudFormLimit, post: { request in try UpstreamSettings.set(request, admin, secrets, .vertex) }),
            route("/settings/upstreams/move", post: { request in try UpstreamList.move(request, admin) }),
            route("/settings/upstreams/remove", post: { request in try UpstreamList.remove(request, admin) }),
            route("/settings/budget", post: { request in try WorkspaceBudgetSection.update(request, admin) }),
            route("/settings/members", post: { request in try SettingsPage.addMember(request, admin) }),
            route("/settings/members/remove", post: { request in try SettingsPage.removeMember(request, admin) }),
            // Any other path under the console: its own not-found page.
            shell.route([], "/*", name: "/console/*", handler: .answer { _ in
                RouteOutcome(Self.finish(ConsolePages.message("Not found", "There is no such page in the console."), status: 404))
            }),
        ]
    }

    // MARK: Signing in

    /// Opening a sign-in link shows a page with one button; pressing it (a POST from that page,
    /// so with our Origin) uses the link up, sets the session cookie, and goes on to the console.
    /// A used, expired or unknown link gets a page that says which, and no session.
    func signIn(_ context: RequestContext) throws -> RouteOutcome {
        let request = context.request
        guard request.method == "POST" else {
            let fields = (try? RequestParsing.formFields(Array((request.query ?? "").utf8))) ?? [:]
            guard let token = fields["token"], ConsoleAccess.isPlausibleToken(token) else {
                return RouteOutcome(Self.finish(ConsolePages.signInRefused(.unknown), status: 403), reason: "console_sign_in_unknown")
            }
            return RouteOutcome(Self.finish(ConsolePages.signInButton(token: token), status: 200))
        }
        guard RequestParsing.hasMediaType(request.header("content-type"), "application/x-www-form-urlencoded"), security.originAllowed(request) else {
            return RouteOutcome(Self.finish(ConsolePages.message("Request refused",
                "Sign in with the button on the sign-in link's page; nothing was changed."), status: 403), reason: "console_origin_refused")
        }
        let token = ((try? RequestParsing.formFields(request.body)) ?? [:])["token"] ?? ""
        switch try admin.signIn(linkToken: token) {
        case .signedIn(let token, let session):
            let cookie = security.setCookie(token, for: context.request)
            return RouteOutcome(Self.finish(ConsolePages.signedIn(session), status: 200, extra: [cookie]))
        case .refused(let state):
            return RouteOutcome(Self.finish(ConsolePages.signInRefused(state), status: 403), reason: "console_sign_in_\(state)")
        }
    }

    // MARK: Route builders

    typealias Handler = @Sendable (ConsoleRequest) throws -> RouteOutcome

    /// A member's path: its page (GET) and/or its form (POST), behind `ConsoleMemberSession`.
    func route(_ path: String, bodyLimit: Int = formLimit, get: Handler? = nil, post: Handler? = nil) -> Route {
        let methods = (get == nil ? [] : ["GET"]) + (post == nil ? [] : ["POST"])
        return member.route(methods, path, bodyLimit: post == nil ? 0 : bodyLimit, handler: .answer { context in
            guard let request = context[ConsoleMember.self] else { throw ConsoleMemberSession.Missing() }
            return try (request.context.request.method == "POST" ? post : get)!(request)
        })
    }

    // MARK: Responses

    /// A page with the console's headers.
    static func finish(_ page: HTML, status: Int, extra: [(name: String, value: String)] = []) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("content-type", "text/html; charset=utf-8")] + ConsoleSecurity.headers + extra,
                     body: Array(page.raw.utf8))
    }

    /// 303: after a form, the browser shows the result with a GET (reloading it changes nothing).
    static func redirect(_ location: String) -> HTTPResponse {
        HTTPResponse(status: 303, headers: [("location", location)] + ConsoleSecurity.headers)
    }
}

/// One signed-in request, as a page handler sees it.
struct ConsoleRequest: Sendable {
    let context: RequestContext
    let session: ConsoleSession
    let sessionToken: String
    /// A POST's fields.
    let form: [String: String]
    /// This attestd's view of the upstreams' states.
    var health: UpstreamHealth? = nil

    var csrf: String { ConsoleAccess.csrfToken(session: sessionToken) }
    /// Admins and above create, edit and revoke; the others read.
    var canManage: Bool { session.role.managesIntegrations }
    var isOwner: Bool { session.role == .primaryOwner || session.role == .owner }
    /// The query's fields.
    var query: [String: String] { (try? RequestParsing.formFields(Array((context.request.query ?? "").utf8))) ?? [:] }

    /// The integration the path names, if it is this workspace's (another's is not found here).
    func integration(_ admin: AdminService) throws -> Integration {
        let clientID = context.parameters["client_id"] ?? ""
        guard clientID.utf8.count <= 64, let integration = try? admin.integration(clientID),
              integration.workspaceID == session.workspace.id else {
            throw AdminError("No app integration \(clientID.prefix(64)) in workspace \(session.workspace.name).", kind: .notFound)
        }
        return integration
    }

    /// Refuses (403) a change by a member who may only read, whatever the page showed.
    func requireManager(_ what: String) throws {
        guard canManage else {
            throw AdminError("\(session.email) is \(session.role.rawValue) in \(session.workspace.name) and may not \(what): "
                             + "that needs the admin, owner or primary owner role.", kind: .forbidden)
        }
    }
}

extension ErrorShape {
    /// The console's refusals as short HTML pages with its headers.
    static let console = ErrorShape(
        name: "console",
        refusal: { status, _ in ConsoleRoutes.finish(ConsolePages.message("Request refused", HTTPResponse.refusalText(status)), status: status) },
        overloaded: { _ in
            var response = ConsoleRoutes.finish(ConsolePages.message("Busy", "The service is busy; try again in a moment."), status: 503)
            response.headers.append(("retry-after", "1"))
            return response
        },
        unavailable: { _ in
            var response = ConsoleRoutes.finish(ConsolePages.message("Unavailable", "The database is busy or unreachable; try again in a moment."), status: 503)
            response.headers.append(("retry-after", "1"))
            return response
        },
        failed: { requestID in
            ConsoleRoutes.finish(ConsolePages.message("Something went wrong", "The request failed (request ID \(requestID)); the service's log says why."),
                                 status: 500)
        })
}
