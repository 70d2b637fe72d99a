import HTTPRouting
import TokenService

/// The context key of a signed-in member's request.
enum ConsoleMember: ContextKey {
    typealias Value = ConsoleRequest
}

/// The console's guard, as middleware on every member page and form: a POST must be a form from
/// our own origin carrying the session's CSRF token; every request needs a live session cookie.
/// What passes goes on with the member's request in the context; the domain's refusals
/// (`AdminError`) come back as pages.
struct ConsoleMemberSession: Middleware {
    let admin: AdminService
    let security: ConsoleSecurity
    /// This attestd's view of each workspace's upstreams (nil: no relay here).
    var health: UpstreamHealth? = nil

    /// A member route without this middleware in front (a wiring mistake): answered 500.
    struct Missing: Error, CustomStringConvertible {
        var description: String { "a console member route ran without its session middleware" }
    }

    func respond(to context: RequestContext, next: (RequestContext) throws -> RouteOutcome?) throws -> RouteOutcome? {
        let http = context.request
        var form: [String: String] = [:]
        if http.method == "POST" {
            guard RequestParsing.hasMediaType(http.header("content-type"), "application/x-www-form-urlencoded") else {
                return refused(415, "The console takes forms only.", reason: "console_not_a_form")
            }
            guard security.originAllowed(http) else {
                return refused(403, "This request did not come from the console's own pages (its Origin is missing or another site's), so nothing was changed.",
                               reason: "console_origin_refused")
            }
            do { form = try RequestParsing.formFields(http.body) } catch {
                return refused(400, "The form could not be read.", reason: "console_bad_form")
            }
        }
        guard let token = security.sessionCookie(http), let session = try admin.consoleSession(token: token) else {
            return RouteOutcome(ConsoleRoutes.finish(ConsolePages.signInNeeded(), status: 401, extra: [security.clearCookie(for: http)]),
                                reason: "console_no_session")
        }
        if http.method == "POST" && !ConsoleSecurity.csrfValid(form["csrf"], sessionToken: token) {
            return refused(403, "This form has expired or did not come from this session. Go back, reload the page and try again; nothing was changed.",
                           reason: "console_csrf_refused")
        }
        let request = ConsoleRequest(context: context, session: session, sessionToken: token, form: form, health: health)
        var member = context
        member[ConsoleMember.self] = request
        do {
            return try next(member)
        } catch let error as AdminError {
            let (status, title) = switch error.kind {
            case .forbidden: (403, "Not allowed")
            case .notFound: (404, "Not found")
            case .invalid: (422, "Not done")
            }
            return RouteOutcome(ConsoleRoutes.finish(ConsolePages.layout(title: title, request: request, nav: nil,
                                                                         ConsolePages.notice(error.description, kind: "error")), status: status),
                                reason: "console_refused")
        }
    }

    private func refused(_ status: Int, _ text: String, reason: String) -> RouteOutcome {
        RouteOutcome(ConsoleRoutes.finish(ConsolePages.message("Request refused", text), status: status), reason: reason)
    }
}
