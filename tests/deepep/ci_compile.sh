#!/usr/bin/env bash
# CI compile test of the DeepEP kit (no GPU, no torch, no DeepEP sources needed).
#
#   bash tests/deepep/ci_compile.sh            # what CI runs
#   DEEPEP_SRC=<DeepEP tree> bash tests/deepep/ci_compile.sh   # also DeepEP's own patched kernels
#
# 1. patches/deepep/apply.sh rejects what is not a DeepEP V1 tree, with status 1 / 2 and a message.
# 2. tests/deepep/ll_calls.cu (this project's kernels making DeepEP's V1 calls in DeepEP's shapes)
#    for sm_90 against NVSHMEM 3.4.5's headers and the generated state header (version 3); then the
#    device link with cuda/nvshmem_efa_gda_state.cu and libnvshmem_device.a (DeepEP's -dlink step) and, when
#    target/{release,debug}/libnvshmem_efa_gda.so exists, a shared-object link with --no-undefined.
# 3. the kit's replacement headers (patches/deepep/*ibgda_device.cuh) in DeepEP's namespaces, with
#    empty stand-ins for the DeepEP headers they include (configs.cuh, exception.cuh, utils.cuh,
#    deep_ep/common/exception.cuh): nothing of DeepEP is needed or stored.
# 4. only with DEEPEP_SRC: a scratch copy of that tree gets the kit (twice: idempotent; --check), then
#    its patched internode_ll.cu (and runtime.cu / internode.cu, or main's backend/nvshmem.cu) are
#    compiled as DeepEP's setup.py compiles them (sm_90, -rdc, torch's nvcc flags). Skipped with a
#    message otherwise: PyPI's only DeepEP source package (deep-ep 1.0.0, 2025-02) has no headers
#    and an older kernel API (nvshmemi_ibgda_prepare_recvs / poll_recv), so CI has no DeepEP V1 to
#    compile.
# Exit status: 0 all passed, 1 a check failed, 2 setup error.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
compile_only=1
# shellcheck source=../gpu/tools.sh
source "$repo/tests/gpu/tools.sh"

say() { echo "[deepep ci] $*"; }
NVCC=$(find_nvcc) || { say "nvcc not found (set NVCC or CUDA_HOME)"; exit 2; }
NVSHMEM=$(find_nvshmem) || { say "NVSHMEM 3.4.x not found (set NVSHMEM_HOME)"; exit 2; }
[ -f "$repo/include/nvshmem_efa_gda.h" ] || { say "include/nvshmem_efa_gda.h missing"; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/deepep-ci.XXXXXX")
trap 'rm -rf "$work"' EXIT
say "nvcc $NVCC; NVSHMEM $NVSHMEM; work $work"
status=0
ok() { say "$1: ok"; }
bad() { say "$1: FAILED"; [ -n "${2:-}" ] && [ -f "$2" ] && tail -n 40 "$2"; status=1; }

NVCC_FLAGS=(-std=c++17 -O3 -rdc=true --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90
    -Xcompiler -fPIC -I"$NVSHMEM/include")
nvcc_extra=()
nvcc_dir=$(dirname "$NVCC")
[ -f "$nvcc_dir/../lib/libcudart_static.a" ] && nvcc_extra+=(-L"$(cd "$nvcc_dir/../lib" && pwd)")

# 1. apply.sh on things that are not DeepEP V1 trees
mkdir -p "$work/not-deepep"
bash "$repo/patches/deepep/apply.sh" "$work/not-deepep" >"$work/apply-bad.log" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "no setup.py" "$work/apply-bad.log"; then ok "apply.sh rejects a non-DeepEP tree"
else bad "apply.sh on a non-DeepEP tree (rc=$rc)" "$work/apply-bad.log"; fi
bash "$repo/patches/deepep/apply.sh" >"$work/apply-usage.log" 2>&1
rc=$?
if [ $rc = 2 ]; then ok "apply.sh without a tree: usage error"; else bad "apply.sh usage (rc=$rc)" "$work/apply-usage.log"; fi

# 2. our kernels with DeepEP's calls, against the generated header (state version 3: the
#    granule-indexed heap-key table and the queue table of one queue per (dst_pe, qp_id))
if ! grep -q '^#define NVSHMEM_EFA_GDA_STATE_VERSION 3$' "$repo/include/nvshmem_efa_gda.h"; then
    bad "include/nvshmem_efa_gda.h does not publish state version 3"
fi
what="ll_calls.cu, generated state header"
if "$NVCC" "${NVCC_FLAGS[@]}" -I"$repo/include" -I"$repo/cuda" -c "$here/ll_calls.cu" -o "$work/ll_calls.o" \
    >"$work/ll_calls.log" 2>&1; then ok "$what"
else bad "$what" "$work/ll_calls.log"; fi
if [ -f "$work/ll_calls.o" ]; then
    if "$NVCC" "${NVCC_FLAGS[@]}" -I"$repo/include" -I"$repo/cuda" -c "$repo/cuda/nvshmem_efa_gda_state.cu" \
        -o "$work/state.o" >"$work/state.log" 2>&1 &&
        "$NVCC" -gencode arch=compute_90,code=sm_90 -Xcompiler -fPIC -dlink "$work/ll_calls.o" "$work/state.o" \
            -L"$NVSHMEM/lib" -lnvshmem_device -o "$work/dlink.o" >"$work/dlink.log" 2>&1; then
        ok "device link (ll_calls + state TU + libnvshmem_device.a)"
    else bad "device link" "$work/dlink.log"; fi
    lib=""
    for d in release debug; do
        f=${CARGO_TARGET_DIR:-$repo/target}/$d/libnvshmem_efa_gda.so
        [ -f "$f" ] && { lib=$f; break; }
    done
    if [ -z "$lib" ]; then
        say "shared-object link: skipped (no libnvshmem_efa_gda.so under \${CARGO_TARGET_DIR:-target}/{release,debug}; cargo build first)"
    elif [ -f "$work/dlink.o" ]; then
        # The host link as torch links DeepEP's extension: the C++ compiler, the device-linked
        # objects, NVSHMEM's libraries, the library, the CUDA runtime.
        if c++ -shared -o "$work/libdeepep_calls.so" "$work/ll_calls.o" "$work/state.o" "$work/dlink.o" \
            "$NVSHMEM/lib/libnvshmem_device.a" "$NVSHMEM/lib/libnvshmem_host.so.3" \
            -L"$(dirname "$lib")" -lnvshmem_efa_gda "${nvcc_extra[@]}" -lcudart_static -ldl -lpthread -lrt \
            -Wl,--no-undefined >"$work/solink.log" 2>&1; then
            ok "shared-object link against $lib (--no-undefined)"
        else bad "shared-object link" "$work/solink.log"; fi
    fi
fi

# 3. the kit's replacement headers with empty stand-ins for DeepEP's headers
stub=$work/stubs
mkdir -p "$stub/kernels" "$stub/kernels/legacy" "$stub/include/deep_ep/common"
for f in configs.cuh exception.cuh utils.cuh; do echo "#pragma once" >"$stub/kernels/$f"; done
echo "#pragma once" >"$stub/kernels/legacy/utils.cuh"
echo "#pragma once" >"$stub/include/deep_ep/common/exception.cuh"
cp "$repo/patches/deepep/ibgda_device.cuh" "$stub/kernels/ibgda_device.cuh"
cp "$repo/patches/deepep/legacy_ibgda_device.cuh" "$stub/kernels/legacy/ibgda_device.cuh"
cat >"$stub/kernels/use.cu" <<'EOT'
#include "ibgda_device.cuh"
namespace deep_ep { namespace internode_ll {
__global__ void k(int *p, int rank) {
    nvshmemx_barrier_all_block();
    const uint64_t d = reinterpret_cast<uint64_t>(p);
    if (nvshmemi_get_p2p_ptr(d, rank, 1 - rank) == 0)
        nvshmemi_ibgda_put_nbi_warp(d, d + 4096, 4096, 1 - rank, 0, threadIdx.x % 32, 0);
    if (threadIdx.x == 0 && ibgda_get_state()->num_rc_per_pe > 0)
        nvshmemi_ibgda_amo_nonfetch_add(p, 1, 1 - rank, 0);
}
} }
EOT
sed -e 's/namespace deep_ep {/namespace deep_ep::legacy {/' "$stub/kernels/use.cu" >"$stub/kernels/legacy/use.cu"
if "$NVCC" "${NVCC_FLAGS[@]}" -I"$repo/include" -I"$repo/cuda" -c "$stub/kernels/use.cu" -o "$work/kit_v121.o" \
    >"$work/kit_v121.log" 2>&1; then ok "patches/deepep/ibgda_device.cuh in namespace deep_ep"
else bad "patches/deepep/ibgda_device.cuh" "$work/kit_v121.log"; fi
if "$NVCC" "${NVCC_FLAGS[@]}" -I"$stub/include" -I"$repo/include" -I"$repo/cuda" -c "$stub/kernels/legacy/use.cu" \
    -o "$work/kit_main.o" >"$work/kit_main.log" 2>&1; then ok "patches/deepep/legacy_ibgda_device.cuh in namespace deep_ep::legacy"
else bad "patches/deepep/legacy_ibgda_device.cuh" "$work/kit_main.log"; fi

# 4. DeepEP's own kernels, when a tree is given
if [ -z "${DEEPEP_SRC:-}" ]; then
    say "DeepEP's own kernels: skipped (set DEEPEP_SRC to a DeepEP v1.2.1 or main tree; PyPI's deep-ep 1.0.0 sdist has no V1 low-latency kernel that compiles: no headers, older API)"
else
    [ -d "$DEEPEP_SRC" ] || { say "DEEPEP_SRC=$DEEPEP_SRC is not a directory"; exit 2; }
    t=$work/deepep
    cp -r "$DEEPEP_SRC" "$t"
    if bash "$repo/patches/deepep/apply.sh" "$t" >"$work/apply1.log" 2>&1 &&
        bash "$repo/patches/deepep/apply.sh" "$t" >"$work/apply2.log" 2>&1 &&
        bash "$repo/patches/deepep/apply.sh" --check "$t" >"$work/apply3.log" 2>&1; then
        ok "apply.sh on $DEEPEP_SRC (applied, re-applied, --check)"
    else bad "apply.sh on $DEEPEP_SRC" "$work/apply1.log"; fi
    flags=("${NVCC_FLAGS[@]}" --ptxas-options=--register-usage-level=10 -DDISABLE_AGGRESSIVE_PTX_INSTRS
        -I"$repo/include" -I"$repo/cuda")
    if [ -f "$t/csrc/kernels/runtime.cu" ]; then
        tus=(csrc/kernels/internode_ll.cu csrc/kernels/runtime.cu csrc/kernels/efa_gda_state.cu)
        [ "${DEEPEP_CI_FULL:-0}" = 1 ] && tus+=(csrc/kernels/internode.cu)
        flags+=(-I"$t/csrc")
    else
        tus=(csrc/kernels/legacy/internode_ll.cu csrc/kernels/backend/nvshmem.cu csrc/kernels/legacy/efa_gda_state.cu)
        [ "${DEEPEP_CI_FULL:-0}" = 1 ] && tus+=(csrc/kernels/legacy/internode.cu)
        flags+=(-I"$t/csrc" -I"$t/deep_ep/include")
    fi
    objs=()
    for tu in "${tus[@]}"; do
        o=$work/$(basename "$tu" .cu).o
        t0=$(date +%s)
        if (cd "$t" && "$NVCC" "${flags[@]}" -c "$tu" -o "$o") >"$o.log" 2>&1; then
            ok "DeepEP $tu patched ($(( $(date +%s) - t0 )) s)"; objs+=("$o")
        else bad "DeepEP $tu" "$o.log"; fi
    done
    if [ ${#objs[@]} = ${#tus[@]} ]; then
        if "$NVCC" -gencode arch=compute_90,code=sm_90 -Xcompiler -fPIC -dlink "${objs[@]}" -L"$NVSHMEM/lib" -lnvshmem_device \
            -o "$work/deepep_dlink.o" >"$work/deepep_dlink.log" 2>&1; then ok "DeepEP device link"
        else bad "DeepEP device link" "$work/deepep_dlink.log"; fi
    fi
fi

[ $status = 0 ] && say "all checks passed" || say "a check failed"
exit $status
