#!/usr/bin/env python3
"""Merge gda_bench CSVs, print a comparison table and draw message rate and bandwidth.

Usage: plot.py OUT_PREFIX CSV [CSV ...]

Inputs: gda_bench CSVs (columns path,size_bytes,msgs,usec,msg_rate_mps,gbytes_per_s), e.g. the
library run (paths gda, proxy), the P2P run (path p2p) and the host copy route's run (gda-host).
Outputs: OUT_PREFIX.csv (all rows, same columns, sorted by path then size), OUT_PREFIX.txt (the
table printed on stdout) and OUT_PREFIX.png (two panels, log-log: message rate and bandwidth vs
message size, one line per path). Without matplotlib the PNG is skipped with a message; the
exit status stays 0.
Exit status: 0 on success, 1 when an input is missing, malformed or empty.
"""
import csv
import sys

COLUMNS = ["path", "size_bytes", "msgs", "usec", "msg_rate_mps", "gbytes_per_s"]
ORDER = {"gda": 0, "gda-host": 1, "proxy": 3, "p2p": 4}
LABELS = {
    "gda": "GDA software queue (device API; copy kernel route)",
    "gda-host": "GDA software queue, host copy route (NVSHMEM_EFA_SOFT_IPC=host)",
    "proxy": "NVSHMEM proxy via this library",
    "p2p": "NVSHMEM P2P (NVLink)",
}


def load(path):
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError("%s: missing column(s) %s" % (path, ", ".join(missing)))
        for r in reader:
            rows.append({
                "path": r["path"],
                "size_bytes": int(r["size_bytes"]),
                "msgs": int(r["msgs"]),
                "usec": float(r["usec"]),
                "msg_rate_mps": float(r["msg_rate_mps"]),
                "gbytes_per_s": float(r["gbytes_per_s"]),
            })
    if not rows:
        raise ValueError("%s: no data rows" % path)
    return rows


def human(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


def table(rows):
    paths = sorted({r["path"] for r in rows}, key=lambda p: (ORDER.get(p, 9), p))
    sizes = sorted({r["size_bytes"] for r in rows})
    by = {(r["path"], r["size_bytes"]): r for r in rows}
    head = "%10s" % "size"
    for p in paths:
        head += " | %22s" % ("%s Mmsg/s   GB/s" % p)
    lines = [head, "-" * len(head)]
    for s in sizes:
        line = "%10s" % human(s)
        for p in paths:
            r = by.get((p, s))
            line += " | %22s" % ("" if r is None else "%9.4f %10.3f" % (r["msg_rate_mps"], r["gbytes_per_s"]))
        lines.append(line)
    return "\n".join(lines), paths, sizes, by


def plot(prefix, paths, by):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - any import problem means no PNG
        print("plot.py: matplotlib not available (%s); skipping %s.png" % (e, prefix))
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for p in paths:
        pts = sorted((s, r) for (q, s), r in by.items() if q == p)
        xs = [s for s, _ in pts]
        a1.plot(xs, [r["msg_rate_mps"] for _, r in pts], marker="o", label=LABELS.get(p, p))
        a2.plot(xs, [r["gbytes_per_s"] for _, r in pts], marker="o", label=LABELS.get(p, p))
    for a, title, unit in ((a1, "GPU-initiated put message rate", "Mmsg/s"),
                           (a2, "GPU-initiated put bandwidth", "GB/s")):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("message size (bytes)")
        a.set_ylabel(unit)
        a.set_title(title)
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=120)
    print("plot.py: wrote %s.png" % prefix)


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2])
        return 1
    prefix = argv[1]
    rows = []
    try:
        for path in argv[2:]:
            rows += load(path)
    except (OSError, ValueError) as e:
        print("plot.py: %s" % e)
        return 1
    rows.sort(key=lambda r: (ORDER.get(r["path"], 9), r["path"], r["size_bytes"]))
    with open(prefix + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r["path"], r["size_bytes"], r["msgs"], "%.3f" % r["usec"],
                        "%.6f" % r["msg_rate_mps"], "%.6f" % r["gbytes_per_s"]])
    text, paths, _sizes, by = table(rows)
    print(text)
    with open(prefix + ".txt", "w") as f:
        f.write(text + "\n")
    print("plot.py: wrote %s.csv and %s.txt" % (prefix, prefix))
    plot(prefix, paths, by)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
