import Foundation
import ProcessCPU
import Testing

/// `attest-sim load --cpu-of` charges a watched process with its children's CPU over the timed
/// phase only. PostgreSQL forks and reaps workers (autovacuum, parallel workers) during a run;
/// their CPU must neither vanish nor be counted from before the phase.
@Suite struct ProcessCPUTests {
    /// A python3 child that spends `seconds` of CPU, prints a line, then waits for its stdin to
    /// close before it exits: the test decides, by an event, when it goes.
    private static func busyChild(seconds: Double) throws -> (process: Process, stdin: Pipe, stdout: Pipe) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", """
            import sys, time
            while time.process_time() < \(seconds): pass
            print("spent", flush=True)
            sys.stdin.read()
            """]
        let stdin = Pipe(), stdout = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        try process.run()
        return (process, stdin, stdout)
    }

    private static func waitForLine(_ pipe: Pipe) -> String {
        var bytes: [UInt8] = []
        while true {
            let chunk = pipe.fileHandleForReading.readData(ofLength: 1)
            if chunk.isEmpty || chunk.first == UInt8(ascii: "\n") { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(contentsOf: chunk)
        }
    }

    @Test func aChildBornAndReapedWithinThePhaseIsCounted() throws {
        let watched = WatchedProcesses(pids: [getpid()])
        let start = watched.sample()
        let child = try Self.busyChild(seconds: 0.3)
        #expect(Self.waitForLine(child.stdout) == "spent")
        try child.stdin.fileHandleForWriting.close()
        child.process.waitUntilExit()   // reaped: its CPU is now in this process's cutime/cstime
        let spent = try #require(watched.spent(from: start, to: watched.sample()).first)
        #expect(spent.pid == getpid())
        #expect(spent.seconds >= 0.25, "a child that spent 0.3 s of CPU within the phase: \(spent.seconds) s")
    }

    @Test func aChildThatExitsMidPhaseIsNotChargedForItsLifeBeforeIt() throws {
        let watched = WatchedProcesses(pids: [getpid()])
        let child = try Self.busyChild(seconds: 0.5)
        #expect(Self.waitForLine(child.stdout) == "spent")
        let start = watched.sample()
        let before = try #require(start[getpid()]?.members[child.process.processIdentifier], "the live child is sampled")
        #expect(before >= 0.45)
        try child.stdin.fileHandleForWriting.close()
        child.process.waitUntilExit()
        let end = watched.sample()
        #expect(end[getpid()]?.members[child.process.processIdentifier] == nil)
        let spent = try #require(watched.spent(from: start, to: end).first)
        // Its 0.5 s came before the phase; what is left is the exit and this process's own waiting.
        #expect(spent.seconds < 0.25, "charged \(spent.seconds) s for a child that was idle during the phase")
    }

    @Test func aProcessThatIsNotThereHasNoFigure() {
        #expect(WatchedProcesses.cpuSeconds(of: 2_147_483_646) == nil)
        #expect(WatchedProcesses.reapedChildrenSeconds(of: 2_147_483_646) == nil)
    }
}
