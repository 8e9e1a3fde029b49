#!/usr/bin/env bash
# The main job, shown to a newcomer: the plugin moving data between processes, then what it costs.
#  0. What this machine offers (nvshmem-efa-gda info).
#  1. CPU: the host harness loads the library exactly as NVSHMEM does (dlopen by the plugin file name,
#     nvshmemt_init with each served ABI, bootstrap over local sockets) and moves and verifies data
#     between 4 processes over tcp;ofi_rxm and shm. One line per run; the full output (including the
#     harness's deliberate bad-version probe, which the library rightly logs as an error) goes to a
#     log that is printed only if the run fails. The whole suite, bad input included, is in the tests.
#  2. Measurements per provider (tcp, shm), each the median of DEMO_REPS (5) runs, then one table:
#     the library's put bandwidth at 1 MiB next to fi_rma_bw measured the same way (one way, window
#     64, delivery complete, initiator side), 8-byte delivered-put latency next to libfabric's write
#     round trip, the AMO rate, the GDA software-queue rate, with one line per row saying what it is.
#  3. GPU (where nvidia-smi lists a GPU and NVSHMEM is installed): the NVSHMEM test suite and benchmark
#     with the library as NVSHMEM's transport (tests/gpu/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
bash .ci/clean-shm.sh
root=$PWD
target=${CARGO_TARGET_DIR:-$root/target}
echo "=== building (cargo build --release)"
cargo build --release --locked --quiet
prefix=$target/demo-prefix
PREFIX=$prefix bash cmake/install.sh --build-dir "$target/release" >/dev/null
# softq-bench drives the software queue with the test-support poster (a CPU thread posting WQEs as
# kernels do), so it is built with that feature, after the plain library was installed above.
cargo build --release --locked --quiet --features test-support --bin softq-bench
work=$(mktemp -d)
cc -O2 -Wall -o "$work/harness" tests/harness/harness.c -ldl
logs=${DEMO_LOGS:-$target/demo-logs}
mkdir -p "$logs"
t_start=$SECONDS
# Regions of the demo's processes that did not get to close their endpoints.
trap 'rm -rf "$work"; bash .ci/clean-shm.sh' EXIT

echo
echo "=== 0. what this machine offers (nvshmem-efa-gda info; exit 0 ready, 3/4 NVSHMEM not served/found)"
"$target/release/nvshmem-efa-gda" info || echo "(info exit status $?)"

echo
echo "=== 1. the plugin moving data: host harness, 4 processes, loaded as NVSHMEM loads it"
cases=(--case put --case put_nbi --case get --case p --case amo --case contention --case proxy_put_get)
for abi in 3 4; do
  extra=()
  [ "$abi" = 4 ] && extra=(--case put_signal)
  for prov in tcp shm; do
    log=$logs/harness-abi$abi-$prov.log
    rc=0
    NVSHMEM_LIBFABRIC_PROVIDER=$prov NVSHMEM_EFA_GDA=off \
      timeout 300 "$work/harness" --lib "$prefix/lib/nvshmem_transport_libfabric.so.$abi" --abi "$abi" --np 4 \
      "${cases[@]}" "${extra[@]}" > "$log" 2>&1 || rc=$?
    summary=$(tail -1 "$log")
    moved=$(sed -n 's/^PASS \([a-z_]*\) .*/\1/p' "$log" | grep -vx 'bad_version\|init\|connect\|register\|finalize' | tr '\n' ' ')
    printf '  ABI %s  %-3s  %s: %s\n' "$abi" "$prov" "$summary" "$moved"
    if [ "$rc" -ne 0 ]; then
      echo "  FAILED (exit $rc): $log"
      cat "$log"
      exit 1
    fi
  done
done

echo
reps=${DEMO_REPS:-5}
t_bench=$SECONDS
echo "=== 2. measurements: 2 processes, host memory, each figure the median of $reps runs (min-max after it)"
source tests/bench/lib.sh
LOG=$logs/bench.log
: > "$LOG"
WORK=$work
PIDS=()
RUN_TIMEOUT=60
# No pinning: the harness's two ranks cannot be pinned one CPU each, so fi_rma_bw is not either.
PIN=${PIN:-0}
bench_pins
ft=$LIBFABRIC_HOME/bin
# Bandwidth runs move 1 GiB in 1 MiB puts (0.3-1 s each at this machine's 1-4 GB/s), a window of 64
# puts in flight, 10 warm-up puts: the library (host harness --bench, rank 0 -> rank 1, nbi puts,
# quiet every 64: its puts are delivery complete) and libfabric itself (fi_rma_bw -o writedata -U:
# one way, client -> server, delivery complete, the client waits for each window's completions;
# -c sread: its waits block instead of busy-polling, see below). Both figures are the initiator's
# bytes over its own time from the first timed put to the last completion. (fi_rma_bw -o write is
# not the same measure: both of its sides write at once.) Waiting: the library's waiting threads
# yield the CPU (sched_yield) and its target rank sleeps in the bootstrap; fabtests' default
# (-c spin) busy-polls on both sides without yielding, which on 2 cores takes the CPU from the
# kernel's TCP work or the shm copy: measured 2026-11-28, fi_rma_bw -c spin gave 0.2-0.3x of
# -c sread on tcp (shm: 0.3x in one pair, 1.2x in another), and with -c spin the library looked
# 2-5x faster than its fabric (docs/testing.md).
bw_bytes=$((1 << 30))
fab() { # tool provider size iters field [flags]
  OOB_PORT=$(( 40000 + RANDOM % 20000 ))
  local args=(-p "$(ft_prov "$2")" -E="$OOB_PORT" -S "$3" -I "$4" -w 10 -m "${@:6}")
  [ "$1" = fi_rma_bw ] && args+=(-W 64)
  run_pair "$1 $2 $3 ${*:6}" "$ft/$1" "${args[@]}" -- "$ft/$1" "${args[@]}" 127.0.0.1 |
    sed -n "s/.*xfer_size: $3,.* $5: \([0-9.]*\),.*/\1/p"
}
val() { awk -F, -v k="$1" -v p="$2" -v s="$3" -v f="$4" '$1 == k && $2 == p && $4 == "host" && $5 == s { v = $f } END { print v }' "$5"; }
# summ FORMAT VALUES...: "median (min-max)" in FORMAT, or nothing when a value is missing.
summ() {
  local fmt=$1
  shift
  [ "$#" -eq "$reps" ] || return 0
  printf '%s\n' "$@" | sort -g | awk -v f="$fmt" '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf f " (" f "-" f ")", m, v[1], v[NR] }'
}
median() { echo "${1%% *}"; }
declare -A R
for prov in tcp shm; do
  bw=() lat=() amo=() fbw=() flat=() sq=()
  echo "  $prov: library (harness --bench-lat-amo), fi_rma_bw, fi_rma_pingpong, softq-bench; $reps runs each ..."
  for r in $(seq "$reps"); do
    csv=$work/bench-$prov-$r.csv
    echo "## transport $prov run $r" >> "$LOG"
    NVSHMEM_LIBFABRIC_PROVIDER=$prov NVSHMEM_EFA_GDA=off "${BOTH_PIN[@]}" timeout 300 "$work/harness" \
      --lib "$prefix/lib/nvshmem_transport_libfabric.so.3" --abi 3 --np 2 --bench-lat-amo \
      --bench-sizes 1048576 --bench-bytes "$bw_bytes" --csv "$csv" >> "$LOG" 2>&1 ||
      { echo "transport bench on $prov failed: $LOG"; tail -20 "$LOG"; exit 1; }
    bw+=("$(val transport "$prov" 1048576 7 "$csv")")
    lat+=("$(val transport_lat "$prov" 8 7 "$csv")")
    amo+=("$(val transport_amo "$prov" 8 7 "$csv")")
    fbw+=("$(fab fi_rma_bw "$prov" 1048576 $((bw_bytes >> 20)) 'MB\/sec' -o writedata -U -c sread)")
    # fi_rma_pingpong reports half a round trip; a delivered put is a whole one (data out, ack back).
    half=$(fab fi_rma_pingpong "$prov" 8 10000 'usec\/xfer' -o write)
    [ -z "$half" ] || flat+=("$(awk -v h="$half" 'BEGIN { printf "%.2f", 2 * h }')")
    "$target/release/softq-bench" --provider "$prov" --sizes 8 --threads 1 --seconds 1 \
      --csv "$work/softq-$prov-$r.csv" >> "$LOG" 2>&1 || { echo "softq-bench on $prov failed: $LOG"; exit 1; }
    sq+=("$(awk -F, 'NR == 2 { printf "%.3f", $6 / 1e6 }' "$work/softq-$prov-$r.csv")")
  done
  R[$prov,bw]=$(summ %.0f "${bw[@]}") R[$prov,fbw]=$(summ %.0f "${fbw[@]}")
  R[$prov,lat]=$(summ %.1f "${lat[@]}") R[$prov,flat]=$(summ %.1f "${flat[@]}")
  R[$prov,amo]=$(summ %.4f "${amo[@]}") R[$prov,sq]=$(summ %.3f "${sq[@]}")
  for k in bw lat amo fbw flat sq; do
    [ -n "${R[$prov,$k]}" ] || { echo "fewer than $reps $k results for $prov: $LOG"; exit 1; }
  done
done

gpu_note="no GPU here: the NVSHMEM GPU suite did not run (tests/gpu/run.sh runs it where one exists)"
if command -v nvidia-smi >/dev/null && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 1 ]; then
  echo
  echo "=== 3. GPU: NVSHMEM 3.4.5 with the library as its remote transport (tests/gpu/run.sh)"
  if PLUGIN_DIR=$prefix/lib LIBFABRIC_HOME=$LIBFABRIC_HOME OUT=${OUT:-$root/gpu-out} bash tests/gpu/run.sh; then
    gpu_note="NVSHMEM GPU suite: passed (logs in ${OUT:-$root/gpu-out})"
  else
    gpu_note="NVSHMEM GPU suite: FAILED (logs in ${OUT:-$root/gpu-out})"
    gpu_failed=1
  fi
fi

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
echo
echo "=== summary: $(nproc) CPU cores, libfabric $(pkg-config --modversion libfabric 2>/dev/null || echo '?'), measurements $(( SECONDS - t_bench )) s"
row() { printf '  %-44s %-26s %-26s\n' "$@"; }
row "" "tcp (tcp;ofi_rxm)" "shm"
for spec in "bw|put 1 MiB, library, MB/s" "fbw|put 1 MiB, libfabric fi_rma_bw, MB/s" \
            "lat|8 B put delivered, library, us" "flat|8 B write round trip, libfabric, us" \
            "amo|64-bit ADD, library, Mops/s" "sq|GDA software queue 8 B, Mmsg/s"; do
  k=${spec%%|*}
  row "${spec#*|}" "${R[tcp,$k]}" "${R[shm,$k]}"
done
# spread "median (min-max)": max / min
spread() { echo "$1" | sed 's/.*(\(.*\)-\(.*\))/\1 \2/' | awk '{ if ($1 > 0) printf "%.1f", $2 / $1; else print 99 }'; }
for prov in tcp shm; do
  r_bw=$(ratio "$(median "${R[$prov,bw]}")" "$(median "${R[$prov,fbw]}")")
  r_lat=$(ratio "$(median "${R[$prov,lat]}")" "$(median "${R[$prov,flat]}")")
  echo "  $prov: library / libfabric: bandwidth $r_bw, latency $r_lat"
  # The library runs on libfabric: above it means the runs did not measure what they should.
  if awk -v r="$r_bw" 'BEGIN { exit !(r > 1.1) }'; then
    echo "  WARNING: $prov: the library's put bandwidth is above libfabric's ($r_bw x), which it runs on:" \
      "not a result (spreads ${R[$prov,bw]} / ${R[$prov,fbw]}); re-run on an idle machine"
  fi
  for k in bw fbw lat flat; do
    if awk -v x="$(spread "${R[$prov,$k]}")" 'BEGIN { exit !(x > 1.5) }'; then
      echo "  WARNING: $prov $k: runs spread ${R[$prov,$k]} (max/min $(spread "${R[$prov,$k]}")): the machine was busy"
    fi
  done
done
load=$(cut -d' ' -f1 /proc/loadavg)
echo "  load average at the end: $load on $(nproc) cores"
cat <<NOTES
What each row means (figures: median of $reps runs, min-max in brackets):
  put 1 MiB, library: rank 0 puts 1 GiB to rank 1 through NVSHMEM's transport ABI (non-blocking puts,
    quiet every 64, so 64 in flight; the library's puts are delivery complete); initiator's MB/s.
  put 1 MiB, libfabric: fi_rma_bw -o writedata -U -c sread -W 64, 1 GiB one way, delivery
    complete, blocking waits, same libfabric and provider; client's MB/s. The library runs on top of
    it, so it should not exceed it; a ratio near 1 means the transport adds little on this path.
  8 B put delivered, library: one blocking put + quiet, i.e. until the target has the data.
  8 B write round trip, libfabric: 2 x fi_rma_pingpong's half round trip (write there, write back).
  64-bit ADD: non-fetching atomics through the transport, quiet every 64, the counter checked after.
  GDA software queue: 8-byte RDMA-write WQEs per second through the software EFA queue, one CPU
    thread posting them as a GPU kernel would (softq-bench, 1 s per run).
  Runs share $(nproc) cores with the progress threads of both sides; the min-max says how steady
    they were, and other work on the machine widens it (warnings above when max/min > 1.5).
$gpu_note
Logs: $logs
Demo stages (after the build): $(( SECONDS - t_start )) s
NOTES
[ -z "${gpu_failed:-}" ]
