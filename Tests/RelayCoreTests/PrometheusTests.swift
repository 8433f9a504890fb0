import Testing
@testable import RelayCore

/// What the text exposition format (0.0.4) requires of a page, checked line by line: each
/// family once, its HELP and TYPE before its samples, all its samples in one group; sample
/// names belong to the family being written (histograms: _bucket, _sum, _count); label values
/// closed and escaped; values numbers. Returns the problems found (empty: valid).
func expositionProblems(_ text: String) -> [String] {
    var problems: [String] = []
    var finished = Set<String>()
    var current: (name: String, type: String?)?
    var seenHelp = Set<String>()
    guard text.hasSuffix("\n") else { return ["the page does not end with a line feed"] }
    for line in text.split(separator: "\n", omittingEmptySubsequences: false).dropLast() {
        if line.hasPrefix("# ") {
            let parts = line.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false)
            guard parts.count >= 3, parts[1] == "HELP" || parts[1] == "TYPE" else { continue }
            let name = String(parts[2])
            if current?.name != name {
                if let c = current { finished.insert(c.name) }
                if finished.contains(name) { problems.append("\(name): a second group") }
                current = (name, nil)
            }
            if parts[1] == "HELP" {
                if !seenHelp.insert(name).inserted { problems.append("\(name): a second HELP") }
            } else {
                guard current?.type == nil else { problems.append("\(name): a second TYPE"); continue }
                let type = parts.count > 3 ? String(parts[3]) : ""
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(type) { problems.append("\(name): TYPE \(type)") }
                current?.type = type
            }
            continue
        }
        guard let c = current else { problems.append("a sample before any family: \(line)"); continue }
        let nameEnd = line.firstIndex { $0 == "{" || $0 == " " } ?? line.endIndex
        let name = String(line[..<nameEnd])
        let allowed = c.type == "histogram" ? ["_bucket", "_sum", "_count"].map { c.name + $0 } : [c.name]
        if !allowed.contains(name) { problems.append("\(name) inside the group of \(c.name)") }
        var rest = line[nameEnd...]
        if rest.first == "{" {
            // label="value" pairs; inside a value only \\, \" and \n are escapes.
            var i = rest.index(after: rest.startIndex)
            var closed = false
            while i < rest.endIndex {
                if rest[i] == "}" { closed = true; i = rest.index(after: i); break }
                guard let eq = rest[i...].firstIndex(of: "="), rest.index(after: eq) < rest.endIndex,
                      rest[rest.index(after: eq)] == "\"" else { break }
                var j = rest.index(eq, offsetBy: 2)
                var ok = false
                while j < rest.endIndex {
                    if rest[j] == "\\" {
                        let n = rest.index(after: j)
                        guard n < rest.endIndex, ["\\", "\"", "n"].contains(rest[n]) else { break }
                        j = rest.index(after: n)
                    } else if rest[j] == "\"" {
                        ok = true
                        j = rest.index(after: j)
                        break
                    } else {
                        j = rest.index(after: j)
                    }
                }
                guard ok else { break }
                if j < rest.endIndex, rest[j] == "," { j = rest.index(after: j) }
                i = j
            }
            if !closed { problems.append("bad labels: \(line)"); continue }
            rest = rest[i...]
        }
        let value = rest.drop { $0 == " " }
        if rest.first != " " || (Double(value) == nil && !["+Inf", "-Inf", "NaN"].contains(value)) {
            problems.append("bad value: \(line)")
        }
    }
    return problems
}

@Suite struct PrometheusTests {
    @Test func samplesAddedLaterJoinTheirFamilysGroup() {
        var r = PrometheusRegistry()
        r.declare("a_total", .counter, help: "A.")
        r.sample("a_total", ["listener": "ingest"], 1)
        r.gauge("b", help: "B.", 2.5)
        r.declare("a_total", .counter, help: "A.")
        r.sample("a_total", ["listener": "admin"], 3)
        r.declare("c", .gauge, help: "No samples yet.")
        let page = r.render()
        #expect(page == """
            # HELP a_total A.
            # TYPE a_total counter
            a_total{listener="ingest"} 1
            a_total{listener="admin"} 3
            # HELP b B.
            # TYPE b gauge
            b 2.5
            # HELP c No samples yet.
            # TYPE c gauge

            """)
        #expect(expositionProblems(page).isEmpty)
    }

    @Test func labelValuesAndHelpAreEscaped() {
        var r = PrometheusRegistry()
        r.declare("x_total", .counter, help: "back\\slash and\nline \"quoted\"")
        r.sample("x_total", ["reason": "a\"b\\c\nd", "status": "410"], 1)
        let page = r.render()
        #expect(page == "# HELP x_total back\\\\slash and\\nline \"quoted\"\n# TYPE x_total counter\n"
                    + "x_total{reason=\"a\\\"b\\\\c\\nd\",status=\"410\"} 1\n")
        #expect(expositionProblems(page).isEmpty, "\(expositionProblems(page))")
    }

    @Test func histogramsAreCumulativeWithInfSumAndCount() {
        var h = PrometheusHistogram(bounds: [0.25, 1])
        h.observe(0.125)
        h.observe(0.5)
        h.observe(2)
        var r = PrometheusRegistry()
        r.histogram("d_seconds", help: "D.", h)
        #expect(r.render() == """
            # HELP d_seconds D.
            # TYPE d_seconds histogram
            d_seconds_bucket{le="0.25"} 1
            d_seconds_bucket{le="1.0"} 2
            d_seconds_bucket{le="+Inf"} 3
            d_seconds_sum 2.625
            d_seconds_count 3

            """)
    }

    /// The checker itself: each rule it enforces catches a page that breaks it.
    @Test func theExpositionCheckerRefusesBrokenPages() {
        let valid = "# HELP a A.\n# TYPE a gauge\na{l=\"v\"} 1\n"
        #expect(expositionProblems(valid).isEmpty)
        // Two families' HELP/TYPE first, samples after: a's samples are outside its group.
        #expect(!expositionProblems("# HELP a A.\n# TYPE a gauge\n# HELP b B.\n# TYPE b gauge\na 1\nb 2\n").isEmpty)
        #expect(!expositionProblems("# HELP a A.\n# TYPE a gauge\na 1\n# HELP b B.\n# TYPE b gauge\nb 1\n# HELP a A.\n# TYPE a gauge\na 2\n").isEmpty)
        #expect(!expositionProblems("a 1\n").isEmpty)
        #expect(!expositionProblems("# HELP a A.\n# TYPE a gauge\na{l=\"v} 1\n").isEmpty)
        #expect(!expositionProblems("# HELP a A.\n# TYPE a gauge\na{l=\"\\x\"} 1\n").isEmpty)
        #expect(!expositionProblems("# HELP a A.\n# TYPE a gauge\na one\n").isEmpty)
        #expect(!expositionProblems("# HELP a A.\n# TYPE a gauge\na 1").isEmpty)
        #expect(!expositionProblems("# HELP a A.\n# TYPE a counter\n# TYPE a counter\na 1\n").isEmpty)
    }
}
