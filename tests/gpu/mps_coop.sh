#!/usr/bin/env bash
# Whether the cooperative grids of several processes on one GPU under CUDA MPS run at the same time
# (tests/gpu/mps_coop.cu: each process launches a grid of one block per SM it sees, DeepEP's shape,
# whose blocks wait until every block of every grid has started). Neither DeepEP nor this library
# takes part. Asked because DeepEP's low-latency test with two ranks on one H200 stops in the first
# combine at 50 % of the SMs per rank, on its own P2P path as well (results/gpu-2026-11-29f).
#
#   bash tests/gpu/mps_coop.sh [--percents "50 40 25"] [--procs 2] [--smem "max 0"]
#       [--threads 1024] [--timeout-ms 5000] [--compile-only]
#
# For each MPS percentage (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of every process) and each shared
# memory size per block ("max": the most a block may have, so one block per SM; 0: none, so blocks
# are bounded by threads only), --procs processes launch together. Prints a table and writes
# $OUT/mps_coop.csv:
#   percent,procs,smem,sms_seen,blocks,per_sm,resident_all,waited_ms,started,distinct_sms,overlap
# (one row per process; resident_all=yes when every block of that process saw every block of every
# grid started: the grids ran together). The MPS daemon is started here (tests/gpu/mps.sh) unless one
# runs, and stopped at the end if started here. --compile-only builds the program and runs --help.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
percents="50 40 25"
procs=2
smems="max 0"
threads=1024
timeout_ms=5000
compile_only=0
while [ $# -gt 0 ]; do
    case "$1" in
    --percents) percents=${2:?}; shift ;;
    --procs) procs=${2:?}; shift ;;
    --smem) smems=${2:?}; shift ;;
    --threads) threads=${2:?}; shift ;;
    --timeout-ms) timeout_ms=${2:?}; shift ;;
    --compile-only) compile_only=1 ;;
    *) echo "mps_coop.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
for n in $percents $procs $threads $timeout_ms; do
    case $n in '' | *[!0-9]*) echo "mps_coop.sh: '$n' is not a number" >&2; exit 2 ;; esac
done
for m in $smems; do
    case $m in max | [0-9]*) ;; *) echo "mps_coop.sh: --smem takes max or bytes, not '$m'" >&2; exit 2 ;; esac
done
say() { echo "[mps_coop] $*"; }
# shellcheck source=tools.sh
source "$here/tools.sh"
# shellcheck source=mps.sh
source "$here/mps.sh"
NVCC=$(find_nvcc) || { say "nvcc not found (set NVCC or CUDA_HOME)"; exit 2; }
OUT=${OUT:-$PWD/mps-coop-out}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
bin=$OUT/mps_coop
lib=()
[ -f "$(dirname "$NVCC")/../lib/libcudart_static.a" ] && lib=(-L"$(cd "$(dirname "$NVCC")/../lib" && pwd)")
# shellcheck disable=SC2054 # the commas belong to nvcc's -gencode syntax
"$NVCC" -O2 -std=c++17 "${lib[@]}" -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -o "$bin" "$here/mps_coop.cu" >"$OUT/build.log" 2>&1 || { say "build failed:"; cat "$OUT/build.log"; exit 1; }
"$bin" --help >/dev/null 2>&1 || { say "$bin --help failed"; exit 1; }
if [ $compile_only = 1 ]; then
    say "compile-only: ok"
    exit 0
fi
[ "$(gpu_count)" -ge 1 ] || { say "no GPU"; exit 2; }

mps_start || { say "could not start the MPS daemon"; exit 2; }
started=$MPS_STARTED
trap '[ $started = 1 ] && mps_stop' EXIT
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

csv=$OUT/mps_coop.csv
echo "percent,procs,smem,sms_seen,blocks,per_sm,resident_all,waited_ms,started,distinct_sms,overlap" >"$csv"
status=0
for pct in $percents; do
    for m in $smems; do
        file=/dev/shm/mps_coop.$$.$pct.$m
        rm -f "$file"
        smem_arg=()
        [ "$m" != max ] && smem_arg=(--smem "$m")
        pids=()
        for ((k = 0; k < procs; k++)); do
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct timeout $((timeout_ms / 1000 + 30)) "$bin" --file "$file" \
                --me "$k" --procs "$procs" --threads "$threads" --timeout-ms "$timeout_ms" "${smem_arg[@]}" \
                >"$OUT/p$pct-$m-$k.txt" 2>&1 &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p"; done
        rm -f "$file"
        for ((k = 0; k < procs; k++)); do
            line=$(grep '^mps_coop me=' "$OUT/p$pct-$m-$k.txt")
            if [ -z "$line" ]; then
                say "$pct % smem $m process $k: no result: $(tail -n 2 "$OUT/p$pct-$m-$k.txt" | tr '\n' ' ')"
                status=1
                continue
            fi
            say "$pct % smem $m: $line"
            val() { echo "$line" | grep -o " $1=[^ ]*" | cut -d= -f2; }
            echo "$pct,$procs,$(val smem),$(val sms),$(val blocks),$(val per_sm),$(val resident_all),$(val waited_ms),$(val started | tr ',' ' '),$(val distinct_sms),$(val overlap)" >>"$csv"
        done
    done
done
say "CSV: $csv"
column -s, -t "$csv" 2>/dev/null || cat "$csv"
exit $status
