import Foundation
import ProcessCPU
import Testing

/// `attest-sim load --cpu-of` charges a watched process with its children's CPU over the timed
/// phase only. PostgreSQL forks and reaps workers (autovacuum, parallel workers) during a run;
/// their CPU must neither vanish nor be counted from before the phase.
/// The watched process is a python3 parent of our own, not this test process, whose other threads
/// and children (servers other suites started) would add CPU of their own on a busy run.
@Suite struct ProcessCPUTests {
    /// The parent forks one child that spends `seconds` of CPU, then waits for its stdin to close.
    /// `later`: the parent says "ready", and forks the child only after a line from us; it says
    /// "reaped" once the child has exited and been waited for. `now`: it forks the child at once,
    /// says "spent" when the child has spent its CPU, and ends it after a line from us ("reaped").
    /// Every step is an event on a pipe: nothing sleeps.
    private static let parentScript = """
        import subprocess, sys
        busy = "import sys, time\\nwhile time.process_time() < %s: pass\\nprint('spent', flush=True)\\nsys.stdin.read()"
        mode, seconds = sys.argv[1], sys.argv[2]
        def spawn():
            return subprocess.Popen([sys.executable, "-c", busy % seconds], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if mode == "later":
            print("ready", flush=True); sys.stdin.readline()
            child = spawn(); child.stdout.readline(); child.stdin.close(); child.wait()
        else:
            child = spawn(); child.stdout.readline(); print(child.pid, flush=True)
            sys.stdin.readline(); child.stdin.close(); child.wait()
        print("reaped", flush=True)
        sys.stdin.read()
        """

    private struct Parent {
        let process = Process()
        let stdin = Pipe(), stdout = Pipe()

        init(_ mode: String, seconds: Double) throws {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = ["python3", "-c", ProcessCPUTests.parentScript, mode, "\(seconds)"]
            process.standardInput = stdin
            process.standardOutput = stdout
            try process.run()
        }

        var pid: Int32 { process.processIdentifier }

        func line() -> String {
            var bytes: [UInt8] = []
            while true {
                let chunk = stdout.fileHandleForReading.readData(ofLength: 1)
                if chunk.isEmpty || chunk.first == UInt8(ascii: "\n") { return String(decoding: bytes, as: UTF8.self) }
                bytes.append(contentsOf: chunk)
            }
        }

        func go() { stdin.fileHandleForWriting.write(Data("go\n".utf8)) }

        func end() throws {
            try stdin.fileHandleForWriting.close()
            process.waitUntilExit()
        }
    }

    @Test func aChildBornAndReapedWithinThePhaseIsCounted() throws {
        let parent = try Parent("later", seconds: 0.3)
        #expect(parent.line() == "ready")
        let watched = WatchedProcesses(pids: [parent.pid])
        let start = watched.sample()
        parent.go()
        #expect(parent.line() == "reaped")   // its CPU is now in the parent's cutime/cstime
        let spent = try #require(watched.spent(from: start, to: watched.sample()).first)
        try parent.end()
        #expect(spent.pid == parent.pid)
        #expect(spent.seconds >= 0.25, "a child that spent 0.3 s of CPU within the phase: \(spent.seconds) s")
    }

    @Test func aChildThatExitsMidPhaseIsNotChargedForItsLifeBeforeIt() throws {
        let parent = try Parent("now", seconds: 0.5)
        let child = try #require(Int32(parent.line()), "the child's PID once it has spent its CPU")
        let watched = WatchedProcesses(pids: [parent.pid])
        let start = watched.sample()
        let before = try #require(start[parent.pid]?.members[child], "the live child is sampled")
        #expect(before >= 0.45)
        parent.go()
        #expect(parent.line() == "reaped")
        let end = watched.sample()
        try parent.end()
        #expect(end[parent.pid]?.members[child] == nil)
        let spent = try #require(watched.spent(from: start, to: end).first)
        // Its 0.5 s came before the phase; what is left is its exit and the parent's own waiting.
        #expect(spent.seconds < 0.25, "charged \(spent.seconds) s for a child that was idle during the phase")
    }

    @Test func aProcessThatIsNotThereHasNoFigure() {
        #expect(WatchedProcesses.cpuSeconds(of: 2_147_483_646) == nil)
        #expect(WatchedProcesses.reapedChildrenSeconds(of: 2_147_483_646) == nil)
    }
}
