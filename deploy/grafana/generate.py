#!/usr/bin/env python3
"""Writes deploy/grafana/relay-dashboard.json. The JSON is checked in (import it into Grafana);
edit this generator rather than the JSON so panels stay consistent. Metric names:
docs/operations.md "Metrics"."""
import json, os

DS = {"type": "prometheus", "uid": "${datasource}"}
panels = []

def panel(title, kind, targets, x, y, w=12, h=8, unit="short", description="", stack=False):
    p = {
        "id": len(panels) + 1, "title": title, "type": kind, "datasource": DS,
        "description": description,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [{"datasource": DS, "refId": chr(65 + i), "expr": e, "legendFormat": l}
                    for i, (e, l) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]}}
                   if kind == "timeseries" else {"reduceOptions": {"calcs": ["lastNotNull"]}},
    }
    if kind == "timeseries" and stack:
        p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal"}, "fillOpacity": 30}
    panels.append(p)

I = 'instance=~"$instance"'
panel("Ready (/readyz)", "stat", [(f'min(probe_success{{job="relay-readyz",{I}}})', "ready")], 0, 0, 6, 4,
      description="1 when /readyz answers 200: DB writable, APNs credentials loaded, dispatcher running.")
panel("Pending responses", "stat", [(f'sum(relay_outbox_responses{{state=~"queued|retry|inflight",{I}}})', "pending")], 6, 0, 6, 4)
panel("Oldest pending", "stat", [(f'max(relay_outbox_oldest_pending_age_seconds{{{I}}})', "age")], 12, 0, 6, 4, unit="s",
      description="Age of the oldest queued or retry-scheduled response. Alert at 10 min.")
panel("Ingest 202/s", "stat", [(f'sum(rate(relay_ingest_requests_total{{status="202",{I}}}[5m]))', "202/s")], 18, 0, 6, 4, unit="reqps")

panel("Ingest by status", "timeseries",
      [(f'sum by (status) (rate(relay_ingest_requests_total{{{I}}}[$__rate_interval]))', "{{status}}")], 0, 4, unit="reqps",
      description="202 accepted, 200 duplicate, 4xx client errors, 429 rate limited, 503 shedding (storage or outbox bound).")
panel("Outbox by state", "timeseries",
      [(f'sum by (state) (relay_outbox_responses{{{I}}})', "{{state}}")], 12, 4, stack=False,
      description="Rows per state. delivered/failed shrink only when purged (relayctl purge).")
panel("Pushes by APNs status / reason", "timeseries",
      [(f'sum by (status, reason) (rate(relay_pushes_total{{{I}}}[$__rate_interval]))', "{{status}} {{reason}}")], 0, 12, unit="reqps", stack=True,
      description="status=transport for connection-level failures. Runbook per reason: docs/operations.md.")
panel("Push latency (relay -> APNs answer)", "timeseries",
      [(f'histogram_quantile(0.5, sum by (le) (rate(relay_push_duration_seconds_bucket{{{I}}}[$__rate_interval])))', "p50"),
       (f'histogram_quantile(0.99, sum by (le) (rate(relay_push_duration_seconds_bucket{{{I}}}[$__rate_interval])))', "p99")],
      12, 12, unit="s")
panel("Oldest pending age", "timeseries",
      [(f'max by (instance) (relay_outbox_oldest_pending_age_seconds{{{I}}})', "{{instance}}")], 0, 20, unit="s")
panel("Retries and token pacing", "timeseries",
      [(f'sum(rate(relay_push_retries_total{{{I}}}[$__rate_interval]))', "retries scheduled"),
       (f'sum(rate(relay_pushes_total{{reason="TooManyRequests",{I}}}[$__rate_interval]))', "TooManyRequests (token paced)")],
      12, 20, unit="ops")
panel("Ingest connections open", "timeseries",
      [(f'sum by (instance) (relay_http_connections_open{{listener="ingest",{I}}})', "{{instance}}")], 0, 28)
panel("Rate limited (429) by limit", "timeseries",
      [(f'sum by (scope) (rate(relay_rate_limited_total{{{I}}}[$__rate_interval]))', "{{scope}}")], 0, 36, unit="reqps",
      description="Requests refused because a credential or a push token exceeded its configured rate (ingest.rateLimits).")
panel("Ingest to APNs answer (first attempt)", "timeseries",
      [(f'histogram_quantile(0.99, sum by (le) (rate(relay_ingest_to_answer_seconds_bucket{{{I}}}[$__rate_interval])))', "p99"),
       (f'histogram_quantile(0.5, sum by (le) (rate(relay_ingest_to_answer_seconds_bucket{{{I}}}[$__rate_interval])))', "p50")],
      12, 36, unit="s", description="From the 202 commit to APNs' first answer: what a person waiting for the reply feels.")
panel("Ingest request rate vs pushes", "timeseries",
      [(f'sum(rate(relay_ingest_requests_total{{status="202",{I}}}[$__rate_interval]))', "accepted"),
       (f'sum(rate(relay_pushes_total{{status="200",{I}}}[$__rate_interval]))', "delivered")],
      12, 28, unit="reqps", description="Over time the two lines must meet; a gap that persists is the outbox growing.")

dashboard = {
    "__inputs": [], "title": "Accessory relay", "uid": "accessory-relay", "editable": True,
    "schemaVersion": 39, "version": 1, "tags": ["accessory-relay", "apns"],
    "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
    "templating": {"list": [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
        {"name": "instance", "type": "query", "datasource": DS, "label": "instance",
         "query": {"query": "label_values(relay_outbox_responses, instance)", "refId": "instance"},
         "definition": "label_values(relay_outbox_responses, instance)",
         "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2},
    ]},
    "annotations": {"list": []},
    "panels": panels,
}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay-dashboard.json")
with open(out, "w") as f:
    json.dump(dashboard, f, indent=2)
    f.write("\n")
