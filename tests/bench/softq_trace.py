#!/usr/bin/env python3
"""Prints what software-queue event traces say (NVSHMEM_EFA_SOFT_TRACE=PREFIX writes
PREFIX.pe<PE>.t<THREAD>.csv; src/gda/softq/trace.rs names the events and their numbers).

    python3 tests/bench/softq_trace.py PREFIX.pe0.t0.csv PREFIX.pe1.t0.csv [--at FRACTION] [--span-us US]

(gzipped traces, .csv.gz, are read as they are)

For every file: events by kind, the slow consumer passes (>= 50 us) by the part that took longest,
and the SEND post-to-answer times. Then one timeline of all files merged on their shared clock,
SPAN-US long, starting at FRACTION (default 0.5) of the traced time; runs of one event of one file
are folded into one line ("send x144")."""
import argparse
import collections
import csv
import gzip
import os
import sys

PARTS = ["provider CQ", "copies and held AMOs", "hand-overs, receive batch, outbox", "taking WQEs"]


def load(path):
    rows = []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for r in csv.reader(line for line in f if not line.startswith("#")):
            if r and r[0] != "unix_ns":
                rows.append((int(r[0]), r[1], int(r[2]), int(r[3])))
    return rows


def pct(v, p):
    return v[min(len(v) - 1, int(len(v) * p))] if v else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--at", type=float, default=0.5)
    ap.add_argument("--span-us", type=float, default=3000.0)
    a = ap.parse_args()
    traces = {}
    for p in a.files:
        name = os.path.basename(p).removesuffix(".gz").rsplit(".csv", 1)[0].split(".", 1)[-1]
        traces[name] = load(p)
    for name, rows in traces.items():
        if not rows:
            print(f"{name}: no events")
            continue
        span = (rows[-1][0] - rows[0][0]) / 1e6
        kinds = collections.Counter(r[1] for r in rows)
        print(f"{name}: {len(rows)} events over {span:.1f} ms: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        slow = [r for r in rows if r[1] == "slow_pass"]
        if slow:
            by = collections.defaultdict(list)
            for r in slow:
                by[r[3]].append(r[2])
            tot = sum(r[2] for r in slow)
            print(f"  slow passes (>= 50 us): {len(slow)}, {tot / 1e3:.1f} ms in all ({100 * tot / 1e3 / span:.0f}% of the traced time)")
            for part, us in sorted(by.items()):
                us.sort()
                print(f"    longest part {PARTS[part] if part < len(PARTS) else part}: {len(us)} passes, "
                      f"median {pct(us, 0.5)} us, p90 {pct(us, 0.9)} us, max {us[-1]} us, {sum(us) / 1e3:.1f} ms")
        sd = sorted(r[3] for r in rows if r[1] == "send_done")
        if sd:
            print(f"  SEND post to answer: {len(sd)}, median {pct(sd, 0.5)} us, p90 {pct(sd, 0.9)} us, max {sd[-1]} us")
        ab = [r for r in rows if r[1] == "amo_batch"]
        if ab:
            n = sum(r[2] for r in ab)
            t = sum(r[3] for r in ab)
            print(f"  AMO batches: {len(ab)}, {n / len(ab):.1f} AMOs each, {t / len(ab):.1f} us each, {t / 1e3:.1f} ms in all")
    allrows = sorted((r[0], name, r[1], r[2], r[3]) for name, rows in traces.items() for r in rows)
    if not allrows:
        return 0
    t0 = allrows[0][0] + (allrows[-1][0] - allrows[0][0]) * a.at
    t1 = t0 + a.span_us * 1e3
    print(f"\ntimeline: {a.span_us:.0f} us from {a.at:.2f} of the traced time (us from the window's start)")
    last = None
    for ns, name, ev, x, y in allrows:
        if ns < t0 or ns > t1:
            continue
        key = (name, ev)
        if last and last[0] == key:
            last[1] += 1
            last[3] = (ns - t0) / 1e3
            last[4].append((x, y))
            continue
        if last:
            emit(last)
        last = [key, 1, (ns - t0) / 1e3, (ns - t0) / 1e3, [(x, y)]]
    if last:
        emit(last)
    return 0


def emit(run):
    (name, ev), n, start, end, vals = run
    if n == 1:
        x, y = vals[0]
        print(f"  {start:9.1f}  {name:8s} {ev:12s} a={x} b={y}")
    else:
        xs = [v[0] for v in vals]
        ys = [v[1] for v in vals]
        print(f"  {start:9.1f}  {name:8s} {ev:12s} x{n} until {end:.1f}: a {min(xs)}..{max(xs)} (sum {sum(xs)}), b {min(ys)}..{max(ys)}")


if __name__ == "__main__":
    sys.exit(main())
