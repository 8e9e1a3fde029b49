#!/usr/bin/env bash
# The main job, shown to a newcomer: the plugin moving data between processes, then what it costs.
#  0. What this machine offers (nvshmem-efa-gda info).
#  1. CPU: the host harness loads the library exactly as NVSHMEM does (dlopen by the plugin file name,
#     nvshmemt_init with each served ABI, bootstrap over local sockets) and moves and verifies data
#     between 4 processes over tcp;ofi_rxm and shm. One line per run; the full output (including the
#     harness's deliberate bad-version probe, which the library rightly logs as an error) goes to a
#     log that is printed only if the run fails. The whole suite, bad input included, is in the tests.
#  2. Measurements per provider (tcp, shm), then one table: transport put bandwidth at 1 MiB next to
#     fi_rma_bw on the same libfabric, 8-byte put latency, the AMO rate, the GDA software-queue rate.
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
trap 'rm -rf "$work"' EXIT
cc -O2 -Wall -o "$work/harness" tests/harness/harness.c -ldl
logs=${DEMO_LOGS:-$target/demo-logs}
mkdir -p "$logs"
t_start=$SECONDS

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
echo "=== 2. measurements (2 processes, host memory; each number is one short run)"
source tests/bench/lib.sh
LOG=$logs/bench.log
: > "$LOG"
WORK=$work
PIDS=()
RUN_TIMEOUT=60
bench_pins
ft=$LIBFABRIC_HOME/bin
csv=$work/bench.csv
: > "$csv"
fab() { # tool provider size iters field [flags]
  OOB_PORT=$(( 40000 + RANDOM % 20000 ))
  local args=(-p "$(ft_prov "$2")" -E="$OOB_PORT" -o write -S "$3" -I "$4" -w 10 -m "${@:6}")
  [ "$1" = fi_rma_bw ] && args+=(-W 64)
  run_pair "$1 $2 $3 ${*:6}" "$ft/$1" "${args[@]}" -- "$ft/$1" "${args[@]}" 127.0.0.1 |
    sed -n "s/.*xfer_size: $3,.* $5: \([0-9.]*\),.*/\1/p"
}
val() { awk -F, -v k="$1" -v p="$2" -v s="$3" -v f="$4" '$1 == k && $2 == p && $4 == "host" && $5 == s { v = $f } END { print v }' "$csv"; }
declare -A R
for prov in tcp shm; do
  echo "  $prov: transport (harness --bench-lat-amo) ..."
  { echo "## transport $prov"; } >> "$LOG"
  NVSHMEM_LIBFABRIC_PROVIDER=$prov NVSHMEM_EFA_GDA=off "${BOTH_PIN[@]}" timeout 300 "$work/harness" \
    --lib "$prefix/lib/nvshmem_transport_libfabric.so.3" --abi 3 --np 2 --bench-lat-amo \
    --bench-sizes 1048576 --bench-bytes 268435456 --csv "$csv" >> "$LOG" 2>&1 ||
    { echo "transport bench on $prov failed: $LOG"; tail -20 "$LOG"; exit 1; }
  R[$prov,bw]=$(val transport "$prov" 1048576 7)
  R[$prov,lat]=$(val transport_lat "$prov" 8 7)
  R[$prov,amo]=$(val transport_amo "$prov" 8 7)
  echo "  $prov: fi_rma_bw, fi_rma_pingpong ..."
  R[$prov,fbw]=$(fab fi_rma_bw "$prov" 1048576 256 'MB\/sec') || R[$prov,fbw]=
  R[$prov,fbwdc]=$(fab fi_rma_bw "$prov" 1048576 256 'MB\/sec' -U) || R[$prov,fbwdc]=
  R[$prov,flat]=$(fab fi_rma_pingpong "$prov" 8 2000 'usec\/xfer') || R[$prov,flat]=
  echo "  $prov: GDA software queue (softq-bench) ..."
  "$target/release/softq-bench" --provider "$prov" --sizes 8 --threads 1 --seconds 1.5 \
    --csv "$work/softq-$prov.csv" >> "$LOG" 2>&1 || { echo "softq-bench on $prov failed: $LOG"; exit 1; }
  R[$prov,sq]=$(awk -F, 'NR == 2 { printf "%.3f", $6 / 1e6 }' "$work/softq-$prov.csv")
  for k in bw lat amo fbw fbwdc flat sq; do
    [ -n "${R[$prov,$k]}" ] || { echo "no $k result for $prov: $LOG"; exit 1; }
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
echo "=== summary: $(nproc) CPU cores, libfabric $(pkg-config --modversion libfabric 2>/dev/null || echo '?'), $(( SECONDS - t_start )) s"
printf '%-8s | %-28s | %-26s | %-15s | %-15s\n' "provider" "put 1 MiB, MB/s" "8 B put latency, us" "AMO rate" "GDA soft queue"
printf '%-8s | %-28s | %-26s | %-15s | %-15s\n' "" "library / fi_rma_bw (-U)" "library / fi_rma_pingpong" "Mops/s" "8 B, Mmsg/s"
printf '%s\n' "---------+------------------------------+----------------------------+-----------------+----------------"
for prov in tcp shm; do
  printf '%-8s | %-28s | %-26s | %-15s | %-15s\n' "$prov" \
    "$(printf '%.0f / %.0f (%.0f)' "${R[$prov,bw]}" "${R[$prov,fbw]}" "${R[$prov,fbwdc]}")" \
    "$(printf '%.1f / %.1f' "${R[$prov,lat]}" "${R[$prov,flat]}")" \
    "$(printf '%.4f' "${R[$prov,amo]}")" "${R[$prov,sq]}"
done
cat <<NOTES
put 1 MiB: the library's non-blocking puts through NVSHMEM's transport ABI (quiet every 64) vs raw
  libfabric fi_rma_bw -W 64 (-U: delivery complete, which the library's puts are) on the same provider.
8 B put latency: library = one blocking put + quiet (until delivered at the target);
  fi_rma_pingpong = half a write round trip. Not the same measure: the library's includes a completion.
AMO rate: 64-bit non-fetching ADDs through the transport, quiet every 64, counter checked at the target.
GDA soft queue: 8-byte RDMA-write WQEs per second through the software EFA queue (one CPU thread posts
  as a GPU would; softq-bench). Single short runs on $(nproc) shared cores: expect +-30% and more.
$gpu_note
Logs: $logs
NOTES
[ -z "${gpu_failed:-}" ]
