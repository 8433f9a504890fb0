// relayctl: the operator's CLI. This file only hands the arguments to the command tree
// (CommandTree.swift) and exits with its status: 0 ok, 1 runtime failure, 64 usage error.
#if canImport(Glibc)
import Glibc
#endif

exit(RelayCtl.run(Array(CommandLine.arguments.dropFirst())))
