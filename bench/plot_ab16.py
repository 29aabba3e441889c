#!/usr/bin/env python3
"""Scaling plot of a `bench/ab16.sh` run: ops/s against threads, the
median of the alternated runs of each build, one panel per workload, as
one SVG (no dependencies beyond Python 3).

    bench/plot_ab16.py OUT/a.md OUT/b.md "label A" "label B" plot.svg
"""
import statistics
import sys


def value(x):
    x = x.strip()
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}
    return float(x[:-1]) * scale[x[-1]] if x[-1] in scale else float(x)


def medians(path):
    """{workload: {threads: median ops/s}} of the default rows of a table."""
    runs = {}
    for line in open(path):
        c = [x.strip() for x in line.split("|")]
        if len(c) < 6 or not c[3].isdigit() or "*" not in c[2]:
            continue
        runs.setdefault(c[1], {}).setdefault(int(c[3]), []).append(value(c[4]))
    return {w: {t: statistics.median(v) for t, v in d.items()} for w, d in runs.items()}


def main():
    a_md, b_md, a_label, b_label, out = sys.argv[1:6]
    a, b = medians(a_md), medians(b_md)
    loads = [w for w in a if w in b and w != "control-pingpong"]
    pw, ph, pad = 300, 220, 50
    width, height = pw * len(loads) + pad, ph + 2 * pad
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    colours = [("#888888", a_label), ("#c0392b", b_label)]
    for i, w in enumerate(loads):
        x0, y0 = pad + i * pw, pad
        threads = sorted(set(a[w]) | set(b[w]))
        top = max(max(a[w].values()), max(b[w].values())) * 1.1
        sx = lambda t: x0 + (threads.index(t)) * (pw - 70) / max(1, len(threads) - 1)
        sy = lambda v: y0 + ph - v / top * ph
        svg.append(f'<text x="{x0}" y="{y0 - 12}" font-weight="bold">{w}</text>')
        svg.append(f'<line x1="{x0}" y1="{y0 + ph}" x2="{x0 + pw - 70}" y2="{y0 + ph}" stroke="black"/>')
        svg.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + ph}" stroke="black"/>')
        for t in threads:
            svg.append(f'<text x="{sx(t) - 4}" y="{y0 + ph + 14}">{t}</text>')
        for frac in (0.5, 1.0):
            v = top / 1.1 * frac
            svg.append(f'<text x="{x0 + 2}" y="{sy(v) - 2}" fill="#555">{v / 1e6:.2f}M</text>')
        for (colour, _), d in zip(colours, (a[w], b[w])):
            pts = " ".join(f"{sx(t):.1f},{sy(d[t]):.1f}" for t in threads if t in d)
            svg.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
    for j, (colour, label) in enumerate(colours):
        y = height - 14
        x = pad + j * 260
        svg.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 20}" y2="{y - 4}" stroke="{colour}" stroke-width="2"/>')
        svg.append(f'<text x="{x + 26}" y="{y}">{label}</text>')
    svg.append(f'<text x="{width - 230}" y="{height - 14}">ops/s against threads, 1-16 on a log scale (median)</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
