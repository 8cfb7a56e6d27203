#!/usr/bin/env python3
"""Plot the scale figures (docs/scale.md) as one SVG, no dependencies.

    python3 bench/scale/plot.py bench.txt [more.txt ...] [procs.csv ...] > docs/scale.svg

Inputs: the output of `go test ./core -run '^$' -bench Scale` (lines
"BenchmarkScale/<transport>/<ranks>/<topology>-N ... value unit ...") and the
CSV of `go run ./bench/scale -csv FILE`. Four panels, each a log-scale value
per topology against the world size: connections per rank, heartbeats per
second (all ranks), bootstrap time, and allreduce of 1 MiB (median).
"""
import csv
import math
import re
import sys

PANELS = [
    ("conns", "connections per rank"),
    ("hb", "heartbeats per second, all ranks"),
    ("boot", "bootstrap, ms"),
    ("ar1m", "allreduce 1 MiB, ms (median)"),
]
BENCH_KEYS = {"conns/rank": "conns", "heartbeats/s": "hb", "boot-ms": "boot", "ar1MiB-med-ms": "ar1m"}
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
MARKS = {"mem": "circle", "quic": "square", "processes": "triangle"}


def read(paths):
    """Points: {(transport, topology): {panel: [(ranks, value)]}}."""
    pts = {}
    for path in paths:
        with open(path) as f:
            if path.endswith(".csv"):
                for row in csv.DictReader(f):
                    if row.get("boot_ms") in (None, "", "failed"):
                        continue
                    key = (row["transport"], row["topology"])
                    n = int(row["ranks"])
                    for panel, col in (("conns", "conns_per_rank"), ("hb", "heartbeats_per_s"),
                                       ("boot", "boot_ms"), ("ar1m", "ar1m_med_ms")):
                        pts.setdefault(key, {}).setdefault(panel, []).append((n, float(row[col])))
                continue
            for line in f:
                m = re.match(r"BenchmarkScale/(\w+)/(\d+)/(\S+?)-\d+\s+\d+\s+\d+ ns/op\s+(.*)", line)
                if not m:
                    continue
                tr, n, topo, rest = m.group(1), int(m.group(2)), m.group(3), m.group(4)
                vals = re.findall(r"([\d.]+) (\S+)", rest)
                for v, unit in vals:
                    panel = BENCH_KEYS.get(unit)
                    if panel:
                        pts.setdefault((tr, topo), {}).setdefault(panel, []).append((n, float(v)))
    return pts


def svg(pts):
    w, h = 1000, 640
    pw, ph = 420, 230
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (w, h),
           '<rect width="100%" height="100%" fill="white"/>']
    topos = sorted({t for _, t in pts})
    color = {t: COLORS[i % len(COLORS)] for i, t in enumerate(topos)}
    ranks = sorted({n for series in pts.values() for p in series.values() for n, _ in p})
    for i, (panel, title) in enumerate(PANELS):
        ox, oy = 60 + (i % 2) * (pw + 80), 40 + (i // 2) * (ph + 70)
        vals = [v for s in pts.values() for n, v in s.get(panel, []) if v > 0]
        if not vals or not ranks:
            continue
        lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
        hi = max(hi, lo + 1)
        out.append('<text x="%d" y="%d" font-size="13" font-weight="bold">%s (log scale)</text>' % (ox - 40, oy - 12, title))
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>' % (ox, oy, pw, ph))
        for d in range(lo, hi + 1):
            y = oy + ph - (d - lo) / (hi - lo) * ph
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (ox, y, ox + pw, y))
            out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (ox - 4, y + 4, fmt(10 ** d)))
        xs = {n: ox + (k + 0.5) / len(ranks) * pw for k, n in enumerate(ranks)}
        for n, x in xs.items():
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%d ranks</text>' % (x, oy + ph + 14, n))
        for (tr, topo), series in sorted(pts.items()):
            p = sorted(series.get(panel, []))
            p = [(n, v) for n, v in p if v > 0]
            if not p:
                continue
            coords = [(xs[n], oy + ph - (math.log10(v) - lo) / (hi - lo) * ph) for n, v in p]
            dash = {"mem": "", "quic": ' stroke-dasharray="5,3"', "processes": ' stroke-dasharray="1,3"'}.get(tr, "")
            out.append('<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="%s"/>' % (
                color[topo], dash, " ".join("%.1f,%.1f" % c for c in coords)))
            for x, y in coords:
                out.append(marker(MARKS.get(tr, "circle"), x, y, color[topo]))
    ly = h - 40
    x = 60
    for t in topos:
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>' % (x, ly, color[t], x + 16, ly + 10, t))
        x += 120
    x = 60
    for tr, shape in MARKS.items():
        out.append(marker(shape, x + 6, ly + 26, "black"))
        out.append('<text x="%d" y="%d">%s</text>' % (x + 16, ly + 30, {"mem": "in memory, one process (solid)",
                                                                          "quic": "QUIC on loopback, one process (dashed)",
                                                                          "processes": "rank processes on one host (dotted)"}[tr]))
        x += 300
    out.append("</svg>")
    return "\n".join(out)


def marker(shape, x, y, c):
    if shape == "square":
        return '<rect x="%.1f" y="%.1f" width="7" height="7" fill="%s"/>' % (x - 3.5, y - 3.5, c)
    if shape == "triangle":
        return '<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="%s"/>' % (x, y - 4.5, x - 4, y + 3.5, x + 4, y + 3.5, c)
    return '<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>' % (x, y, c)


def fmt(v):
    return "%g" % v if v < 1e5 else "1e%d" % round(math.log10(v))


if __name__ == "__main__":
    sys.stdout.write(svg(read(sys.argv[1:])) + "\n")
