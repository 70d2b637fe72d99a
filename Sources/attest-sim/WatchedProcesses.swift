import Foundation

/// Other processes whose CPU `attest-sim load` measures over its refresh phase only (`--cpu-of
/// PID`): the server and its database share these cores with the load generator, and a per-exchange
/// CPU figure must not include the registrations before the timed phase.
/// Each watched process counts with its children (PostgreSQL's backends are the postmaster's), a
/// child that appears mid-phase from zero; a child that exits mid-phase takes its CPU with it.
/// Linux only (/proc); elsewhere the figure is absent.
struct WatchedProcesses: Sendable {
    let pids: [Int32]

    /// CPU seconds so far of each watched process and each of its children: by watched PID, then by member PID.
    func sample() -> [Int32: [Int32: Double]] {
        var seconds: [Int32: [Int32: Double]] = [:]
        for pid in pids {
            var members: [Int32: Double] = [:]
            for member in [pid] + Self.children(of: pid) {
                if let cpu = Self.cpuSeconds(of: member) { members[member] = cpu }
            }
            seconds[pid] = members
        }
        return seconds
    }

    /// CPU each watched process (with its children) spent between two samples, in `pids` order.
    func spent(from start: [Int32: [Int32: Double]], to end: [Int32: [Int32: Double]]) -> [(pid: Int32, seconds: Double)] {
        pids.map { pid in
            let before = start[pid] ?? [:]
            let total = (end[pid] ?? [:]).reduce(0) { sum, entry in sum + max(0, entry.value - (before[entry.key] ?? 0)) }
            return (pid, total)
        }
    }

    private static let ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))

    /// utime + stime of a process (all its threads) from /proc/PID/stat.
    static func cpuSeconds(of pid: Int32) -> Double? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")") else { return nil }
        // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
        return (user + system) / ticksPerSecond
    }

    /// Direct children of a process, from each of its threads' children lists.
    static func children(of pid: Int32) -> [Int32] {
        guard let tasks = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return [] }
        var found: Set<Int32> = []
        for task in tasks {
            guard let text = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/children", encoding: .utf8) else { continue }
            for word in text.split(separator: " ") { if let child = Int32(word.trimmingCharacters(in: .whitespacesAndNewlines)) { found.insert(child) } }
        }
        return found.sorted()
    }
}
