#!/usr/bin/env python3
"""DeepEP low-latency table as a bar chart: dispatch + combine time per config and path/label.

    python3 tests/deepep/plot_ll.py [--kernels] [--title TEXT] DEEPEP_LL_CSV OUT_PNG

Reads the CSV tests/deepep/ll_matrix.sh writes (columns config, path, dispatch_combine_us; an
optional label column names the run a row comes from), one bar per (label, path) and config,
log-scale time axis. --kernels draws dispatch_us + combine_us instead (DeepEP's kineto times of the
two kernels): the figure to use when the test's own wall-clock bench is not comparable, as with
DEEPEP_SYNC_CALLS=1, whose host synchronization falls inside each timed pair. --title replaces the
default title. Needs matplotlib.
"""
import csv
import sys


def main() -> int:
    args = sys.argv[1:]
    kernels = False
    title = "DeepEP low-latency test, 2 x H200, one rank per GPU"
    while args and args[0].startswith("--"):
        if args[0] == "--kernels":
            kernels = True
            args = args[1:]
        elif args[0] == "--title" and len(args) > 1:
            title = args[1]
            args = args[2:]
        else:
            print(f"plot_ll.py: unknown option {args[0]}\n{__doc__}", file=sys.stderr)
            return 2
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, png = args
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_ll.py: matplotlib is not installed", file=sys.stderr)
        return 2
    need = ("dispatch_us", "combine_us") if kernels else ("dispatch_combine_us",)
    rows = [r for r in csv.DictReader(open(src)) if all(r.get(k) for k in need)]
    if not rows:
        print(f"plot_ll.py: no row with {' and '.join(need)}", file=sys.stderr)
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
                    ys.append(sum(float(r[k]) for k in need))
        ax.bar(xs, ys, width, label=f"{path} {label}".strip())
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(configs))])
    ax.set_xticklabels(configs)
    ax.set_yscale("log")
    ax.set_ylabel(
        "dispatch + combine kernels, us (DeepEP's kineto)"
        if kernels
        else "dispatch + combine, us (DeepEP's avg_t)"
    )
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
