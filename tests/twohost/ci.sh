#!/usr/bin/env bash
# The two-host layout on one machine, host memory (CI): two network + UTS namespaces joined by a
# veth pair (tests/twohost/netns.sh), one rank in each, provider tcp over the veth. In order:
#   1. the namespaces answer (host names, addresses, a TCP connection across the veth);
#   2. the host harness, every case of ABI 4, one rank per namespace; the library must see two hosts
#      ("1 of 2 PEs on this host" in its log);
#   3. the host-memory stream benchmark: harness --bench (ABI 3, nbi puts, quiet every 64, data
#      checked after every size, host and proxy endpoint) in the same two namespaces; then the
#      staged path (NVSHMEM_EFA_GPU_STAGING=1: host memory staged the way GPU memory is for a PE
#      on another host: outbox, coalesced small puts, get answers), puts and gets, data checked;
#   4. raw libfabric in the same namespaces with the same window: fi_rma_bw -p "tcp;ofi_rxm" -o
#      write -W 64, server in one namespace, client in the other;
#   5. bytes really crossed the veth (its tx counters grew by at least what the puts moved).
# Asserts correctness (every case passes, data checked, fi_rma_bw completes), not speed; prints the
# bandwidth table and writes OUT/twohost-host.csv (layout,provider,endpoint,size_bytes,window,
# library_mbps,fabric_mbps,staged_put_mbps,staged_get_mbps) and OUT/twohost-host.log (commands,
# raw output). A few minutes at most.
#
#   bash tests/twohost/ci.sh            (root; .ci/env.sh's setup; builds what is missing)
# Environment: NVSHMEM_EFA_LIB (default target/release/libnvshmem_efa_gda.so, built when missing),
# LIBFABRIC_HOME (default .deps/libfabric), OUT (default ./twohost-out), SIZES (default
# "8 4096 65536 1048576 4194304"), BW_BYTES (bytes per size, default 67108864), TWOHOST_IP /
# TWOHOST_IP_LIBS (netns.sh).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# shellcheck disable=SC1091
source .ci/env.sh
LIBFABRIC_HOME=${LIBFABRIC_HOME:-$ROOT/.deps/libfabric}
FT_BIN=$LIBFABRIC_HOME/bin
export LD_LIBRARY_PATH="$LIBFABRIC_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUT=${OUT:-$ROOT/twohost-out}
SIZES=${SIZES:-"8 4096 65536 1048576 4194304"}
BW_BYTES=${BW_BYTES:-67108864}
WINDOW=64 # the harness's BENCH_WINDOW
mkdir -p "$OUT"
LOG=$OUT/twohost-host.log
CSV=$OUT/twohost-host.csv
: >"$LOG"
say() { echo "[twohost] $*"; }
fail() { say "FAILED: $*"; exit 1; }
START=$SECONDS

[ -x "$FT_BIN/fi_rma_bw" ] || fail "missing $FT_BIN/fi_rma_bw (fabtests; .ci/setup-libfabric.sh builds them)"
LIB=${NVSHMEM_EFA_LIB:-${CARGO_TARGET_DIR:-$ROOT/target}/release/libnvshmem_efa_gda.so}
if [ ! -f "$LIB" ]; then
    say "building the library (release)"
    cargo build --release --quiet --lib || fail "cargo build --release"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/twohost.XXXXXX")
HARNESS=$WORK/harness
cc -O2 -g -Wall -Werror -o "$HARNESS" tests/harness/harness.c -ldl || fail "building the harness"

# shellcheck source=tests/twohost/netns.sh
source tests/twohost/netns.sh
trap 'twohost_down; rm -rf "$WORK"' EXIT
twohost_up "thc$$" || fail "the namespaces could not be made (root with CAP_SYS_ADMIN and CAP_NET_ADMIN, iproute2, veth)"
twohost_check || fail "the namespaces do not answer"
say "1. namespaces: ${TH_HOST[0]} (${TH_ADDR[0]}) and ${TH_HOST[1]} (${TH_ADDR[1]}) over ${TH_IF[0]}; this host: $(uname -n)"

export FI_TCP_IFACE=${TH_IF[0]} NVSHMEM_LIBFABRIC_PROVIDER=tcp NVSHMEM_EFA_GDA=off
export HARNESS_RANK_NS="${TH_PID[0]},${TH_PID[1]}"
tx_bytes() { # I: bytes sent by namespace I's veth end
    th_ip_in "$1" -s link show dev "${TH_IF[$1]}" | awk '/TX:/ { getline; print $1; exit }'
}

# 2. every harness case, one rank per "host"
cmd=("$HARNESS" --lib "$LIB" --abi 4 --np 2)
{ echo "## harness cases: HARNESS_RANK_NS=$HARNESS_RANK_NS FI_TCP_IFACE=$FI_TCP_IFACE ${cmd[*]}"; } >>"$LOG"
NVSHMEM_EFA_LOG=warn,nvshmem_efa_gda::mover=debug timeout 300 "${cmd[@]}" >"$WORK/cases.out" 2>&1
rc=$?
cat "$WORK/cases.out" >>"$LOG"
grep -E '^(PASS|FAIL)|passed, [0-9]+ failed' "$WORK/cases.out" | sed 's/^/    /'
[ $rc = 0 ] && grep -q ' passed, 0 failed' "$WORK/cases.out" || fail "harness cases (exit status $rc; $LOG)"
n_two=$(grep -c 'PE [01]: 1 of 2 PEs on this host' "$WORK/cases.out")
[ "$n_two" -ge 2 ] || fail "the library did not see two hosts (no 'PE 0/1: 1 of 2 PEs on this host' lines; $LOG)"
say "2. harness cases: ok; both ranks saw 1 of 2 PEs on their host"

# 3. the host-memory stream: harness --bench, data checked after every size
tx0=$(tx_bytes 0)
list=$(echo $SIZES | tr ' ' ,)
cmd=("$HARNESS" --lib "$LIB" --abi 3 --np 2 --bench --bench-sizes "$list" --bench-bytes "$BW_BYTES" --csv "$WORK/lib.csv")
{ echo "## harness --bench: ${cmd[*]}"; } >>"$LOG"
: >"$WORK/lib.csv"
timeout 300 "${cmd[@]}" >"$WORK/bench.out" 2>&1
rc=$?
cat "$WORK/bench.out" >>"$LOG"
[ $rc = 0 ] && grep -q ' passed, 0 failed' "$WORK/bench.out" || { tail -n 20 "$WORK/bench.out"; fail "harness --bench (exit status $rc; $LOG)"; }
tx1=$(tx_bytes 0)
say "3. harness --bench: ok (received data checked after every size)"
for op in put get; do
    flag=()
    [ $op = get ] && flag=(--bench-get)
    cmd=(env NVSHMEM_EFA_GPU_STAGING=1 "$HARNESS" --lib "$LIB" --abi 3 --np 2 --bench "${flag[@]}" --bench-sizes "$list"
        --bench-bytes "${STAGED_BYTES:-16777216}" --csv "$WORK/staged-$op.csv")
    { echo "## staged $op: ${cmd[*]}"; } >>"$LOG"
    : >"$WORK/staged-$op.csv"
    timeout 300 "${cmd[@]}" >"$WORK/staged.out" 2>&1
    rc=$?
    cat "$WORK/staged.out" >>"$LOG"
    [ $rc = 0 ] && grep -q ' passed, 0 failed' "$WORK/staged.out" || { tail -n 20 "$WORK/staged.out"; fail "staged harness --bench $op (exit status $rc; $LOG)"; }
done
say "3b. staged puts and gets (NVSHMEM_EFA_GPU_STAGING=1): ok (data checked after every size)"

# 4. fi_rma_bw, same namespaces, same window
fab() { # SIZE ITERS -> MB/s of the client's line
    local r
    r=$(twohost_fi_rma_bw "$FT_BIN/fi_rma_bw" "$LOG" "$WORK" "$WINDOW" write "$1" "$2") || return 1
    echo "${r%% *}"
}
echo "layout,provider,endpoint,size_bytes,window,library_mbps,fabric_mbps,staged_put_mbps,staged_get_mbps" >"$CSV"
rows=()
for size in $SIZES; do
    iters=$((BW_BYTES / size))
    [ $iters -gt 10000 ] && iters=10000
    [ $iters -lt 100 ] && iters=100
    f=$(fab "$size" "$iters") || fail "fi_rma_bw at $size bytes ($LOG)"
    [ -n "$f" ] || fail "no fi_rma_bw figure at $size bytes ($LOG)"
    for ep in host proxy; do
        l=$(awk -F, -v e="$ep" -v s="$size" '$1 == "transport" && $4 == e && $5 == s { v = $7 } END { print v }' "$WORK/lib.csv")
        [ -n "$l" ] || fail "no library figure for $ep at $size bytes ($WORK/lib.csv)"
        sp=$(awk -F, -v e="$ep" -v s="$size" '$1 ~ /^transport/ && $4 == e && $5 == s { v = $7 } END { print v }' "$WORK/staged-put.csv")
        sg=$(awk -F, -v e="$ep" -v s="$size" '$1 ~ /^transport/ && $4 == e && $5 == s { v = $7 } END { print v }' "$WORK/staged-get.csv")
        [ -n "$sp" ] && [ -n "$sg" ] || fail "no staged figure for $ep at $size bytes ($WORK/staged-*.csv)"
        echo "two-host,tcp,$ep,$size,$WINDOW,$l,$f,$sp,$sg" >>"$CSV"
        rows+=("$(printf '%-6s %10s %8s %14.2f %14.2f %7.2f %12.2f %12.2f' "$ep" "$size" "$WINDOW" "$l" "$f" "$(awk -v a="$l" -v b="$f" 'BEGIN { print (b > 0 ? a / b : 0) }')" "$sp" "$sg")")
    done
done
say "4. fi_rma_bw in the same namespaces: ok"

# 5. the puts crossed the veth: at least the bytes the timed puts moved, from namespace 0
moved=$(awk -F, '$1 == "transport" { s += $5 * $6 } END { printf "%.0f", s }' "$WORK/lib.csv")
sent=$((tx1 - tx0))
[ "$sent" -ge "$moved" ] || fail "namespace 0 sent $sent bytes over ${TH_IF[0]} during the benchmark, less than the $moved bytes put"
say "5. ${TH_IF[0]} of ${TH_HOST[0]} sent $sent bytes during the benchmark (puts: $moved bytes)"

echo
echo "two-host layout, host memory, tcp over a veth pair; nbi puts, quiet every $WINDOW (library: harness --bench) vs fi_rma_bw -W $WINDOW; MB/s"
printf '%-6s %10s %8s %14s %14s %7s %12s %12s\n' endpoint size window library fi_rma_bw ratio staged_put staged_get
printf '%s\n' "${rows[@]}"
echo "csv: $CSV   log: $LOG   elapsed: $((SECONDS - START)) s"
say "RESULT: ok"
