// relayctl events: delivery events and their webhook deliveries (docs/events.md). list and show
// read only; replay makes deliveries pending again (same event id, the receiver dedupes).
import Foundation
import RelayCore

extension RelayCtl {
    static var events: Command {
        .group("events", "Delivery events and their webhook deliveries: list, show, replay.",
               discussion: """
               Events are written with the outcome they report (response.delivered, response.failed,
               token.unregistered). Each configured webhook has a delivery of each event it receives:
               pending (to send or retrying), delivered, or dead (gave up; replay sends it again).
               """, [
            .leaf("list", "Events, newest first; with --webhook or --state, webhook deliveries, oldest first.",
                  options: [
                      .value("webhook", "name", "Deliveries of this webhook only.", required: false),
                      .value("state", "pending|delivered|dead", "Deliveries in this state only.", required: false),
                      .value("type", "type", "Events of this type only: response.delivered, response.failed or token.unregistered.", required: false),
                      .value("limit", "n", "At most this many (default 100, at most 10000).", required: false),
                  ] + databaseOptionSpecs, run: EventsCommand.list),
            .leaf("show", "One event: its webhook body and every webhook's delivery of it.",
                  arguments: [ArgumentSpec(name: "id", help: "The event id (the webhook-id header, the feed's id).")],
                  options: databaseOptionSpecs, run: EventsCommand.show),
            .leaf("replay", "Make deliveries pending again, due now, with the same event id.",
                  discussion: "Either --id ID (every webhook's delivery of it, or --webhook's) or --dead --webhook NAME.",
                  options: [
                      .value("id", "event-id", "Replay this event.", required: false),
                      .flag("dead", "Replay every dead delivery of --webhook."),
                      .value("webhook", "name", "The webhook (required with --dead).", required: false),
                  ] + databaseOptionSpecs, run: EventsCommand.replay),
        ])
    }
}

enum EventsCommand {
    struct EventJSON: Encodable {
        var id: String
        var sequence: Int64
        var type: String
        var createdAt: String
        @Nullable var credentialID: String?
        var app: String
        /// The exact webhook body (what is signed), as text.
        var body: String

        init(_ e: StoredEvent) {
            id = e.id; sequence = e.sequence; type = e.type.rawValue; createdAt = isoTime(e.createdAt); credentialID = e.credentialID
            app = e.app; body = String(decoding: e.body, as: UTF8.self)
        }
    }

    struct DeliveryJSON: Encodable {
        var webhook: String
        var state: String
        var attempts: Int
        @Nullable var firstAttemptAt: String?
        var nextAttemptAt: String
        @Nullable var lastError: String?
        var updatedAt: String
        @Nullable var event: EventJSON?

        init(_ d: WebhookDeliveryRecord, withEvent: Bool) {
            webhook = d.webhook; state = d.state.rawValue; attempts = d.attempts; firstAttemptAt = d.firstAttemptAt.map(isoTime)
            nextAttemptAt = isoTime(d.nextAttemptAt); lastError = d.lastError; updatedAt = isoTime(d.updatedAt)
            event = withEvent ? EventJSON(d.event) : nil
        }
    }

    static func parseType(_ args: ParsedArguments) throws -> EventType? {
        guard let raw = args.optionalString("type") else { return nil }
        guard let t = EventType(rawValue: raw) else {
            throw UsageError("--type: expected one of \(EventType.allCases.map(\.rawValue).joined(separator: "|")), got '\(raw)'")
        }
        return t
    }

    static func list(_ args: ParsedArguments, _ console: Console) throws {
        let type = try parseType(args)
        var state: WebhookDeliveryState?
        if let raw = args.optionalString("state") {
            guard let s = WebhookDeliveryState(rawValue: raw) else { throw UsageError("--state: expected one of pending|delivered|dead, got '\(raw)'") }
            state = s
        }
        let limit = try args.optionalInt("limit", in: 1...10_000) ?? 100
        let webhook = args.optionalString("webhook")
        let store = try openStore(args, readOnly: true)
        defer { store.close() }
        if webhook == nil && state == nil {
            let events = try storeCall("reading events") { try store.listEvents(type: type, limit: limit) }
            if args.flag("json") { return emit(console, try renderJSON(events.map(EventJSON.init))) }
            if events.isEmpty { return console.out("no events") }
            return emit(console, renderTable(["ID", "TYPE", "CREATED", "APP", "CREDENTIAL"], events.map {
                [$0.id, $0.type.rawValue, isoTime($0.createdAt), $0.app, $0.credentialID ?? "-"]
            }))
        }
        let deliveries = try storeCall("reading webhook deliveries") {
            try store.webhookDeliveries(WebhookDeliveryFilter(webhook: webhook, state: state, type: type, limit: limit))
        }
        if args.flag("json") { return emit(console, try renderJSON(deliveries.map { DeliveryJSON($0, withEvent: true) })) }
        if deliveries.isEmpty { return console.out("no webhook deliveries") }
        emit(console, renderTable(["EVENT", "TYPE", "WEBHOOK", "STATE", "ATTEMPTS", "NEXT ATTEMPT", "LAST ERROR"], deliveries.map {
            [$0.event.id, $0.event.type.rawValue, $0.webhook, $0.state.rawValue, String($0.attempts),
             $0.state == .pending ? isoTime($0.nextAttemptAt) : "-", $0.lastError ?? "-"]
        }, rightAligned: [4]))
    }

    static func show(_ args: ParsedArguments, _ console: Console) throws {
        let id = args.positionals[0]
        let store = try openStore(args, readOnly: true)
        defer { store.close() }
        guard let event = try storeCall("reading the event", { try store.event(id: id) }) else { throw RuntimeFailure("no event \(id)") }
        let deliveries = try storeCall("reading webhook deliveries") {
            try store.webhookDeliveries(WebhookDeliveryFilter(eventID: event.id, limit: 10_000))
        }
        struct Shown: Encodable { var event: EventJSON; var deliveries: [DeliveryJSON] }
        if args.flag("json") {
            return emit(console, try renderJSON(Shown(event: EventJSON(event), deliveries: deliveries.map { DeliveryJSON($0, withEvent: false) })))
        }
        var lines = ["id          \(event.id)", "type        \(event.type.rawValue)", "created     \(isoTime(event.createdAt))",
                     "app         \(event.app)", "credential  \(event.credentialID ?? "-")", "body        \(String(decoding: event.body, as: UTF8.self))"]
        lines += deliveries.map {
            "webhook     \($0.webhook): \($0.state.rawValue), \($0.attempts) attempts" + ($0.lastError.map { ", last error: \($0)" } ?? "")
        }
        if deliveries.isEmpty { lines.append("webhooks    none") }
        console.out(lines.joined(separator: "\n"))
    }

    static func replay(_ args: ParsedArguments, _ console: Console) throws {
        let id = args.optionalString("id")
        let dead = args.flag("dead")
        let webhook = args.optionalString("webhook")
        let n: Int
        switch (id, dead) {
        case (let id?, false):
            let store = try openStore(args, readOnly: false)
            defer { store.close() }
            guard try storeCall("reading the event", { try store.event(id: id) }) != nil else { throw RuntimeFailure("no event \(id)") }
            n = try storeCall("replaying") { try store.replayWebhookDelivery(eventID: id, webhook: webhook) }
        case (nil, true):
            guard let webhook else { throw UsageError("--dead needs --webhook NAME") }
            let store = try openStore(args, readOnly: false)
            defer { store.close() }
            n = try storeCall("replaying") { try store.replayDeadWebhookDeliveries(webhook: webhook) }
        default:
            throw UsageError("give either --id ID or --dead --webhook NAME")
        }
        if args.flag("json") { return emit(console, try renderJSON(["replayed": n])) }
        console.out(n == 0 ? "nothing to replay" : "replayed \(n) deliver\(n == 1 ? "y" : "ies"): pending again, due now")
    }
}
