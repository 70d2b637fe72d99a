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
