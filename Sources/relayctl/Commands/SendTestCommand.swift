enum SendTestCommand { static let help = ""; static func run(_ a: [String]) throws {} }
