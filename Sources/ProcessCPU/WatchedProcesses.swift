import Foundation

/// Other processes whose CPU `attest-sim load` measures over its refresh phase only (`--cpu-of
/// PID`): the server and its database share these cores with the load generator, and a per-exchange
/// CPU figure must not include the registrations before the timed phase.
/// Each watched process counts with its children (PostgreSQL's backends and autovacuum workers are
/// the postmaster's): a child that appears mid-phase counts from zero, and one that exits and is
/// reaped mid-phase reaches the parent's cutime/cstime with its whole life, of which the part it had
/// spent before the phase (its start sample) is taken off again.
/// Linux only (/proc); elsewhere the figure is absent.
public struct WatchedProcesses: Sendable {
    public let pids: [Int32]

    public init(pids: [Int32]) { self.pids = pids }

    /// One watched process at one moment: the CPU seconds of it and of each live child (by PID),
    /// and of its children already reaped.
    public struct Sample: Sendable {
        public var members: [Int32: Double] = [:]
        public var reaped = 0.0
    }

    public func sample() -> [Int32: Sample] {
        var samples: [Int32: Sample] = [:]
        for pid in pids {
            var sample = Sample()
            // The watched process's own times and its reaped children's from one read of its stat.
            if let fields = Self.statFields(of: pid) {
                sample.members[pid] = Self.seconds(fields, from: Self.utime)
                sample.reaped = Self.seconds(fields, from: Self.cutime) ?? 0
            }
            for child in Self.children(of: pid) {
                if let cpu = Self.cpuSeconds(of: child) { sample.members[child] = cpu }
            }
            samples[pid] = sample
        }
        return samples
    }

    /// CPU each watched process (with its children) spent between two samples, in `pids` order.
    public func spent(from start: [Int32: Sample], to end: [Int32: Sample]) -> [(pid: Int32, seconds: Double)] {
        pids.map { pid in
            let before = start[pid] ?? Sample(), after = end[pid] ?? Sample()
            let live = after.members.reduce(0) { sum, entry in sum + max(0, entry.value - (before.members[entry.key] ?? 0)) }
            // Children gone by the end: their whole life is in the reaped delta, so what they had
            // spent before the start comes off.
            let gone = before.members.reduce(0) { sum, entry in sum + (after.members[entry.key] == nil && entry.key != pid ? entry.value : 0) }
            return (pid, max(0, live + max(0, after.reaped - before.reaped) - gone))
        }
    }

    private static let ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))

    /// utime + stime of a process (all its threads) from /proc/PID/stat.
    public static func cpuSeconds(of pid: Int32) -> Double? {
        statFields(of: pid).flatMap { seconds($0, from: utime) }
    }

    /// cutime + cstime: the CPU of the children the process has waited for, over their whole lives.
    public static func reapedChildrenSeconds(of pid: Int32) -> Double? {
        statFields(of: pid).flatMap { seconds($0, from: cutime) }
    }

    /// The fields of /proc/PID/stat after the command name (which may hold spaces): index 0 is
    /// field 3 (state), so utime (field 14) is index 11 and cutime (field 16) index 13, each
    /// followed by its system-time twin.
    private static let utime = 11, cutime = 13

    private static func statFields(of pid: Int32) -> [Substring]? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")") else { return nil }
        return text[text.index(after: close)...].split(separator: " ")
    }

    /// A user time and the system time after it, in seconds.
    private static func seconds(_ fields: [Substring], from index: Int) -> Double? {
        guard fields.count > index + 1, let user = Double(fields[index]), let system = Double(fields[index + 1]) else { return nil }
        return (user + system) / ticksPerSecond
    }

    /// Direct children of a process, from each of its threads' children lists.
    public static func children(of pid: Int32) -> [Int32] {
        guard let tasks = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return [] }
        var found: Set<Int32> = []
        for task in tasks {
            guard let text = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/children", encoding: .utf8) else { continue }
            for word in text.split(separator: " ") { if let child = Int32(word.trimmingCharacters(in: .whitespacesAndNewlines)) { found.insert(child) } }
        }
        return found.sorted()
    }
}
