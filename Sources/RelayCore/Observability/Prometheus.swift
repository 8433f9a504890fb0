// The Prometheus text exposition format (version 0.0.4), written in one place: every /metrics
// line goes through PrometheusRegistry, which keeps each family's HELP, TYPE and samples
// together (the format requires one group per family) and escapes label values.

/// One /metrics page being assembled: families in the order they were first declared, each
/// rendered as its HELP and TYPE lines followed by all of its samples, whoever added them.
public struct PrometheusRegistry: Sendable {
    public enum Kind: String, Sendable { case counter, gauge, histogram }

    private struct Family: Sendable {
        let kind: Kind
        let help: String
        var samples = ""
    }

    private var order: [String] = []
    private var families: [String: Family] = [:]

    public init() {}

    /// Declares a family (a second declaration of the same name and kind is a no-op, so several
    /// sources can add samples to one family). A family without samples still renders its
    /// HELP and TYPE.
    public mutating func declare(_ name: String, _ kind: Kind, help: String) {
        if let existing = families[name] {
            precondition(existing.kind == kind, "metric \(name) declared as \(existing.kind) and \(kind)")
            return
        }
        precondition(Self.isName(name), "not a Prometheus metric name: \(name)")
        order.append(name)
        families[name] = Family(kind: kind, help: help)
    }

    /// Adds one sample to the declared family `name` (integers and doubles as Swift prints them).
    public mutating func sample(_ name: String, _ labels: KeyValuePairs<String, String> = [:], _ value: some Numeric & CustomStringConvertible) {
        append(name, suffix: "", labels, value.description)
    }

    /// Declares and fills a family with a single unlabelled sample.
    public mutating func counter(_ name: String, help: String, _ value: some Numeric & CustomStringConvertible) {
        declare(name, .counter, help: help)
        sample(name, [:], value)
    }

    public mutating func gauge(_ name: String, help: String, _ value: some Numeric & CustomStringConvertible) {
        declare(name, .gauge, help: help)
        sample(name, [:], value)
    }

    /// Declares a histogram family and adds its cumulative buckets, `+Inf`, sum and count.
    public mutating func histogram(_ name: String, help: String, _ h: PrometheusHistogram) {
        declare(name, .histogram, help: help)
        for (i, bound) in h.bounds.enumerated() { append(name, suffix: "_bucket", ["le": "\(bound)"], "\(h.counts[i])") }
        append(name, suffix: "_bucket", ["le": "+Inf"], "\(h.total)")
        append(name, suffix: "_sum", [:], "\(h.sum)")
        append(name, suffix: "_count", [:], "\(h.total)")
    }

    /// The page: `# HELP`, `# TYPE`, then the samples of each family in turn.
    public func render() -> String {
        var out = ""
        for name in order {
            let f = families[name]!
            out += "# HELP \(name) \(Self.escapeHelp(f.help))\n# TYPE \(name) \(f.kind.rawValue)\n"
            out += f.samples
        }
        return out
    }

    private mutating func append(_ name: String, suffix: String, _ labels: KeyValuePairs<String, String>, _ value: String) {
        precondition(families[name] != nil, "metric \(name) sampled before it was declared")
        var line = name + suffix
        if !labels.isEmpty {
            line += "{"
            for (i, (key, text)) in labels.enumerated() {
                precondition(Self.isName(key) && !key.contains(":"), "not a Prometheus label name: \(key)")
                line += (i == 0 ? "" : ",") + key + "=\"" + Self.escapeLabelValue(text) + "\""
            }
            line += "}"
        }
        families[name]!.samples += line + " " + value + "\n"
    }

    /// Label values escape backslash, double quote and line feed (the exposition format).
    static func escapeLabelValue(_ s: String) -> String {
        guard s.utf8.contains(where: { $0 == UInt8(ascii: "\\") || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\n") }) else { return s }
        return s.replacing("\\", with: "\\\\").replacing("\"", with: "\\\"").replacing("\n", with: "\\n")
    }

    /// HELP text escapes backslash and line feed only.
    static func escapeHelp(_ s: String) -> String {
        s.replacing("\\", with: "\\\\").replacing("\n", with: "\\n")
    }

    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`
    static func isName(_ s: String) -> Bool {
        guard let first = s.utf8.first, !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else { return false }
        return s.utf8.allSatisfy { c in
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(c) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(c)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) || c == UInt8(ascii: "_") || c == UInt8(ascii: ":")
        }
    }
}

/// A latency histogram: cumulative counts per upper bound (seconds), their sum and count.
public struct PrometheusHistogram: Sendable {
    public let bounds: [Double]
    public private(set) var counts: [Int]
    public private(set) var sum: Double = 0
    public private(set) var total = 0

    public init(bounds: [Double]) {
        self.bounds = bounds
        counts = [Int](repeating: 0, count: bounds.count)
    }

    public mutating func observe(_ seconds: Double) {
        for (i, b) in bounds.enumerated() where seconds <= b { counts[i] += 1 }
        sum += seconds
        total += 1
    }
}
