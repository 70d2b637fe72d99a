import AttestCrypto
import Foundation
import HTTPRouting
import HTTPServer
import TokenService

/// What every console response carries, and the checks every console request passes: the
/// session cookie, the CSRF token of forms, and `Origin` on whatever changes state.
struct ConsoleSecurity: Sendable {
    static let cookieName = "attestd_console"
    /// Over TLS the cookie takes the `__Host-` prefix: the browser then holds it only if it is
    /// Secure, for Path=/ and this host alone, so a sibling subdomain cannot plant or shadow it.
    static let secureCookieName = "__Host-attestd_console"
    /// Scripts and styles only from our own static files; no inline script, no CDN, no frames.
    static let contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        + "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    static let headers: [(name: String, value: String)] = [
        ("content-security-policy", contentSecurityPolicy),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
        ("x-frame-options", "DENY"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cache-control", "no-store"),
    ]

    let callers: CallerResolver

    /// The session cookie's value, if the request sent one: over TLS only the `__Host-` one.
    func sessionCookie(_ request: HTTPRequest) -> String? {
        let name = arrivedOverTLS(request) ? Self.secureCookieName : Self.cookieName
        for header in request.headers where header.name == "cookie" {
            for pair in header.value.split(separator: ";") {
                let parts = pair.split(separator: "=", maxSplits: 1)
                if parts.count == 2, parts[0].trimmingCharacters(in: .whitespaces) == name {
                    return parts[1].trimmingCharacters(in: .whitespaces)
                }
            }
        }
        return nil
    }

    /// Whether the request reached us over TLS: said by a trusted proxy in front, never by the client.
    func arrivedOverTLS(_ request: HTTPRequest) -> Bool {
        guard callers.isTrusted(request.remoteAddress) else { return false }
        if let proto = request.header("x-forwarded-proto") {
            return proto.split(separator: ",").last?.trimmingCharacters(in: .whitespaces).lowercased() == "https"
        }
        if let forwarded = request.header("forwarded") {
            let last = forwarded.split(separator: ",").last ?? ""
            return last.split(separator: ";").contains { $0.trimmingCharacters(in: .whitespaces).lowercased() == "proto=https" }
        }
        return false
    }

    func setCookie(_ token: String, for request: HTTPRequest) -> (name: String, value: String) {
        ("set-cookie", cookie(token, maxAge: Int(ConsoleAccess.sessionLifetime), request))
    }

    func clearCookie(for request: HTTPRequest) -> (name: String, value: String) {
        ("set-cookie", cookie("", maxAge: 0, request))
    }

    /// Plain HTTP (loopback): `attestd_console`, for /console/ only. Over TLS: `__Host-attestd_console`,
    /// which must be Secure with Path=/.
    private func cookie(_ value: String, maxAge: Int, _ request: HTTPRequest) -> String {
        arrivedOverTLS(request)
            ? "\(Self.secureCookieName)=\(value); Path=/; Max-Age=\(maxAge); HttpOnly; SameSite=Strict; Secure"
            : "\(Self.cookieName)=\(value); Path=/console/; Max-Age=\(maxAge); HttpOnly; SameSite=Strict"
    }

    /// The origin this console is served from, as the browser names it: the `Host` the request
    /// was sent to (through a trusted proxy, the host and scheme it says the browser used).
    func expectedOrigin(_ request: HTTPRequest) -> String? {
        var host = request.header("host")
        if callers.isTrusted(request.remoteAddress), let forwarded = request.header("x-forwarded-host") {
            host = forwarded.split(separator: ",").first.map { $0.trimmingCharacters(in: .whitespaces) }
        }
        guard let host, !host.isEmpty else { return nil }
        return (arrivedOverTLS(request) ? "https://" : "http://") + host.lowercased()
    }

    /// A state-changing request must come from a page of this console: the browser's `Origin`
    /// must be ours (browsers send it with every POST).
    func originAllowed(_ request: HTTPRequest) -> Bool {
        guard let origin = request.header("origin"), let expected = expectedOrigin(request) else { return false }
        return constantTimeEquals(Array(origin.lowercased().utf8), Array(expected.utf8))
    }

    /// The form's CSRF token must be the one derived from this session's cookie.
    static func csrfValid(_ presented: String?, sessionToken: String) -> Bool {
        guard let presented else { return false }
        return constantTimeEquals(Array(presented.utf8), Array(ConsoleAccess.csrfToken(session: sessionToken).utf8))
    }
}
