import Testing
import TokenService

/// /metrics in Prometheus' text format: series kept by their labels as given and rendered only
/// here, names and series in a stable order, label values escaped, histogram buckets cumulative.
@Suite struct MetricsTests {
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
