#!/usr/bin/env bash
# Installs the CUDA compiler and NVSHMEM 3.4.5 from PyPI wheels into a git-ignored venv (.deps/cuda-venv)
# and prints nothing but progress. No GPU is needed: the wheels carry nvcc, the CUDA runtime headers,
# the NVML headers (libfabric's CUDA build wants them) and NVSHMEM's headers and libnvshmem_device.a.
# Re-running reuses a finished venv. Writes .deps/cuda.env with CUDA_HOME and NVSHMEM_HOME.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
venv="$deps/cuda-venv"
stamp="$venv/.complete-v1"
mkdir -p "$deps"
# shellcheck disable=SC1091
source "$root/.ci/quietly.sh"
if [ ! -f "$stamp" ]; then
  echo "[setup-cuda] creating $venv (pip output: $deps/logs/setup-cuda-pip.log)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  quietly "$deps/logs/setup-cuda-pip.log" "$venv/bin/pip" install --disable-pip-version-check \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 \
    nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85 nvidia-nvml-dev==13.0.87 \
    nvidia-nvshmem-cu13==3.4.5
  touch "$stamp"
fi
site=$("$venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cuda="$site/nvidia/cu13"
[ -d "$cuda" ] || { echo "[setup-cuda] no CUDA tree at $cuda" >&2; exit 1; }
nvshmem="$site/nvidia/nvshmem"
cat > "$deps/cuda.env" <<ENV
export CUDA_HOME="$cuda"
export NVSHMEM_HOME="$nvshmem"
export PATH="$cuda/bin:\$PATH"
ENV
echo "[setup-cuda] CUDA_HOME=$cuda"
"$cuda/bin/nvcc" --version | tail -2
