// ratchet-bench: measures the Ratchet module in a release build for scripts/bench-ratchet.sh.
// Prints `key=value` lines (CPU seconds of this thread, so a busy machine skews less; the
// script compares against `openssl speed`, which also reports CPU time).
// Usage: ratchet-bench [seconds-per-measurement]   (default 1.0)
#if canImport(Glibc)
import Glibc
#endif
import Ratchet

let seconds = CommandLine.arguments.count > 1 ? Double(CommandLine.arguments[1]) ?? 1.0 : 1.0
print(Bench.run(secondsPerMeasurement: seconds), terminator: "")
