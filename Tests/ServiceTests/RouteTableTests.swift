import AttestDaemon
import Foundation
import HTTPRouting
import HTTPServer
import Testing

/// The route table is the only list of routes: every route's path is answered, its metric label
/// and access-log name are the table's, and the transport's body limits and refusal shapes come
/// from the same entries.
@Suite struct RouteTableTests {
    /// A concrete path for a pattern (parameters and rests filled in).
    static func example(_ pattern: String) -> String {
        pattern.split(separator: "/", omittingEmptySubsequences: false).map { part in
            part == "*" ? "example" : part.hasPrefix("{") ? "param" : String(part)
        }.joined(separator: "/").replacingOccurrences(of: "/example", with: pattern == "/v1/*" ? "/models" : "")
    }

    @Test func pathsMetricLabelsAndLogNamesAreTheSameSet() async throws {
        let service = try TestService()
        let table = service.router.router.table
        #expect(Set(table.map(\.name)).count == table.count, "route names are unique")
        let http = TestHTTP(baseURL: service.baseURL)
        for route in table {
            let method = route.methods.first ?? "POST"
            let answer = try await http.send(method, Self.example(route.pattern.description), body: route.contentType == nil ? nil : Data("{}".utf8),
                                             contentType: route.contentType)
            #expect(answer.status != 404, "\(route.name): \(answer.status)")
        }
        let metrics = String(decoding: try await http.send("GET", "/metrics").body, as: UTF8.self)
        let labels = Set(metrics.split(separator: "\n").filter { $0.hasPrefix("attestd_http_requests_total{") }.compactMap { line -> String? in
            guard let start = line.range(of: #"route=""#), let end = line[start.upperBound...].firstIndex(of: "\"") else { return nil }
            return String(line[start.upperBound..<end])
        })
        // /metrics itself is counted after its page was rendered: it is the one label not yet in it.
        #expect(labels.union(["/metrics"]) == Set(table.map(\.name)), "labels \(labels.sorted()) against the table")
        let logged = Set(service.logs.lines.withLock { $0 }.compactMap { line -> String? in
            guard line.contains(#""event":"request""#), let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return nil }
            return object["route"] as? String
        })
        #expect(logged == Set(table.map(\.name)), "access-log names \(logged.sorted()) against the table")
        // The transport's questions are answered from the same entries.
        for route in table {
            for listener in route.listeners {
                #expect(service.router.router.bodyLimit(path: Self.example(route.pattern.description), on: listener) == route.bodyLimit, "\(route.name)")
                let refusal = service.router.router.refusal(413, path: Self.example(route.pattern.description), on: listener)
                #expect(refusal.body == route.shape.refusal(413, nil).body, "\(route.name): refusal shape")
            }
        }
        // A path no route takes is not found, under the bounded label "other".
        #expect(try await http.send("GET", "/nothing-here").status == 404)
        let after = String(decoding: try await http.send("GET", "/metrics").body, as: UTF8.self)
        #expect(after.contains(#"attestd_http_requests_total{route="other",status="404"} 1"#))
    }
}

/// attestd's table against its API as documented (PROTOCOL.md; the README's console, operations
/// and proxy sections), written out by hand: a route dropped, renamed, moved to another listener,
/// or given another error shape, body limit, media type or executor fails here, where the test
/// above would follow the table wherever it went.
@Suite struct DocumentedRoutesTests {
    /// On SQLite (token checks on the loop: see `StoreHealth.readsCrossTheNetwork`).
    static let documented = [
        // The device token exchange (PROTOCOL.md §1-3), on workers: verification and the commit.
        "POST /v1/oauth/app-attest/challenge on public: oauth, 64 KiB of application/json, worker",
        "POST /v1/oauth/app-attest/register on public: oauth, 64 KiB of application/json, worker",
        "POST /v1/oauth/token on public: oauth, 64 KiB of application/x-www-form-urlencoded, worker",
        // The Messages API for app tokens (PROTOCOL.md, "Using the token"); anything else under /v1 is refused there.
        "POST /v1/messages on public: messages_api, 32 MB of application/json, loop",
        "POST /v1/messages/count_tokens on public: messages_api, 32 MB of application/json, loop",
        "any /v1/* as /v1/other on public: messages_api, 64 KiB of any, loop",
        // Probes on both listeners; the rest of operations on the admin listener only.
        "GET /healthz on admin,public: oauth, 64 KiB of any, loop",
        "GET /readyz on admin,public: oauth, 64 KiB of any, loop",
        "GET /metrics on admin: oauth, 64 KiB of any, loop",
        "POST /v1/oauth/introspect on admin: oauth, 64 KiB of application/x-www-form-urlencoded, worker",
        "any /v1/authz/check/* as /v1/authz/check on admin: messages_api, 64 KiB of any, loop",
        // The console (README, "The console"): its shell and assets on the loop, its pages (the
        // store) on workers, forms of at most 16 KiB.
        "GET /console on admin: console, 64 KiB of any, loop",
        "GET /console/static/{file} as /console/static on admin: console, 64 KiB of any, loop",
        "any /console/* on admin: console, 64 KiB of any, loop",
        "GET,POST /console/sign-in on admin: console, 4 KiB of any, worker",
        "POST /console/sign-out on admin: console, 16 KiB of any, worker",
        "GET /console/ on admin: console, no body of any, worker",
        "GET,POST /console/integrations on admin: console, 16 KiB of any, worker",
        "GET /console/integrations/new on admin: console, no body of any, worker",
        "GET /console/integrations/{client_id} on admin: console, no body of any, worker",
        "GET /console/integrations/{client_id}/devices on admin: console, no body of any, worker",
        "GET /console/integrations/{client_id}/usage on admin: console, no body of any, worker",
        "GET /console/integrations/{client_id}/audit on admin: console, no body of any, worker",
        "GET,POST /console/integrations/{client_id}/policy on admin: console, 16 KiB of any, worker",
        "GET,POST /console/integrations/{client_id}/revoke on admin: console, 16 KiB of any, worker",
        "GET /console/settings on admin: console, no body of any, worker",
        "POST /console/settings/members on admin: console, 16 KiB of any, worker",
        "POST /console/settings/members/remove on admin: console, 16 KiB of any, worker",
        "POST /console/settings/upstream-key on admin: console, 16 KiB of any, worker",
        "POST /console/settings/upstream-bedrock on admin: console, 64 KiB of any, worker",
        "POST /console/settings/upstream-vertex on admin: console, 64 KiB of any, worker",
        "POST /console/settings/upstreams/remove on admin: console, 16 KiB of any, worker",
        "POST /console/settings/upstreams/move on admin: console, 16 KiB of any, worker",
        "POST /console/settings/budget on admin: console, 16 KiB of any, worker",
        "POST /console/integrations/{client_id}/rule-mode on admin: console, 16 KiB of any, worker",
    ]

    static func describe(_ route: RouteInfo) -> String {
        let methods = route.methods.isEmpty ? "any" : route.methods.joined(separator: ",")
        let name = route.name == route.pattern.description ? "" : " as \(route.name)"
        let limit = route.bodyLimit == 0 ? "no body" : route.bodyLimit % 1_000_000 == 0 ? "\(route.bodyLimit / 1_000_000) MB"
            : route.bodyLimit % 1024 == 0 ? "\(route.bodyLimit / 1024) KiB" : "\(route.bodyLimit) B"
        return "\(methods) \(route.pattern)\(name) on \(route.listeners.map(\.rawValue).sorted().joined(separator: ",")): "
            + "\(route.shape.name), \(limit) of \(route.contentType ?? "any"), \(route.executor == .worker ? "worker" : "loop")"
    }

    @Test func theTableIsTheDocumentedAPI() throws {
        let (directory, db, _) = try DurabilityTests().makeDatabase()
        defer { try? FileManager.default.removeItem(at: directory) }
        let options = try ServeOptions(["--db", db, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                                        "--trust-anchor", ServerProcess.testAuthorityRoot])
        let daemon = try Daemon(options, logger: Logger(write: { _ in }))
        let actual = daemon.routeTable.map(Self.describe)
        let missing = Set(Self.documented).subtracting(actual), undocumented = Set(actual).subtracting(Self.documented)
        #expect(missing.isEmpty, "documented but not served: \(missing.sorted())")
        #expect(undocumented.isEmpty, "served but not documented: \(undocumented.sorted())")
        #expect(actual.count == Set(actual).count)
    }
}
