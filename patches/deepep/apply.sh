#!/usr/bin/env bash
# Applies the nvshmem-efa-gda kit to a DeepEP source tree: DeepEP's V1 low-latency kernels then run on
# the library's GDA queue (see patches/deepep/README.md). Idempotent: a tree that already has the kit
# is left as it is.
#
#   patches/deepep/apply.sh [--check] DEEPEP_TREE
#
# Layouts: DeepEP v1.2.1 (V1 kernels in csrc/kernels/) and DeepEP main (V1 kernels in
# csrc/kernels/legacy/). --check only reports whether the kit is applied.
# Exit status: 0 applied (or, with --check, already applied), 1 not applicable / not applied,
# 2 usage error.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
MARK='nvshmem-efa-gda: replaces DeepEP'

say() { echo "deepep-kit: $*"; }
die() { echo "deepep-kit: error: $1" >&2; exit "${2:-1}"; }

check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi
[ $# -eq 1 ] || die "usage: patches/deepep/apply.sh [--check] DEEPEP_TREE" 2
tree=$1
[ -d "$tree" ] || die "$tree is not a directory" 2
tree=$(cd "$tree" && pwd)
[ -f "$tree/setup.py" ] || die "$tree has no setup.py: not a DeepEP source tree"

if [ -f "$tree/csrc/kernels/internode_ll.cu" ] && [ -f "$tree/csrc/kernels/runtime.cu" ]; then
    layout=v1.2.1
    kdir=$tree/csrc/kernels
    patchfile=$here/v1.2.1.patch
    header=$here/ibgda_device.cuh
elif [ -f "$tree/csrc/kernels/legacy/internode_ll.cu" ]; then
    layout=main-legacy
    kdir=$tree/csrc/kernels/legacy
    patchfile=$here/main-legacy.patch
    header=$here/legacy_ibgda_device.cuh
else
    die "$tree has neither csrc/kernels/internode_ll.cu (v1.2.1) nor csrc/kernels/legacy/internode_ll.cu (main)"
fi
[ -f "$kdir/ibgda_device.cuh" ] || die "$kdir/ibgda_device.cuh missing: not a DeepEP V1 tree with IBGDA kernels (v1.2.1 or main's legacy/)"
say "tree $tree (layout $layout)"

# One patch tool for both directions: patch(1) when installed, else git apply.
patch_q() { # patch_q MODE (check-apply | check-reverse | apply)
    if command -v patch >/dev/null 2>&1; then
        case $1 in
        check-apply) patch -d "$tree" -p1 -f -s --dry-run <"$patchfile" >/dev/null 2>&1 ;;
        check-reverse) patch -d "$tree" -p1 -f -s -R --dry-run <"$patchfile" >/dev/null 2>&1 ;;
        apply) patch -d "$tree" -p1 -f -s --no-backup-if-mismatch <"$patchfile" ;;
        esac
    elif command -v git >/dev/null 2>&1; then
        case $1 in
        check-apply) (cd "$tree" && git apply --check -p1 "$patchfile" >/dev/null 2>&1) ;;
        check-reverse) (cd "$tree" && git apply --check -R -p1 "$patchfile" >/dev/null 2>&1) ;;
        apply) (cd "$tree" && git apply -p1 "$patchfile") ;;
        esac
    else
        die "neither patch nor git is installed"
    fi
}

state_tu=$kdir/efa_gda_state.cu
state_text='// nvshmem-efa-gda: the one definition of the GDA device state (patches/deepep/apply.sh)
#include "nvshmem_efa_gda_state.cu"'

# Status of the three pieces.
if patch_q check-reverse; then p_state=applied
elif patch_q check-apply; then p_state=pending
else p_state=conflict; fi
if grep -q "$MARK" "$kdir/ibgda_device.cuh"; then
    if cmp -s "$header" "$kdir/ibgda_device.cuh"; then h_state=applied; else h_state=stale; fi
else h_state=pending; fi
if [ -f "$state_tu" ] && [ "$(cat "$state_tu")" = "$state_text" ]; then s_state=applied; else s_state=pending; fi
say "patch $(basename "$patchfile"): $p_state; ibgda_device.cuh: $h_state; efa_gda_state.cu: $s_state"

if [ $check_only = 1 ]; then
    [ $p_state = applied ] && [ $h_state = applied ] && [ $s_state = applied ] && exit 0
    exit 1
fi

case $p_state in
applied) ;;
pending) patch_q apply || die "applying $(basename "$patchfile") failed" ;;
conflict) die "$(basename "$patchfile") does not apply to $tree (another DeepEP version, or local edits there); files: $(grep '^+++ ' "$patchfile" | sed 's#^+++ b/##' | tr '\n' ' ')" ;;
esac
case $h_state in
applied) ;;
stale) cp "$header" "$kdir/ibgda_device.cuh" ;;  # an older kit's replacement: refresh it
pending)
    [ -e "$kdir/ibgda_device.cuh.orig" ] || cp "$kdir/ibgda_device.cuh" "$kdir/ibgda_device.cuh.orig"
    cp "$header" "$kdir/ibgda_device.cuh" ;;
esac
[ $s_state = applied ] || printf '%s\n' "$state_text" >"$state_tu"

# The headers the patched tree includes must exist where setup.py will look for them.
for f in cuda/nvshmem_efa_gda_ibgda.cuh cuda/nvshmem_efa_gda_device.cuh cuda/nvshmem_efa_gda_state.cu \
         cuda/efa_wqe.cuh include/nvshmem_efa_gda.h; do
    [ -f "$repo/$f" ] || die "$repo/$f missing"
done
say "applied; build with NVSHMEM_EFA_GDA_HOME=$repo (and NVSHMEM_EFA_GDA_LIB_DIR=<dir of libnvshmem_efa_gda.so>)"
