# Shared by the GPU runners (tests/gpu/run.sh, tests/gpu_gda/run.sh, tests/deepep/run.sh): where the
# PEs of a job run. Sourced, not run.
#
# With at least as many GPUs as PEs every PE gets its own GPU (node-local rank = device). With fewer
# GPUs the PEs share them through CUDA MPS: NVSHMEM's multiple-PEs-per-GPU mode needs MPS, with
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / PEs-per-GPU in every PE, or it runs in "limited MPG" mode
# and refuses collectives. The MPS control daemon is started here when none runs and stopped by
# gpu_placement_end if it was started here. Each program picks device (local rank % device count).
# CUDA_VISIBLE_DEVICES, when set, limits the count (CUDA_VISIBLE_DEVICES=0 on a two-GPU machine runs
# the one-GPU layout; the MPS daemon started here then serves that GPU only).
#
#   gpu_count              prints how many GPUs the programs will see (nvidia-smi's, narrowed by
#                          CUDA_VISIBLE_DEVICES)
#   gpu_placement NPES     sets GPU_COUNT, GPU_LAYOUT (words for logs) and the array GPU_ENV
#                          (VAR=value entries every rank needs); returns 1 without a GPU
#   gpu_placement_end      stops the MPS daemon if gpu_placement started it

GPU_MPS_STARTED=0
gpu_count() {
    local n visible
    n=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        visible=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
        [ "$visible" -lt "$n" ] && n=$visible
    fi
    echo "${n:-0}"
}

gpu_placement() {
    local npes=$1 per
    GPU_ENV=()
    GPU_COUNT=$(gpu_count)
    [ "$GPU_COUNT" -ge 1 ] || { GPU_LAYOUT="no GPU${CUDA_VISIBLE_DEVICES:+ (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)}"; return 1; }
    if [ "$GPU_COUNT" -ge "$npes" ]; then
        GPU_LAYOUT="$npes PEs on $npes of $GPU_COUNT GPUs, one PE per GPU"
        return 0
    fi
    per=$(((npes + GPU_COUNT - 1) / GPU_COUNT))
    export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvshmem-efa-gda-mps}
    export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/nvshmem-efa-gda-mps-log}
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if ! echo get_default_active_thread_percentage | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1; then
        command -v nvidia-cuda-mps-control >/dev/null 2>&1 || {
            echo "gpu_placement: $npes PEs on $GPU_COUNT GPU(s) need CUDA MPS, and nvidia-cuda-mps-control is missing" >&2
            return 1
        }
        nvidia-cuda-mps-control -d || { echo "gpu_placement: could not start the MPS daemon" >&2; return 1; }
        GPU_MPS_STARTED=1
        sleep 1
    fi
    GPU_ENV=(
        "CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY"
        "CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_LOG_DIRECTORY"
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / per))"
    )
    GPU_LAYOUT="$npes PEs on $GPU_COUNT GPU(s), $per per GPU under CUDA MPS ($((100 / per))% of the SMs each)"
    return 0
}

gpu_placement_end() {
    if [ "$GPU_MPS_STARTED" = 1 ]; then
        echo quit | timeout 30 nvidia-cuda-mps-control >/dev/null 2>&1 || true
        GPU_MPS_STARTED=0
    fi
}
