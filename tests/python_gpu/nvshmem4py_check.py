# SPDX-License-Identifier: BSD-3-Clause
"""An nvshmem4py (PyPI nvshmem4py-cu13) program, one PE of a torchrun job.

    torchrun --standalone --nproc-per-node 2 nvshmem4py_check.py --mode library|p2p

--mode library: nvshmem_efa_gda.enable() first (no LD_PRELOAD: checked); the runner sets
NVSHMEM_DISABLE_P2P=1, so every operation between PEs goes through this library. --mode p2p: no
library, NVSHMEM's P2P path (the reference, to tell a library fault from a program fault).

NVSHMEM starts with nvshmem4py's UID bootstrap: PE 0's unique id goes to the others over a gloo
process group (torchrun's rendezvous; no mpi4py needed). Then, each PE with its neighbour
(rank + 1) % world, every result checked:
  * put on a stream at 8 B, 64 KiB, 4 MiB; get of the peer's data; put_nbi + quiet;
  * barriers: barrier_all and team barrier on the stream, sync_all, the host barrier_all, in a loop
    where each round's value must be visible after the barrier;
  * only with --host-amos: host-initiated AMOs on the peer's uint64 slots: set, fetch, fetch_add,
    add, inc, fetch_inc, compare_swap (hit and miss), swap, or, fetch_and, fetch_xor, and 50
    fetch_inc round trips. Off by default: NVSHMEM's host AMO API is a set of stubs that log
    "nvshmem_<type>_atomic_<op>() not implemented" and return 0 (NVSHMEM_TYPE_*_NOT_IMPLEMENTED in
    NVSHMEM's src/host/comm/amo.cpp); on the GPU node (NVSHMEM 3.4.5) every one of these checks
    failed the same way through the library and on NVSHMEM's own P2P path. AMOs are device calls
    in NVSHMEM; this program makes none.
Exit status 0 when every check passed on every PE.
"""
import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Reporter, activate, check_plugin, rank_info  # noqa: E402

SIZES = (8, 64 * 1024, 4 * 1024 * 1024)  # bytes
BARRIER_ROUNDS = 20
ROUNDS = 50


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("library", "p2p"), required=True)
    ap.add_argument("--host-amos", action="store_true",
                    help="also check NVSHMEM's host AMO API (stubs in NVSHMEM 3.4-3.8: fails)")
    args = ap.parse_args()
    rank, world, local_rank = rank_info()
    rep = Reporter(rank, f"nvshmem4py {args.mode}")
    act = activate(rep, args.mode)

    import torch
    import torch.distributed as dist
    from cuda.core import Device

    import nvshmem
    import nvshmem.bindings as bindings
    import nvshmem.core as nv

    ndev = torch.cuda.device_count()
    if ndev < 1:
        rep.check("CUDA device visible", False)
        return 1
    dev_id = local_rank % ndev
    torch.cuda.set_device(dev_id)
    dev = Device(dev_id)
    dev.set_current()
    dist.init_process_group(backend="gloo")

    # UID bootstrap: PE 0's id to every PE, as bytes.
    uid = nv.get_unique_id(empty=(rank != 0))
    size = uid._data.nbytes
    payload = [ctypes.string_at(uid.ptr, size) if rank == 0 else None]
    dist.broadcast_object_list(payload, src=0)
    if rank != 0:
        ctypes.memmove(uid.ptr, payload[0], size)
    nv.init(device=dev, uid=uid, rank=rank, nranks=world, initializer_method="uid")
    ver = nv.get_version()
    rep.say(f"nvshmem4py {nvshmem.__version__}, libnvshmem {ver.libnvshmem_version}, "
            f"cuda:{dev_id} of {ndev}, MPS thread percentage "
            f"{os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', '-')}, "
            f"NVSHMEM_DISABLE_P2P={os.environ.get('NVSHMEM_DISABLE_P2P', '-')}")
    rep.check("my_pe/n_pes", nv.my_pe() == rank and nv.n_pes() == world,
              f"my_pe {nv.my_pe()} n_pes {nv.n_pes()}")
    check_plugin(rep, act)

    peer, left = (rank + 1) % world, (rank - 1) % world
    s = torch.cuda.current_stream()
    ns = nv.NvshmemStream(s)
    owned = []

    def tensor(n, dtype):
        t = nv.tensor((n,), dtype=dtype)
        owned.append(t)
        return t

    def pattern(r, n):
        return torch.arange(n, device="cuda", dtype=torch.int64) + (r + 1) * (1 << 40)

    def stream_barrier():
        nv.barrier_all(ns)
        s.synchronize()

    # ---- put / get / put_nbi
    srcs = {}
    for nbytes in SIZES:
        n = nbytes // 8
        src, dst = tensor(n, torch.int64), tensor(n, torch.int64)
        src.copy_(pattern(rank, n))
        dst.fill_(-1)
        stream_barrier()
        nv.put(dst, src, remote_pe=peer, stream=ns)
        nv.quiet(ns)
        stream_barrier()
        bad = int((dst != pattern(left, n)).sum().item())
        rep.check(f"put {nbytes} B to PE {peer}", bad == 0, f"{bad} of {n} words wrong" if bad else "")
        srcs[nbytes] = src
    for nbytes in SIZES:
        n = nbytes // 8
        got = tensor(n, torch.int64)
        got.fill_(-1)
        stream_barrier()
        nv.get(got, srcs[nbytes], remote_pe=peer, stream=ns)
        nv.quiet(ns)
        s.synchronize()
        bad = int((got != pattern(peer, n)).sum().item())
        rep.check(f"get {nbytes} B from PE {peer}", bad == 0, f"{bad} of {n} words wrong" if bad else "")
    n = 64 * 1024 // 8
    dst = tensor(n, torch.int64)
    dst.fill_(-1)
    stream_barrier()
    nv.put_nbi(dst, srcs[64 * 1024], remote_pe=peer, stream=ns)
    nv.quiet(ns)
    stream_barrier()
    bad = int((dst != pattern(left, n)).sum().item())
    rep.check("put_nbi + quiet 64 KiB", bad == 0, f"{bad} words wrong" if bad else "")

    # ---- barriers: each round's value is visible after the barrier
    flag, one = tensor(1, torch.int64), tensor(1, torch.int64)
    kinds = ("barrier_all", "team barrier", "sync_all", "host barrier_all")
    wrong = {k: 0 for k in kinds}
    for i in range(BARRIER_ROUNDS):
        kind = kinds[i % len(kinds)]
        one.fill_(1000 * (rank + 1) + i)
        nv.put(flag, one, remote_pe=peer, stream=ns)
        if kind == "barrier_all":
            nv.barrier_all(ns)
        elif kind == "team barrier":
            nv.barrier(nv.Teams.TEAM_WORLD, ns)
        elif kind == "sync_all":
            nv.quiet(ns)
            nv.sync_all(ns)
        else:
            nv.quiet(ns)
            s.synchronize()
            bindings.barrier_all()
        s.synchronize()
        if int(flag.item()) != 1000 * (left + 1) + i:
            wrong[kind] += 1
        stream_barrier()  # nobody overwrites flag before every PE has read it
    for k in kinds:
        rep.check(f"{k}: {BARRIER_ROUNDS // len(kinds)} rounds, data visible after it", wrong[k] == 0,
                  f"{wrong[k]} rounds wrong" if wrong[k] else "")

    # ---- host-initiated AMOs on the peer's uint64 slots
    amo = tensor(8, torch.uint64)
    words = amo.view(torch.int64)
    words.zero_()
    s.synchronize()
    bindings.barrier_all()

    def host_barrier():
        s.synchronize()
        bindings.barrier_all()

    def check_amo(name, fn):
        try:
            ok, detail = fn()
        except Exception as e:  # a raised binding error is a failed check, not a crash
            ok, detail = False, f"{type(e).__name__}: {e}"
        rep.check(f"AMO {name}", ok, detail)

    def amo_set():
        nv.atomic_set(amo, 5, remote_pe=peer, offset=0)
        host_barrier()
        return int(words[0].item()) == 5, f"slot 0 = {int(words[0].item())}"

    def amo_fetch():
        v = nv.atomic_fetch(amo, remote_pe=peer, offset=0)
        return v == 5, f"fetched {v}"

    def amo_fetch_add():
        got = [nv.atomic_fetch_add(amo, 3, remote_pe=peer, offset=1) for _ in range(10)]
        host_barrier()
        final = int(words[1].item())
        return got == [3 * k for k in range(10)] and final == 30, f"returned {got}, slot 1 = {final}"

    def amo_add():
        for _ in range(4):
            nv.atomic_add(amo, 7, remote_pe=peer, offset=2)
        host_barrier()
        return int(words[2].item()) == 28, f"slot 2 = {int(words[2].item())}"

    def amo_inc():
        for _ in range(5):
            nv.atomic_inc(amo, remote_pe=peer, offset=3)
        got = [nv.atomic_fetch_inc(amo, remote_pe=peer, offset=3) for _ in range(3)]
        host_barrier()
        final = int(words[3].item())
        return got == [5, 6, 7] and final == 8, f"fetch_inc returned {got}, slot 3 = {final}"

    def amo_cswap():
        hit = nv.atomic_compare_swap(amo, 0, 99, remote_pe=peer, offset=4)
        miss = nv.atomic_compare_swap(amo, 0, 11, remote_pe=peer, offset=4)
        host_barrier()
        final = int(words[4].item())
        return (hit, miss, final) == (0, 99, 99), f"hit returned {hit}, miss {miss}, slot 4 = {final}"

    def amo_swap():
        a = nv.atomic_swap(amo, 123, remote_pe=peer, offset=5)
        b = nv.atomic_swap(amo, 124, remote_pe=peer, offset=5)
        host_barrier()
        final = int(words[5].item())
        return (a, b, final) == (0, 123, 124), f"returned {a}, {b}, slot 5 = {final}"

    def amo_bitwise():
        nv.atomic_or(amo, 0b1010, remote_pe=peer, offset=6)
        f_and = nv.atomic_fetch_and(amo, 0b0110, remote_pe=peer, offset=6)
        f_xor = nv.atomic_fetch_xor(amo, 0b1111, remote_pe=peer, offset=6)
        host_barrier()
        final = int(words[6].item())
        return (f_and, f_xor, final) == (0b1010, 0b0010, 0b1101), \
            f"fetch_and returned {f_and}, fetch_xor {f_xor}, slot 6 = {final}"

    def amo_rounds():
        # Only the peer is targeted: a PE's AMOs on itself run as GPU kernels (NVSHMEM's P2P AMO
        # path), which are not atomic with respect to another transport's AMOs on the same word.
        got = [nv.atomic_fetch_inc(amo, remote_pe=peer, offset=7) for _ in range(ROUNDS)]
        host_barrier()
        final = int(words[7].item())
        return got == list(range(ROUNDS)) and final == ROUNDS, \
            f"returned 0..{ROUNDS - 1} in order: {got == list(range(ROUNDS))}, slot 7 = {final}"

    amo_checks = (("set", amo_set), ("fetch", amo_fetch), ("fetch_add", amo_fetch_add),
                  ("add", amo_add), ("inc + fetch_inc", amo_inc),
                  ("compare_swap", amo_cswap), ("swap", amo_swap),
                  ("or / fetch_and / fetch_xor", amo_bitwise),
                  (f"{ROUNDS} fetch_inc round trips", amo_rounds))
    if args.host_amos:
        for name, fn in amo_checks:
            check_amo(name, fn)
    else:
        rep.say("host AMOs not checked: NVSHMEM's host AMO API only logs 'not implemented' "
                "(src/host/comm/amo.cpp); --host-amos runs them anyway")

    # ---- teardown
    s.synchronize()
    bindings.barrier_all()
    for t in owned:
        nv.free_tensor(t)
    owned.clear()
    verdicts = [None] * world
    dist.all_gather_object(verdicts, rep.failed)
    nv.finalize()
    dist.destroy_process_group()
    total_failed = sum(verdicts)
    rep.say(f"{rep.passed} passed, {rep.failed} failed on this PE; {total_failed} failed in all")
    return 0 if total_failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
