#!/usr/bin/env python3
"""DeepEP low-latency table as a bar chart: dispatch + combine time per config and path/label.

    python3 tests/deepep/plot_ll.py DEEPEP_LL_CSV OUT_PNG

Reads the CSV tests/deepep/ll_matrix.sh writes (columns config, path, dispatch_combine_us; an
optional label column names the run a row comes from), one bar per (label, path) and config,
log-scale time axis. Needs matplotlib.
"""
import csv
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_ll.py: matplotlib is not installed", file=sys.stderr)
        return 2
    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("dispatch_combine_us")]
    if not rows:
        print("plot_ll.py: no row with dispatch_combine_us", file=sys.stderr)
        return 1
    configs = list(dict.fromkeys(r["config"] for r in rows))
    series = list(dict.fromkeys((r.get("label", ""), r["path"]) for r in rows))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(10, 5))
    for i, (label, path) in enumerate(series):
        xs, ys = [], []
        for j, c in enumerate(configs):
            for r in rows:
                if r["config"] == c and r["path"] == path and r.get("label", "") == label:
                    xs.append(j + i * width)
                    ys.append(float(r["dispatch_combine_us"]))
        ax.bar(xs, ys, width, label=f"{path} {label}".strip())
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(configs))])
    ax.set_xticklabels(configs)
    ax.set_yscale("log")
    ax.set_ylabel("dispatch + combine, us (DeepEP's avg_t)")
    ax.set_title("DeepEP low-latency test, 2 x H200, one rank per GPU")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
