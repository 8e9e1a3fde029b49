#!/usr/bin/env python3
"""Gathers gda_bench count runs (GDA_BENCH_SETS=count, rows gda-countN) into one CSV and a PNG.

    python3 tests/gpu_gda/plot_count.py OUT.csv OUT.png LABEL=DIR [LABEL=DIR ...]

DIR is a tests/gpu_gda/run.sh output directory holding bench-count.csv and bench-count.log (the
log says whether the counts checked out: a "VERIFY FAIL" line for a size marks that size's row
verified=no). CSV columns: label,path,size_bytes,msgs,usec,puts_mps,counts_mps,count_every,verified.
The PNG (when matplotlib imports) plots puts per second against the size, one line per label.
"""
import csv
import re
import sys


def rows_of(label, d):
    try:
        with open(f"{d}/bench-count.log", errors="replace") as f:
            log = f.read()
    except OSError:
        log = ""
    failed = {int(m) for m in re.findall(r"VERIFY FAIL: \S+ (\d+) B:", log)}
    out = []
    with open(f"{d}/bench-count.csv") as f:
        for r in csv.DictReader(f):
            m = re.search(r"-count(\d+)$", r["path"])
            every = int(m.group(1)) if m else 0
            size = int(r["size_bytes"])
            msgs, usec = int(r["msgs"]), float(r["usec"])
            out.append({
                "label": label,
                "path": r["path"],
                "size_bytes": size,
                "msgs": msgs,
                "usec": usec,
                "puts_mps": msgs / usec,
                "counts_mps": (msgs // every) / usec if every else 0.0,
                "count_every": every,
                "verified": "no" if size in failed else "yes",
            })
    return out


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    out_csv, out_png = sys.argv[1], sys.argv[2]
    rows = []
    for a in sys.argv[3:]:
        label, _, d = a.partition("=")
        if not d:
            print(f"plot_count.py: '{a}' is not LABEL=DIR")
            return 2
        rows += rows_of(label, d)
    cols = ["label", "path", "size_bytes", "msgs", "usec", "puts_mps", "counts_mps", "count_every",
            "verified"]
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.6f}" if isinstance(r[k], float) else r[k]) for k in cols})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    print(f"{'label':<34} {'8 B':>9} {'256 B':>9} {'64 KiB':>9}  (M puts/s; * = counts did not check out)")
    for lb in labels:
        by = {r["size_bytes"]: r for r in rows if r["label"] == lb}
        cells = []
        for s in (8, 256, 65536):
            r = by.get(s)
            cells.append("-" if r is None else f"{r['puts_mps']:.3f}{'*' if r['verified'] == 'no' else ''}")
        print(f"{lb:<34} {cells[0]:>9} {cells[1]:>9} {cells[2]:>9}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_count.py: no matplotlib: no PNG")
        return 0
    fig, ax = plt.subplots(figsize=(13, 6))
    colors = plt.get_cmap("tab20").colors
    for i, lb in enumerate(labels):
        rs = sorted((r for r in rows if r["label"] == lb), key=lambda r: r["size_bytes"])
        bad = any(r["verified"] == "no" for r in rs)
        ax.plot([r["size_bytes"] for r in rs], [r["puts_mps"] for r in rs], marker="o",
                color=colors[(2 * i) % 20 + (i // 10) % 2], linestyle="--" if bad else "-",
                label=lb + (" (counts wrong)" if bad else ""))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("put size (bytes); each put followed by / sharing a count at the target")
    ax.set_ylabel("puts per second (M), counts checked at the target")
    ax.set_title("GDA put-then-count stream (gda_bench --count-every), software queue")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    print(f"plot_count.py: {out_csv} {out_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
