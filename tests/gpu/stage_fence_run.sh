#!/usr/bin/env bash
# Packs what tests/gpu/fence_run.sh needs on the GPU node into .gpu/fence.tgz: this build's library
# (.ci/stage-gpu.sh, debug info stripped), libfabric, iproute2 (.gpu/iproute2, Debian's package
# unpacked: tests/twohost/netns.sh), the stream benchmark (.gpu/bins-3.4.5-stream/stream_bench:
# tests/gpu/stage_stream_run.sh), the unit-test binary (its GPU tests), and, as the 'before'
# variant, the library directory BEFORE names (a build of the commit before, copied to
# plugin-b4fence/lib).
#   BEFORE=<dir with libnvshmem_efa_gda.so> bash tests/gpu/stage_fence_run.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source .ci/env.sh
say() { echo "[stage_fence_run] $*"; }
[ -d .gpu/iproute2 ] || { say "no .gpu/iproute2"; exit 2; }
[ -x .gpu/bins-3.4.5-stream/stream_bench ] || { say "no .gpu/bins-3.4.5-stream/stream_bench"; exit 2; }
bash .ci/stage-gpu.sh
lib_tests=$(cargo test --release --locked --lib --no-run 2>&1 |
    sed -n 's/.*Executable unittests src\/lib.rs (\(.*\))/\1/p' | tail -n 1)
[ -x "$lib_tests" ] || { say "no unit test binary found"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/stage-fence.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -a .gpu/plugin .gpu/libfabric .gpu/iproute2 "$work/"
strip --strip-debug "$work/plugin/lib/libnvshmem_efa_gda.so"
mkdir -p "$work/bins-3.4.5" "$work/t"
cp -a .gpu/bins-3.4.5-stream/stream_bench "$work/bins-3.4.5/"
cp "$lib_tests" "$work/t/libtests"
strip "$work/t/libtests"
what=(plugin libfabric iproute2 bins-3.4.5 t)
if [ -n "${BEFORE:-}" ]; then
    mkdir -p "$work/plugin-b4fence/lib"
    cp -a "$BEFORE"/libnvshmem_efa_gda.so "$BEFORE"/nvshmem_transport_libfabric.so.* "$work/plugin-b4fence/lib/"
    strip --strip-debug "$work/plugin-b4fence/lib/libnvshmem_efa_gda.so"
    what+=(plugin-b4fence)
fi
tar -C "$work" -czf .gpu/fence.tgz "${what[@]}"
say ".gpu/fence.tgz: $(du -h .gpu/fence.tgz | cut -f1) (${what[*]})"
