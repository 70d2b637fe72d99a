import AttestWire
import Foundation
import RawHTTP
import Testing

/// The front door under attack, on the shipped binaries: every route of attestd (with the stub
/// upstream behind /v1/messages) against every kind of malformed request, over raw sockets.
/// For each one: the status, exactly one answer per request (status lines counted in all that
/// arrives until the server closes), the route's own opaque error shape, no hang, and a server
/// that is still healthy afterwards.
@Suite(.serialized) struct MalformedRequestTests {
    /// How a route refuses: `{"error":…}` (device exchange, introspection, probes) or the
    /// Messages API's envelope `{"type":"error","error":{"type":…}}` (every other /v1/ path).
    enum Shape: Sendable { case oauth, api }

    /// What a well-formed request on a route needs, and what it gets.
    struct Route: CustomStringConvertible, Sendable {
        let method: String
        let path: String
        /// The media type the route reads (nil: it reads no body).
        let contentType: String?
        let shape: Shape
        let bodyLimit: Int
        /// `Authorization` for a well-formed request (a device token, the introspection key).
        let authorization: @Sendable (Context) -> String?
        let body: @Sendable (Context) -> String
        let status: Int
        /// What a well-formed request's answer must show besides its status.
        let check: @Sendable (RawResponse) -> Bool
        /// Served on the admin listener only (never on the public one).
        var onAdminListener = false
        var description: String { "\(method) \(path)" }
    }

    /// The live fixture's names: a real integration, a real device token, the introspection key.
    struct Context: Sendable {
        let clientID: String
        let token: String
        let introspectionKey: String
    }

    static let json = "application/json"
    static let form = "application/x-www-form-urlencoded"
    static let introspectionKey = "introspection-key-for-the-front-door-0123456789"

    static func randomKeyID() -> String { Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString() }

    static func formEncoded(_ fields: [(String, String)]) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return fields.map { "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: allowed)!)" }.joined(separator: "&")
    }

    static func apiErrorType(_ response: RawResponse) -> String? { (response.json?["error"] as? [String: Any])?["type"] as? String }

    static let routes: [Route] = [
        Route(method: "POST", path: WireProtocol.challengePath, contentType: json, shape: .oauth, bodyLimit: 65_536,
              authorization: { _ in nil },
              body: { #"{"client_id":"\#($0.clientID)","key_id":"\#(randomKeyID())"}"# }, status: 200,
              check: { ($0.json?["challenge"] as? String)?.isEmpty == false && $0.json?["expires_in"] as? Int == 300 }),
        // A key with no pending challenge: refused, opaquely.
        Route(method: "POST", path: WireProtocol.registerPath, contentType: json, shape: .oauth, bodyLimit: 65_536,
              authorization: { _ in nil },
              body: { #"{"client_id":"\#($0.clientID)","key_id":"\#(randomKeyID())","attestation_object":"AAAA"}"# }, status: 401,
              check: { $0.json?["error"] as? String == "invalid_grant" }),
        Route(method: "POST", path: WireProtocol.tokenPath, contentType: form, shape: .oauth, bodyLimit: 65_536,
              authorization: { _ in nil },
              body: { formEncoded([("assertion", "AAAA"), ("client_id", $0.clientID), ("grant_type", WireProtocol.grantType),
                                   ("key_id", randomKeyID())]) }, status: 401,
              check: { $0.json?["error"] as? String == "invalid_grant" }),
        Route(method: "POST", path: "/v1/oauth/introspect", contentType: form, shape: .oauth, bodyLimit: 65_536,
              authorization: { "Bearer \($0.introspectionKey)" },
              body: { formEncoded([("token", $0.token)]) }, status: 200,
              check: { $0.json?["active"] as? Bool == true }, onAdminListener: true),
        Route(method: "POST", path: WireProtocol.messagesPath, contentType: json, shape: .api, bodyLimit: 32_000_000,
              authorization: { "Bearer \($0.token)" },
              body: { _ in RelayTests.request() }, status: 200,
              check: { $0.json?["type"] as? String == "message" }),
        Route(method: "POST", path: WireProtocol.countTokensPath, contentType: json, shape: .api, bodyLimit: 32_000_000,
              authorization: { "Bearer \($0.token)" },
              body: { _ in RelayTests.request() }, status: 200,
              check: { $0.json?["input_tokens"] is Int }),
        Route(method: "GET", path: "/healthz", contentType: nil, shape: .oauth, bodyLimit: 65_536,
              authorization: { _ in nil }, body: { _ in "" }, status: 200,
              check: { $0.json?["status"] as? String == "ok" }),
        Route(method: "GET", path: "/readyz", contentType: nil, shape: .oauth, bodyLimit: 65_536,
              authorization: { _ in nil }, body: { _ in "" }, status: 200,
              check: { $0.json?["status"] as? String == "ready" }),
        Route(method: "GET", path: "/metrics", contentType: nil, shape: .oauth, bodyLimit: 65_536,
              authorization: { _ in nil }, body: { _ in "" }, status: 200,
              check: { $0.text.contains("attestd_http_requests_total") }, onAdminListener: true),
        // Any other /v1/ path is another API: a device token is refused there.
        Route(method: "POST", path: "/v1/models/unknown", contentType: nil, shape: .api, bodyLimit: 65_536,
              authorization: { "Bearer \($0.token)" }, body: { _ in "{}" }, status: 403,
              check: { apiErrorType($0) == "permission_error" }),
    ]

    /// What one request of a probe must get.
    enum Answer: Sendable {
        /// The route's answer to a well-formed request (`Route.status`, `Route.check`).
        case normal
        /// Refused with this status in the route's shape (`invalid_request`, or for the
        /// Messages API `invalid_request_error`, `request_too_large` for 413).
        case refused(Int)
        /// Refused by libmicrohttpd itself, before any of our code saw the request: its fixed
        /// text (the head did not fit the connection's 32 KiB memory pool).
        case refusedByLibmicrohttpd(Int)
        /// GET /healthz's answer.
        case healthy
    }

    /// One kind of malformed (or merely unusual) request: its bytes for a route, and what it gets.
    struct Probe: CustomStringConvertible, Sendable {
        let name: String
        let request: @Sendable (Route, Context) -> String
        let answers: @Sendable (Route) -> [Answer]
        /// Must not reach the upstream Messages API.
        var refusedBeforeUpstream: @Sendable (Route) -> Bool = { _ in false }
        var description: String { name }
    }

    /// A request on `route` with the headers a well-formed one carries, changed as asked.
    static func request(_ route: Route, _ context: Context, method: String? = nil, query: String = "", version: String = "HTTP/1.1",
                        contentType: String? = nil, omitContentType: Bool = false, body: String? = nil, contentLength: [String]? = nil,
                        extraHeaders: [String] = [], close: Bool = true) -> String {
        let body = body ?? route.body(context)
        var head = "\(method ?? route.method) \(route.path)\(query) \(version)\r\n"
        if version == "HTTP/1.1" { head += "Host: 127.0.0.1\r\n" }
        if let authorization = route.authorization(context) { head += "Authorization: \(authorization)\r\n" }
        if !omitContentType, let type = contentType ?? route.contentType { head += "Content-Type: \(type)\r\n" }
        for length in contentLength ?? (body.isEmpty && route.method == "GET" ? [] : [String(body.utf8.count)]) {
            head += "Content-Length: \(length)\r\n"
        }
        for header in extraHeaders { head += header + "\r\n" }
        if close { head += "Connection: close\r\n" }
        return head + "\r\n" + body
    }

    static let healthz = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"

    static let probes: [Probe] = [
        Probe(name: "bad JSON body", request: { route, context in request(route, context, body: #"{"client_id": "clid_"#) },
              answers: { route in [route.contentType == nil ? .normal : .refused(400)] }),
        Probe(name: "bad form body", request: { route, context in request(route, context, body: "client_id=%zz&key_id=%") },
              answers: { route in [route.contentType == nil ? .normal : .refused(400)] }),
        Probe(name: "body over the route's limit (declared)",
              request: { route, context in request(route, context, body: "", contentLength: [String(route.bodyLimit + 1)], close: false) },
              answers: { _ in [.refused(413)] }, refusedBeforeUpstream: { _ in true }),
        Probe(name: "wrong content type", request: { route, context in request(route, context, contentType: "text/plain") },
              answers: { route in [route.contentType == nil ? .normal : .refused(415)] },
              refusedBeforeUpstream: { $0.contentType != nil }),
        Probe(name: "no content type", request: { route, context in request(route, context, omitContentType: true) },
              answers: { route in [route.contentType == nil ? .normal : .refused(415)] },
              refusedBeforeUpstream: { $0.contentType != nil }),
        // Media types are case-insensitive and may carry parameters.
        Probe(name: "content type in capitals with a charset",
              request: { route, context in request(route, context, contentType: route.contentType.map { $0.uppercased() + "; charset=UTF-8" }) },
              answers: { _ in [.normal] }),
        Probe(name: "header flood: 150 headers",
              request: { route, context in request(route, context, extraHeaders: (0..<150).map { "X-Flood-\($0): flood" }, close: false) },
              answers: { _ in [.refused(431)] }, refusedBeforeUpstream: { _ in true }),
        Probe(name: "one 20 KB header",
              request: { route, context in request(route, context, extraHeaders: ["X-Huge: " + String(repeating: "h", count: 20_000)], close: false) },
              answers: { _ in [.refused(431)] }, refusedBeforeUpstream: { _ in true }),
        Probe(name: "a 16 KB URL", request: { route, context in request(route, context, query: "?q=" + String(repeating: "u", count: 16_000), close: false) },
              answers: { _ in [.refused(414)] }, refusedBeforeUpstream: { _ in true }),
        Probe(name: "one 40 KB header (over the memory pool)",
              request: { route, context in request(route, context, extraHeaders: ["X-Huge: " + String(repeating: "h", count: 40_000)], close: false) },
              answers: { _ in [.refusedByLibmicrohttpd(431)] }, refusedBeforeUpstream: { _ in true }),
        Probe(name: "a 40 KB URL (over the memory pool)",
              request: { route, context in request(route, context, query: "?q=" + String(repeating: "u", count: 40_000), close: false) },
              answers: { _ in [.refusedByLibmicrohttpd(414)] }, refusedBeforeUpstream: { _ in true }),
        Probe(name: "wrong method", request: { route, context in request(route, context, method: route.method == "GET" ? "POST" : "GET") },
              answers: { route in [route.path == "/v1/models/unknown" ? .normal : .refused(405)] },
              refusedBeforeUpstream: { _ in true }),
        Probe(name: "HTTP/1.0 without Host", request: { route, context in request(route, context, version: "HTTP/1.0", close: false) },
              answers: { _ in [.normal] }),
        Probe(name: "two requests in one write", request: { route, context in request(route, context, close: false) + healthz },
              answers: { _ in [.normal, .healthy] }),
        Probe(name: "Transfer-Encoding: gzip",
              request: { route, context in request(route, context, body: "abc", contentLength: [], extraHeaders: ["Transfer-Encoding: gzip"], close: false) },
              answers: { _ in [.refused(501)] }, refusedBeforeUpstream: { _ in true }),
        Probe(name: "Content-Length 2^64",
              request: { route, context in request(route, context, body: "", contentLength: ["18446744073709551616"], close: false) },
              answers: { _ in [.refused(400)] }, refusedBeforeUpstream: { _ in true }),
        Probe(name: "two different Content-Lengths",
              request: { route, context in request(route, context, body: "{}", contentLength: ["2", "5"], close: false) },
              answers: { _ in [.refused(400)] }, refusedBeforeUpstream: { _ in true }),
    ]

    @Test func everyRouteAnswersEveryMalformedRequestOnceInItsOwnShape() async throws {
        let fixture = try await RelayTests.Fixture { fixture in
            let keyFile = fixture.directory.appendingPathComponent("introspection.key").path
            _ = FileManager.default.createFile(atPath: keyFile, contents: Data(Self.introspectionKey.utf8))
            return ["--introspection-key-file", keyFile]
        }
        defer { fixture.stop() }
        let context = Context(clientID: fixture.clientA, token: fixture.tokenA, introspectionKey: Self.introspectionKey)
        for probe in Self.probes {
            for route in Self.routes {
                let port = route.onAdminListener ? fixture.server.adminPort : fixture.server.port
                let label = "\(probe) on \(route)"
                let upstreamBefore = fixture.stub.requests.count
                let connection = try RawConnection(port: port, timeout: 2)
                let started = ContinuousClock.now
                // A refused request may be cut off mid-send: the answer is what counts.
                _ = connection.sendAll(probe.request(route, context))
                var responses: [RawResponse] = []
                while let response = connection.readFramedResponse() { responses.append(response) }
                _ = connection.readToEnd()
                let elapsed = ContinuousClock.now - started

                #expect(connection.lastOutcome == .closed, "\(label): the server did not close the connection (\(connection.lastOutcome))")
                #expect(elapsed < .milliseconds(1500), "\(label): answered after \(elapsed)")
                let expected = probe.answers(route)
                #expect(connection.statusLinesReceived == expected.count,
                        "\(label): \(connection.statusLinesReceived) status lines in \(String(decoding: connection.transcript.prefix(600), as: UTF8.self))")
                #expect(responses.count == expected.count, "\(label): \(responses.count) responses")
                for (response, answer) in zip(responses, expected) {
                    Self.check(response, answer, route, label)
                }
                if probe.refusedBeforeUpstream(route) {
                    #expect(fixture.stub.requests.count == upstreamBefore, "\(label) reached the upstream")
                }
                // Still healthy, on a new connection.
                let after = try RawConnection(port: port, timeout: 2)
                #expect(after.sendAll(Self.healthz))
                let health = after.readFramedResponse()
                #expect(health?.status == 200 && health?.json?["status"] as? String == "ok", "\(label): unhealthy afterwards")
            }
        }

        // The transport counted what it refused: 413 once per route; framing (400, 501) and
        // oversize heads (414, 431) six times per route.
        // Polled: a rendering of /metrics is shared for up to a second.
        let admin = TestHTTP(baseURL: fixture.server.adminBaseURL)
        let counted = [
            "\nattestd_too_large_requests_total \(Self.routes.count)\n", "\nattestd_malformed_requests_total \(6 * Self.routes.count)\n",
        ]
        var text = ""
        let deadline = Date() + 5
        repeat {
            text = String(decoding: try await admin.send("GET", "/metrics").body, as: UTF8.self)
            if counted.allSatisfy(text.contains) { break }
            try await Task.sleep(for: .milliseconds(100))
        } while Date() < deadline
        for line in counted { #expect(text.contains(line), "\(line) in \(text.split(separator: "\n").filter { $0.contains("requests_total") })") }
    }

    static func check(_ response: RawResponse, _ answer: Answer, _ route: Route, _ label: String) {
        switch answer {
        case .normal:
            #expect(response.status == route.status, "\(label): status \(response.status): \(response.text.prefix(300))")
            #expect(route.check(response), "\(label): \(response.text.prefix(300))")
        case .healthy:
            #expect(response.status == 200 && response.json?["status"] as? String == "ok", "\(label): second answer \(response.text.prefix(200))")
        case .refused(let status):
            #expect(response.status == status, "\(label): status \(response.status), expected \(status): \(response.text.prefix(300))")
            #expect(response.headers["content-type"] == "application/json", "\(label): content-type \(response.headers["content-type"] ?? "none")")
            let json = response.json ?? [:]
            switch route.shape {
            case .oauth:
                // Opaque: the code and nothing else.
                #expect(json.count == 1 && json["error"] as? String == "invalid_request", "\(label): body \(response.text.prefix(300))")
            case .api:
                let error = json["error"] as? [String: Any]
                #expect(json["type"] as? String == "error" && error?["message"] is String, "\(label): body \(response.text.prefix(300))")
                #expect(error?["type"] as? String == (status == 413 ? "request_too_large" : "invalid_request_error"),
                        "\(label): body \(response.text.prefix(300))")
            }
            if status == 405 { #expect(response.headers["allow"] == route.method, "\(label): allow \(response.headers["allow"] ?? "none")") }
        case .refusedByLibmicrohttpd(let status):
            #expect(response.status == status, "\(label): status \(response.status), expected \(status)")
            #expect(response.text.contains("Request too big"), "\(label): body \(response.text.prefix(300))")
        }
    }
}
