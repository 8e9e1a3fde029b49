#!/usr/bin/env bash
# The main job: the plugin moving data between processes.
#  1. CPU: the host harness loads the library exactly as NVSHMEM does (dlopen by the plugin file name,
#     nvshmemt_init with ABI 3 and 4, bootstrap over local sockets) and moves and verifies data between
#     4 processes over tcp;ofi_rxm and shm.
#  2. GPU (where nvidia-smi sees two GPUs and NVSHMEM 3.4.5 is installed): the NVSHMEM test suite and
#     benchmark on 2 PEs with the library as NVSHMEM's transport (tests/gpu/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
cargo build --release --locked
prefix=$PWD/target/demo-prefix
PREFIX=$prefix bash cmake/install.sh --build-dir target/release >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O1 -Wall -o "$work/harness" tests/harness/harness.c -ldl
# The data-moving cases (the full suite, bad input included, is part of the tests).
cases=(--case put --case put_nbi --case get --case p --case amo --case contention --case proxy_put_get)
for abi in 3 4; do
  extra=()
  [ "$abi" = 4 ] && extra=(--case put_signal)
  for prov in tcp shm; do
    echo "=== host harness: NVSHMEM transport ABI $abi, provider $prov, 4 processes"
    NVSHMEM_LIBFABRIC_PROVIDER=$prov NVSHMEM_EFA_GDA=off \
      timeout 300 "$work/harness" --lib "$prefix/lib/nvshmem_transport_libfabric.so.$abi" --abi "$abi" --np 4 \
      "${cases[@]}" "${extra[@]}"
  done
done
if command -v nvidia-smi >/dev/null && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  echo "=== GPU run: NVSHMEM 3.4.5 with the library as its remote transport"
  PLUGIN_DIR=$prefix/lib LIBFABRIC_HOME=$LIBFABRIC_HOME OUT=${OUT:-$PWD/gpu-out} bash tests/gpu/run.sh
else
  echo "=== no 2-GPU node here: skipping the NVSHMEM GPU run (tests/gpu/run.sh runs it where one exists)"
fi
