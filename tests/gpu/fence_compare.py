#!/usr/bin/env python3
"""Side by side: the stream benchmark's runs of tests/gpu/fence_run.sh, one folder per run named
<step>-<variant>-<rep> (variant order, quiet or before) holding stream_run.sh's
stream-compare.csv.

    python3 tests/gpu/fence_compare.py DIR [--csv OUT.csv] [--png OUT.png]

Prints one table (best of the reps per variant: M ops/s up to 4 KiB, GB/s above; order / before
and order / quiet), writes every row with its variant and rep to --csv, and with matplotlib a PNG
of put_signal, amo and signal per layout.
"""
import argparse
import os
import re
import sys

from stream_compare import library_rows, pyplot, write_rows

NAME = re.compile(r"^(same|two)-([A-Za-z0-9]+)-(\d+)$")
# Shown in this order, then any other variant (fence_run.sh's VARIANT_ENV) by name.
VARIANTS = ("before", "quiet", "order")


# The columns kept from each run's stream-compare.csv, in order (None: optional, as written).
COLS = [
    ("layout", str),
    ("provider", str),
    ("op", str),
    ("blocks", int),
    ("size_bytes", int),
    ("window", str),
    ("library_gbps", float),
    ("library_mops", float),
    ("library_usec_per_op", None),
    ("verified", None),
]


def load(folder):
    rows = []
    for d in sorted(os.listdir(folder)):
        m = NAME.match(d)
        f = os.path.join(folder, d, "stream-compare.csv")
        if not m or not os.path.isfile(f):
            continue
        _, variant, rep = m.groups()
        rows += library_rows(f, COLS, variant=variant, rep=int(rep))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--csv")
    ap.add_argument("--png")
    a = ap.parse_args()
    rows = load(a.dir)
    if not rows:
        print(f"no <step>-<variant>-<rep>/stream-compare.csv in {a.dir}", file=sys.stderr)
        return 1
    found = {r["variant"] for r in rows}
    variants = [v for v in VARIANTS if v in found] + sorted(found - set(VARIANTS))
    best = {}
    for r in rows:
        key = (r["layout"], r["op"], r["blocks"], r["size_bytes"], r["variant"])
        if key not in best or r["library_mops"] > best[key]["library_mops"]:
            best[key] = r
    cells = sorted({k[:4] for k in best})
    hdr = f"{'layout':9} {'op':10} {'blk':>3} {'size':>9} " + " ".join(f"{v:>11}" for v in variants)
    print(hdr + f" {'ord/bef':>8} {'ord/qui':>8}")
    for layout, op, blk, size in cells:
        unit = "mops" if size <= 4096 else "gbps"
        u = "M" if unit == "mops" else "G"
        vals = {}
        for v in variants:
            r = best.get((layout, op, blk, size, v))
            vals[v] = r[f"library_{unit}"] if r else None
        line = f"{layout:9} {op:10} {blk:3d} {size:9d} "
        line += " ".join(f"{vals[v]:10.4f}{u}" if vals[v] is not None else f"{'-':>11}" for v in variants)
        for ref in ("before", "quiet"):
            o, b = vals.get("order"), vals.get(ref)
            line += f" {o / b:8.2f}" if o is not None and b else f" {'-':>8}"
        print(line)
    bad = [r for r in rows if r["verified"] not in ("ok", "")]
    for r in bad:
        print(f"NOT VERIFIED: {r}")
    if a.csv:
        write_rows(a.csv, rows)
    if a.png:
        plt = pyplot()
        if plt is None:
            return 0
        layouts = sorted({r["layout"] for r in rows})
        fig, axes = plt.subplots(1, len(layouts), figsize=(6 * len(layouts), 4.5), squeeze=False)
        for ax, layout in zip(axes[0], layouts):
            labels, xs, width = [], [], 0.25
            cats = [
                (op, blk)
                for op in ("put_signal", "amo", "signal")
                for blk in (1, 8)
                if any(k[0] == layout and k[1] == op and k[2] == blk and k[3] == 8 for k in best)
            ]
            for i, v in enumerate(variants):
                ys = []
                for op, blk in cats:
                    r = best.get((layout, op, blk, 8, v))
                    ys.append(r["library_mops"] if r else 0)
                ax.bar([c + (i - 1) * width for c in range(len(cats))], ys, width, label=v)
            labels = [f"{op}\n{blk} blk" for op, blk in cats]
            ax.set_xticks(range(len(cats)))
            ax.set_xticklabels(labels, fontsize=8)
            ax.set_yscale("log")
            ax.set_ylabel("M operations / s at 8 B (best run; 200 in flight, one quiet)")
            ax.set_title(f"{layout}: fence that orders vs fence = quiet")
            ax.grid(True, which="both", axis="y", alpha=0.3)
            ax.legend(fontsize=8)
        fig.text(0.01, 0.01, f"python3 tests/gpu/fence_compare.py {a.dir} --png ...", fontsize=7)
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
