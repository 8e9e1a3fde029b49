# SPDX-License-Identifier: BSD-3-Clause
"""Draws torch-a2a.csv's nvshmem_all_to_all medians as grouped bars (SVG, no plotting library).

    python3 plot_a2a.py torch-a2a.csv torch-a2a.svg
"""
import csv
import sys

PATHS = ["library, default", "library, NVSHMEM_EFA_AMO_KERNEL=1", "NVSHMEM P2P"]
COLORS = ["#999999", "#1f77b4", "#2ca02c"]


def main():
    src, out = sys.argv[1], sys.argv[2]
    rows = [r for r in csv.DictReader(open(src)) if r["op"] == "nvshmem_all_to_all"]
    sizes = sorted({int(r["bytes_per_peer"]) for r in rows})
    runs = sorted({r["run"] for r in rows})
    groups = [(s, run) for s in sizes for run in runs]
    val = {(int(r["bytes_per_peer"]), r["run"], r["path"]): float(r["median_us"]) for r in rows}
    top = max(val.values()) * 1.1
    W, H, L, B, bw = 760, 360, 60, 60, 16
    gw = (W - L - 20) / len(groups)
    y = lambda v: H - B - (H - B - 30) * v / top
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<text x="{L}" y="18" font-size="13">PyTorch nvshmem_all_to_all, 2 ranks on one H100 (MPS): median us, lower is better</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - 10}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="30" x2="{L}" y2="{H - B}" stroke="black"/>']
    for t in range(0, int(top) + 1, 50):
        svg.append(f'<text x="{L - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t}</text>')
        svg.append(f'<line x1="{L}" y1="{y(t):.1f}" x2="{W - 10}" y2="{y(t):.1f}" stroke="#eee"/>')
    for g, (s, run) in enumerate(groups):
        x0 = L + g * gw + (gw - bw * len(PATHS)) / 2
        for i, p in enumerate(PATHS):
            v = val.get((s, run, p))
            if v is None:
                continue
            svg.append(f'<rect x="{x0 + i * bw:.1f}" y="{y(v):.1f}" width="{bw - 2}" height="{H - B - y(v):.1f}" fill="{COLORS[i]}"/>')
            svg.append(f'<text x="{x0 + i * bw + bw / 2 - 1:.1f}" y="{y(v) - 3:.1f}" text-anchor="middle" font-size="9">{v:.0f}</text>')
        label = f"{s // 1024} KiB" if s < 1 << 20 else f"{s >> 20} MiB"
        svg.append(f'<text x="{L + g * gw + gw / 2:.1f}" y="{H - B + 16}" text-anchor="middle">{label}, run {run}</text>')
    for i, p in enumerate(PATHS):
        svg.append(f'<rect x="{L + i * 230}" y="{H - 22}" width="10" height="10" fill="{COLORS[i]}"/>')
        svg.append(f'<text x="{L + i * 230 + 14}" y="{H - 13}">{p}</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
