#!/usr/bin/env bash
# Library builds side by side in one GPU-node call, on one node and layout, within a time budget:
# a change measured against what it replaced. Works on a one-GPU node (both PEs under CUDA MPS,
# tests/gpu/mps.sh) and on a two-GPU node (one PE per GPU).
#
#   AB_PLUGINS="now=.gpu/plugin/lib before=.gpu/plugin-0a83360/lib" LIBFABRIC_HOME=.gpu/libfabric \
#   NVSHMEM_DISABLE_NVLS=1 OUT=<dir> bash tests/gpu/ab_run.sh [--budget S] [--steps LIST]
#
# Steps, in this order, each for every build in AB_PLUGINS (NAME=LIB_DIR, the first is "the
# change"), each skipped when the budget no longer holds it:
#   count    GDA puts each followed by a count at the target (gda_bench --count-every 1, DeepEP's
#            "data, then count"; tests/gpu_gda/run.sh GDA_BENCH_SETS=count), 8 B to 64 KiB
#   countvar the first build only: the count benchmark in variants (AB_COUNT_VARIANTS, "NAME:VAR=V,...;..."
#            default: one queue per warp, the host copy route, a count every 4 puts), with the
#            software queue's debug summary in the log (rounds, copy kernel, ordering rule)
#   exchange the first build only: DeepEP's dispatch pattern both ways with the wait inside the kernel
#            (gda_bench --exchange; tests/gpu_gda/run.sh GDA_BENCH_SETS=exchange) in variants
#            (AB_EXCHANGE_VARIANTS, as AB_COUNT_VARIANTS; default: 144 experts on the copy kernel, on
#            the host copy route, 4 consumer threads, 16 experts x 32 puts, 8-byte puts), with the
#            software queue's debug summary in the log (AB_EXCHANGE_LOG replaces the log filter:
#            with no debug level the consumer reads no clocks per WQE); with AB_EXCHANGE_TRACE=1 also the consumers'
#            event traces (NVSHMEM_EFA_SOFT_TRACE, in exchange-<variant>/trace.*.csv) and what
#            tests/bench/softq_trace.py reads in them (exchange-<variant>/trace.txt);
#            AB_EXCHANGE_ALL=1 runs every build of AB_PLUGINS (interleaved, variant by variant),
#            AB_EXCHANGE_REPS=N repeats the whole set N times
#   gdatests the first build only: the GDA device-API suite (tests/gpu_gda/run.sh, no sanitizer)
#   same     the stream benchmark, same-host layout, library on shm (tests/gpu/stream_run.sh --quick
#            --only same)
#   threads  the first build only: the GDA sweep at 66x8 posting warps, 64 queues, software-queue
#            consumer threads 1 and 4 (GDA_SWEEP_THREADS); AB_SWEEP_POINTS, AB_SWEEP_QUEUES,
#            AB_SWEEP_THREADS, AB_SWEEP_BUDGET_S (seconds per point) and AB_SWEEP_LIMIT (the step's
#            limit, default 150 s) replace those
#   two      the first build only: the stream benchmark in the two-host layout (library on tcp
#            between two network namespaces, its null completion, fi_rma_bw between them), with the
#            library's per-stage times in the log (nvshmem_efa_gda::stages=debug)
# The GDA programs are built on the node once (tests/gpu_gda/run.sh --save-bins, with the node's MPI;
# about a minute) into BINS_GDA (default /tmp/ab-bins-gda, kept on a warm node) unless they are
# there. The stream benchmark's inputs: tests/gpu/stage_stream_run.sh (.gpu/bins-3.4.5/stream_bench,
# .gpu/iproute2), or tests/deepep/stage_followup.sh's carry.
# Writes $OUT/<step>-<name>/ (each runner's own output) and $OUT/summary.txt.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
budget=560
steps="count,countvar,exchange,gdatests,same,threads,two"
while [ $# -gt 0 ]; do
    case "$1" in
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    --steps) steps=${2:?--steps needs a list}; shift ;;
    *) echo "ab_run.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done
case $budget in '' | *[!0-9]*) echo "ab_run.sh: --budget must be seconds" >&2; exit 2 ;; esac
for s in ${steps//,/ }; do
    case $s in count | countvar | exchange | gdatests | same | threads | two) ;; *) echo "ab_run.sh: unknown step '$s'" >&2; exit 2 ;; esac
done
[ -n "${AB_PLUGINS:-}" ] || { echo "ab_run.sh: AB_PLUGINS is not set (NAME=LIB_DIR ...)" >&2; exit 2; }
names=() dirs=()
for p in $AB_PLUGINS; do
    n=${p%%=*} d=${p#*=}
    [ -f "$d/nvshmem_transport_libfabric.so.3" ] || { echo "ab_run.sh: $d has no nvshmem_transport_libfabric.so.3" >&2; exit 2; }
    names+=("$n") dirs+=("$(cd "$d" && pwd)")
done
# shellcheck source=tests/gpu/runner.sh
source "$here/runner.sh"
runner_init ab_run "$PWD/ab-out"
status=0
say "node: $(nproc) CPUs, cgroup cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none), clock source $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null || echo unknown), load $(cut -d' ' -f1-3 /proc/loadavg)"
# run NAME LIMIT CMD...: runs when LIMIT seconds are left, bounded by LIMIT.
run() {
    local name=$1 limit=$2
    shift 2
    if [ "$(left)" -lt "$limit" ]; then say "$name: SKIPPED ($(left) s left, needs $limit)"; return; fi
    say "$name ($(left) s left)"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" >"$OUT/$name.console.txt" 2>&1
    local rc=$?
    say "$name: rc=$rc in $((SECONDS - t0)) s"
    [ $rc = 0 ] || status=1
}
BINS_GDA=${BINS_GDA:-/tmp/ab-bins-gda}
gda=(bash tests/gpu_gda/run.sh --bin-dir "$BINS_GDA" --no-tests --no-sanitizer)
export NVSHMEM_DISABLE_NVLS=1
if { want count || want countvar || want exchange || want gdatests || want threads; } && ! [ -x "$BINS_GDA/gda_bench" ]; then
    # About a minute on an H200 node (56 s, results/gpu-2026-11-29g); 150 s bounds it, so that a
    # short budget still builds and runs a step.
    run build-gda 150 bash tests/gpu_gda/run.sh --no-tests --no-sanitizer --no-bench \
        --plugin-dir "${dirs[0]}" --save-bins "$BINS_GDA" --out "$OUT/build-gda"
fi
if want count; then
    for k in "${!names[@]}"; do
        run "count-${names[$k]}" 100 env GDA_BENCH_SETS=count "${gda[@]}" --plugin-dir "${dirs[$k]}" \
            --out "$OUT/count-${names[$k]}"
        grep -h "gda-count" "$OUT/count-${names[$k]}/bench-count.log" 2>/dev/null | sed 's/^/    /' | tee -a "$SUM"
    done
fi
if want countvar; then
    variants=${AB_COUNT_VARIANTS:-"q16:;q64:GDA_COUNT_QUEUES=64;host:NVSHMEM_EFA_SOFT_IPC=host;every4:GDA_COUNT_EVERY=4"}
    IFS=';' read -r -a vlist <<<"$variants"
    for v in "${vlist[@]}"; do
        vn=${v%%:*} venv=${v#*:}
        IFS=',' read -r -a vars <<<"$venv"
        run "countvar-$vn" 60 env GDA_BENCH_SETS=count \
            NVSHMEM_EFA_LOG="nvshmem_efa_gda=info,nvshmem_efa_gda::gda::softq=debug" "${vars[@]}" \
            "${gda[@]}" --plugin-dir "${dirs[0]}" --out "$OUT/countvar-$vn"
        grep -h "gda-count" "$OUT/countvar-$vn/bench-count.log" 2>/dev/null | sed -n '1p;6p;14p' |
            sed "s/^/    $vn /" | tee -a "$SUM"
    done
fi
if want exchange; then
    variants=${AB_EXCHANGE_VARIANTS:-"e144:;host:NVSHMEM_EFA_SOFT_IPC=host;t4:NVSHMEM_EFA_SOFT_THREADS=4;e16:GDA_EXCHANGE=50 4x4 16 32 7168;small:GDA_EXCHANGE=200 36x4 144 1 8"}
    IFS=';' read -r -a vlist <<<"$variants"
    for rep in $(seq 1 "${AB_EXCHANGE_REPS:-1}"); do
        for v in "${vlist[@]}"; do
            vn=${v%%:*} venv=${v#*:}
            IFS=',' read -r -a vars <<<"$venv"
            for k in "${!names[@]}"; do
                # One build only, unless AB_EXCHANGE_ALL=1 (every build of AB_PLUGINS in turn).
                [ "$k" -gt 0 ] && [ "${AB_EXCHANGE_ALL:-0}" != 1 ] && continue
                tag=$vn
                [ "${AB_EXCHANGE_ALL:-0}" = 1 ] && tag=$vn-${names[$k]}
                [ "${AB_EXCHANGE_REPS:-1}" -gt 1 ] && tag=$tag-r$rep
                trace=()
                if [ "${AB_EXCHANGE_TRACE:-0}" = 1 ]; then
                    mkdir -p "$OUT/exchange-$tag"
                    trace=(NVSHMEM_EFA_SOFT_TRACE="$OUT/exchange-$tag/trace")
                fi
                run "exchange-$tag" 60 env GDA_BENCH_SETS=exchange \
                    NVSHMEM_EFA_LOG="${AB_EXCHANGE_LOG:-nvshmem_efa_gda=info,nvshmem_efa_gda::gda::softq=debug}" "${trace[@]}" "${vars[@]}" \
                    "${gda[@]}" --plugin-dir "${dirs[$k]}" --out "$OUT/exchange-$tag"
                grep -h "gda-exchange\|FAIL" "$OUT/exchange-$tag/bench-exchange.log" 2>/dev/null | grep -v "^gda_bench" |
                    sed "s/^/    $tag /" | tee -a "$SUM"
                tfiles=("$OUT/exchange-$tag"/trace.pe*.t0.csv)
                if [ ${#trace[@]} -gt 0 ] && [ -f "${tfiles[0]}" ]; then
                    python3 tests/bench/softq_trace.py "${tfiles[@]}" >"$OUT/exchange-$tag/trace.txt" 2>&1
                    sed -n '/^timeline/q;p' "$OUT/exchange-$tag/trace.txt" | sed "s/^/    $tag /" | tee -a "$SUM"
                fi
            done
        done
    done
fi
if want gdatests; then
    run "gdatests-${names[0]}" 150 bash tests/gpu_gda/run.sh --bin-dir "$BINS_GDA" --no-sanitizer --no-bench \
        --plugin-dir "${dirs[0]}" --out "$OUT/gdatests-${names[0]}"
    grep -hE "^(PASS|FAIL)|RESULT|cases passed" "$OUT/gdatests-${names[0]}.console.txt" 2>/dev/null | tail -n 20 |
        sed 's/^/    /' | tee -a "$SUM"
fi
if want same; then
    for k in "${!names[@]}"; do
        run "same-${names[$k]}" 75 env STREAM_PLUGIN_DIR="${dirs[$k]}" OUT="$OUT/same-${names[$k]}" \
            bash tests/gpu/stream_run.sh --quick --only same --budget 65
        grep -hE "^    (put|get) " "$OUT/same-${names[$k]}.console.txt" 2>/dev/null | sed 's/^/  /' | tee -a "$SUM"
    done
fi
if want threads; then
    run "threads-${names[0]}" "${AB_SWEEP_LIMIT:-150}" env GDA_BENCH_SETS=sweep \
        GDA_SWEEP_THREADS="${AB_SWEEP_THREADS:-1 4}" GDA_SWEEP_QUEUES="${AB_SWEEP_QUEUES:-64}" \
        GDA_SWEEP="${AB_SWEEP_POINTS:-66x8}" GDA_SWEEP_BUDGET_S="${AB_SWEEP_BUDGET_S:-8}" \
        "${gda[@]}" --plugin-dir "${dirs[0]}" --out "$OUT/threads-${names[0]}"
    cat "$OUT/threads-${names[0]}/bench-sweep.csv" 2>/dev/null | sed 's/^/    /' | tee -a "$SUM"
fi
if want two; then
    run "two-${names[0]}" 200 env STREAM_PLUGIN_DIR="${dirs[0]}" OUT="$OUT/two-${names[0]}" \
        NVSHMEM_EFA_LOG="nvshmem_efa_gda=warn,nvshmem_efa_gda::mover=debug,nvshmem_efa_gda::stages=debug" \
        bash tests/gpu/stream_run.sh --only two,twonull,fabric --budget 190
    grep -hE "^    (put|get|amo|put_signal) |two-host" "$OUT/two-${names[0]}.console.txt" 2>/dev/null | head -60 |
        sed 's/^/  /' | tee -a "$SUM"
fi
say "done in $((SECONDS - T0)) s"
exit $status
