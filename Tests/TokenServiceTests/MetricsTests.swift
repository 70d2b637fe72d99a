import Foundation
import Testing
import TokenService

/// /metrics in Prometheus' text format: series kept by their labels as given and rendered only
/// here, names and series in a stable order, label values escaped, histogram buckets cumulative.
@Suite struct MetricsTests {
    /// Counts and histograms are kept per thread stripe and summed for /metrics: observations
    /// from many threads at once all arrive, once each, in one series.
    @Test func observationsFromManyThreadsAreSummedOnce() {
        let metrics = Metrics()
        let threads = 24, each = 500
        let done = DispatchGroup()
        for thread in 0..<threads {
            done.enter()
            Thread {
                for index in 0..<each {
                    metrics.increment("c_total", labels: [("kind", "x")])
                    metrics.observe("h_seconds", seconds: index % 2 == 0 ? 0.0002 : 0.2)
                }
                metrics.set("g", Double(thread))
                done.leave()
            }.start()
        }
        #expect(done.wait(timeout: .now() + 60) == .success)
        let text = metrics.prometheusText()
        let total = threads * each
        #expect(text.contains("c_total{kind=\"x\"} \(total)\n"), "\(text)")
        #expect(text.contains("h_seconds_count \(total)\n"))
        #expect(text.contains("h_seconds_bucket{le=\"0.00025\"} \(total / 2)\n"))
        #expect(text.contains("h_seconds_bucket{le=\"+Inf\"} \(total)\n"))
        #expect(text.components(separatedBy: "\n").filter { $0.hasPrefix("g ") }.count == 1)
    }

    @Test func countersAndHistogramsRenderInPrometheusTextFormat() {
        let metrics = Metrics()
        metrics.describe("b_total", "B things.")
        metrics.increment("b_total", labels: [("route", "/x"), ("status", "200")])
        metrics.increment("b_total", labels: [("route", "/x"), ("status", "200")], by: 2)
        metrics.increment("b_total", labels: [("route", "/a"), ("status", "404")])
        metrics.increment("a_total")
        metrics.increment("b_total", each: [(labels: [("route", "/x"), ("status", "200")], value: 1),
                                            (labels: [("route", "say \"hi\"\\\n"), ("status", "500")], value: 0.5)])
        metrics.observe("lat_seconds", seconds: 0.0003, labels: [("kind", "k")], buckets: [0.001, 0.01])
        metrics.observe("lat_seconds", seconds: 0.005, labels: [("kind", "k")], buckets: [0.001, 0.01])
        metrics.observe("lat_seconds", seconds: 7, labels: [("kind", "k")], buckets: [0.001, 0.01])
        metrics.observe("lat_seconds", seconds: 0.002, buckets: [0.001, 0.01])
        #expect(metrics.prometheusText() == """
            # TYPE a_total counter
            a_total 1
            # HELP b_total B things.
            # TYPE b_total counter
            b_total{route="/a",status="404"} 1
            b_total{route="/x",status="200"} 4
            b_total{route="say \\"hi\\"\\\\\\n",status="500"} 0.5
            # TYPE lat_seconds histogram
            lat_seconds_bucket{le="0.001"} 0
            lat_seconds_bucket{le="0.01"} 1
            lat_seconds_bucket{le="+Inf"} 1
            lat_seconds_sum 0.002
            lat_seconds_count 1
            lat_seconds_bucket{kind="k",le="0.001"} 1
            lat_seconds_bucket{kind="k",le="0.01"} 2
            lat_seconds_bucket{kind="k",le="+Inf"} 3
            lat_seconds_sum{kind="k"} 7.0053
            lat_seconds_count{kind="k"} 3

            """)
    }
}
