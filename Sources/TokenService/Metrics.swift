import Foundation
import Synchronization

/// Counters, gauges and histograms for `/metrics`, rendered in Prometheus text format.
public final class Metrics: Sendable {
    /// A series: the metric's name and its labels as given. Labels are rendered only for
    /// /metrics: building the text on every observation was most of what metrics cost a
    /// relayed request (six observations each).
    struct Series: Hashable {
        let name: String
        let labels: [(String, String)]

        static func == (a: Series, b: Series) -> Bool {
            a.name == b.name && a.labels.count == b.labels.count && zip(a.labels, b.labels).allSatisfy { $0 == $1 }
        }

        func hash(into hasher: inout Hasher) {
            hasher.combine(name)
            for (label, value) in labels {
                hasher.combine(label)
                hasher.combine(value)
            }
        }

        var renderedLabels: String { Metrics.render(labels) }
    }

    /// Counters and histograms live in stripes, one picked by the calling thread, and are summed
    /// for /metrics: with one lock, the 40 threads of a loaded server queued on it (5% of the
    /// service's CPU spinning in the lock under exchange load). Gauges and help stay in one
    /// place, since the last value set wins.
    private struct Stripe {
        var counters: [Series: Double] = [:]
        var histograms: [Series: Histogram] = [:]
    }
    private final class StripeBox: Sendable {
        let state = Mutex(Stripe())
    }
    private struct Shared {
        var help: [String: String] = [:]
        var gauges: [Series: Double] = [:]
    }

    private let stripes: [StripeBox] = (0..<16).map { _ in StripeBox() }
    private let shared = Mutex(Shared())

    /// This thread's stripe: its pthread_t (an address) mixed, so neighbouring threads spread.
    private var stripe: StripeBox {
        let id = UInt64(pthread_self())
        return stripes[Int(truncatingIfNeeded: (id &* 0x9E37_79B9_7F4A_7C15) >> 60)]
    }

    struct Histogram {
        let bounds: [Double]
        var buckets: [Int]   // per bucket, not cumulative (+Inf last)
        var sum: Double = 0
        var count = 0

        init(bounds: [Double]) {
            self.bounds = bounds
            buckets = [Int](repeating: 0, count: bounds.count + 1)
        }

        /// Two stripes' observations of one series (the bounds are a series' first observation's).
        func merged(with other: Histogram) -> Histogram {
            // Every series has one bucket list (its callers pass a constant); say so if one ever does not.
            assert(other.bounds == bounds, "one histogram series observed with two bucket lists")
            guard other.bounds == bounds else { return count >= other.count ? self : other }
            var sum = self
            for index in buckets.indices { sum.buckets[index] += other.buckets[index] }
            sum.sum += other.sum
            sum.count += other.count
            return sum
        }

        mutating func observe(_ seconds: Double) {
            buckets[bounds.firstIndex(where: { seconds <= $0 }) ?? bounds.count] += 1
            sum += seconds
            count += 1
        }
    }

    public static let latencyBuckets: [Double] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25]

    /// For relayed requests: a reply can take from milliseconds to minutes.
    public static let relayBuckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]

    public init() {}

    public func describe(_ name: String, _ text: String) {
        shared.withLock { $0.help[name] = text }
    }

    public func increment(_ name: String, labels: [(String, String)] = [], by value: Double = 1) {
        let series = Series(name: name, labels: labels)
        stripe.state.withLock { $0.counters[series, default: 0] += value }
    }

    /// Several increments of one counter under one lock (a request's token counts by kind).
    public func increment(_ name: String, each increments: [(labels: [(String, String)], value: Double)]) {
        stripe.state.withLock { state in
            for (labels, value) in increments { state.counters[Series(name: name, labels: labels), default: 0] += value }
        }
    }

    /// A value that goes up and down (the age of the oldest due refresh, …).
    public func set(_ name: String, _ value: Double, labels: [(String, String)] = []) {
        let series = Series(name: name, labels: labels)
        shared.withLock { $0.gauges[series] = value }
    }

    /// - Parameter buckets: the bucket bounds, fixed by a series' first observation.
    public func observe(_ name: String, seconds: Double, labels: [(String, String)] = [], buckets: [Double] = Metrics.latencyBuckets) {
        let series = Series(name: name, labels: labels)
        stripe.state.withLock { state in
            // Mutated in place: a copy taken out of the dictionary and stored back would copy
            // its bucket table on every observation (this runs on every relayed request).
            state.histograms[series, default: Histogram(bounds: buckets)].observe(seconds)
        }
    }

    public func prometheusText() -> String {
        let (help, gauges) = shared.withLock { ($0.help, $0.gauges) }
        var counters: [Series: Double] = [:], histograms: [Series: Histogram] = [:]
        for box in stripes {
            let (stripeCounters, stripeHistograms) = box.state.withLock { ($0.counters, $0.histograms) }
            counters.merge(stripeCounters, uniquingKeysWith: +)
            histograms.merge(stripeHistograms) { a, b in a.merged(with: b) }
        }
        var out = ""
        for (name, series) in Self.byName(counters) {
            if let text = help[name] { out += "# HELP \(name) \(text)\n" }
            out += "# TYPE \(name) counter\n"
            for (labels, value) in series { out += "\(name)\(labels) \(format(value))\n" }
        }
        for (name, series) in Self.byName(gauges) {
            if let text = help[name] { out += "# HELP \(name) \(text)\n" }
            out += "# TYPE \(name) gauge\n"
            for (labels, value) in series { out += "\(name)\(labels) \(format(value))\n" }
        }
        for (name, series) in Self.byName(histograms) {
            if let text = help[name] { out += "# HELP \(name) \(text)\n" }
            out += "# TYPE \(name) histogram\n"
            for (labels, histogram) in series {
                let inner = labels.isEmpty ? "" : String(labels.dropFirst().dropLast()) + ","
                var cumulative = 0
                for (i, count) in histogram.buckets.enumerated() {
                    cumulative += count
                    let le = i < histogram.bounds.count ? format(histogram.bounds[i]) : "+Inf"
                    out += "\(name)_bucket{\(inner)le=\"\(le)\"} \(cumulative)\n"
                }
                out += "\(name)_sum\(labels) \(histogram.sum)\n"
                out += "\(name)_count\(labels) \(histogram.count)\n"
            }
        }
        return out
    }

    private func format(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }

    /// Prometheus label escaping; label values are almost always plain, so check before copying.
    static func escape(_ value: String) -> String {
        guard value.utf8.contains(where: { $0 == UInt8(ascii: "\\") || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\n") }) else { return value }
        var out = ""
        for c in value {
            switch c {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(c)
            }
        }
        return out
    }

    /// A table's series grouped by name, names sorted, each name's series sorted by their
    /// rendered labels.
    private static func byName<Value>(_ table: [Series: Value]) -> [(name: String, series: [(labels: String, value: Value)])] {
        Dictionary(grouping: table, by: \.key.name).sorted { $0.key < $1.key }.map { name, entries in
            (name, entries.map { (labels: $0.key.renderedLabels, value: $0.value) }.sorted { $0.labels < $1.labels })
        }
    }

    /// `{name="value",…}`, for /metrics.
    static func render(_ labels: [(String, String)]) -> String {
        guard !labels.isEmpty else { return "" }
        var out = "{"
        out.reserveCapacity(48)
        for (index, (name, value)) in labels.enumerated() {
            if index > 0 { out += "," }
            out += name
            out += "=\""
            out += escape(value)
            out += "\""
        }
        out += "}"
        return out
    }
}
