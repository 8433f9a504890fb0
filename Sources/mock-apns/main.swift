// mock-apns: see `mock-apns --help` and docs/mock-apns.md. All logic lives in MockAPNs.
import BuildInfo
import MockAPNs
#if canImport(Glibc)
import Glibc
#endif

let arguments = Array(CommandLine.arguments.dropFirst())
if arguments == ["--version"] {
    print(BuildInfo.versionLine("mock-apns"))
    exit(0)
}
exit(MockAPNsMain.run(arguments: arguments))
