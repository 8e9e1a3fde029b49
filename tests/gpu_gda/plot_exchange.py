#!/usr/bin/env python3
"""Gathers gda_bench exchange runs (tests/gpu/ab_run.sh step exchange: OUT/exchange-TAG/, TAG
VARIANT[-BUILD][-rREP]) into one CSV, a table and a PNG.

    python3 tests/gpu_gda/plot_exchange.py OUT.csv OUT.png AB_RUN_OUT_DIR [AB_RUN_OUT_DIR ...]

CSV columns: run,variant,build,rep,pe,size_bytes,rounds,kernel_us,us_per_round,verified (the
kernel time of each PE's run and its time per round; verified=no when the log has a FAIL line).
The table prints, per variant and build, the median of the runs' microseconds per round (PE 0) with
min and max; the PNG (when matplotlib imports) draws those medians as bars, the min-max as error
bars.
"""
import csv
import glob
import os
import re
import statistics
import sys

ROW = re.compile(r"gda-exchange PE (\d+) +(\d+) B +(\d+) rounds: .*kernel +([0-9.]+) us")


def runs(root):
    for d in sorted(glob.glob(os.path.join(root, "exchange-*"))):
        log = os.path.join(d, "bench-exchange.log")
        if not os.path.isfile(log):
            continue
        tag = os.path.basename(d)[len("exchange-"):]
        rep = 1
        m = re.search(r"-r(\d+)$", tag)
        if m:
            rep = int(m.group(1))
            tag = tag[: m.start()]
        variant, _, build = tag.partition("-")
        with open(log, errors="replace") as f:
            text = f.read()
        ok = "FAIL" not in text
        for m in ROW.finditer(text):
            pe, size, rounds, kus = int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4))
            yield {
                "run": os.path.basename(root.rstrip("/")),
                "variant": variant,
                "build": build or "now",
                "rep": rep,
                "pe": pe,
                "size_bytes": size,
                "rounds": rounds,
                "kernel_us": kus,
                "us_per_round": round(kus / rounds, 1),
                "verified": "yes" if ok else "no",
            }


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    out_csv, out_png, roots = sys.argv[1], sys.argv[2], sys.argv[3:]
    rows = [r for root in roots for r in runs(root)]
    if not rows:
        print("no exchange runs found")
        return 1
    with open(out_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    groups = {}
    for r in rows:
        if r["pe"] == 0:
            groups.setdefault((r["variant"], r["build"]), []).append(r["us_per_round"])
    print(f"{'variant':10s} {'build':8s} {'runs':>4s} {'median us/round':>16s} {'min':>8s} {'max':>8s}")
    for (v, b), us in sorted(groups.items()):
        print(f"{v:10s} {b:8s} {len(us):4d} {statistics.median(us):16.1f} {min(us):8.1f} {max(us):8.1f}")
    bad = [r for r in rows if r["verified"] != "yes"]
    if bad:
        print(f"{len(bad)} rows from runs whose log has a FAIL line")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{out_csv} written; no PNG (matplotlib missing)")
        return 0
    variants = sorted({v for v, _ in groups})
    builds = sorted({b for _, b in groups})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(builds)
    for i, b in enumerate(builds):
        xs, ys, lo, hi = [], [], [], []
        for j, v in enumerate(variants):
            us = groups.get((v, b))
            if not us:
                continue
            med = statistics.median(us)
            xs.append(j + i * width)
            ys.append(med)
            lo.append(med - min(us))
            hi.append(max(us) - med)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=b)
    ax.set_xticks([j + width * (len(builds) - 1) / 2 for j in range(len(variants))])
    ax.set_xticklabels(variants)
    ax.set_ylabel("us per round (median of runs, PE 0)")
    ax.set_title("gda_bench --exchange: DeepEP's round, both PEs on one H200 (MPS)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    print(f"{out_csv} and {out_png} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
