// HTTPServer's counters on /metrics (docs/operations.md lists the families).
import HTTPServer

extension PrometheusRegistry {
    /// HTTPServer's counters, one series per listener ("ingest", "admin") in each family; the
    /// families are declared even when no listener runs.
    mutating func collectHTTP(_ listeners: [(name: String, metrics: HTTPServerMetrics)]) {
        let families: [(String, PrometheusRegistry.Kind, String)] = [
            ("relay_http_connections_open", .gauge, "Open client connections."),
            ("relay_http_connections_total", .counter, "Accepted client connections."),
            ("relay_http_connections_refused_total", .counter, "Connections refused over the connection limit (total or per address)."),
            ("relay_http_connections_refused_per_address_total", .counter,
             "Connections refused because their address held ingest.maxConnectionsPerAddress."),
            ("relay_http_responses_total", .counter, "Responses by status class."),
            ("relay_http_parse_errors_total", .counter, "Malformed requests by kind."),
            ("relay_http_tls_handshake_failures_total", .counter, "Failed TLS handshakes."),
            ("relay_http_timeouts_total", .counter, "Connections closed by a header/body/idle/write timeout."),
            ("relay_http_proxy_header_failures_total", .counter,
             "Connections closed for the PROXY protocol: untrusted peer, or no valid header in time."),
            ("relay_http_queued_output_bytes", .gauge, "Response bytes queued for clients that have not read them yet."),
            ("relay_http_buffered_input_bytes", .gauge, "Request bytes held by connections: unparsed input and requests in progress."),
            ("relay_http_largest_connection_input_bytes", .gauge, "The most input one connection has held at once since start."),
            ("relay_http_connections_closed_input_budget_total", .counter,
             "Connections closed because connections together held more input than the server-wide budget."),
            ("relay_http_accept_failures_total", .counter,
             "Accepts that failed for lack of descriptors, buffers or memory, or on a broken listening socket."),
        ]
        for (name, kind, help) in families { declare(name, kind, help: help) }
        for (l, m) in listeners {
            sample("relay_http_connections_open", ["listener": l], m.connectionsOpen)
            sample("relay_http_connections_total", ["listener": l], m.connectionsTotal)
            sample("relay_http_connections_refused_total", ["listener": l], m.connectionsRefused)
            sample("relay_http_connections_refused_per_address_total", ["listener": l], m.connectionsRefusedPerAddress)
            for cls in 1...5 where cls < m.requestsByStatusClass.count {
                sample("relay_http_responses_total", ["listener": l, "class": "\(cls)xx"], m.requestsByStatusClass[cls])
            }
            for (kind, n) in m.parseErrorsByKind.sorted(by: { $0.key < $1.key }) {
                sample("relay_http_parse_errors_total", ["listener": l, "kind": kind], n)
            }
            sample("relay_http_tls_handshake_failures_total", ["listener": l], m.tlsHandshakeFailures)
            sample("relay_http_timeouts_total", ["listener": l], m.timeouts)
            sample("relay_http_proxy_header_failures_total", ["listener": l], m.proxyHeaderFailures)
            sample("relay_http_queued_output_bytes", ["listener": l], m.queuedOutputBytes)
            sample("relay_http_buffered_input_bytes", ["listener": l], m.bufferedInputBytes)
            sample("relay_http_largest_connection_input_bytes", ["listener": l], m.largestConnectionInputBytes)
            sample("relay_http_connections_closed_input_budget_total", ["listener": l], m.connectionsClosedForInputBudget)
            sample("relay_http_accept_failures_total", ["listener": l], m.acceptFailures)
        }
    }
}
