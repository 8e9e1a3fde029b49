#!/usr/bin/env python3
"""Draws the GDA sweep (tests/gpu_gda/run.sh with GDA_BENCH_SETS=sweep): post rate (null consumer)
and delivered message rate against posting warps, one line per queue count (and consumer thread
count, where the sweep has more than one).

Usage: plot_sweep.py BENCH_SWEEP_CSV OUT_PNG

Input columns: blocks,warps,posters,queues,kind,path,size_bytes,msgs,usec,msg_rate_mps,wqe_rate_mwps
and optionally threads (NVSHMEM_EFA_SOFT_THREADS; absent: 1) (kind: null or data). Prints the table it draws. Without matplotlib the PNG is skipped with a
message (exit 0). Exit status 1 when the CSV is missing, malformed or empty.
"""
import csv
import sys

NEED = ["posters", "queues", "kind", "msg_rate_mps", "wqe_rate_mwps"]


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 1
    try:
        with open(argv[1], newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        print(f"plot_sweep.py: {e}", file=sys.stderr)
        return 1
    if not rows or any(c not in rows[0] for c in NEED):
        print(f"plot_sweep.py: {argv[1]}: no rows or missing columns (need {', '.join(NEED)})",
              file=sys.stderr)
        return 1
    series = {}
    for r in rows:
        rate = float(r["wqe_rate_mwps"] if r["kind"] == "null" else r["msg_rate_mps"])
        threads = int(r.get("threads") or 1)
        series.setdefault((r["kind"], int(r["queues"]), threads), []).append((int(r["posters"]), rate))
    many = len({t for _, _, t in series}) > 1
    print(f"{'kind':6} {'queues':>6} {'threads':>7} {'posting warps':>13} {'M/s':>9}")
    for (kind, q, t), pts in sorted(series.items()):
        for p, v in sorted(pts):
            print(f"{kind:6} {q:>6} {t:>7} {p:>13} {v:>9.3f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_sweep.py: matplotlib not importable: no PNG")
        return 0
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, kind, title in ((axes[0], "null", "post rate, null consumer (M WQEs/s)"),
                            (axes[1], "data", "delivered 8 B puts (M msgs/s)")):
        for (k, q, t), pts in sorted(series.items()):
            if k != kind:
                continue
            pts.sort()
            label = f"{q} queue(s) per PE" + (f", {t} thread(s)" if many else "")
            ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("posting warps")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("GDA software queue: a queue per (dst_pe, qp_id), 2 x H200, shm")
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    print(f"plot_sweep.py: {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
