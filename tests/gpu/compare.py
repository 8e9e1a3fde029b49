#!/usr/bin/env python3
"""Merge two nvshmem_bench CSVs (library path and NVSHMEM's P2P path) into one comparison.

Usage: compare.py LIBRARY_CSV P2P_CSV OUT_CSV

Input columns: path,size_bytes,iters,usec_per_op,gbytes_per_s
Output columns: size_bytes,lib_usec_per_op,p2p_usec_per_op,lib_gbytes_per_s,p2p_gbytes_per_s,
                bw_ratio_lib_over_p2p,latency_ratio_lib_over_p2p
A size measured by only one side is kept with the other side left empty.
Exit status: 0 on success, 1 when an input is missing or malformed or has no rows.
Standard library only.
"""
import csv
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
    if len(argv) != 4:
        sys.stderr.write(__doc__)
        return 1
    try:
        lib_label, lib = load(argv[1])
        p2p_label, p2p = load(argv[2])
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write("compare.py: %s\n" % e)
        return 1

    out_rows = []
    for size in sorted(set(lib) | set(p2p)):
        lu, lg, _ = lib.get(size, (None, None, None))
        pu, pg, _ = p2p.get(size, (None, None, None))
        out_rows.append((size, lu, pu, lg, pg, ratio(lg, pg), ratio(lu, pu)))

    with open(argv[3], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["size_bytes", "lib_usec_per_op", "p2p_usec_per_op", "lib_gbytes_per_s",
                    "p2p_gbytes_per_s", "bw_ratio_lib_over_p2p", "latency_ratio_lib_over_p2p"])
        for size, lu, pu, lg, pg, br, lr in out_rows:
            w.writerow([size, fmt(lu, ".4f"), fmt(pu, ".4f"), fmt(lg, ".4f"), fmt(pg, ".4f"),
                        fmt(br, ".4f"), fmt(lr, ".4f")])

    print("device-initiated put (1 block, putmem_nbi_block + quiet): %s vs %s"
          % (lib_label, p2p_label))
    head = "%10s | %12s %12s | %10s %10s | %9s %9s" % (
        "size", "lib us/op", "p2p us/op", "lib GB/s", "p2p GB/s", "bw ratio", "lat ratio")
    print(head)
    print("-" * len(head))
    for size, lu, pu, lg, pg, br, lr in out_rows:
        print("%10s | %12s %12s | %10s %10s | %9s %9s" % (
            human(size), fmt(lu, ".3f"), fmt(pu, ".3f"), fmt(lg, ".3f"), fmt(pg, ".3f"),
            fmt(br, ".3f"), fmt(lr, ".2f")))
    print("bw ratio = library GB/s / P2P GB/s (1.0 = parity); lat ratio = library us / P2P us")
    print("written: %s" % argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
