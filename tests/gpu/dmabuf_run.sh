#!/usr/bin/env bash
# GPU memory registered by dmabuf (FI_MR_DMABUF), the registration the efa and efa-direct route
# uses, on a GPU node without EFA: libfabric's utility providers take the dmabuf as an address
# range, so the export and the registration code run with shm and tcp (docs/routing.md, "GPU memory
# by the NIC on EFA").
#   1. the library's unit tests fabric::mr_gpu_tests: dmabuf export of device memory, GPU memory
#      registered by dmabuf and by address on shm and tcp;
#   2. the NVSHMEM suite and put benchmark on shm with GPU memory handed to the provider
#      (NVSHMEM_EFA_GPU_STAGING=0) and registered by dmabuf (NVSHMEM_EFA_DMABUF=1), with the
#      library's INFO lines (the route line says "registered by dmabuf (FI_MR_DMABUF)").
#
# Staged on the build machine (repo root, after bash .ci/run's setup): bash tests/gpu/stage_mover_run.sh
# On the node (repo root), carrying .gpu/base.tgz and .gpu/bins-3.4.5.tgz:
#   OUT=<dir> bash tests/gpu/dmabuf_run.sh
# Writes $OUT/libtests.log, $OUT/nvshmem-shm-dmabuf/ (the suite's logs and summary.txt) and
# $OUT/summary.txt. NVSHMEM_HOME defaults to the node's torch venv.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
for t in base bins-3.4.5; do
    [ -f .gpu/$t.tgz ] || { echo "dmabuf_run.sh: .gpu/$t.tgz missing (bash tests/gpu/stage_mover_run.sh)" >&2; exit 2; }
    tar -xzf .gpu/$t.tgz -C .gpu
done
export NVSHMEM_HOME=${NVSHMEM_HOME:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nvshmem}
export PLUGIN_DIR=$PWD/.gpu/plugin/lib LIBFABRIC_HOME=$PWD/.gpu/libfabric
summary=()

LD_LIBRARY_PATH=$LIBFABRIC_HOME/lib timeout 120 .gpu/t/libtests fabric::mr_gpu_tests \
    --test-threads=1 --nocapture >"$OUT/libtests.log" 2>&1
rc=$?
summary+=("libtests fabric::mr_gpu_tests: rc $rc ($(grep -E '^test result' "$OUT/libtests.log" | tail -1))")

NVSHMEM_LIBFABRIC_PROVIDER=shm NVSHMEM_EFA_GPU_STAGING=0 NVSHMEM_EFA_DMABUF=1 NVSHMEM_EFA_LOG=info \
    OUT=$OUT/nvshmem-shm-dmabuf timeout 400 bash tests/gpu/run.sh --bin-dir .gpu/bins-3.4.5 \
    --no-p2p-tests >"$OUT/nvshmem-shm-dmabuf.log" 2>&1
rc=$?
route=$(grep -rhoE "NVSHMEM_LIBFABRIC_PROVIDER=[a-z-]+: [^;]*;" "$OUT/nvshmem-shm-dmabuf" 2>/dev/null | sort -u | head -2)
summary+=("NVSHMEM suite on shm, GPU memory by dmabuf: rc $rc; route: ${route:-(no route line found)}")
summary+=("$(grep -E '^(tests|bench)[a-z-]*:' "$OUT/nvshmem-shm-dmabuf/summary.txt" 2>/dev/null | tr '\n' ' ')")
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
