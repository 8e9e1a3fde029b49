# SPDX-License-Identifier: BSD-3-Clause
"""Joins the CSVs of symm_mem_a2a.py's library and P2P runs into one table (printed) and one CSV.

    python table.py OUT.csv LIBRARY.csv [P2P.csv]
"""
import csv
import sys


def load(path):
    try:
        with open(path) as f:
            return {(r["op"], int(r["bytes_per_peer"])): r for r in csv.DictReader(f)}
    except OSError:
        return {}


def human(n):
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n // 1024} KiB" if n >= 1024 else f"{n} B"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, lib = sys.argv[1], load(sys.argv[2])
    ref = load(sys.argv[3]) if len(sys.argv) > 3 else {}
    keys = sorted(set(lib) | set(ref), key=lambda k: (k[0], k[1]))
    if not keys:
        print("table.py: no timing rows (did the runs fail?)")
        return 1
    head = ("op", "per peer", "library median us", "library GB/s", "P2P median us", "P2P GB/s",
            "library / P2P time")
    rows = []
    for k in keys:
        a, b = lib.get(k), ref.get(k)
        ratio = (f"{float(a['median_us']) / float(b['median_us']):.1f}x" if a and b else "-")
        rows.append((k[0], human(k[1]),
                     a["median_us"] if a else "-", a["GB_per_s_per_rank"] if a else "-",
                     b["median_us"] if b else "-", b["GB_per_s_per_rank"] if b else "-", ratio))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = " | ".join(h.ljust(w) for h, w in zip(head, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print(" | ".join(str(x).ljust(w) for x, w in zip(r, widths)))
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "bytes_per_peer", "library_median_us", "library_GB_per_s",
                    "p2p_median_us", "p2p_GB_per_s"])
        for k in keys:
            a, b = lib.get(k), ref.get(k)
            w.writerow([k[0], k[1], a["median_us"] if a else "", a["GB_per_s_per_rank"] if a else "",
                        b["median_us"] if b else "", b["GB_per_s_per_rank"] if b else ""])
    print(f"(median of 20 per size, slowest rank; GB/s = bytes per peer x ranks / time; {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
