import CBuildInfo

/// What the tools were built from: the release (VERSION) and the commit (scripts/embed-version.sh).
public enum BuildInfo {
    public static let version = String(cString: attest_build_version())
    public static let commit = String(cString: attest_build_commit())

    /// `TOOL VERSION (commit COMMIT)`, what `--version` prints.
    public static func line(_ tool: String) -> String { "\(tool) \(version) (commit \(commit))" }
}
