#!/usr/bin/env bash
# Stages, on the build machine (repo root, after bash .ci/run's setup; root, with apt for iproute2),
# what tests/gpu/stream_run.sh needs on a GPU node, as two tarballs under .gpu/ (git-ignored):
#   .gpu/stream-base.tgz  the release plugin and the CUDA-aware libfabric with fi_rma_bw
#                         (.ci/stage-gpu.sh), stream_bench built against NVSHMEM 3.4.5 without MPI
#                         (.gpu/bins-3.4.5/stream_bench; the runner starts PEs with NVSHMEM's
#                         unique-id bootstrap), and a private iproute2 (tests/twohost/stage_iproute2.sh)
#   .gpu/py.tgz           this library's wheel and the Python wheels the node lacks
#                         (tests/python_gpu/pack.sh), for the PyTorch steps
# Fails when the two together pass 64 MiB (what a run may carry).
# Then, on the node: OUT=<dir> bash tests/gpu/stream_run.sh, carrying .gpu/stream-base.tgz .gpu/py.tgz.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source .ci/env.sh
bash .ci/stage-gpu.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash tests/gpu/run.sh --compile-only --save-bins "$work/bins"
if grep -q MPI_Init "$work/bins/stream_bench"; then
    echo "stage_stream_run.sh: stream_bench was built with MPI (mpi.h found); stream_run.sh starts PEs without MPI." >&2
    echo "  Build where mpicc/mpi.h are absent, or move mpicc out of PATH for this step." >&2
    exit 1
fi
rm -rf .gpu/bins-3.4.5-stream
mkdir -p .gpu/bins-3.4.5-stream
cp "$work/bins/stream_bench" .gpu/bins-3.4.5-stream/
bash tests/twohost/stage_iproute2.sh
# The node sees the programs as .gpu/bins-3.4.5 (stream_run.sh); only stream_bench goes.
mkdir -p "$work/pack"
cp -a .gpu/plugin .gpu/libfabric .gpu/iproute2 "$work/pack/"
cp -a .gpu/bins-3.4.5-stream "$work/pack/bins-3.4.5"
tar -C "$work/pack" -czf .gpu/stream-base.tgz plugin libfabric iproute2 bins-3.4.5
bash tests/python_gpu/pack.sh
total=$(($(stat -c %s .gpu/stream-base.tgz) + $(stat -c %s .gpu/py.tgz)))
ls -l .gpu/stream-base.tgz .gpu/py.tgz
echo "together: $total bytes"
[ "$total" -lt $((64 * 1024 * 1024)) ] || { echo "stage_stream_run.sh: more than 64 MiB to carry" >&2; exit 1; }
