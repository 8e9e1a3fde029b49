#!/usr/bin/env bash
# The staged path with host memory (NVSHMEM_EFA_GPU_STAGING=1 stages host memory the way GPU
# memory is staged for a PE on another host): nbi puts and nbi gets, rank 0 with rank 1, k = 64 in
# flight then one quiet (the host harness's --bench / --bench-get), on tcp and shm, for one or more
# builds of the library side by side. Each configuration runs REPS times and the best bandwidth is
# kept (on a shared machine other load only ever slows a run down).
#
#   tests/bench/staged_host.sh [LABEL=LIB ...]     default: this tree's release build, label "tree"
#
# Writes $OUT/staged_host.csv (label,provider,op,endpoint,size,best_mbps,runs) and prints a table.
# Environment: OUT (bench-out), PROVIDERS ("tcp shm"), OPS ("put get"), REPS (3),
# SIZES ("8,65536,1048576,2097152,4194304,16777216"), BYTES (67108864: per size and endpoint).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$ROOT/.ci/env.sh"
LIBFABRIC_HOME=${LIBFABRIC_HOME:-$ROOT/.deps/libfabric}
export LD_LIBRARY_PATH="$LIBFABRIC_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FI_TCP_IFACE=${FI_TCP_IFACE:-lo}
PROVIDERS=${PROVIDERS:-"tcp shm"}
OPS=${OPS:-"put get"}
REPS=${REPS:-3}
SIZES=${SIZES:-8,65536,1048576,2097152,4194304,16777216}
BYTES=${BYTES:-67108864}
OUT=${OUT:-$ROOT/bench-out}
mkdir -p "$OUT"

LIBS=("$@")
if (( ${#LIBS[@]} == 0 )); then
    lib=${CARGO_TARGET_DIR:-$ROOT/target}/release/libnvshmem_efa_gda.so
    [[ -f $lib ]] || (cd "$ROOT" && cargo build --release --quiet --lib)
    LIBS=("tree=$lib")
fi
for l in "${LIBS[@]}"; do
    [[ $l == *=* && -f ${l#*=} ]] || { echo "not LABEL=LIB with an existing library: $l" >&2; exit 2; }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/staged-host.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
HARNESS=$WORK/harness
cc -O2 -g -Wall -Werror -o "$HARNESS" "$ROOT/tests/harness/harness.c" -ldl

RAW=$WORK/raw.csv
: > "$RAW"
for rep in $(seq "$REPS"); do
    for prov in $PROVIDERS; do
        for op in $OPS; do
            # The builds take turns, so a burst of load hits all of them alike.
            for l in "${LIBS[@]}"; do
                label=${l%%=*} lib=${l#*=}
                flag=()
                [[ $op == get ]] && flag=(--bench-get)
                csv=$WORK/one.csv
                : > "$csv"
                cmd=(env NVSHMEM_EFA_GPU_STAGING=1 NVSHMEM_LIBFABRIC_PROVIDER="$prov" NVSHMEM_EFA_GDA=off
                     "$HARNESS" --lib "$lib" --abi 3 --np 2 --bench "${flag[@]}" --bench-sizes "$SIZES"
                     --bench-bytes "$BYTES" --csv "$csv")
                echo "run $rep: ${cmd[*]}" >&2
                if ! timeout 600 "${cmd[@]}" > "$WORK/out.txt" 2>&1; then
                    echo "run failed ($label $prov $op):" >&2
                    tail -20 "$WORK/out.txt" >&2
                    exit 1
                fi
                awk -F, -v l="$label" -v o="$op" '{ print l "," $2 "," o "," $4 "," $5 "," $7 }' "$csv" >> "$RAW"
            done
        done
    done
done

CSV=$OUT/staged_host.csv
echo "label,provider,op,endpoint,size,best_mbps,runs" > "$CSV"
awk -F, '{ k = $1 "," $2 "," $3 "," $4 "," $5; n[k]++; if (!(k in b) || $6 > b[k]) b[k] = $6 }
         END { for (k in b) print k "," b[k] "," n[k] }' "$RAW" | sort -t, -k1,1 -k2,2 -k3,3 -k4,4 -k5,5n >> "$CSV"
echo
echo "staged path, host memory, k = 64 in flight then quiet; best MB/s of $REPS runs ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
column -s, -t "$CSV"
echo "csv: $CSV"
