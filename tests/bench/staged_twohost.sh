#!/usr/bin/env bash
# The staged path in the two-host layout with host memory: one rank per network + UTS namespace
# (tests/twohost/netns.sh), provider tcp over the veth, NVSHMEM_EFA_GPU_STAGING=1 (host memory is
# staged the way GPU memory is for a PE on another host). Non-blocking puts (harness --bench) and
# gets (--bench-get), k = 64 in flight then one quiet, data checked after every size, for one or
# more builds of the library; and raw libfabric in the same namespaces with the same window
# (fi_rma_bw -p "tcp;ofi_rxm" -o write / -o read -W 64, host memory: what bounds a staged path).
# Each configuration runs REPS times; the best bandwidth is kept (other load only slows a run).
#
#   bash tests/bench/staged_twohost.sh [LABEL=LIB ...]   (root; default: this tree's release build)
#
# Writes $OUT/staged_twohost.csv with the columns of issue 26's stream-compare.csv:
#   label,layout,provider,op,endpoint,size_bytes,window,library_gbps,library_mops,fabric_gbps,p2p_gbps
# (p2p_gbps empty: no NVSHMEM P2P with host memory), and prints a table with library/fabric ratios.
# OPS may also name "amo": the harness's --bench-lat-amo with target-applied atomics
# (NVSHMEM_EFA_ATOMICS=target, the way AMOs on GPU memory go to another host): rows op amo_add
# (non-fetching ADDs, a quiet every 64: library_mops) and put_lat (8-byte blocking put + quiet:
# library_mops = 1 / latency in us); no fabric figure for those.
# Environment: OUT (bench-out), OPS ("put get"), REPS (3), SIZES ("8 4096 32768 65536 1048576
# 2097152 4194304 16777216"), BYTES (33554432 per size and endpoint), TWOHOST_IP / TWOHOST_IP_LIBS.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# shellcheck disable=SC1091
source .ci/env.sh
LIBFABRIC_HOME=${LIBFABRIC_HOME:-$ROOT/.deps/libfabric}
FT_BIN=$LIBFABRIC_HOME/bin
export LD_LIBRARY_PATH="$LIBFABRIC_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OPS=${OPS:-"put get"}
REPS=${REPS:-3}
SIZES=${SIZES:-"8 4096 32768 65536 1048576 2097152 4194304 16777216"}
BYTES=${BYTES:-33554432}
OUT=${OUT:-$ROOT/bench-out}
WINDOW=64 # the harness's BENCH_WINDOW
mkdir -p "$OUT"
say() { echo "[staged-twohost] $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

[ -x "$FT_BIN/fi_rma_bw" ] || fail "missing $FT_BIN/fi_rma_bw (fabtests; .ci/setup-libfabric.sh builds them)"
LIBS=("$@")
if ((${#LIBS[@]} == 0)); then
    lib=${CARGO_TARGET_DIR:-$ROOT/target}/release/libnvshmem_efa_gda.so
    [[ -f $lib ]] || cargo build --release --quiet --lib || fail "cargo build --release"
    LIBS=("tree=$lib")
fi
for l in "${LIBS[@]}"; do
    [[ $l == *=* && -f ${l#*=} ]] || fail "not LABEL=LIB with an existing library: $l"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/staged-twohost.XXXXXX")
HARNESS=$WORK/harness
cc -O2 -g -Wall -Werror -o "$HARNESS" tests/harness/harness.c -ldl || fail "building the harness"
# shellcheck source=tests/twohost/netns.sh
source tests/twohost/netns.sh
trap 'twohost_down; rm -rf "$WORK"' EXIT
twohost_up "sth$$" || fail "the namespaces could not be made (root, CAP_SYS_ADMIN, CAP_NET_ADMIN, iproute2, veth)"
twohost_check || fail "the namespaces do not answer"
export FI_TCP_IFACE=${TH_IF[0]} NVSHMEM_LIBFABRIC_PROVIDER=tcp NVSHMEM_EFA_GDA=off
export HARNESS_RANK_NS="${TH_PID[0]},${TH_PID[1]}"
LOG=$OUT/staged_twohost.log
: >"$LOG"

# fi_rma_bw OP SIZE ITERS -> "MB/s Mmsg/s" of the client's line (write: client writes the server;
# read: client reads from it, as rank 0 reads rank 1 in --bench-get).
fab() {
    twohost_fi_rma_bw "$FT_BIN/fi_rma_bw" "$LOG" "$WORK" "$WINDOW" "$@"
}

RAW=$WORK/raw.csv
FAB=$WORK/fab.csv
: >"$RAW"
: >"$FAB"
list=$(echo $SIZES | tr ' ' ,)
for rep in $(seq "$REPS"); do
    for op in $OPS; do
        # The builds take turns, so a burst of load hits all of them alike.
        for l in "${LIBS[@]}"; do
            label=${l%%=*} lib=${l#*=}
            if [[ $op == amo ]]; then
                : >"$WORK/one.csv"
                cmd=(env NVSHMEM_EFA_GPU_STAGING=1 NVSHMEM_EFA_ATOMICS=target "$HARNESS" --lib "$lib" --abi 3
                    --np 2 --bench --bench-sizes 8 --bench-bytes 65536 --bench-lat-amo --csv "$WORK/one.csv")
                say "run $rep: $label amo"
                echo "## run $rep $label amo: ${cmd[*]}" >>"$LOG"
                timeout 600 "${cmd[@]}" >"$WORK/out.txt" 2>&1
                rc=$?
                cat "$WORK/out.txt" >>"$LOG"
                [ $rc = 0 ] && grep -q ' passed, 0 failed' "$WORK/out.txt" ||
                    { tail -n 20 "$WORK/out.txt" >&2; fail "harness ($label amo, exit status $rc; $LOG)"; }
                # As MB/s-like figures: amo Mops x 8 bytes, latency as 8 / us (so "best" is the max).
                awk -F, -v l="$label" '$1 == "transport_amo" { print l ",amo_add,host,8," $7 * 8 }
                    $1 == "transport_lat" && $7 > 0 { print l ",put_lat,host,8," 8 / $7 }' "$WORK/one.csv" >>"$RAW"
                continue
            fi
            flag=()
            [[ $op == get ]] && flag=(--bench-get)
            : >"$WORK/one.csv"
            cmd=(env NVSHMEM_EFA_GPU_STAGING=1 "$HARNESS" --lib "$lib" --abi 3 --np 2 --bench "${flag[@]}"
                --bench-sizes "$list" --bench-bytes "$BYTES" --csv "$WORK/one.csv")
            say "run $rep: $label $op"
            echo "## run $rep $label $op: HARNESS_RANK_NS=$HARNESS_RANK_NS FI_TCP_IFACE=$FI_TCP_IFACE ${cmd[*]}" >>"$LOG"
            timeout 600 "${cmd[@]}" >"$WORK/out.txt" 2>&1
            rc=$?
            cat "$WORK/out.txt" >>"$LOG"
            [ $rc = 0 ] && grep -q ' passed, 0 failed' "$WORK/out.txt" ||
                { tail -n 20 "$WORK/out.txt" >&2; fail "harness ($label $op, exit status $rc; $LOG)"; }
            # transport,PROVIDER,ABI,ENDPOINT,SIZE,ITERS,MBPS
            awk -F, -v l="$label" -v o="$op" '$1 ~ /^transport/ { print l "," o "," $4 "," $5 "," $7 }' \
                "$WORK/one.csv" >>"$RAW"
        done
        [[ $op == amo ]] && continue
        for size in $SIZES; do
            iters=$((BYTES / size))
            ((iters > 20000)) && iters=20000
            ((iters < 100)) && iters=100
            fop=write
            [[ $op == get ]] && fop=read
            f=$(fab "$fop" "$size" "$iters") || fail "fi_rma_bw $fop at $size bytes ($LOG)"
            [ -n "$f" ] || fail "no fi_rma_bw figure at $size bytes ($LOG)"
            echo "$op,$size,${f% *},${f#* }" >>"$FAB"
        done
    done
done

CSV=$OUT/staged_twohost.csv
echo "label,layout,provider,op,endpoint,size_bytes,window,library_gbps,library_mops,fabric_gbps,p2p_gbps" >"$CSV"
# Best of the runs: library per (label, op, endpoint, size), fabric per (op, size).
awk -F, -v w="$WINDOW" '
    FNR == NR { k = $1 "," $2; if (!(k in fb) || $3 > fb[k]) fb[k] = $3; next }
    { k = $1 "," $2 "," $3 "," $4; if (!(k in b) || $5 > b[k]) b[k] = $5; op[k] = $2; sz[k] = $4 }
    END {
        for (k in b) {
            split(k, p, ",")
            f = (op[k] "," sz[k]) in fb ? fb[op[k] "," sz[k]] : 0
            printf "%s,two-host,tcp,%s,%s,%s,%d,%.4f,%.4f,%.4f,\n", p[1], p[2], p[3], p[4], w,
                b[k] / 1000, b[k] / sz[k], f / 1000
        }
    }' "$FAB" "$RAW" | sort -t, -k1,1 -k4,4 -k5,5 -k6,6n >>"$CSV"
echo
echo "staged path, two-host layout (tcp over a veth), host memory, k = $WINDOW in flight then quiet;"
echo "best of $REPS runs ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)); GB/s = 1e9 B/s"
awk -F, 'NR > 1 { printf "%-8s %-4s %-6s %10s %10.4f %10.4f %10.4f %6.2f\n", $1, $4, $5, $6, $8, $9, $10, ($10 > 0 ? $8 / $10 : 0) }
         NR == 1 { printf "%-8s %-4s %-6s %10s %10s %10s %10s %6s\n", "label", "op", "ep", "size", "lib_GB/s", "lib_Mops", "fab_GB/s", "ratio" }' "$CSV"
echo "csv: $CSV   log: $LOG"
