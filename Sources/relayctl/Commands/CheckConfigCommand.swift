extension RelayCtl { static var checkConfig: Command { .leaf("check-config", "x", options: []) { _, _ in } } }
