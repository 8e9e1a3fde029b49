#!/usr/bin/env bash
# Raw libfabric on GPU memory, the reference column of the GPU put benchmark: fabtests' fi_rma_bw
# with both buffers in CUDA memory (-D cuda): window 64 for bandwidth, and window 1 (one write,
# then its completion: what a put + quiet costs; fi_rma_pingpong refuses -D cuda) for time per
# operation, server and client on this host (device 0 and device 1 when
# there are 2 GPUs, both on device 0 otherwise, sharing it under CUDA MPS as the PEs do).
#
#   LIBFABRIC_HOME=<prefix with bin/fi_rma_bw> bash tests/gpu/fabtests_cuda.sh OUT_DIR [PROVIDER]
#
# Writes OUT_DIR/fabtests-cuda-bw.csv and OUT_DIR/fabtests-cuda-lat.csv in nvshmem_bench's columns
# (path,size_bytes,iters,usec_per_op,gbytes_per_s) and OUT_DIR/fabtests-cuda.log (commands, raw
# output). A size that fails is left out and named on stdout; the exit status is 1 when no size
# was measured, 2 on a usage error. Environment: SIZES (bandwidth sizes), LAT_SIZES, BW_BYTES
# (bytes per bandwidth run, default 256 MiB), RUN_TIMEOUT (s per run, default 30), HMEM (cuda;
# "system" runs the same on host memory, without a GPU, to check this script).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: fabtests_cuda.sh OUT_DIR [PROVIDER]}
prov=${2:-${NVSHMEM_LIBFABRIC_PROVIDER:-shm}}
: "${LIBFABRIC_HOME:?LIBFABRIC_HOME must name the libfabric prefix with bin/fi_rma_bw}"
FT_BIN=$LIBFABRIC_HOME/bin
[ -x "$FT_BIN/fi_rma_bw" ] || { echo "fabtests_cuda.sh: missing $FT_BIN/fi_rma_bw" >&2; exit 2; }
fabric_lib=$LIBFABRIC_HOME/lib
[ -e "$fabric_lib/libfabric.so.1" ] || fabric_lib=$LIBFABRIC_HOME/lib64
mkdir -p "$out"
SIZES=${SIZES:-"8 64 1024 4096 65536 262144 1048576 4194304 16777216 67108864"}
LAT_SIZES=${LAT_SIZES:-"8 64 1024 4096 65536"}
BW_BYTES=${BW_BYTES:-268435456}
RUN_TIMEOUT=${RUN_TIMEOUT:-30}
LOG=$out/fabtests-cuda.log
BW_CSV=$out/fabtests-cuda-bw.csv
LAT_CSV=$out/fabtests-cuda-lat.csv
: >"$LOG"
PIN=0
# shellcheck source=tests/bench/lib.sh
source "$repo/tests/bench/lib.sh"
bench_pins
bench_workdir fabtests-cuda
HMEM=${HMEM:-cuda}
srv_dev=0 cli_dev=0
GPU_ENV=()
hmem_args=()
if [ "$HMEM" = cuda ]; then
    # shellcheck source=tests/gpu/mps.sh
    source "$here/mps.sh"
    gpu_placement 2 || { echo "fabtests_cuda.sh: no GPU ($GPU_LAYOUT)" >&2; exit 2; }
    trap 'gpu_placement_end; bench_cleanup' EXIT
    [ "$GPU_COUNT" -ge 2 ] && cli_dev=1
    hmem_args=(-D cuda)
else
    GPU_LAYOUT="host memory"
fi
envs=(env LD_LIBRARY_PATH="$fabric_lib:${LD_LIBRARY_PATH:-}" "${GPU_ENV[@]}")
echo "fabtests -D $HMEM, provider $prov, $GPU_LAYOUT, server device $srv_dev, client device $cli_dev" | tee -a "$LOG"

# one WINDOW SIZE ITERS: prints "usec MBps" of the client's line, nothing on failure.
one() {
    local tool=fi_rma_bw window=$1 size=$2 iters=$3
    OOB_PORT=$((40000 + RANDOM % 20000))
    local common=(-p "$(ft_prov "$prov")" -E="$OOB_PORT" -o write -S "$size" -I "$iters" -m "${hmem_args[@]}"
        -w 10 -W "$window")
    local dev_s=() dev_c=()
    [ "$HMEM" = cuda ] && dev_s=(-i "$srv_dev") && dev_c=(-i "$cli_dev")
    run_pair "$tool -W $window $size" "${envs[@]}" "$FT_BIN/$tool" "${common[@]}" "${dev_s[@]}" -- \
        "${envs[@]}" "$FT_BIN/$tool" "${common[@]}" "${dev_c[@]}" 127.0.0.1 |
        sed -n "s/.*xfer_size: $size,.* MB\/sec: \([0-9.]*\), usec\/xfer: \([0-9.]*\),.*/\2 \1/p" | tail -n 1
}

echo "path,size_bytes,iters,usec_per_op,gbytes_per_s" >"$BW_CSV"
echo "path,size_bytes,iters,usec_per_op,gbytes_per_s" >"$LAT_CSV"
n=0
printf '%10s | %14s %10s | %14s\n' size "bw usec/xfer" "GB/s" "usec/op (W 1)"
for s in $SIZES; do
    iters=$((BW_BYTES / s)); ((iters > 10000)) && iters=10000; ((iters < 50)) && iters=50
    r=$(one 64 "$s" "$iters")
    lat=""
    if [[ " $LAT_SIZES " == *" $s "* ]]; then
        l=$(one 1 "$s" 1000)
        if [ -n "$l" ]; then
            lat=${l% *}
            echo "fabtests-$HMEM-$prov-w1,$s,1000,$lat,$(awk -v m="${l#* }" 'BEGIN{printf "%.4f", m/1000}')" >>"$LAT_CSV"
        fi
    fi
    if [ -n "$r" ]; then
        us=${r% *} mb=${r#* }
        gb=$(awk -v m="$mb" 'BEGIN{printf "%.4f", m/1000}')
        echo "fabtests-$HMEM-$prov,$s,$iters,$us,$gb" >>"$BW_CSV"
        n=$((n + 1))
        printf '%10s | %14s %10s | %14s\n' "$s" "$us" "$gb" "${lat:--}"
    else
        printf '%10s | %14s %10s | %14s\n' "$s" FAILED - "${lat:--}"
    fi
done
echo "written: $BW_CSV, $LAT_CSV (log $LOG)"
[ $n -gt 0 ]
