// What a binary says about itself: `--version`, relay_build_info on /metrics, the start log line.
// The version is the package's (bump it here; the Makefile and the Debian package read it from
// this line); the commit is whatever `make` recorded (docs/operations.md, "Versions").
import CBuildInfo

public enum BuildInfo {
    public static let version = "0.1.0"

    /// 12 hex digits of the commit, "-dirty" when tracked files differed from it, or "unknown".
    public static let commit = String(cString: relay_build_commit())

    /// `<program> <version> (commit <commit>)`: the whole output of `--version`.
    public static func versionLine(_ program: String) -> String { "\(program) \(version) (commit \(commit))" }
}
