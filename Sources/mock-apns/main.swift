// mock-apns: see `mock-apns --help` and docs/mock-apns.md. All logic lives in MockAPNs.
import MockAPNs
#if canImport(Glibc)
import Glibc
#endif

exit(MockAPNsMain.run(arguments: Array(CommandLine.arguments.dropFirst())))
