#!/usr/bin/env bash
# Puts the fabric layer (src/bin/fabric_bench.rs) next to raw libfabric (fabtests from the same
# libfabric build) on the same provider, in the same run, on one machine:
#
#   put bandwidth  fabric-bench --test bw   vs  fi_rma_bw -o write        (MB/s, 10^6 B/s, per side)
#   latency        fabric-bench --test lat  vs  fi_rma_pingpong -o write  (us, half round trip)
#
# Each size runs as its own pair of processes (server and client) for both tools, with the same
# iteration, warm-up and window counts; tcp (tcp;ofi_rxm) stays on the loopback interface and shm
# needs no address (fabtests still exchanges addresses over a loopback socket, -E). Prints one table
# and writes bench-out/fabric_vs_fabtests.csv; ratio = ours / fabtests (bandwidth: higher is better
# for us; latency: lower is better for us). The fabric layer asks for FI_DELIVERY_COMPLETE by default
# and fabtests does not, so bandwidth is also run as `fi_rma_bw -U` (delivery complete; column
# fabtests_dc, ratio_dc); fi_rma_pingpong has no -U. The exact commands go to
# bench-out/fabric_vs_fabtests.log.
#
# Environment: FABRIC_BENCH (a built fabric-bench; otherwise built here with cargo --release),
# LIBFABRIC_HOME (default .deps/libfabric), PROVIDERS ("tcp shm"), BW_SIZES, LAT_SIZES, LAT_ITERS,
# BW_BYTES (bytes per bandwidth run, which sets its iteration count), RUN_TIMEOUT (s per run),
# OURS_MODE (fabric-bench --mode: default = the layer's write with its default flags, plain, inject),
# REPEAT (runs per measurement, the median is kept; default 1), PIN (1: server on CPU 0, client on
# CPU 1, for both tools; default 1 where taskset exists and there are 2 CPUs or more).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIBFABRIC_HOME=${LIBFABRIC_HOME:-$ROOT/.deps/libfabric}
FT_BIN=${FT_BIN:-$LIBFABRIC_HOME/bin}
export LD_LIBRARY_PATH="$LIBFABRIC_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$LIBFABRIC_HOME/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo}

PROVIDERS=${PROVIDERS:-"tcp shm"}
BW_SIZES=${BW_SIZES:-"8 64 512 4096 32768 262144 1048576 4194304"}
LAT_SIZES=${LAT_SIZES:-"8 64 512 4096"}
LAT_ITERS=${LAT_ITERS:-5000}
BW_BYTES=${BW_BYTES:-268435456}
WINDOW=64
WARMUP=10
RUN_TIMEOUT=${RUN_TIMEOUT:-60}
OURS_MODE=${OURS_MODE:-default}
REPEAT=${REPEAT:-1}
# shellcheck source=tests/bench/lib.sh
source "$ROOT/tests/bench/lib.sh"
bench_pins
OUT=${OUT:-$ROOT/bench-out}
CSV=$OUT/fabric_vs_fabtests.csv
LOG=$OUT/fabric_vs_fabtests.log

mkdir -p "$OUT"
: > "$LOG"
START=$(date +%s)

for t in fi_rma_bw fi_rma_pingpong; do
    [[ -x $FT_BIN/$t ]] || { echo "missing $FT_BIN/$t (fabtests)" >&2; exit 1; }
done

if [[ -z ${FABRIC_BENCH:-} ]]; then
    echo "building fabric-bench (release)..." >&2
    (cd "$ROOT" && cargo build --release --quiet --bin fabric-bench)
    FABRIC_BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/fabric-bench
fi
[[ -x $FABRIC_BENCH ]] || { echo "no fabric-bench at $FABRIC_BENCH" >&2; exit 1; }

bench_workdir fabric-bench
RUN_PAIR_NO_LISTEN=${FABRIC_BENCH:-}

ours() { # provider test size iters
    local dir="$WORK/addr.$RANDOM$RANDOM"
    mkdir -p "$dir"
    local common=(--provider "$1" --addr-dir "$dir" --test "$2" --size "$3" --iters "$4" --warmup "$WARMUP" --window "$WINDOW" --mode "$OURS_MODE")
    run_pair "ours $1 $2 $3" "$FABRIC_BENCH" --role server "${common[@]}" -- "$FABRIC_BENCH" --role client "${common[@]}" |
        sed -n 's/^RESULT .* value=\([0-9.]*\) .*/\1/p'
}

fabtests() { # provider test size iters [extra fabtests flags]
    local tool field
    OOB_PORT=$(( 40000 + RANDOM % 20000 ))
    if [[ $2 == bw ]]; then
        tool=fi_rma_bw; field='MB\/sec'
        local args=(-p "$(ft_prov "$1")" -E="$OOB_PORT" -o write -S "$3" -I "$4" -w "$WARMUP" -W "$WINDOW" -m "${@:5}")
    else
        tool=fi_rma_pingpong; field='usec\/xfer'
        local args=(-p "$(ft_prov "$1")" -E="$OOB_PORT" -o write -S "$3" -I "$4" -w "$WARMUP" -m)
    fi
    run_pair "fabtests $1 $2 $3" "$FT_BIN/$tool" "${args[@]}" -- "$FT_BIN/$tool" "${args[@]}" 127.0.0.1 |
        sed -n "s/.*xfer_size: $3,.* $field: \([0-9.]*\),.*/\1/p"
}

# median CMD... : runs CMD REPEAT times and prints the median of what it prints (empty on failure).
median() {
    local vals=() v i
    for (( i = 0; i < REPEAT; i++ )); do
        v=$("$@") || return 1
        [[ -n $v ]] || return 1
        vals+=("$v")
    done
    printf '%s\n' "${vals[@]}" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

echo "provider,test,size,unit,iters,ours,fabtests,ratio,fabtests_dc,ratio_dc" > "$CSV"
ROWS=()
for prov in $PROVIDERS; do
    for test in bw lat; do
        if [[ $test == bw ]]; then sizes=$BW_SIZES; unit=MB/s; else sizes=$LAT_SIZES; unit=us; fi
        for size in $sizes; do
            if [[ $test == bw ]]; then iters=$(bw_iters "$size"); else iters=$LAT_ITERS; fi
            o=$(median ours "$prov" "$test" "$size" "$iters") || o=
            f=$(median fabtests "$prov" "$test" "$size" "$iters") || f=
            [[ -n $o && -n $f ]] || { echo "no result for $prov $test $size (ours '$o', fabtests '$f'); see $LOG" >&2; exit 1; }
            r=$(ratio "$o" "$f")
            fdc=- rdc=-
            if [[ $test == bw ]]; then
                fdc=$(median fabtests "$prov" "$test" "$size" "$iters" -U) || fdc=
                [[ -n $fdc ]] || { echo "no result for fi_rma_bw -U $prov $size; see $LOG" >&2; exit 1; }
                rdc=$(ratio "$o" "$fdc")
            fi
            echo "$prov,$test,$size,$unit,$iters,$o,$f,$r,$fdc,$rdc" >> "$CSV"
            ROWS+=("$(printf '%-4s %-4s %9s %6s %12.3f %12.3f %8s %12s %8s' "$prov" "$test" "$size" "$unit" "$o" "$f" "$r" "$fdc" "$rdc")")
            printf '%s\n' "${ROWS[-1]}" >&2
        done
    done
done

echo
echo "fabric layer vs fabtests (libfabric $(pkg-config --modversion libfabric 2>/dev/null || echo '?'), $(nproc) cores, $(uname -n), ours --mode $OURS_MODE, median of $REPEAT, pinned $PIN)"
printf '%-4s %-4s %9s %6s %12s %12s %8s %12s %8s\n' prov test size unit ours fabtests ratio fabtests_dc ratio_dc
printf '%s\n' "${ROWS[@]}"
echo "ratio = ours / fabtests (bw: >1 is faster than fabtests; lat: <1 is faster); _dc: fi_rma_bw -U"
echo "csv: $CSV   commands and raw output: $LOG   elapsed: $(( $(date +%s) - START )) s"
