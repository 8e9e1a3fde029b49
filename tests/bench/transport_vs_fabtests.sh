#!/usr/bin/env bash
# Puts the whole transport (libnvshmem_efa_gda.so driven through its NVSHMEM ABI by the host
# harness, tests/harness/harness.c --bench) next to raw libfabric (fi_rma_bw from the same libfabric
# build) on the same provider, in the same run, on one machine:
#
#   transport   harness --abi 3 --np 2 --bench   rank 0 -> rank 1, host_ops.rma PUT nbi, quiet every 64
#   fabtests    fi_rma_bw -o write -W 64         (and again with -U: delivery complete, which the
#                                                  library asks for)
#
# Put bandwidth in MB/s (10^6 B/s). The transport runs once per provider with every size (each size
# stops after ~2 s or BW_BYTES bytes, after a warm-up of 10 puts), on the host endpoint (column
# transport) and the proxy endpoint (column proxy); fi_rma_bw runs as its own server/client pair per
# size with the iteration count of fabric_vs_fabtests.sh (BW_BYTES / size, within 100..10000),
# warm-up 10, window 64. tcp is tcp;ofi_rxm on the loopback interface (FI_TCP_IFACE=lo); shm needs
# no address (fabtests still exchanges addresses over a loopback socket, -E). ratio = transport /
# fabtests (>1: the transport is faster), ratio_dc = transport / fabtests -U, ratio_proxy_dc =
# proxy / fabtests -U. Prints one table and writes bench-out/transport_vs_fabtests.csv; the exact
# commands and raw outputs go to bench-out/transport_vs_fabtests.log.
#
# Pinning (PIN=1, the default where taskset exists and there are 2 CPUs or more): fi_rma_bw's server
# on CPU 0 and client on CPU 1, as fabric_vs_fabtests.sh does; the harness (both ranks, with the
# library's progress threads) on CPUs 0 and 1 together.
#
# Environment: NVSHMEM_EFA_LIB (the library; default target/release/libnvshmem_efa_gda.so, built
# with cargo build --release when missing), LIBFABRIC_HOME (default .deps/libfabric), PROVIDERS
# ("tcp shm"), BW_SIZES ("8 4096 65536 1048576 4194304"), BW_BYTES (268435456), RUN_TIMEOUT (s per
# fi_rma_bw process, 60), PIN.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$ROOT/.ci/env.sh"
LIBFABRIC_HOME=${LIBFABRIC_HOME:-$ROOT/.deps/libfabric}
FT_BIN=${FT_BIN:-$LIBFABRIC_HOME/bin}
export LD_LIBRARY_PATH="$LIBFABRIC_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo}

PROVIDERS=${PROVIDERS:-"tcp shm"}
BW_SIZES=${BW_SIZES:-"8 4096 65536 1048576 4194304"}
BW_BYTES=${BW_BYTES:-268435456}
WINDOW=64 # the harness's BENCH_WINDOW
WARMUP=10 # the harness's BENCH_WARMUP
RUN_TIMEOUT=${RUN_TIMEOUT:-60}
# shellcheck source=tests/bench/lib.sh
source "$ROOT/tests/bench/lib.sh"
bench_pins
OUT=${OUT:-$ROOT/bench-out}
CSV=$OUT/transport_vs_fabtests.csv
LOG=$OUT/transport_vs_fabtests.log

mkdir -p "$OUT"
: > "$LOG"
START=$(date +%s)

[[ -x $FT_BIN/fi_rma_bw ]] || { echo "missing $FT_BIN/fi_rma_bw (fabtests)" >&2; exit 1; }

LIB=${NVSHMEM_EFA_LIB:-${CARGO_TARGET_DIR:-$ROOT/target}/release/libnvshmem_efa_gda.so}
if [[ ! -f $LIB ]]; then
    echo "building the library (release)..." >&2
    (cd "$ROOT" && cargo build --release --quiet --lib)
fi
[[ -f $LIB ]] || { echo "no library at $LIB" >&2; exit 1; }

bench_workdir transport-bench

HARNESS=$WORK/harness
cc -O2 -g -Wall -Werror -o "$HARNESS" "$ROOT/tests/harness/harness.c" -ldl

fabtests() { # provider size iters [extra fi_rma_bw flags]
    OOB_PORT=$(( 40000 + RANDOM % 20000 ))
    local args=(-p "$(ft_prov "$1")" -E="$OOB_PORT" -o write -S "$2" -I "$3" -w "$WARMUP" -W "$WINDOW" -m "${@:4}")
    run_pair "fabtests $1 $2 ${*:4}" "$FT_BIN/fi_rma_bw" "${args[@]}" -- "$FT_BIN/fi_rma_bw" "${args[@]}" 127.0.0.1 |
        sed -n "s/.*xfer_size: $2,.* MB\/sec: \([0-9.]*\),.*/\1/p"
}

# transport PROVIDER: one harness run, every size, both endpoints; CSV lines into $WORK/transport.csv.
transport() {
    local sizes list cmd rc=0
    read -ra list <<< "$BW_SIZES"
    sizes=$(IFS=,; echo "${list[*]}")
    cmd=("$HARNESS" --lib "$LIB" --abi 3 --np 2 --bench --bench-sizes "$sizes" --bench-bytes "$BW_BYTES"
         --csv "$WORK/transport.csv")
    { echo "## transport $1"; echo "NVSHMEM_LIBFABRIC_PROVIDER=$1 NVSHMEM_EFA_GDA=off ${BOTH_PIN[*]} ${cmd[*]}"; } >> "$LOG"
    NVSHMEM_LIBFABRIC_PROVIDER=$1 NVSHMEM_EFA_GDA=off "${BOTH_PIN[@]}" "${cmd[@]}" > "$WORK/harness.out" 2>&1 || rc=$?
    cat "$WORK/harness.out" >> "$LOG"
    if (( rc != 0 )); then
        echo "transport bench on $1 failed ($rc); see $LOG" >&2
        return 1
    fi
}

# transport_value PROVIDER ENDPOINT SIZE FIELD(6: iters, 7: MB/s)
transport_value() {
    awk -F, -v p="$1" -v e="$2" -v s="$3" -v f="$4" '$1 == "transport" && $2 == p && $3 == 3 && $4 == e && $5 == s { v = $f } END { print v }' "$WORK/transport.csv"
}

: > "$WORK/transport.csv"
echo "provider,size,transport_iters,transport,fabtests_iters,fabtests,ratio,fabtests_dc,ratio_dc,proxy,ratio_proxy_dc" > "$CSV"
ROWS=()
for prov in $PROVIDERS; do
    echo "transport bench on $prov..." >&2
    transport "$prov" || exit 1
    for size in $BW_SIZES; do
        iters=$(bw_iters "$size")
        ti=$(transport_value "$prov" host "$size" 6)
        t=$(transport_value "$prov" host "$size" 7)
        tp=$(transport_value "$prov" proxy "$size" 7)
        f=$(fabtests "$prov" "$size" "$iters") || f=
        fdc=$(fabtests "$prov" "$size" "$iters" -U) || fdc=
        [[ -n $t && -n $tp && -n $f && -n $fdc ]] ||
            { echo "no result for $prov $size (transport '$t', proxy '$tp', fabtests '$f', fabtests -U '$fdc'); see $LOG" >&2; exit 1; }
        r=$(ratio "$t" "$f")
        rdc=$(ratio "$t" "$fdc")
        rpdc=$(ratio "$tp" "$fdc")
        echo "$prov,$size,$ti,$t,$iters,$f,$r,$fdc,$rdc,$tp,$rpdc" >> "$CSV"
        ROWS+=("$(printf '%-4s %9s %12.2f %12.2f %8s %12.2f %8s %12.2f %8s' "$prov" "$size" "$t" "$f" "$r" "$fdc" "$rdc" "$tp" "$rpdc")")
        printf '%s\n' "${ROWS[-1]}" >&2
    done
done

echo
echo "transport (harness --bench, ABI 3) vs fi_rma_bw (libfabric $(pkg-config --modversion libfabric 2>/dev/null || echo '?'), $(nproc) cores, $(uname -n), pinned $PIN)"
printf '%-4s %9s %12s %12s %8s %12s %8s %12s %8s\n' prov size transport fabtests ratio fabtests_dc ratio_dc proxy ratio_p_dc
printf '%s\n' "${ROWS[@]}"
echo "MB/s (10^6 B/s); transport = host endpoint, proxy = proxy endpoint; ratio = transport / fabtests (>1: the transport is faster); _dc: fi_rma_bw -U"
echo "csv: $CSV   commands and raw output: $LOG   elapsed: $(( $(date +%s) - START )) s"
