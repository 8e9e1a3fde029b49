# SPDX-License-Identifier: BSD-3-Clause
"""PyTorch symmetric memory on its NVSHMEM backend, one rank of a torchrun job.

    torchrun --standalone --nproc-per-node 2 symm_mem_a2a.py --mode library|p2p --csv FILE

--mode library: nvshmem_efa_gda.enable() before torch is imported (no LD_PRELOAD: checked), so the
NVSHMEM that torch loads uses this library as its remote transport (the runner sets
NVSHMEM_DISABLE_P2P=1 for this mode: every byte goes through it). --mode p2p: the reference, no
library, NVSHMEM's own P2P path.

Checks, on every rank: torch.ops.symm_mem.nvshmem_all_to_all (patterned data, 1 KiB, 64 KiB and
4 MiB per peer) and torch.ops.symm_mem.all_to_all_vdev (random splits: output splits, offsets and
data; both of torch's signatures are handled: (input, out, in_out_splits, group) and
(input, out, in_splits, out_splits_offsets, group)), then which plugin the process holds. Timing:
median of 20 (after 3 warm-ups) of each op at 1 KiB, 64 KiB, 4 MiB per peer, CUDA events around
the op; the CSV row is the slowest rank's median. SYMM_A2A_TIME=a2a or =vdev times only that op
(for a trace of one op). Exit status 0 when every check passed.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Reporter, activate, check_plugin, rank_info  # noqa: E402

SIZES = (1024, 64 * 1024, 4 * 1024 * 1024)  # bytes per peer
ITERS, WARMUP = 20, 3
PATTERN = 4096  # values stay exact in float32 (< 2^24)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("library", "p2p"), required=True)
    ap.add_argument("--csv", required=True)
    args = ap.parse_args()
    rank, world, local_rank = rank_info()
    rep = Reporter(rank, f"symm_mem {args.mode}")
    act = activate(rep, args.mode)

    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    ndev = torch.cuda.device_count()
    if ndev < 1:
        rep.check("CUDA device visible", False)
        return 1
    dev = torch.device("cuda", local_rank % ndev)
    torch.cuda.set_device(dev)
    torch.empty(1, device=dev)  # the CUDA context before NVSHMEM
    shared = world > ndev
    backend = "gloo" if shared else "nccl"  # NCCL refuses two ranks on one GPU
    kw = {"device_id": dev} if backend == "nccl" else {}
    dist.init_process_group(backend=backend, **kw)
    group_name = dist.group.WORLD.group_name
    rep.say(f"torch {torch.__version__}, cuda:{dev.index} of {ndev}, process group {backend}, "
            f"MPS thread percentage {os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '-')}, "
            f"NVSHMEM_DISABLE_P2P={os.environ.get('NVSHMEM_DISABLE_P2P', '-')}, "
            f"NVSHMEM_REMOTE_TRANSPORT={os.environ.get('NVSHMEM_REMOTE_TRANSPORT', '-')}")

    if hasattr(symm_mem, "set_backend"):
        symm_mem.set_backend("NVSHMEM")
    if hasattr(symm_mem, "is_nvshmem_available"):
        rep.check("symm_mem.is_nvshmem_available()", symm_mem.is_nvshmem_available())
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        symm_mem.enable_symm_mem_for_group(group_name)

    def sym(shape, dtype):
        t = symm_mem.empty(shape, dtype=dtype, device=dev)
        symm_mem.rendezvous(t, group=group_name)
        return t

    # ---- nvshmem_all_to_all: correctness at every size, then timing
    j = {}
    a2a = {}
    for nbytes in SIZES:
        n = nbytes // 4
        inp, out = sym(world * n, torch.float32), sym(world * n, torch.float32)
        j[nbytes] = torch.arange(n, device=dev, dtype=torch.float32).remainder_(PATTERN)
        for p in range(world):  # inp[p*n + i] = value(src=rank, dst=p, i)
            inp[p * n:(p + 1) * n].copy_(j[nbytes] + float((rank * world + p) * PATTERN))
        out.fill_(-1)
        torch.cuda.synchronize()
        dist.barrier()
        torch.ops.symm_mem.nvshmem_all_to_all(inp, out, group_name)
        torch.cuda.synchronize()
        expected = torch.cat([j[nbytes] + float((p * world + rank) * PATTERN) for p in range(world)])
        bad = int((out != expected).sum().item())
        rep.check(f"nvshmem_all_to_all {nbytes} B per peer", bad == 0,
                  f"{bad} of {out.numel()} elements wrong" if bad else "")
        a2a[nbytes] = (inp, out)
        if nbytes == SIZES[0]:
            check_plugin(rep, act)  # NVSHMEM is initialised by now

    # ---- all_to_all_vdev: random splits, both signatures
    schema = torch.ops.symm_mem.all_to_all_vdev.default._schema
    nargs = len(schema.arguments)
    rep.say(f"all_to_all_vdev schema: {schema}")
    max_split = 4096
    gen = torch.Generator().manual_seed(1234 + rank)
    splits = torch.randint(0, max_split, (world,), generator=gen, dtype=torch.int64)
    all_splits = [None] * world
    dist.all_gather_object(all_splits, splits.tolist())
    in_numel = int(splits.sum())
    v_inp = sym(world * max_split, torch.float32)
    v_out = sym(world * world * max_split, torch.float32)
    v_inp.copy_(torch.arange(world * max_split, device=dev, dtype=torch.float32) + rank * 100000.0)

    def vdev(inp, out, split_list):
        """Runs all_to_all_vdev; returns (received splits, offsets) as lists."""
        if nargs == 4:
            io = sym((3, world), torch.int64)
            io.fill_(-1)
            io[0].copy_(torch.tensor(split_list, dtype=torch.int64))
            torch.cuda.synchronize()
            dist.barrier()
            torch.ops.symm_mem.all_to_all_vdev(inp, out, io, group_name)
            torch.cuda.synchronize()
            return io[1].tolist(), io[2].tolist(), io[0].tolist()
        ins = sym((world,), torch.int64)
        ins.copy_(torch.tensor(split_list, dtype=torch.int64))
        oso = sym((2, world), torch.int64)
        oso.fill_(-1)
        torch.cuda.synchronize()
        dist.barrier()
        torch.ops.symm_mem.all_to_all_vdev(inp, out, ins, oso, group_name)
        torch.cuda.synchronize()
        return oso[0].tolist(), oso[1].tolist(), ins.tolist()

    if nargs not in (4, 5):
        rep.check("all_to_all_vdev has a known signature", False, str(schema))
    else:
        v_out.fill_(-1)
        recv, offs, kept = vdev(v_inp, v_out, splits.tolist())
        want_recv = [all_splits[s][rank] for s in range(world)]
        want_offs = [sum(want_recv[:s]) for s in range(world)]
        rep.check("all_to_all_vdev input splits unchanged", kept == splits.tolist(), f"{kept}")
        rep.check("all_to_all_vdev output splits", recv == want_recv, f"got {recv}, want {want_recv}")
        rep.check("all_to_all_vdev output offsets (exclusive scan)", offs == want_offs,
                  f"got {offs}, want {want_offs}")
        bad = 0
        for s in range(world):
            src_off = sum(all_splits[s][:rank])  # where rank's part starts in s's input
            n = want_recv[s]
            want = torch.arange(src_off, src_off + n, device=dev, dtype=torch.float32) + s * 100000.0
            got = v_out[want_offs[s]:want_offs[s] + n]
            bad += int((got != want).sum().item())
        rep.check(f"all_to_all_vdev data ({in_numel} elements sent)", bad == 0,
                  f"{bad} elements wrong" if bad else "")

    # ---- timing
    rows = []

    def time_op(name, nbytes, fn):
        times = []
        for it in range(WARMUP + ITERS):
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            if it >= WARMUP:
                times.append(start.elapsed_time(end) * 1000.0)  # us
        med = statistics.median(times)
        gathered = [None] * world
        dist.all_gather_object(gathered, (med, min(times), max(times)))
        worst = max(g[0] for g in gathered)
        rows.append((args.mode, name, nbytes, worst, min(g[1] for g in gathered),
                     max(g[2] for g in gathered), nbytes * world / worst / 1e3))
        rep.say(f"time {name} {nbytes} B/peer: median {med:.1f} us (slowest rank {worst:.1f} us)")

    timed = os.environ.get("SYMM_A2A_TIME", "a2a,vdev").split(",")
    for nbytes in SIZES if "a2a" in timed else ():
        inp, out = a2a[nbytes]
        time_op("nvshmem_all_to_all", nbytes,
                lambda: torch.ops.symm_mem.nvshmem_all_to_all(inp, out, group_name))
    if nargs in (4, 5) and "vdev" in timed:
        for nbytes in SIZES:
            n = nbytes // 4
            t_inp = sym(world * n, torch.float32)
            t_out = sym(world * n, torch.float32)
            t_inp.fill_(float(rank))
            eq = [n] * world
            if nargs == 4:
                io = sym((3, world), torch.int64)
                io[0].copy_(torch.tensor(eq, dtype=torch.int64))

                def fn(t_inp=t_inp, t_out=t_out, io=io):
                    torch.ops.symm_mem.all_to_all_vdev(t_inp, t_out, io, group_name)
            else:
                ins = sym((world,), torch.int64)
                ins.copy_(torch.tensor(eq, dtype=torch.int64))
                oso = sym((2, world), torch.int64)

                def fn(t_inp=t_inp, t_out=t_out, ins=ins, oso=oso):
                    torch.ops.symm_mem.all_to_all_vdev(t_inp, t_out, ins, oso, group_name)
            time_op("all_to_all_vdev", nbytes, fn)
            torch.cuda.synchronize()
            want = torch.cat([torch.full((n,), float(p), device=dev) for p in range(world)])
            bad = int((t_out != want).sum().item())
            rep.check(f"all_to_all_vdev {nbytes} B per peer after timing", bad == 0,
                      f"{bad} elements wrong" if bad else "")

    if rank == 0:
        with open(args.csv, "w") as f:
            f.write("mode,op,bytes_per_peer,median_us,min_us,max_us,GB_per_s_per_rank\n")
            for r in rows:
                f.write(f"{r[0]},{r[1]},{r[2]},{r[3]:.2f},{r[4]:.2f},{r[5]:.2f},{r[6]:.3f}\n")
        rep.say(f"wrote {args.csv}")

    # Every rank's verdict, so that rank 0's line is the job's.
    verdicts = [None] * world
    dist.all_gather_object(verdicts, rep.failed)
    dist.barrier()
    dist.destroy_process_group()
    total_failed = sum(verdicts)
    rep.say(f"{rep.passed} passed, {rep.failed} failed on this rank; {total_failed} failed in all")
    return 0 if total_failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
