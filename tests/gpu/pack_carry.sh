#!/usr/bin/env bash
# Packs what a GPU node needs to run the NVSHMEM GPU suite against one NVSHMEM release, without
# building there: the runtime of .gpu/nvshmem-VERSION (tests/gpu/fetch_nvshmem.sh: headers,
# libnvshmem_host.so.3, the MPI and unique-id bootstraps; not libnvshmem_device.a, which only the
# build needs) and the programs of .gpu/bins-VERSION (tests/gpu/run.sh --compile-only --save-bins).
#
#   bash tests/gpu/pack_carry.sh VERSION     -> .gpu/carry-VERSION.tar.zst (xz when zstd is missing)
#
# On the node, from the repository root: zstd -dc .gpu/carry-VERSION.tar.zst | tar -xf - (paths start with .gpu/),
# then tests/gpu/run.sh --bin-dir .gpu/bins-VERSION with NVSHMEM_HOME=.gpu/nvshmem-VERSION
# (tests/gpu/README.md). Prints the bundle's path and size.
set -euo pipefail
[ $# = 1 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
ver=$1
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
nv=.gpu/nvshmem-$ver
bins=.gpu/bins-$ver
for f in "$nv/include/nvshmem.h" "$nv/include/non_abi/nvshmem_version.h" "$nv/lib/libnvshmem_host.so.3" \
    "$nv/lib/nvshmem_bootstrap_mpi.so.3" "$nv/lib/nvshmem_bootstrap_uid.so.3" "$bins/nvshmem_tests" \
    "$bins/nvshmem_bench"; do
    [ -f "$f" ] || { echo "pack_carry.sh: $f missing (run fetch_nvshmem.sh $ver and run.sh --compile-only --save-bins $bins)" >&2; exit 1; }
done
files=("$nv/include" "$nv/lib/libnvshmem_host.so.3" "$nv/lib/nvshmem_bootstrap_mpi.so.3"
    "$nv/lib/nvshmem_bootstrap_uid.so.3" "$bins/nvshmem_tests" "$bins/nvshmem_bench")
if command -v zstd >/dev/null 2>&1; then
    out=.gpu/carry-$ver.tar.zst
    tar -cf - "${files[@]}" | zstd -q -19 -T0 -f -o "$out"
else
    out=.gpu/carry-$ver.tar.xz
    tar -cf - "${files[@]}" | xz -9 -T0 >"$out"
fi
echo "$out $(stat -c %s "$out") bytes"
