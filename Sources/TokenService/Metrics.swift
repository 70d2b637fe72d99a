import Foundation
import Synchronization

/// Counters and histograms for `/metrics`, rendered in Prometheus text format.
public final class Metrics: Sendable {
    private struct State {
        var counters: [String: [String: Double]] = [:]   // name → rendered labels → value
        var help: [String: String] = [:]
        var histograms: [String: Histogram] = [:]
    }

    private let state = Mutex(State())

    struct Histogram {
        let bounds: [Double]
        var buckets: [String: [Int]] = [:]   // labels → cumulative-free bucket counts (+Inf last)
        var sums: [String: Double] = [:]
        var counts: [String: Int] = [:]

        mutating func observe(_ seconds: Double, key: String) {
            let slot = bounds.firstIndex(where: { seconds <= $0 }) ?? bounds.count
            buckets[key, default: [Int](repeating: 0, count: bounds.count + 1)][slot] += 1
            sums[key, default: 0] += seconds
            counts[key, default: 0] += 1
        }
    }

    public static let latencyBuckets: [Double] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25]

    /// For relayed requests: a reply can take from milliseconds to minutes.
    public static let relayBuckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]

    public init() {}

    public func describe(_ name: String, _ text: String) {
        state.withLock { $0.help[name] = text }
    }

    public func increment(_ name: String, labels: [(String, String)] = [], by value: Double = 1) {
        let key = Metrics.render(labels)
        state.withLock { $0.counters[name, default: [:]][key, default: 0] += value }
    }

    /// Several increments of one counter under one lock (a request's token counts by kind).
    public func increment(_ name: String, each increments: [(labels: [(String, String)], value: Double)]) {
        let rendered = increments.map { (Metrics.render($0.labels), $0.value) }
        state.withLock { state in
            for (key, value) in rendered { state.counters[name, default: [:]][key, default: 0] += value }
        }
    }

    /// - Parameter buckets: the bucket bounds, fixed by a histogram's first observation.
    public func observe(_ name: String, seconds: Double, labels: [(String, String)] = [], buckets: [Double] = Metrics.latencyBuckets) {
        let key = Metrics.render(labels)
        state.withLock { state in
            // Mutated in place: a copy taken out of the dictionary and stored back would copy
            // its bucket tables on every observation (this runs on every relayed request).
            state.histograms[name, default: Histogram(bounds: buckets)].observe(seconds, key: key)
        }
    }

    public func prometheusText() -> String {
        let (counters, help, histograms) = state.withLock { ($0.counters, $0.help, $0.histograms) }
        var out = ""
        for name in counters.keys.sorted() {
            if let text = help[name] { out += "# HELP \(name) \(text)\n" }
            out += "# TYPE \(name) counter\n"
            for (labels, value) in counters[name]!.sorted(by: { $0.key < $1.key }) {
                out += "\(name)\(labels) \(format(value))\n"
            }
        }
        for name in histograms.keys.sorted() {
            let histogram = histograms[name]!
            if let text = help[name] { out += "# HELP \(name) \(text)\n" }
            out += "# TYPE \(name) histogram\n"
            for labels in histogram.buckets.keys.sorted() {
                let inner = labels.isEmpty ? "" : String(labels.dropFirst().dropLast()) + ","
                var cumulative = 0
                for (i, count) in histogram.buckets[labels]!.enumerated() {
                    cumulative += count
                    let le = i < histogram.bounds.count ? format(histogram.bounds[i]) : "+Inf"
                    out += "\(name)_bucket{\(inner)le=\"\(le)\"} \(cumulative)\n"
                }
                out += "\(name)_sum\(labels) \(histogram.sums[labels]!)\n"
                out += "\(name)_count\(labels) \(histogram.counts[labels]!)\n"
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

    /// `{name="value",…}`, appended piece by piece: this runs for every observation.
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
