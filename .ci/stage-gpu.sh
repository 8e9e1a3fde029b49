#!/usr/bin/env bash
# Stages what a GPU node needs into .gpu/ (git-ignored): the release plugin installed with
# cmake/install.sh (.gpu/plugin: library + nvshmem_transport_libfabric.so.{3,4,5,6,7} + headers) and the
# runtime part of the libfabric build (.gpu/libfabric: lib/, provider modules, fi_info and the fabtests
# used by the benchmarks). Build here (x86-64), carry .gpu to the node, run tests/gpu/run.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
cargo build --release --locked
# Only what this script makes: .gpu/ also holds NVSHMEM releases and carry bundles
# (tests/gpu/fetch_nvshmem.sh, tests/gpu/pack_carry.sh).
rm -rf .gpu/plugin .gpu/libfabric
mkdir -p .gpu/libfabric/lib .gpu/libfabric/bin
PREFIX="$PWD/.gpu/plugin" bash cmake/install.sh --build-dir "${CARGO_TARGET_DIR:-target}/release" >/dev/null
for abi in 3 4 5 6 7; do
  [ -e ".gpu/plugin/lib/nvshmem_transport_libfabric.so.$abi" ] ||
    { echo "stage-gpu.sh: cmake/install.sh did not install nvshmem_transport_libfabric.so.$abi" >&2; exit 1; }
done
cp -a "$LIBFABRIC_HOME"/lib/libfabric.so* .gpu/libfabric/lib/
if [ -d "$LIBFABRIC_HOME/lib/libfabric" ]; then
  mkdir -p .gpu/libfabric/lib/libfabric
  cp -a "$LIBFABRIC_HOME"/lib/libfabric/*.so .gpu/libfabric/lib/libfabric/ 2>/dev/null || true
fi
for b in fi_info fi_rma_bw fi_rma_pingpong fi_rdm_atomic; do
  [ -x "$LIBFABRIC_HOME/bin/$b" ] && cp -a "$LIBFABRIC_HOME/bin/$b" .gpu/libfabric/bin/
done
# fabtests link against libfabric only; keep the binaries' own libs if any.
du -sh .gpu/plugin .gpu/libfabric
