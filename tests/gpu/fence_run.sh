#!/usr/bin/env bash
# A fence that orders instead of waiting (NVSHMEM_EFA_FENCE, src/nvshmem/transport/fence.rs) and
# AMO records applied in batches at the target (src/nvshmem/transport/apply.rs), measured in one
# GPU-node call: the stream benchmark's put_signal, amo, signal and put rows (tests/gpu/
# stream_run.sh --quick), same-host (library on shm) and two-host (library on tcp between two
# network namespaces), for three variants of the library, interleaved REPS times:
#   order   this build, fences ordered (default)
#   quiet   this build, NVSHMEM_EFA_FENCE=quiet (every fence a quiet towards its PE)
#   before  the build before both changes (a library directory given as BEFORE_DIR)
# One GPU: both PEs under CUDA MPS (tests/gpu/mps.sh); two GPUs: one PE per GPU.
#
# Step tests first: the mover's GPU tests of the copy kernel (copies, and the atomics and fences the
# staged path's target now applies with it) and of the kernel front.
#
# Staged on the build machine (repo root): BEFORE=<library dir of the build before> bash
# tests/gpu/stage_fence_run.sh (writes .gpu/fence.tgz). On the node (repo root), carrying it:
#   tar -C .gpu -xzf .gpu/fence.tgz
#   NVSHMEM_DISABLE_NVLS=1 OUT=<dir> bash tests/gpu/fence_run.sh [--budget S]
#       [--steps tests,same,two] [--variants "order quiet before"]   (REPS=<n>: interleaved reps)
#   Other variants: this build with one setting changed, VARIANT_ENV="w32=NVSHMEM_EFA_GET_WINDOW=32
#   ..." (variant w32); VBUDGET=<s> replaces each run's budget (85 s; --quick runs take ~12 s).
# Writes $OUT/<step>-<variant>-<rep>/ (stream_run.sh's files) and $OUT/summary.txt; compare with
# python3 tests/gpu/fence_compare.py $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
budget=560 steps=tests,same,two variants="order quiet before"
while [ $# -gt 0 ]; do
    case "$1" in
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    --steps) steps=${2:?--steps needs a list}; shift ;;
    --variants) variants=${2:?--variants needs a list}; shift ;;
    *) echo "fence_run.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done
# shellcheck source=tests/gpu/runner.sh
source tests/gpu/runner.sh
runner_init fence_run "$PWD/fence-out"
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
BEFORE_DIR=${BEFORE_DIR:-$PWD/.gpu/plugin-b4fence/lib}
OPS=${FENCE_OPS:-put_signal,amo,signal,put}
say "start $(date -u +%FT%TZ) on $(uname -n), budget $budget s, steps $steps, variants $variants, ops $OPS"
nvidia-smi -L 2>/dev/null | sed 's/^/    /' | tee -a "$SUM"
if [[ " $variants " == *" before "* ]] && [ ! -f "$BEFORE_DIR/libnvshmem_efa_gda.so" ]; then
    say "no $BEFORE_DIR/libnvshmem_efa_gda.so: the 'before' variant is left out"
    variants=${variants//before/}
fi

# run STEP LAYOUT ONLY VBUDGET REP VARIANT: one stream_run.sh --quick of the variant.
run() {
    local step=$1 layout=$2 only=$3 vbudget=$4 rep=$5 v=$6 d
    local -a vars=(STREAM_EXTRA="--ops $OPS")
    d=$OUT/$step-$v-$rep
    case $v in
    quiet) vars+=(NVSHMEM_EFA_FENCE=quiet) ;;
    before) vars+=(STREAM_PLUGIN_DIR="$BEFORE_DIR") ;;
    *)
        # VARIANT_ENV="name=VAR=value ...": a variant of this build with one setting changed.
        local kv
        for kv in ${VARIANT_ENV:-}; do
            [ "${kv%%=*}" = "$v" ] && vars+=("${kv#*=}")
        done
        ;;
    esac
    vbudget=${VBUDGET:-$vbudget}
    fits "$layout $v (rep $rep)" $((vbudget + 3)) || return
    env "${vars[@]}" OUT="$d" bash tests/gpu/stream_run.sh --quick --only "$only" --budget "$vbudget" \
        >"$d.log" 2>&1
    say "$layout, $v, rep $rep: exit status $? ($((SECONDS - T0)) s)"
    [ -s "$d/stream-compare.txt" ] &&
        grep -E 'layout|put_signal +1 +8 B|put_signal +1 +64 KiB|amo +1 +8 B|amo +8 +8 B|signal +1 +8 B|put +1 +8 B' \
            "$d/stream-compare.txt" | sed 's/^/    /' | tee -a "$SUM"
}

if want tests; then
    [ -x .gpu/t/libtests ] || say "no .gpu/t/libtests (tests/gpu/stage_fence_run.sh packs it)"
    LD_LIBRARY_PATH=$PWD/.gpu/libfabric/lib timeout 120 .gpu/t/libtests mover::gpu_tests::the_copy_kernel \
        mover::gpu_tests::the_kernel_front mover::gpu_tests::k_copies_in_flight --test-threads=1 \
        --nocapture >"$OUT/tests.log" 2>&1
    say "mover GPU tests: exit status $?"
    grep -E '^test |test result|settled in|us per copy' "$OUT/tests.log" | sed 's/^/    /' | tee -a "$SUM"
fi

for rep in $(seq 1 "${REPS:-1}"); do
    for v in $variants; do
        want same && run same same-host same 70 "$rep" "$v"
        want two && run two two-host two 85 "$rep" "$v"
    done
done
say "done in $((SECONDS - T0)) s"
# Everything in one file (the node's output may hold a limited number of files).
tar -C "$OUT" -czf "$OUT.tgz" . && say "packed: $OUT.tgz"
