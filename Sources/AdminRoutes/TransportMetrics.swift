import HTTPServer

extension HTTPServerStats {
    /// The transport's gauges and counters in Prometheus text format, appended to /metrics.
    public var prometheusText: String {
        var out = "# HELP attestd_connections Open connections, by what they are doing.\n# TYPE attestd_connections gauge\n"
        for (state, value) in [("waiting", waitingConnections), ("head", receivingHeads), ("body", receivingBodies),
                               ("handling", handling), ("responding", responding), ("streaming", openStreams), ("held", held)] {
            out += "attestd_connections{state=\"\(state)\"} \(value)\n"
        }
        out += "# HELP attestd_buffered_body_bytes Request-body bytes held in memory.\n# TYPE attestd_buffered_body_bytes gauge\n"
        out += "attestd_buffered_body_bytes \(bufferedBodyBytes)\n"
        let counters: [(String, String, UInt64)] = [
            ("attestd_connections_accepted_total", "Connections accepted.", connectionsAccepted),
            ("attestd_malformed_requests_total", "Requests refused for their framing (400, 501) or an oversize head (414, 431).", malformedRequests),
            ("attestd_too_large_requests_total", "Requests refused with 413.", tooLargeRequests),
            ("attestd_overloaded_requests_total", "Requests refused because the body budget was spent (529).", overloadedRequests),
            ("attestd_cancelled_answers_total", "Deferred or streamed answers cut short (client gone, deadline, stop).", cancelledAnswers),
            ("attestd_held_requests_total", "Pipelined requests held while earlier answers on their connection waited unread.", heldRequests),
            ("attestd_unanswered_requests_total", "Whole requests whose connection closed before an answer (the client left, or a deadline).", unansweredRequests),
        ]
        for (name, help, value) in counters { out += "# HELP \(name) \(help)\n# TYPE \(name) counter\n\(name) \(value)\n" }
        out += "# HELP attestd_connections_reaped_total Connections the server closed on its own, by reason.\n"
        out += "# TYPE attestd_connections_reaped_total counter\n"
        for reason in HTTPReapReason.allCases { out += "attestd_connections_reaped_total{reason=\"\(reason.rawValue)\"} \(reaped[reason] ?? 0)\n" }
        return out
    }
}
