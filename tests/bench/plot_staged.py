#!/usr/bin/env python3
"""Plots tests/bench/staged_twohost.sh CSVs side by side: bandwidth against size per op and
endpoint, one line per NAME=CSV, and raw libfabric (fabric_gbps of the first CSV) dashed.

    python3 tests/bench/plot_staged.py OUT.png NAME=staged_twohost.csv [NAME=...]
"""
import csv
import sys


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    out = sys.argv[1]
    runs = []
    for a in sys.argv[2:]:
        name, _, path = a.rpartition("=")
        with open(path) as f:
            runs.append((name, list(csv.DictReader(f))))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_staged.py: no matplotlib: no PNG")
        return 0
    panels = sorted({(r["op"], r["endpoint"]) for _, rows in runs for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4.2), squeeze=False)
    for ax, (op, ep) in zip(axes[0], panels):
        for i, (name, rows) in enumerate(runs):
            rs = sorted((r for r in rows if r["op"] == op and r["endpoint"] == ep),
                        key=lambda r: int(r["size_bytes"]))
            xs = [int(r["size_bytes"]) for r in rs]
            ax.plot(xs, [float(r["library_gbps"]) for r in rs], marker="o", label=name)
            if i == 0:
                ax.plot(xs, [float(r["fabric_gbps"] or 0) for r in rs], linestyle="--", color="gray",
                        label="fi_rma_bw (same window)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{op}, {ep} endpoint")
        ax.set_xlabel("bytes")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("GB/s (k = 64 in flight, then quiet)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("staged path, two hosts (namespaces), tcp, host memory")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"plot_staged.py: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
