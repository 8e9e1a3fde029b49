#!/usr/bin/env python3
"""Side by side: the stream benchmark with the copy kernel (NVSHMEM_EFA_COPY_KERNEL default) and
with the copy engine alone (NVSHMEM_EFA_COPY_KERNEL=0), from stream_run.sh's stream-compare.csv
files named <call>-<layout>-<variant>[-<tag>].csv (variant kernel or engine) in one folder, as
tests/gpu/copy_kernel_run.sh's runs are kept in results/.

    python3 tests/gpu/copy_kernel_compare.py DIR [--csv OUT.csv] [--png OUT.png]

Prints one table (1 block: M ops/s up to 4 KiB, GB/s above; the ratio kernel / engine of the same
call), writes every row with its call and variant to --csv, and with matplotlib a PNG of puts and
gets per layout.
"""
import argparse
import os
import re
import sys

from stream_compare import library_rows, pyplot, write_rows

NAME = re.compile(r"^(c\d+)-(same|two)-(kernel|engine)(?:-([\w-]+))?\.csv$")


# The columns kept from each run's stream-compare.csv, in order (None: optional, as written).
COLS = [
    ("layout", str),
    ("op", str),
    ("blocks", int),
    ("size_bytes", int),
    ("library_gbps", float),
    ("library_mops", float),
    ("fabric_gbps", None),
    ("null_mops", None),
]


def load(folder):
    rows = []
    for f in sorted(os.listdir(folder)):
        m = NAME.match(f)
        if not m:
            continue
        call, layout, variant, tag = m.groups()
        rows += library_rows(os.path.join(folder, f), COLS, call=call, tag=tag or "", variant=variant)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--csv")
    ap.add_argument("--png")
    a = ap.parse_args()
    rows = load(a.dir)
    if not rows:
        print(f"no <call>-<layout>-<variant>.csv files in {a.dir}", file=sys.stderr)
        return 1
    by = {}
    for r in rows:
        by[(r["call"], r["tag"], r["layout"], r["variant"], r["op"], r["blocks"], r["size_bytes"])] = r
    print(f"{'call':5} {'layout':9} {'op':10} {'blk':>3} {'size':>9} {'engine':>10} {'kernel':>10} {'x':>6}")
    for key, r in sorted(by.items()):
        call, tag, layout, variant, op, blk, size = key
        if variant != "kernel":
            continue
        e = by.get((call, "", layout, "engine", op, blk, size)) or by.get(
            (call, tag, layout, "engine", op, blk, size)
        )
        if e is None:
            continue
        unit = "mops" if size <= 4096 else "gbps"
        k, v = r[f"library_{unit}"], e[f"library_{unit}"]
        u = "M/s" if unit == "mops" else "GB/s"
        x = k / v if v > 0 else float("nan")
        print(f"{call:5} {layout:9} {op:10} {blk:3d} {size:9d} {v:8.3f}{u[0]:>2} {k:8.3f}{u[0]:>2} {x:6.2f}")
    if a.csv:
        write_rows(a.csv, rows)
    if a.png:
        plt = pyplot()
        if plt is None:
            return 0
        layouts = sorted({r["layout"] for r in rows})
        fig, axes = plt.subplots(1, len(layouts), figsize=(6 * len(layouts), 4.5), squeeze=False)
        for ax, layout in zip(axes[0], layouts):
            for (op, variant), style in {
                ("put", "kernel"): "o-",
                ("put", "engine"): "o--",
                ("get", "kernel"): "s-",
                ("get", "engine"): "s--",
            }.items():
                pts = {}
                for r in rows:
                    if (r["layout"], r["op"], r["variant"], r["blocks"]) == (layout, op, variant, 1):
                        pts.setdefault(r["size_bytes"], []).append(r["library_mops"])
                if pts:
                    xs = sorted(pts)
                    ax.plot(xs, [max(pts[x]) for x in xs], style, label=f"{op}, copy {variant}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("bytes per operation (k in flight, then one quiet)")
            ax.set_ylabel("M operations / s (best run, 1 block)")
            ax.set_title(f"{layout}: copy kernel vs copy engine")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.text(0.01, 0.01, f"python3 tests/gpu/copy_kernel_compare.py {a.dir} --png ...", fontsize=7)
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
