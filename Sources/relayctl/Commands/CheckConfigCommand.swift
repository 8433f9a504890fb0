enum CheckConfigCommand { static let help = ""; static func run(_ a: [String]) throws {} }
