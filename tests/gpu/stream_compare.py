#!/usr/bin/env python3
"""Joins the stream benchmark's CSVs of one run (tests/gpu/stream_run.sh) into the comparison.

    python3 stream_compare.py DIR [--png FILE]

Reads, in DIR:
  stream-*.csv   stream_bench rows; the label is LAYOUT/KIND/PROVIDER (kind: library, p2p, null)
  fabric.csv     fi_rma_bw rows: layout,provider,op,size_bytes,window,memory,usec_per_xfer,mbps
  torch-*.csv    symm_mem_a2a.py rows, file torch-LAYOUT-MODE.csv (mode: library, p2p)
Writes DIR/stream-compare.csv, DIR/stream-compare.txt (the table) and, when there are torch rows,
DIR/torch-compare.csv; with --png FILE also a plot (needs matplotlib; run it wherever matplotlib
is, on the CSV). Standard library only otherwise.

stream-compare.csv: one row per (layout, provider, op, blocks, size): layout,provider,op,blocks,
size_bytes,window,library_gbps,library_mops,library_usec_per_op,fabric_gbps,fabric_mops,
fabric_memory,p2p_gbps,p2p_mops,null_gbps,null_mops,library_over_fabric,verified. GB/s = 10^9 B/s;
fabric = fi_rma_bw (write for put and put_signal, read for get) with the same window, size and
provider; fabric_dc_gbps: fi_rma_bw -o write -U (delivery complete: the window ends when the
target has the data, as a quiet does; plain writes end when handed to the provider), with
library_over_fabric_dc; p2p and null are the same op, blocks and size on NVSHMEM's P2P path and with the
library's null completion (NVSHMEM_EFA_BENCH_NULL=1: NVSHMEM's proxy ceiling).
"""
import csv
import glob
import os
import sys

COLS = ["layout", "provider", "op", "blocks", "size_bytes", "window", "library_gbps",
        "library_mops", "library_usec_per_op", "fabric_gbps", "fabric_mops", "fabric_memory",
        "p2p_gbps", "p2p_mops", "null_gbps", "null_mops", "library_over_fabric", "verified",
        "fabric_dc_gbps", "library_over_fabric_dc"]
FABRIC_OP = {"put": "write", "put_signal": "write", "get": "read"}
# fi_rma_bw -U (FI_DELIVERY_COMPLETE): a window of writes completes once the target has the data,
# as a quiet does; plain writes complete once handed to the provider (tcp: written to the socket).
FABRIC_DC_OP = {"put": "write_dc", "put_signal": "write_dc"}


def human(n):
    n = int(n)
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def library_rows(path, cols, **labels):
    """The rows of stream-compare.csv `path` that carry the library's figures, each a dict of
    `labels` first, then `cols` in order ((name, type): the column converted by `type`, which the
    file must have; type None: as written, "" when the file lacks it). The comparison scripts of the GPU runners
    (copy_kernel_compare.py, fence_compare.py) read their runs with it."""
    rows = []
    for r in read_csv(path):
        if not r.get("library_mops"):
            continue
        row = dict(labels)
        for name, typ in cols:
            row[name] = r.get(name, "") if typ is None else typ(r[name])
        rows.append(row)
    return rows


def load(d):
    stream = {}  # (layout, kind) -> {(op, blocks, size): row}; provider per (layout, kind)
    provider = {}
    for path in sorted(glob.glob(os.path.join(d, "stream-*.csv"))):
        if os.path.basename(path) == "stream-compare.csv":
            continue
        for r in read_csv(path):
            parts = r["label"].split("/")
            if len(parts) != 3:
                sys.exit(f"stream_compare.py: {path}: label {r['label']!r} is not LAYOUT/KIND/PROVIDER")
            layout, kind, prov = parts
            provider[(layout, kind)] = prov
            stream.setdefault((layout, kind), {})[(r["op"], int(r["blocks"]), int(r["size_bytes"]))] = r
    fabric = {}
    fpath = os.path.join(d, "fabric.csv")
    if os.path.exists(fpath):
        for r in read_csv(fpath):
            key = (r["layout"], r["provider"], r["op"], int(r["size_bytes"]), int(r["window"]))
            fabric[key] = r
    return stream, provider, fabric


def write_rows(path, rows):
    """Writes `rows` (dicts with the keys of the first) to the CSV file `path` and says so."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path} ({len(rows)} rows)")


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (said on stderr) where matplotlib does not
    import."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no PNG", file=sys.stderr)
        return None
    return plt


def fmt(x, nd=3):
    return "" if x is None else f"{x:.{nd}f}"


def join(stream, provider, fabric):
    rows = []
    for (layout, kind), by in sorted(stream.items()):
        if kind != "library":
            continue
        prov = provider[(layout, kind)]
        p2p = stream.get(("same-host", "p2p"), {}) if layout == "same-host" else {}
        null = stream.get((layout, "null"), {})
        for (op, blocks, size), r in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
            window = int(r["window"])
            f = fabric.get((layout, prov, FABRIC_OP.get(op, ""), size, window))
            fg = float(f["mbps"]) / 1000 if f and f["mbps"] else None
            fm = fg * 1000 / size if fg is not None else None
            dc = fabric.get((layout, prov, FABRIC_DC_OP.get(op, ""), size, window))
            dg = float(dc["mbps"]) / 1000 if dc and dc["mbps"] else None
            lg, lm = float(r["gbps"]), float(r["mops"])
            pr, nr = p2p.get((op, blocks, size)), null.get((op, blocks, size))
            rows.append({
                "layout": layout, "provider": prov, "op": op, "blocks": blocks, "size_bytes": size,
                "window": window, "library_gbps": fmt(lg, 4), "library_mops": fmt(lm, 4),
                "library_usec_per_op": r["usec_per_op"], "fabric_gbps": fmt(fg, 4),
                "fabric_mops": fmt(fm, 4), "fabric_memory": f["memory"] if f else "",
                "p2p_gbps": pr["gbps"] if pr else "", "p2p_mops": pr["mops"] if pr else "",
                "null_gbps": nr["gbps"] if nr else "", "null_mops": nr["mops"] if nr else "",
                "library_over_fabric": fmt(lg / fg, 3) if fg else "", "verified": r["verified"],
                "fabric_dc_gbps": fmt(dg, 4), "library_over_fabric_dc": fmt(lg / dg, 3) if dg else "",
            })
    return rows


def table(rows):
    head = ["layout", "prov", "op", "blk", "size", "k", "lib GB/s", "lib Mop/s", "us/op",
            "fabric GB/s", "(mem)", "lib/fabric", "dc GB/s", "lib/dc", "p2p GB/s", "null Mop/s",
            "check"]
    body = [[r["layout"], r["provider"], r["op"], str(r["blocks"]), human(r["size_bytes"]),
             str(r["window"]), r["library_gbps"], r["library_mops"], r["library_usec_per_op"],
             r["fabric_gbps"] or "-", r["fabric_memory"] or "-", r["library_over_fabric"] or "-",
             r["fabric_dc_gbps"] or "-", r["library_over_fabric_dc"] or "-",
             r["p2p_gbps"] or "-", r["null_mops"] or "-", r["verified"]] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    out = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    out += ["  ".join(x.rjust(w) for x, w in zip(b, widths)) for b in body]
    return "\n".join(out)


def torch_rows(d):
    runs = {}
    for path in sorted(glob.glob(os.path.join(d, "torch-*.csv"))):
        name = os.path.basename(path)[len("torch-"):-len(".csv")]
        if name == "compare" or "-" not in name:
            continue
        layout, mode = name.rsplit("-", 1)
        for r in read_csv(path):
            runs.setdefault((r["op"], int(r["bytes_per_peer"])), {})[f"{layout}/{mode}"] = r
    return runs


def write_torch(d, runs):
    cols = ["same-host/library", "two-host/library", "same-host/p2p"]
    path = os.path.join(d, "torch-compare.csv")
    lines = []
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "bytes_per_peer"] + [c.replace("/", "_") + "_median_us" for c in cols])
        for (op, n), by in sorted(runs.items()):
            vals = [by[c]["median_us"] if c in by else "" for c in cols]
            w.writerow([op, n] + vals)
            lines.append(f"{op:>20} {human(n):>8}  " + "  ".join(f"{v or '-':>18}" for v in vals))
    head = f"{'op':>20} {'per peer':>8}  " + "  ".join(f"{c:>18}" for c in cols)
    return path, "\n".join([head] + lines)


def plot(rows, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layouts = sorted({r["layout"] for r in rows})
    ops = [o for o in ("put", "get", "put_signal") if any(r["op"] == o for r in rows)]
    fig, axes = plt.subplots(len(layouts), len(ops), figsize=(5.5 * len(ops), 4.2 * len(layouts)),
                             squeeze=False)
    for i, layout in enumerate(layouts):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            sel = [r for r in rows if r["layout"] == layout and r["op"] == op]
            if not sel:
                ax.set_title(f"{layout}: {op}: no rows")
                ax.axis("off")
                continue
            for blocks in sorted({r["blocks"] for r in sel}):
                pts = [(r["size_bytes"], float(r["library_gbps"])) for r in sel if r["blocks"] == blocks]
                ax.plot(*zip(*pts), marker="o", label=f"library, {blocks} block(s)")
            one = [r for r in sel if r["blocks"] == min(x["blocks"] for x in sel)]
            for key, label, style in (("fabric_gbps", "fi_rma_bw, same window", "--"),
                                      ("p2p_gbps", "NVSHMEM P2P", ":"),
                                      ("null_gbps", "null completion (proxy ceiling)", "-.")):
                pts = [(r["size_bytes"], float(r[key])) for r in one if r[key]]
                if pts:
                    ax.plot(*zip(*pts), linestyle=style, marker=".", label=label)
            prov = sel[0]["provider"] if sel else ""
            ax.set_title(f"{layout}, {prov}: {op} (k in flight, one quiet)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel("GB/s")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    d = argv[1]
    png = argv[argv.index("--png") + 1] if "--png" in argv else None
    stream, provider, fabric = load(d)
    rows = join(stream, provider, fabric)
    if not rows:
        print(f"stream_compare.py: no library rows in {d}/stream-*.csv")
        return 1
    with open(os.path.join(d, "stream-compare.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS)
        w.writeheader()
        w.writerows(rows)
    text = table(rows)
    runs = torch_rows(d)
    if runs:
        tpath, ttext = write_torch(d, runs)
        text += f"\n\nPyTorch symmetric memory (median us, slowest rank; {os.path.basename(tpath)}):\n{ttext}"
    with open(os.path.join(d, "stream-compare.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    wrong = [r for r in rows if r["verified"] == "WRONG"]
    if png:
        plot(rows, png)
        print(f"plot: {png}")
    print(f"{len(rows)} rows: {os.path.join(d, 'stream-compare.csv')}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
