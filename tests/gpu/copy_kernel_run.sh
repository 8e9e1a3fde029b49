#!/usr/bin/env bash
# The transport's same-host copy route with and without the copy kernel in front of the copy engine
# (NVSHMEM_EFA_COPY_KERNEL, src/mover/kfront.rs), one build, one GPU-node call, within a budget:
#   1. the mover's GPU tests of the copy queue (k = 200 small copies then one quiet on the copy
#      engine and through the kernel, with the time per copy; submission order across the two
#      routes, every byte checked);
#   2. the stream benchmark, same-host layout (library on shm), with the copy kernel (default,
#      with the null completion beside it: NVSHMEM's proxy ceiling) and with
#      NVSHMEM_EFA_COPY_KERNEL=0, interleaved STREAM_REPS times (default 2; tests/gpu/stream_run.sh
#      --quick --only same[,null]);
#   3. PyTorch symmetric memory through enable(), same-host (nvshmem_all_to_all, all_to_all_vdev),
#      with and without the copy kernel (tests/gpu/stream_run.sh --only torch).
# One GPU: both PEs under CUDA MPS (tests/gpu/mps.sh); two GPUs: one PE per GPU.
#
# Staged on the build machine (repo root): bash tests/deepep/stage_followup.sh (the library,
# libfabric, the stream benchmark), the unit-test binary as .gpu/t/libtests packed in
# .gpu/libtests.tgz (tests/gpu/stage_mover_run.sh's first half), and bash tests/python_gpu/pack.sh
# (.gpu/py.tgz, the wheel with this library). On the node (repo root), carrying the three:
#   tar -C .gpu -xzf .gpu/followup.tgz; tar -C .gpu -xzf .gpu/libtests.tgz
#   NVSHMEM_DISABLE_NVLS=1 OUT=<dir> bash tests/gpu/copy_kernel_run.sh [--budget S] [--steps LIST]
#   4. (step two) the stream benchmark in the two-host layout (library on tcp between two network
#      namespaces, GPU memory staged: small records through the copy kernel at both ends, or with
#      NVSHMEM_EFA_COPY_KERNEL=0 the copy engine), fi_rma_bw beside it, TWO_REPS times (default 1).
# Steps: tests,stream,torch,two (default tests,stream,torch); STREAM_REPS (default 2),
# TORCH_VARIANTS (default "kernel engine"). Writes $OUT/<step>-<variant>/ and $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
budget=560 steps=tests,stream,torch
while [ $# -gt 0 ]; do
    case "$1" in
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    --steps) steps=${2:?--steps needs a list}; shift ;;
    *) echo "copy_kernel_run.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done
# shellcheck source=tests/gpu/runner.sh
source tests/gpu/runner.sh
runner_init copy_kernel_run "$PWD/copy-kernel-out"
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
LIBFABRIC_HOME=${LIBFABRIC_HOME:-$PWD/.gpu/libfabric}
say "start $(date -u +%FT%TZ) on $(uname -n), budget $budget s, steps $steps"
nvidia-smi -L 2>/dev/null | sed 's/^/    /' | tee -a "$SUM"

if want tests && fits "mover GPU tests" 90; then
    [ -x .gpu/t/libtests ] || say "no .gpu/t/libtests (unpack .gpu/libtests.tgz)"
    LD_LIBRARY_PATH=$LIBFABRIC_HOME/lib timeout 90 .gpu/t/libtests \
        mover::gpu_tests::k_copies_in_flight mover::gpu_tests::the_kernel_front \
        mover::gpu_tests::the_copy_kernel --test-threads=1 --nocapture >"$OUT/tests.log" 2>&1
    say "mover GPU tests: exit status $?"
    grep -E '^test |test result|us per copy|kernel front' "$OUT/tests.log" | sed 's/^/    /' | tee -a "$SUM"
fi

# variants STEP LAYOUT REPS PATTERN KERNEL_STEPS KERNEL_BUDGET ENGINE_STEPS ENGINE_BUDGET: the stream
# benchmark (stream_run.sh --quick) with the copy kernel, then with NVSHMEM_EFA_COPY_KERNEL=0,
# REPS times, into $OUT/STEP-<variant>-<rep>; the rows PATTERN names go to the summary. A variant
# runs when its budget and 2-5 s of slack are left.
variants() {
    # (not `budget`: fits() and left() read the run's budget by that name)
    local step=$1 layout=$2 reps=$3 pattern=$4 r v d only vbudget slack
    local -a vars
    for r in $(seq 1 "$reps"); do
        for v in kernel engine; do
            d=$OUT/$step-$v-$r
            if [ $v = engine ]; then
                only=$7 vbudget=$8 slack=5 vars=(NVSHMEM_EFA_COPY_KERNEL=0)
            else
                only=$5 vbudget=$6 slack=2 vars=()
            fi
            fits "stream $layout $v (rep $r)" $((vbudget + slack)) || continue
            env "${vars[@]}" OUT="$d" bash tests/gpu/stream_run.sh --quick --only "$only" \
                --budget "$vbudget" >"$d.log" 2>&1
            say "stream $layout, copy $v, rep $r: exit status $?"
            [ -s "$d/stream-compare.txt" ] &&
                grep -E "$pattern" "$d/stream-compare.txt" | sed 's/^/    /' | tee -a "$SUM"
        done
    done
}

# Same host; the null completion (NVSHMEM's proxy ceiling) does not depend on the copy route:
# measured with the first variant only.
want stream && variants stream same-host "${STREAM_REPS:-2}" \
    'layout|put +1 +8 B|put +1 +64 KiB|put +8 +8 B|get +1 +8 B|put_signal +1 +8 B|amo +1 +8 B|put +1 +1 MiB' \
    same,null 78 same 45

# The two-host layout (each PE in its own network namespace, tcp over a veth): GPU memory is
# staged, and a coalesced message's small copies go through the copy kernel at both ends;
# fi_rma_bw between the namespaces with the first variant only.
want two && variants two two-host "${TWO_REPS:-1}" \
    'layout|put +1 +8 B|put +1 +4 KiB|put +8 +8 B|put_signal +1 +8 B|amo +1 +8 B|put +1 +64 KiB' \
    two,fabric 98 two 55

if want torch; then
    # stream_run.sh gives its torch step the budget less 60 s, at most 150 s.
    for v in ${TORCH_VARIANTS:-kernel engine}; do
        fits "torch same-host $v" 215 || continue
        d=$OUT/torch-$v
        if [ $v = engine ]; then
            NVSHMEM_EFA_COPY_KERNEL=0 OUT=$d bash tests/gpu/stream_run.sh --only torch --budget 212 >"$d.log" 2>&1
        else
            OUT=$d bash tests/gpu/stream_run.sh --only torch --budget 212 >"$d.log" 2>&1
        fi
        say "torch same-host, copy $v: exit status $?"
        grep -E 'PASS|FAIL|all_to_all' "$d.log" | tail -n 12 | sed 's/^/    /' | tee -a "$SUM"
    done
fi
say "done in $((SECONDS - T0)) s"
