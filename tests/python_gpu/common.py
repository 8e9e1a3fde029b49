# SPDX-License-Identifier: BSD-3-Clause
"""Shared by the rank programs of tests/python_gpu: the launch facts torchrun gives every rank, the
activation of nvshmem-efa-gda through enable() (never LD_PRELOAD), and the checks that prove which
transport plugin this process holds.

Nothing here imports torch or NVSHMEM: activate() must run before either is loaded.
"""
import os
import sys

SHIM_PREFIX = "nvshmem_transport_libfabric.so."


def rank_info():
    """(rank, world size, local rank) from torchrun's environment."""
    try:
        return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                int(os.environ["LOCAL_RANK"]))
    except KeyError as e:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {e.args[0]} is not set: launch with torchrun")


class Reporter:
    """PASS/FAIL lines, prefixed with the rank; counts failures."""

    def __init__(self, rank, tag):
        self.rank, self.tag, self.failed, self.passed = rank, tag, 0, 0

    def say(self, msg):
        print(f"[{self.tag} rank {self.rank}] {msg}", flush=True)

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        self.say(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        return ok


def mapped_files():
    """Paths of the files mapped in this process."""
    out = []
    with open("/proc/self/maps") as f:
        for ln in f:
            parts = ln.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                p = parts[5].strip()
                if p not in out:
                    out.append(p)
    return out


def activate(rep, mode):
    """mode 'library': asserts LD_PRELOAD is unset, calls nvshmem_efa_gda.enable() and returns its
    Activation. mode 'p2p': asserts the library is not loaded and returns None."""
    preload = os.environ.get("LD_PRELOAD")
    rep.check("LD_PRELOAD unset in the rank", preload is None, f"LD_PRELOAD={preload!r}" if preload else "")
    if mode != "library":
        return None
    import nvshmem_efa_gda

    act = nvshmem_efa_gda.enable()
    rep.say(f"enable(): NVSHMEM {act.nvshmem.version} ({act.nvshmem.source}), transport ABI {act.abi}, "
            f"shim {act.shim}, libfabric {act.libfabric}, env set {act.env_set}, kept {act.env_kept}")
    return act


def check_plugin(rep, act):
    """After NVSHMEM initialised: with the library, exactly its shim is the mapped
    nvshmem_transport_libfabric.so.N (NVSHMEM's own plugin of that name is not) and
    libnvshmem_efa_gda.so comes from the installed package; without it, neither is mapped."""
    maps = mapped_files()
    shims = [p for p in maps if os.path.basename(p).startswith(SHIM_PREFIX)]
    libs = [p for p in maps if os.path.basename(p).startswith("libnvshmem_efa_gda.so")]
    if act is None:
        rep.check("library not loaded (reference run)", not shims and not libs,
                  f"mapped: {shims + libs}" if shims or libs else "")
        return
    import nvshmem_efa_gda

    want_dir = os.path.realpath(nvshmem_efa_gda.lib_dir())
    ok_shim = len(shims) == 1 and os.path.realpath(shims[0]) == os.path.realpath(act.shim)
    rep.check("the one mapped transport plugin is the installed package's shim", ok_shim,
              f"mapped plugins: {shims}")
    ok_lib = bool(libs) and all(os.path.dirname(os.path.realpath(p)) == want_dir for p in libs)
    rep.check("libnvshmem_efa_gda.so mapped from the installed package", ok_lib, f"{libs}")
    rep.check("LD_PRELOAD still unset after NVSHMEM init", "LD_PRELOAD" not in os.environ)
