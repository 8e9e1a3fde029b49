#!/usr/bin/env bash
# One GPU-node run for the kernel atomics (src/mover/amo.rs): the mover's GPU tests (every op on
# this GPU's memory and on a second process's through legacy IPC and VMM, the host's take-over of
# a kernel that cannot start, launch cost), the NVSHMEM 3.4.5 suite through the library with kernel
# atomics on (NVSHMEM_EFA_AMO_KERNEL=1) at the default stuck limit and at 0 (every atomic whose
# kernel has not run yet is taken over), and with the default (off); PyTorch's nvshmem_all_to_all
# with kernel atomics against NVSHMEM's P2P path, then with the default. Key lines on stdout; logs
# under $OUT.
#
# Staged here first: bash .ci/stage-gpu.sh; cargo test --release --lib --no-run, the binary copied
# to .gpu/t/libtests; tar -C .gpu -czf .gpu/base.tgz plugin libfabric t; bash tests/python_gpu/pack.sh;
# the suite programs in .gpu/bins-3.4.5.tgz (tests/gpu/run.sh --compile-only --save-bins).
# On the node (repo root), carrying .gpu/base.tgz .gpu/bins-3.4.5.tgz .gpu/py.tgz:
#   OUT=<dir> bash tests/gpu/kernel_amo_run.sh [--skip-torch]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
skip_torch=0
[ "${1:-}" = --skip-torch ] && skip_torch=1
for t in base bins-3.4.5 py; do [ -f .gpu/$t.tgz ] && tar -xzf .gpu/$t.tgz -C .gpu; done
export NVSHMEM_HOME=${NVSHMEM_HOME:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nvshmem}
export PLUGIN_DIR=$PWD/.gpu/plugin/lib LIBFABRIC_HOME=$PWD/.gpu/libfabric NVSHMEM_DISABLE_NVLS=1
log_debug="nvshmem_efa_gda=info,nvshmem_efa_gda::nvshmem::transport=debug,nvshmem_efa_gda::mover=debug"

echo "== mover GPU tests"
LD_LIBRARY_PATH=$LIBFABRIC_HOME/lib timeout 300 .gpu/t/libtests mover::gpu_tests --test-threads=1 \
    --nocapture >"$OUT/libtests.log" 2>&1
echo "libtests rc $?"
grep -E "^test |kernel atomic|B:|test result|panicked" "$OUT/libtests.log" | head -40

suite() { # NAME [VAR=VALUE...]
    local name=$1; shift
    echo "== NVSHMEM suite: $name"
    env "$@" NVSHMEM_EFA_LOG="$log_debug" OUT="$OUT/$name" timeout 280 bash tests/gpu/run.sh \
        --bin-dir .gpu/bins-3.4.5 --no-bench --no-p2p-tests --no-fabtests >"$OUT/$name.log" 2>&1
    echo "$name rc $?"
    grep -E "passed|FAIL|TIMEOUT" "$OUT/$name.log" | tail -8
    grep -rhoE "kernel atomics: [0-9]+ applied by the kernel, [0-9]+ taken over by the host" \
        "$OUT/$name" 2>/dev/null | sort | uniq -c | sort -rn | head -6
    grep -rhE "kernel atomics: loaded.*" "$OUT/$name" 2>/dev/null | sed 's/.*kernel atomics/kernel atomics/' | sort | uniq -c | head -3
}
suite suite-kernel NVSHMEM_EFA_AMO_KERNEL=1
suite suite-kernel-again NVSHMEM_EFA_AMO_KERNEL=1
suite suite-stuck0 NVSHMEM_EFA_AMO_KERNEL=1 NVSHMEM_EFA_AMO_KERNEL_STUCK_US=0
suite suite-stuck0-again NVSHMEM_EFA_AMO_KERNEL=1 NVSHMEM_EFA_AMO_KERNEL_STUCK_US=0
suite suite-default

if [ $skip_torch = 0 ]; then
    for mode in kernel default; do
        echo "== PyTorch symmetric memory, library ($mode atomics; with kernel: NVSHMEM P2P after)"
        ref=()
        [ $mode = default ] && ref=(--no-ref)
        if [ $mode = kernel ]; then export NVSHMEM_EFA_AMO_KERNEL=1; else unset NVSHMEM_EFA_AMO_KERNEL; fi
        OUT=$OUT/torch-$mode timeout 300 bash tests/python_gpu/run.sh --wheels .gpu/py \
            --libfabric .gpu/libfabric --only torch "${ref[@]}" >"$OUT/torch-$mode.log" 2>&1
        echo "torch ($mode) rc $?"
        grep -E "FAIL|^op|^all_to_all|^nvshmem_all|median of" "$OUT/torch-$mode.log" | tail -12
        grep -hE "time nvshmem_all_to_all" "$OUT/torch-$mode.log" | grep library | head -6
    done
    unset NVSHMEM_EFA_AMO_KERNEL
fi
