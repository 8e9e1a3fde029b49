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
#   mps_start              starts the MPS control daemon unless one runs (pipe and log folders:
#                          CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY, exported, /tmp/mps and
#                          /tmp/mps-log when unset); MPS_STARTED=1 when this call started it;
#                          returns 1 when it could not
#   mps_stop               stops the MPS control daemon and server for good: asks them to quit,
#                          waits up to 10 s, then kills them. A client killed while its kernel spun
#                          (a hung run ended by timeout) stays in the server, and "quit" then waits
#                          for it for ever (2026-11-29: a probe lost 390 s of a call to that).

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

# The MPS daemon's and server's processes, by command line: their names are longer than the 15
# characters the kernel keeps of a name, so pgrep -x nvidia-cuda-mps-control never matches.
MPS_PROCS='(^|/)nvidia-cuda-mps-(control|server)( |$)'
mps_running() { pgrep -f "$MPS_PROCS" >/dev/null 2>&1; }
mps_start() {
    export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps}
    export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps-log}
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    MPS_STARTED=0
    mps_running && return 0
    nvidia-cuda-mps-control -d || return 1
    MPS_STARTED=1
    sleep 1
}
mps_stop() {
    local i
    echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
    for i in 1 2 3 4 5 6 7 8 9 10; do
        mps_running || return 0
        sleep 1
    done
    echo "mps_stop: the MPS daemon did not quit within 10 s (clients of a killed run?): killing it" >&2
    pkill -9 -f "$MPS_PROCS" 2>/dev/null
    sleep 1
    return 0
}

gpu_placement_end() {
    if [ "$GPU_MPS_STARTED" = 1 ]; then
        mps_stop
        GPU_MPS_STARTED=0
    fi
}
