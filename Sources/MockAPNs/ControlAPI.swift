// The control port (HTTP/1.1, cleartext, loopback only): what tests read and steer.
//   GET    /deliveries   JSON array of accepted pushes, oldest first
//                         (?deviceToken=HEX filters; ?limit=N keeps the newest N)
//   GET    /stats        counters by status/reason, connections, streams
//   POST   /reset        clear deliveries, counters and receiving ratchets (faults stay)
//   GET    /faults       the current fault plan {"rules":[...]}
//   POST   /faults       replace the plan: {"rules":[...]}, a bare array of rules, or one rule
//   DELETE /faults       no faults
import Foundation
import HTTPServer

struct ControlAPI: Sendable {
    let core: MockCore
    let metrics: @Sendable () -> HTTPServerMetrics

    func handle(_ request: HTTPRequest, _ writer: HTTPReplyWriter) {
        writer.respond(route(request))
    }

    func route(_ request: HTTPRequest) -> HTTPReply {
        switch (request.method, request.path) {
        case ("GET", "/deliveries"):
            var deliveries = core.recorder.deliveries
            if let token = query(request.target, "deviceToken")?.lowercased() {
                deliveries = deliveries.filter { $0.deviceToken == token }
            }
            if let text = query(request.target, "limit") {
                guard let limit = Int(text), limit >= 0 else { return json(400, ["error": "limit must be a non-negative integer"]) }
                deliveries = Array(deliveries.suffix(limit))
            }
            return json(200, deliveries.map { $0.jsonObject() })
        case ("GET", "/stats"):
            var object = core.statsSnapshot.jsonObject()
            let m = metrics()
            object["connectionsOpen"] = m.connectionsOpen
            object["connectionsTotal"] = m.connectionsTotal
            object["tlsHandshakeFailures"] = m.tlsHandshakeFailures
            object["deliveriesInMemory"] = core.recorder.deliveries.count
            object["deliveriesDroppedFromMemory"] = core.recorder.droppedFromMemory
            return json(200, object)
        case ("POST", "/reset"):
            core.reset()
            return json(200, ["reset": true])
        case ("GET", "/faults"):
            return encodedPlan(core.faultPlan)
        case ("POST", "/faults"):
            do {
                let plan = try decodePlan(request.body)
                core.setFaults(plan)
                log("faults set: \(plan.rules.count) rule(s)")
                return encodedPlan(plan)
            } catch let error as MockConfigurationError {
                return json(400, ["error": error.message])
            } catch {
                return json(400, ["error": "faults: \(error)"])
            }
        case ("DELETE", "/faults"):
            core.setFaults(FaultPlan())
            return encodedPlan(FaultPlan())
        case (_, "/deliveries"), (_, "/stats"), (_, "/reset"), (_, "/faults"):
            return json(405, ["error": "method \(request.method) not allowed on \(request.path)"])
        default:
            return json(404, ["error": "no such endpoint \(request.path); try /deliveries, /stats, /reset, /faults"])
        }
    }

    private func decodePlan(_ body: [UInt8]) throws -> FaultPlan {
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) else {
            throw MockConfigurationError("faults: body is not JSON")
        }
        let rulesObject: Any
        if let dict = object as? [String: Any], let rules = dict["rules"] {
            rulesObject = rules
        } else if let dict = object as? [String: Any] {
            rulesObject = [dict]
        } else {
            rulesObject = object
        }
        guard let list = rulesObject as? [[String: Any]] else { throw MockConfigurationError("faults: rules must be an array of objects") }
        let known = Set(["deviceToken", "fraction", "status", "reason", "timestampMs", "latencyMs", "stall", "abort", "goAwayAfter",
                         "closeAfter", "goAwayAfterErrors", "expireTokensIssuedBefore", "refuseConnections", "stallHandshake",
                         "goAwayBeforeFirstStream"])
        var rules: [FaultRule] = []
        for (i, item) in list.enumerated() {
            if let unknown = Set(item.keys).subtracting(known).sorted().first {
                throw MockConfigurationError("faults: rules[\(i)].\(unknown) is not a fault field")
            }
            let data = try JSONSerialization.data(withJSONObject: item)
            do {
                rules.append(try JSONDecoder().decode(FaultRule.self, from: data).validated())
            } catch let error as MockConfigurationError {
                throw MockConfigurationError("rules[\(i)]: \(error.message)")
            } catch DecodingError.typeMismatch(_, let context) {
                throw MockConfigurationError("faults: rules[\(i)].\(context.codingPath.map(\.stringValue).joined(separator: ".")) has the wrong type")
            }
        }
        return FaultPlan(rules: rules)
    }

    private func encodedPlan(_ plan: FaultPlan) -> HTTPReply {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let data = (try? encoder.encode(plan)) ?? Data("{}".utf8)
        return HTTPReply.json(200, String(decoding: data, as: UTF8.self))
    }

    private func json(_ status: Int, _ object: Any) -> HTTPReply {
        HTTPReply.json(status, String(decoding: jsonData(object), as: UTF8.self))
    }

    private func query(_ target: String, _ name: String) -> String? {
        guard let q = target.firstIndex(of: "?") else { return nil }
        for pair in target[target.index(after: q)...].split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1)
            if kv.count == 2, kv[0] == name { return String(kv[1]).removingPercentEncoding }
        }
        return nil
    }
}
