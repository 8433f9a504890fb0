#!/usr/bin/env python3
"""Draws the benchmark plots as plain SVG (no plotting library needed, so `make bench` works
offline): scripts/bench-plots.py DATA_DIR OUT_DIR. Reads the CSV files bench-pipeline.sh writes
into DATA_DIR and writes latency-cdf.svg, throughput-connections.svg, drain.svg, growth.svg, and
the peers.csv of bench-ingest.sh as peers-throughput.svg and peers-cpu.svg."""
import csv
import glob
import math
import os
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
W, H, ML, MR, MT, MB = 640, 400, 70, 160, 40, 50


def nice_ticks(lo, hi, log):
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        return [10 ** e for e in range(a, b + 1)]
    span = hi - lo or 1
    step = 10 ** math.floor(math.log10(span / 5))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= 6:
            step *= m
            break
    t = math.floor(lo / step) * step
    out = []
    while t <= hi + step * 0.001:
        out.append(t)
        t += step
    return out


def fmt(v):
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def chart(path, title, xlabel, ylabel, series, xlog=False, ylog=False, ymin=None):
    pts = [p for _, s in series for p in s if (not xlog or p[0] > 0) and (not ylog or p[1] > 0)]
    if not pts:
        return False
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = (ymin if ymin is not None else min(ys)), max(ys)
    if x0 == x1:
        x1 = x0 + 1
    if y0 == y1:
        y1 = y0 + 1
    xt, yt = nice_ticks(x0, x1, xlog), nice_ticks(y0, y1, ylog)
    x0, x1 = min(x0, xt[0]), max(x1, xt[-1])
    y0, y1 = min(y0, yt[0]), max(y1, yt[-1])

    def sx(x):
        f = (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) if xlog else (x - x0) / (x1 - x0)
        return ML + f * (W - ML - MR)

    def sy(y):
        f = (math.log10(y) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) if ylog else (y - y0) / (y1 - y0)
        return H - MB - f * (H - MT - MB)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>']
    for t in xt:
        if x0 <= t <= x1:
            X = sx(t)
            o.append(f'<line x1="{X:.1f}" y1="{MT}" x2="{X:.1f}" y2="{H - MB}" stroke="#ddd"/>')
            o.append(f'<text x="{X:.1f}" y="{H - MB + 16}" text-anchor="middle">{fmt(t)}</text>')
    for t in yt:
        if y0 <= t <= y1:
            Y = sy(t)
            o.append(f'<line x1="{ML}" y1="{Y:.1f}" x2="{W - MR}" y2="{Y:.1f}" stroke="#ddd"/>')
            o.append(f'<text x="{ML - 6}" y="{Y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    o.append(f'<rect x="{ML}" y="{MT}" width="{W - ML - MR}" height="{H - MT - MB}" fill="none" stroke="#333"/>')
    o.append(f'<text x="{(ML + W - MR) / 2}" y="{H - 10}" text-anchor="middle">{xlabel}</text>')
    o.append(f'<text transform="translate(16,{(MT + H - MB) / 2}) rotate(-90)" text-anchor="middle">{ylabel}</text>')
    for i, (label, s) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        s = [p for p in s if (not xlog or p[0] > 0) and (not ylog or p[1] > 0)]
        if not s:
            continue
        d = " ".join(f"{'M' if j == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for j, (x, y) in enumerate(s))
        o.append(f'<path d="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        if len(s) < 30:
            for x, y in s:
                o.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"/>')
        ly = MT + 14 + i * 18
        o.append(f'<line x1="{W - MR + 12}" y1="{ly - 4}" x2="{W - MR + 32}" y2="{ly - 4}" stroke="{c}" stroke-width="2"/>')
        o.append(f'<text x="{W - MR + 38}" y="{ly}">{label}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")
    return True


def bars(path, title, unit, items):
    """Horizontal bars, one per (label, value), values printed at the bar's end."""
    items = [(l, v) for l, v in items if v == v]
    if not items:
        return False
    left, right, top, bh, gap = 220, 90, 44, 22, 10
    height = top + len(items) * (bh + gap) + 20
    vmax = max(v for _, v in items) or 1
    span = W - left - right
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{height}" fill="white"/>',
         f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>']
    for i, (label, v) in enumerate(items):
        y = top + i * (bh + gap)
        c = COLORS[0] if label.startswith("relay") else COLORS[2] if label.startswith("nginx") else COLORS[1]
        o.append(f'<text x="{left - 8}" y="{y + bh / 2 + 4:.1f}" text-anchor="end">{label}</text>')
        o.append(f'<rect x="{left}" y="{y}" width="{max(1.0, v / vmax * span):.1f}" height="{bh}" fill="{c}"/>')
        o.append(f'<text x="{left + v / vmax * span + 6:.1f}" y="{y + bh / 2 + 4:.1f}">{fmt(round(v, 1))} {unit}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")
    return True


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def main(data, out):
    os.makedirs(out, exist_ok=True)
    made = []
    # latency CDF, one line per offered load
    series = []
    files = sorted(glob.glob(os.path.join(data, "latency-[0-9]*.csv")), key=lambda p: int(p.rsplit("-", 1)[1][:-4]))
    for p in files:
        lat = [num(r["latency_ms"]) for r in rows(p)]
        lat = [v for v in lat if v == v]
        if not lat:
            continue
        n = len(lat)
        step = max(1, n // 400)
        pts = [(max(v, 0.05), (i + 1) / n) for i, v in enumerate(lat) if i % step == 0 or i == n - 1]
        series.append((f"{os.path.basename(p)[8:-4]}/s offered", pts))
    if chart(os.path.join(out, "latency-cdf.svg"), "Ingest -> APNs (mock) latency CDF", "latency (ms, log)",
             "fraction of responses", series, xlog=True, ymin=0):
        made.append("latency-cdf.svg")
    r = rows(os.path.join(data, "connections.csv"))
    if r and chart(os.path.join(out, "throughput-connections.svg"), "Durable ingest vs nginx static",
                   "client connections (log)", "requests/s",
                   [("relay 202/s", [(num(x["connections"]), num(x["relay_rps"])) for x in r]),
                    ("nginx 200/s", [(num(x["connections"]), num(x["nginx_rps"])) for x in r])], xlog=True, ymin=0):
        made.append("throughput-connections.svg")
    r = rows(os.path.join(data, "drain.csv"))
    if r and chart(os.path.join(out, "drain.svg"), "Draining the backlog", "seconds", "delivered",
                   [("delivered", [(num(x["seconds"]), num(x["delivered"])) for x in r])], ymin=0):
        made.append("drain.svg")
    r = rows(os.path.join(data, "growth.csv"))
    if r and chart(os.path.join(out, "growth.svg"), "Cost per item vs rows already queued", "queued rows (log)",
                   "microseconds per item",
                   [("ingest (1e6 / 202 per s)", [(num(x["queued"]), 1e6 / num(x["ingest_rps"])) for x in r if num(x["ingest_rps"]) > 0]),
                    ("drain (1e6 / pushes per s)", [(num(x["queued"]), 1e6 / num(x["drain_rate"])) for x in r if num(x["drain_rate"]) > 0])],
                   xlog=True, ymin=0):
        made.append("growth.svg")
    r = rows(os.path.join(data, "peers.csv"))
    if r and bars(os.path.join(out, "peers-throughput.svg"), "Durable records per second (64 connections)", "/s",
                  [(x["system"], num(x["rps"])) for x in r]):
        made.append("peers-throughput.svg")
    if r and bars(os.path.join(out, "peers-cpu.svg"), "Server CPU per durable record", "µs",
                  [(x["system"], num(x["cpu_us"])) for x in r if not x["system"].startswith("nginx")]):
        made.append("peers-cpu.svg")
    print(" ".join(made))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    main(sys.argv[1], sys.argv[2])
