extension RelayCtl { static var sendTest: Command { .leaf("send-test", "x", options: []) { _, _ in } } }
