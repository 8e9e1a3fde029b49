#!/usr/bin/env bash
# Packs what tests/deepep/followup.sh (and tests/gpu/stream_run.sh) need on a GPU node into one
# carry, .gpu/followup.tgz: the library as NVSHMEM loads it (.ci/stage-gpu.sh: .gpu/plugin, debug
# info stripped), libfabric (.gpu/libfabric), a private iproute2 for the two-host layout
# (.gpu/iproute2), the stream benchmark's binary when staged (.gpu/bins-3.4.5-stream, from
# tests/gpu/stage_stream_run.sh) and a DeepEP V1 tree without its git history and figures
# (.gpu/DeepEP; the kit is applied on the node). The DeepEP extension itself travels apart
# (SAVE_EXT of an earlier build, e.g. .gpu/deepep-ext-q.tgz).
#
#   bash tests/deepep/stage_followup.sh          # then carry .gpu/followup.tgz (+ the extension)
#
# On the node: tar -C .gpu -xzf .gpu/followup.tgz, then the command in followup.sh's header.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
say() { echo "[stage_followup] $*"; }
[ -d .gpu/DeepEP ] || { say "no .gpu/DeepEP (a DeepEP V1 checkout, e.g. v1.2.1)"; exit 2; }
[ -d .gpu/iproute2 ] || { say "no .gpu/iproute2 (Debian's iproute2 unpacked; see tests/twohost/netns.sh)"; exit 2; }
bash .ci/stage-gpu.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/stage-followup.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -a .gpu/plugin .gpu/libfabric .gpu/iproute2 "$work/"
strip --strip-debug "$work/plugin/lib/libnvshmem_efa_gda.so"
what=(plugin libfabric iproute2 DeepEP)
if [ -x .gpu/bins-3.4.5-stream/stream_bench ]; then
    mkdir -p "$work/bins-3.4.5"
    cp -a .gpu/bins-3.4.5-stream/stream_bench "$work/bins-3.4.5/"
    what+=(bins-3.4.5)
else
    say "no .gpu/bins-3.4.5-stream/stream_bench (tests/gpu/stage_stream_run.sh): the stream benchmark is not packed"
fi
cp -a .gpu/DeepEP "$work/DeepEP"
rm -rf "$work/DeepEP/.git" "$work/DeepEP/figures" "$work/DeepEP/build" "$work"/DeepEP/deep_ep_cpp*.so
tar -C "$work" -czf .gpu/followup.tgz "${what[@]}"
say ".gpu/followup.tgz: $(du -h .gpu/followup.tgz | cut -f1) (${what[*]})"
