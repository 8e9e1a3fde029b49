#!/usr/bin/env python3
"""Merge two nvshmem_bench CSVs (library path and NVSHMEM's P2P path) into one comparison.

Usage: compare.py LIBRARY_CSV P2P_CSV OUT_CSV [FABTESTS_BW_CSV [FABTESTS_LAT_CSV]]

Input columns: path,size_bytes,iters,usec_per_op,gbytes_per_s
Output columns: size_bytes,lib_usec_per_op,p2p_usec_per_op,lib_gbytes_per_s,p2p_gbytes_per_s,
                bw_ratio_lib_over_p2p,latency_ratio_lib_over_p2p,fabtests_gbytes_per_s,
                fabtests_lat_usec
The optional fabtests CSVs (tests/gpu/fabtests_cuda.sh: raw libfabric fi_rma_bw, window 64 and window 1
on GPU memory) add the last two columns. A size measured by only one side is kept with the other
side left empty. The heading names the benchmark as $NVSHMEM_BENCH_WHAT says (default: the put
benchmark's default mode; tests/gpu/run.sh sets it from --bench-args). With matplotlib importable, OUT_CSV's name with .png is drawn too (bandwidth and
latency against size); without it a line says so.
Exit status: 0 on success, 1 when an input is missing or malformed or has no rows.
"""
import csv
import os
import sys

COLUMNS = ["path", "size_bytes", "iters", "usec_per_op", "gbytes_per_s"]


def load(path):
    rows = {}
    label = None
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError("%s: missing column(s) %s" % (path, ", ".join(missing)))
        for r in reader:
            size = int(r["size_bytes"])
            rows[size] = (float(r["usec_per_op"]), float(r["gbytes_per_s"]), int(r["iters"]))
            label = label or r["path"]
    if not rows:
        raise ValueError("%s: no data rows" % path)
    return label, rows


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v, spec):
    return "" if v is None else format(v, spec)


def human(size):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div and size % div == 0:
            return "%d %s" % (size // div, unit)
    return "%d B" % size


def main(argv):
    if len(argv) not in (4, 5, 6):
        sys.stderr.write(__doc__)
        return 1
    try:
        lib_label, lib = load(argv[1])
        p2p_label, p2p = load(argv[2])
        fab_label, fab = load(argv[4]) if len(argv) > 4 else (None, {})
        fabl_label, fabl = load(argv[5]) if len(argv) > 5 else (None, {})
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write("compare.py: %s\n" % e)
        return 1

    out_rows = []
    for size in sorted(set(lib) | set(p2p)):
        lu, lg, _ = lib.get(size, (None, None, None))
        pu, pg, _ = p2p.get(size, (None, None, None))
        out_rows.append((size, lu, pu, lg, pg, ratio(lg, pg), ratio(lu, pu),
                         fab.get(size, (None, None, None))[1], fabl.get(size, (None, None, None))[0]))

    with open(argv[3], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["size_bytes", "lib_usec_per_op", "p2p_usec_per_op", "lib_gbytes_per_s",
                    "p2p_gbytes_per_s", "bw_ratio_lib_over_p2p", "latency_ratio_lib_over_p2p",
                    "fabtests_gbytes_per_s", "fabtests_lat_usec"])
        for size, lu, pu, lg, pg, br, lr, fg, fl in out_rows:
            w.writerow([size, fmt(lu, ".4f"), fmt(pu, ".4f"), fmt(lg, ".4f"), fmt(pg, ".4f"),
                        fmt(br, ".4f"), fmt(lr, ".4f"), fmt(fg, ".4f"), fmt(fl, ".4f")])

    what = os.environ.get("NVSHMEM_BENCH_WHAT", "put (1 block, putmem_nbi_block + quiet)")
    print("device-initiated %s: %s vs %s" % (what, lib_label, p2p_label))
    if fab_label:
        print("reference: %s (raw libfabric fi_rma_bw, window 64)%s" % (
            fab_label, "; time per op: %s (window 1)" % fabl_label if fabl_label else ""))
    head = "%10s | %12s %12s | %10s %10s | %9s %9s | %10s %10s" % (
        "size", "lib us/op", "p2p us/op", "lib GB/s", "p2p GB/s", "bw ratio", "lat ratio",
        "fab GB/s", "fab W1 us")
    print(head)
    print("-" * len(head))
    for size, lu, pu, lg, pg, br, lr, fg, fl in out_rows:
        print("%10s | %12s %12s | %10s %10s | %9s %9s | %10s %10s" % (
            human(size), fmt(lu, ".3f"), fmt(pu, ".3f"), fmt(lg, ".3f"), fmt(pg, ".3f"),
            fmt(br, ".3f"), fmt(lr, ".2f"), fmt(fg, ".3f"), fmt(fl, ".2f")))
    print("bw ratio = library GB/s / P2P GB/s (1.0 = parity); lat ratio = library us / P2P us")
    print("written: %s" % argv[3])
    plot(argv[3], out_rows, lib_label, p2p_label, fab_label)
    return 0


def plot(out_csv, rows, lib_label, p2p_label, fab_label):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not importable here")
        return
    png = out_csv.rsplit(".", 1)[0] + ".png"
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = [(lib_label, 3, 1), (p2p_label, 4, 2)]
    if fab_label:
        series.append((fab_label, 7, 8))
    for label, bw_i, lat_i in series:
        pts = [(r[0], r[bw_i]) for r in rows if r[bw_i] is not None]
        if pts:
            a.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        pts = [(r[0], r[lat_i]) for r in rows if r[lat_i] is not None and r[0] <= 65536]
        if pts:
            b.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    for ax, title, unit in ((a, "bandwidth", "GB/s"), (b, "time per op (<= 64 KiB)", "us")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print("plot: %s" % png)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
