#!/usr/bin/env bash
# Builds and runs the GDA device-API tests (gda_tests), compute-sanitizer memcheck and racecheck on
# the reduced run, and the put benchmark (gda_bench: GDA software queue, NVSHMEM's proxy path through
# this library, NVSHMEM's P2P path) with its plot, and the WQE post rate of the software queue's
# null consumer (NVSHMEM_EFA_SOFT_NULL=1, rows gda-null), on one node with 2 GPUs. See cuda/README.md.
#
#   PLUGIN_DIR=<dir with libnvshmem_efa_gda.so and nvshmem_transport_libfabric.so.3> \
#   LIBFABRIC_HOME=<libfabric prefix> OUT=<log dir> bash tests/gpu_gda/run.sh [options]
#   bash tests/gpu_gda/run.sh --compile-only          # no GPU needed (CI)
#
# Exit status: 0 when every step passed, 1 when a step failed, 2 on a usage/setup error.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

usage() {
    cat <<'EOF'
usage: tests/gpu_gda/run.sh [options]
  --compile-only      compile every cuda/ header and the test programs for sm_80, sm_90 (and
                      sm_100 when nvcc has it) with the repository's PyPI nvcc, link them against
                      target/{release,debug}/libnvshmem_efa_gda.so when it exists; no GPU, no run
  --plugin-dir DIR    directory with libnvshmem_efa_gda.so and nvshmem_transport_libfabric.so.3
                      (default: $PLUGIN_DIR)
  --libfabric DIR     libfabric prefix with lib/ (default: $LIBFABRIC_HOME)
  --out DIR           log directory (default: $OUT, else ./gpu-gda-out)
  --cases LIST        comma-separated gda_tests cases (default: all; see gda_tests --list)
  --no-tests          skip the full gda_tests run (e.g. to run the sanitizers in a separate call)
  --no-sanitizer      skip compute-sanitizer memcheck / racecheck
  --no-bench          skip the benchmark and the plot
  --debug             NVSHMEM_DEBUG=INFO (default WARN)
  --bin-dir DIR       run the gda_tests / gda_bench found in DIR instead of building them
  --save-bins DIR     copy the built programs to DIR (with --compile-only: the MPI ones, sm_90)
environment: NVSHMEM_HOME, NVCC, CUDA_HOME, GPU_ARCH (default sm_90), MPIRUN_ARGS,
  NVSHMEM_LIBFABRIC_PROVIDER (default shm), NVSHMEM_SYMMETRIC_SIZE (default 1G),
  NVSHMEM_EFA_SQ_DEPTH (default 256: many ring wraps), NVSHMEM_IBGDA_NUM_RC_PER_PE (queues per
  PE of the tests' runs, default 4), GDA_TESTS_CASE_TIMEOUT (s per case),
  GDA_BENCH_SETS (comma list of main, null, thread, host, gda, count, exchange, sweep; default the first three;
  host: the gda path on the copy route NVSHMEM_EFA_SOFT_IPC=host, rows gda-host; gda: the gda path
  alone; count: puts each followed by a count at the target (GDA_COUNT_EVERY, GDA_COUNT_QUEUES), rows
  gda-countN, into bench-count.csv; exchange: DeepEP's dispatch pattern both ways with the wait in
  the kernel (GDA_EXCHANGE), into bench-exchange.csv; sweep:
  8-byte messages over posting warps, null consumer and with data, into bench-sweep.csv),
  GDA_SWEEP (the sweep's points BLOCKSxWARPS, default "1x1 1x4 4x4 16x4 32x8 66x8 132x8"),
  GDA_SWEEP_QUEUES (the sweep's queue counts per PE, default "1 4 16 64"),
  GDA_SWEEP_THREADS (the sweep's software-queue consumer thread counts, NVSHMEM_EFA_SOFT_THREADS
  1 to 16, default the caller's NVSHMEM_EFA_SOFT_THREADS or 1; column threads),
  GDA_SWEEP_BUDGET_S (seconds per sweep run, default 8), GDA_BENCH_EXTRA (more
  gda_bench options for every benchmark run, e.g. "--blocks 16 --warps 8"), GDA_NVCC_DEFINES (extra
  nvcc options for the programs, e.g. -DNVSHMEM_EFA_GDA_PROFILE: gda_bench prints where the device's
  posting time goes),
  COMPUTE_SANITIZER, GDA_SANITIZER_TIMEOUT (s per sanitizer run, default 420),
  GDA_TESTS_TIMEOUT (s for the whole gda_tests run, default 300);
  NVSHMEM_EFA_* and FI_* variables are passed to the library runs.
EOF
}

compile_only=0
debug=0
cases=""
do_bench=1
do_sanitizer=1
do_tests=1
bin_dir=""
save_bins=""
while [ $# -gt 0 ]; do
    case "$1" in
    --compile-only) compile_only=1 ;;
    --debug) debug=1 ;;
    --cases) cases=${2:?--cases needs a value}; shift ;;
    --no-bench) do_bench=0 ;;
    --no-sanitizer) do_sanitizer=0 ;;
    --no-tests) do_tests=0 ;;
    --bin-dir) bin_dir=${2:?--bin-dir needs a value}; shift ;;
    --save-bins) save_bins=${2:?--save-bins needs a value}; shift ;;
    --plugin-dir) PLUGIN_DIR=${2:?--plugin-dir needs a value}; shift ;;
    --libfabric) LIBFABRIC_HOME=${2:?--libfabric needs a value}; shift ;;
    --out) OUT=${2:?--out needs a value}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

say() { echo "[gda run.sh] $*"; }
die() { echo "[gda run.sh] ERROR: $*" >&2; exit 2; }

created_out=""
if [ -n "${OUT:-}" ]; then
    :
elif [ $compile_only = 1 ]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/gda-gpu-build.XXXXXX")
    created_out=$OUT
else
    OUT=$PWD/gpu-gda-out
fi
mkdir -p "$OUT" || die "cannot create OUT=$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gda-gpu.XXXXXX") || die "mktemp failed"
cleanup() {
    rm -rf "$work"
    [ -n "$created_out" ] && rm -rf "$created_out"
}
trap cleanup EXIT

# ----------------------------------------------------------------------------------------------
# Tools
# ----------------------------------------------------------------------------------------------
# shellcheck source=tests/gpu/tools.sh
source "$repo/tests/gpu/tools.sh"

# mpicc -showme output -> nvcc arguments (one per line)
NVCC=$(find_nvcc) || die "nvcc not found (set NVCC or CUDA_HOME, or put nvcc on PATH)"
NVSHMEM=$(find_nvshmem) || die "NVSHMEM 3.4.x not found (set NVSHMEM_HOME to the wheel's nvidia/nvshmem directory)"
NVSHMEM=$(cd "$NVSHMEM" && pwd)
[ -f "$repo/include/nvshmem_efa_gda.h" ] || die "$repo/include/nvshmem_efa_gda.h missing (cargo build generates it)"
say "nvcc:    $NVCC"
say "NVSHMEM: $NVSHMEM"

nvcc_extra=()
nvcc_dir=$(dirname "$NVCC")
if [ -f "$nvcc_dir/../lib/libcudart_static.a" ]; then # PyPI layout: lib/ instead of lib64/
    nvcc_extra+=(-L"$(cd "$nvcc_dir/../lib" && pwd)")
fi
INCS=(-I"$repo/include" -I"$repo/cuda" -I"$here" -I"$NVSHMEM/include")

use_mpi=0
mpi_cflags=()
mpi_ldflags=()
MPICC=$(command -v mpicc 2>/dev/null || true)
if [ -n "$MPICC" ]; then
    inc_ok=0
    for d in $("$MPICC" -showme:incdirs 2>/dev/null); do [ -f "$d/mpi.h" ] && inc_ok=1; done
    if [ $inc_ok = 1 ]; then
        use_mpi=1
        mapfile -t mpi_cflags < <(mpi_to_nvcc "$("$MPICC" -showme:compile)")
        mapfile -t mpi_ldflags < <(mpi_to_nvcc "$("$MPICC" -showme:link)")
        mpi_cflags+=(-DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1)
    fi
fi
say "MPI:     $([ $use_mpi = 1 ] && echo "$MPICC (mpi.h found)" || echo "none: -DGDA_TESTS_NO_MPI builds only")"

# compile SRC OBJ LOG [flags...]: one relocatable-device-code object
compile() {
    local src=$1 obj=$2 log=$3
    shift 3
    # shellcheck disable=SC2206 # GDA_NVCC_DEFINES: e.g. -DNVSHMEM_EFA_GDA_PROFILE, split on spaces
    local cmd=("$NVCC" -std=c++17 -O2 -lineinfo -rdc=true "${ARCH_FLAGS[@]}" "$@" ${GDA_NVCC_DEFINES:-} "${INCS[@]}"
        -c "$src" -o "$obj")
    { printf '%q ' "${cmd[@]}"; echo; } >"$log"
    "${cmd[@]}" >>"$log" 2>&1
}

# link BIN LOG OBJS... : device link with libnvshmem_device.a, host link with NVSHMEM's host
# library and this project's library (LIB_ARGS), MPI (LDFLAGS_X).
LIB_ARGS=()
LDFLAGS_X=()
link() {
    local bin=$1 log=$2
    shift 2
    local cmd=("$NVCC" -rdc=true "${ARCH_FLAGS[@]}" -o "$bin" "$@" "${nvcc_extra[@]}"
        "$NVSHMEM/lib/libnvshmem_device.a" -Xlinker "$NVSHMEM/lib/libnvshmem_host.so.3"
        -Xlinker -rpath -Xlinker "$NVSHMEM/lib" "${LIB_ARGS[@]}" "${LDFLAGS_X[@]}")
    { printf '%q ' "${cmd[@]}"; echo; } >"$log"
    "${cmd[@]}" >>"$log" 2>&1
}

fail_log() { say "FAILED: $1"; tail -n 40 "$2" | sed 's/^/    /'; }

# build_programs TAG SHARED_TAG CFLAGS... : objects of both programs into $work/*TAG.o (the
# MPI-independent objects, state and deepep_style, only when SHARED_TAG == TAG, else reused from
# SHARED_TAG), then (when LINK=1) $work/gda_testsTAG and $work/gda_benchTAG.
LINK=1
build_programs() {
    local tag=$1 stag=$2
    shift 2
    local t0=$SECONDS pids=() names=() i rc=0
    compile "$here/gda_tests.cu" "$work/gda_tests$tag.o" "$OUT/build-gda_tests$tag.log" "$@" &
    pids+=($!); names+=("gda_tests$tag")
    compile "$here/gda_bench.cu" "$work/gda_bench$tag.o" "$OUT/build-gda_bench$tag.log" "$@" &
    pids+=($!); names+=("gda_bench$tag")
    if [ "$tag" = "$stag" ]; then
        compile "$here/deepep_style.cu" "$work/deepep_style$tag.o" "$OUT/build-deepep_style$tag.log" "$@" &
        pids+=($!); names+=("deepep_style$tag")
        compile "$repo/cuda/nvshmem_efa_gda_state.cu" "$work/state$tag.o" "$OUT/build-state$tag.log" "$@" &
        pids+=($!); names+=("state$tag")
    fi
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            fail_log "compile ${names[$i]}" "$OUT/build-${names[$i]}.log"
            rc=1
        fi
    done
    [ $rc = 0 ] || return 1
    if [ "$LINK" = 1 ]; then
        link "$work/gda_tests$tag" "$OUT/link-gda_tests$tag.log" "$work/gda_tests$tag.o" \
            "$work/deepep_style$stag.o" "$work/state$stag.o" ||
            { fail_log "link gda_tests$tag" "$OUT/link-gda_tests$tag.log"; return 1; }
        link "$work/gda_bench$tag" "$OUT/link-gda_bench$tag.log" "$work/gda_bench$tag.o" \
            "$work/state$stag.o" ||
            { fail_log "link gda_bench$tag" "$OUT/link-gda_bench$tag.log"; return 1; }
    fi
    say "build$tag ok ($((SECONDS - t0)) s)"
}

# ----------------------------------------------------------------------------------------------
# --compile-only
# ----------------------------------------------------------------------------------------------
if [ $compile_only = 1 ]; then
    archs=(80 90)
    "$NVCC" --list-gpu-arch 2>/dev/null | grep -qx 'compute_100' && archs+=(100)
    ARCH_FLAGS=()
    for a in "${archs[@]}"; do ARCH_FLAGS+=(-gencode "arch=compute_$a,code=sm_$a"); done
    say "architectures: ${archs[*]}"
    status=0

    # 1. Every cuda/ header on its own (self-contained, no multiple definitions), with a kernel that
    #    instantiates the posting paths of the device API.
    for h in "$repo"/cuda/*.cuh; do
        b=$(basename "$h" .cuh)
        tu=$work/hdr_$b.cu
        {
            echo "#include \"$(basename "$h")\""
            echo "__global__ void hdr_probe_kernel(int *p) { if (p) *p = 1; }"
        } >"$tu"
        if compile "$tu" "$work/hdr_$b.o" "$OUT/build-hdr_$b.log"; then
            say "header $(basename "$h"): ok"
        else
            fail_log "header $(basename "$h")" "$OUT/build-hdr_$b.log"
            status=1
        fi
    done
    # Both API headers twice in one TU, and a second TU with the same headers: with the state file,
    # the device link must not see a multiple definition.
    printf '#include "nvshmem_efa_gda_device.cuh"\n#include "nvshmem_efa_gda_ibgda.cuh"\n#include "nvshmem_efa_gda_device.cuh"\n__global__ void k2(int *p) { if (p) *p = nvshmem_efa_gda::ready(); }\n' >"$work/twice.cu"
    compile "$work/twice.cu" "$work/twice.o" "$OUT/build-twice.log" || { fail_log "twice.cu" "$OUT/build-twice.log"; status=1; }
    # No clash with NVSHMEM's own IBGDA device code: with NVSHMEM_ENABLE_ALL_DEVICE_INLINING,
    # nvshmem.h defines the global ibgda_get_state() and nvshmemi_ibgda_quiet<>(); both theirs and
    # ours (imported with the using-declarations) must be callable in one translation unit.
    cat >"$work/clash.cu" <<'EOF_CLASH'
#include <nvshmem.h>
#include <nvshmemx.h>
#include "nvshmem_efa_gda_ibgda.cuh"
__global__ void nvshmem_own(int *o) {
#ifdef __CUDA_ARCH__
    o[0] = ::ibgda_get_state()->num_rc_per_pe;
#endif
}
namespace app::legacy {
NVSHMEM_EFA_GDA_IBGDA_USING_DECLARATIONS
__global__ void ours(int *o, int *sym) {
    o[0] = ibgda_get_state()->num_rc_per_pe * ibgda_get_state()->num_devices_initialized;
    const uint64_t p = nvshmemi_get_p2p_ptr(reinterpret_cast<uint64_t>(sym), 0, 1);
    nvshmemi_ibgda_put_nbi_warp<true>(reinterpret_cast<uint64_t>(sym), reinterpret_cast<uint64_t>(sym + 8),
                                      16, 1, 0, threadIdx.x % 32, 0);
    nvshmemi_ibgda_put_nbi_warp(reinterpret_cast<uint64_t>(sym), reinterpret_cast<uint64_t>(sym + 8), 16, 1, 0,
                                threadIdx.x % 32, 3);
    if (threadIdx.x % 32 == 0) {
        nvshmemi_ibgda_amo_nonfetch_add(reinterpret_cast<int *>(p ? p : (uint64_t)sym), -3, 1, 2);
        nvshmemi_ibgda_amo_nonfetch_add(sym, 1, 0, 0, true);
        nvshmemi_ibgda_rma_p(sym, 7, 1, 0);
        nvshmemi_ibgda_quiet(1, 0);
    }
}
}  // namespace app::legacy
EOF_CLASH
    saved_arch=("${ARCH_FLAGS[@]}")
    ARCH_FLAGS=(-gencode arch=compute_90,code=sm_90)
    if compile "$work/clash.cu" "$work/clash.o" "$OUT/build-clash.log" -DNVSHMEM_ENABLE_ALL_DEVICE_INLINING; then
        say "IBGDA names next to NVSHMEM's own (NVSHMEM_ENABLE_ALL_DEVICE_INLINING): ok"
    else
        fail_log "IBGDA names next to NVSHMEM's own" "$OUT/build-clash.log"
        status=1
    fi
    ARCH_FLAGS=("${saved_arch[@]}")

    # 2. The programs: MPI and no-MPI variants; linked when the library has been built.
    lib=""
    for cand in "$repo/target/release/libnvshmem_efa_gda.so" "$repo/target/debug/libnvshmem_efa_gda.so"; do
        [ -f "$cand" ] && { lib=$cand; break; }
    done
    if [ -n "$lib" ]; then
        LINK=1
        LIB_ARGS=(-L"$(dirname "$lib")" -lnvshmem_efa_gda -Xlinker -rpath -Xlinker "$(dirname "$lib")")
        say "library: $lib (programs are linked)"
    else
        LINK=0
        say "library: none under target/{release,debug}: compiling only, link skipped (cargo build first)"
    fi
    # Every architecture for the no-MPI variant; the MPI variant (which only adds mpi.h and the MPI
    # bootstrap) for sm_90, reusing the MPI-independent objects.
    LDFLAGS_X=()
    build_programs "-nompi" "-nompi" -DGDA_TESTS_NO_MPI || status=1
    if [ $use_mpi = 1 ] && [ $status = 0 ]; then
        all_arch=("${ARCH_FLAGS[@]}")
        ARCH_FLAGS=(-gencode arch=compute_90,code=sm_90)
        LDFLAGS_X=("${mpi_ldflags[@]}")
        build_programs "-mpi" "-nompi" "${mpi_cflags[@]}" || status=1
        ARCH_FLAGS=("${all_arch[@]}")
        LDFLAGS_X=()
    fi
    if [ -n "$save_bins" ]; then
        if [ $status = 0 ] && [ "$LINK" = 1 ] && [ -x "$work/gda_tests-mpi" ]; then
            mkdir -p "$save_bins" && cp "$work/gda_tests-mpi" "$save_bins/gda_tests" &&
                cp "$work/gda_bench-mpi" "$save_bins/gda_bench" &&
                say "saved gda_tests, gda_bench (MPI, sm_90) in $save_bins" || status=1
        else
            say "FAILED: --save-bins needs the linked MPI programs (cargo build, mpicc with mpi.h)"
            status=1
        fi
    fi
    if [ $status = 0 ] && [ "$LINK" = 1 ]; then
        # Multiple-definition trap: two objects including the headers plus the state object.
        link "$work/twice_app" "$OUT/link-twice.log" "$work/twice.o" "$work/gda_tests-nompi.o" \
            "$work/deepep_style-nompi.o" "$work/state-nompi.o" ||
            { fail_log "link with a second TU" "$OUT/link-twice.log"; status=1; }
        nm "$work/gda_tests-nompi" >"$work/nm.txt" 2>&1
        if grep -q ' T nvshmem_efa_gda_load_device_state$' "$work/nm.txt" &&
            grep -q ' U nvshmemt_efa_gda_get_device_state_sized$' "$work/nm.txt"; then
            say "links: ok (second TU with the headers: no multiple definition)"
        else
            say "FAILED: gda_tests lacks the loader or the library reference"
            status=1
        fi
        for b in "$work"/gda_tests-*; do
            [ -x "$b" ] || continue
            if "$b" --list >"$work/list.txt" 2>&1; then
                if grep -q '^  put_imm ' "$work/list.txt"; then
                    say "$(basename "$b") --list: ok"
                else
                    say "FAILED: $(basename "$b") --list"
                    cat "$work/list.txt"
                    status=1
                fi
            else
                say "note: $(basename "$b") --list did not run here ($(head -n 1 "$work/list.txt")); load check skipped"
            fi
        done
    fi
    # 3. plot.py on synthetic CSVs (with or without matplotlib).
    printf 'path,size_bytes,msgs,usec,msg_rate_mps,gbytes_per_s\ngda,8,1024,2000.0,0.512,0.004096\ngda,4096,1024,2500.0,0.4096,1.677\nproxy,8,512,9000.0,0.0569,0.000455\n' >"$work/a.csv"
    printf 'path,size_bytes,msgs,usec,msg_rate_mps,gbytes_per_s\np2p,8,4096,500.0,8.192,0.0655\np2p,4096,4096,800.0,5.12,20.97\n' >"$work/b.csv"
    if python3 "$here/plot.py" "$work/m" "$work/a.csv" "$work/b.csv" >"$work/plot.txt" 2>&1 &&
        [ "$(wc -l <"$work/m.csv")" = 6 ] && grep -q '^p2p,4096,4096,' "$work/m.csv"; then
        say "plot.py ok"
    else
        say "plot.py FAILED:"
        cat "$work/plot.txt"
        status=1
    fi
    # 4. plot_exchange.py on a synthetic ab_run exchange directory, softq_trace.py on a synthetic
    #    trace of two PEs (one gzipped).
    xd=$work/xab/exchange-e144-now-r2
    mkdir -p "$xd"
    printf '  gda-exchange PE 0     7168 B   50 rounds: round median 1.0 us; kernel    25000.0 us (500.0 us per round)\n  gda-exchange PE 1     7168 B   50 rounds: round median 1.0 us; kernel    26000.0 us (520.0 us per round)\n' >"$xd/bench-exchange.log"
    if python3 "$here/plot_exchange.py" "$work/x.csv" "$work/x.png" "$work/xab" >"$work/x.txt" 2>&1 &&
        [ "$(wc -l <"$work/x.csv")" = 3 ] && grep -q '^xab,e144,now,2,0,7168,50,25000.0,500.0,yes' "$work/x.csv"; then
        say "plot_exchange.py ok"
    else
        say "plot_exchange.py FAILED:"
        cat "$work/x.txt" "$work/x.csv" 2>/dev/null
        status=1
    fi
    printf 'unix_ns,event,a,b\n1000000,take,3,0\n1050000,send,2,1\n1900000,send_done,0,850\n' >"$work/t.pe0.t0.csv"
    printf 'unix_ns,event,a,b\n1400000,amo_batch,2,40\n1500000,slow_pass,60,0\n' | gzip >"$work/t.pe1.t0.csv.gz"
    if python3 "$here/../bench/softq_trace.py" "$work/t.pe0.t0.csv" "$work/t.pe1.t0.csv.gz" --at 0 >"$work/t.txt" 2>&1 &&
        grep -q 'SEND post to answer: 1, median 850 us' "$work/t.txt" && grep -q 'AMO batches: 1, 2.0 AMOs each' "$work/t.txt" &&
        grep -q 'pe1.t0   amo_batch' "$work/t.txt"; then
        say "softq_trace.py ok"
    else
        say "softq_trace.py FAILED:"
        cat "$work/t.txt"
        status=1
    fi
    bash -n "$here/run.sh" || status=1
    if [ $status = 0 ]; then say "compile-only: ok"; else say "compile-only: FAILED"; fi
    exit $status
fi

# ----------------------------------------------------------------------------------------------
# GPU run: inputs
# ----------------------------------------------------------------------------------------------
[ -n "${PLUGIN_DIR:-}" ] || die "PLUGIN_DIR is not set (directory with nvshmem_transport_libfabric.so.3)"
[ -n "${LIBFABRIC_HOME:-}" ] || die "LIBFABRIC_HOME is not set (libfabric prefix with lib/)"
[ -d "$PLUGIN_DIR" ] || die "PLUGIN_DIR=$PLUGIN_DIR is not a directory"
[ -d "$LIBFABRIC_HOME" ] || die "LIBFABRIC_HOME=$LIBFABRIC_HOME is not a directory"
PLUGIN_DIR=$(cd "$PLUGIN_DIR" && pwd)
LIBFABRIC_HOME=$(cd "$LIBFABRIC_HOME" && pwd)
PLUGIN=$PLUGIN_DIR/nvshmem_transport_libfabric.so.3
[ -f "$PLUGIN" ] || die "$PLUGIN not found"
if [ -f "$PLUGIN_DIR/libnvshmem_efa_gda.so" ]; then
    LIB_ARGS=(-L"$PLUGIN_DIR" -lnvshmem_efa_gda -Xlinker -rpath -Xlinker "$PLUGIN_DIR")
    # The library needs libfabric 2.x; resolve it from LIBFABRIC_HOME at link time, not from the
    # system's (older) libfabric.
    if [ -n "${LIBFABRIC_HOME:-}" ] && [ -d "$LIBFABRIC_HOME/lib" ]; then
        LIB_ARGS+=(-Xlinker -rpath-link -Xlinker "$LIBFABRIC_HOME/lib")
    fi
else
    say "note: no $PLUGIN_DIR/libnvshmem_efa_gda.so: linking the transport file itself"
    LIB_ARGS=(-Xlinker "$PLUGIN" -Xlinker -rpath -Xlinker "$PLUGIN_DIR")
fi
fabric_lib=$LIBFABRIC_HOME/lib
[ -e "$fabric_lib/libfabric.so.1" ] || { [ -e "$LIBFABRIC_HOME/lib64/libfabric.so.1" ] && fabric_lib=$LIBFABRIC_HOME/lib64; }
[ -e "$fabric_lib/libfabric.so.1" ] || die "no libfabric.so.1 under $LIBFABRIC_HOME/lib or lib64"
MPIRUN=$(command -v mpirun 2>/dev/null) || die "mpirun not found"
[ $use_mpi = 1 ] || die "the GPU run needs MPI (mpicc with mpi.h) for the bootstrap"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: is this a GPU node?"
# shellcheck source=tests/gpu/mps.sh
source "$repo/tests/gpu/mps.sh"
gpu_placement 2 || die "no usable GPU layout for 2 PEs ($GPU_LAYOUT)"
trap 'gpu_placement_end; cleanup' EXIT

provider=${NVSHMEM_LIBFABRIC_PROVIDER:-shm}
dbg_level=WARN
[ $debug = 1 ] && dbg_level=INFO
read -ra mpirun_extra <<<"${MPIRUN_ARGS:---bind-to none --mca pml ob1 --mca btl self,vader,tcp}"
say "OUT:     $OUT"
say "GPUs:    $GPU_LAYOUT"
say "plugin:  $PLUGIN"
say "libfabric: $LIBFABRIC_HOME (provider $provider)"

summary=()
overall=0
record() { # step status detail
    summary+=("$(printf '%-22s %-9s %s' "$1" "$2" "$3")")
    case "$2" in ok | skipped) ;; *) overall=1 ;; esac
}

{
    echo "## date: $(date -u +%FT%TZ)  host: $(hostname)"
    timeout 30 nvidia-smi -L 2>&1
    "$NVCC" --version 2>&1 | tail -n 2
    echo "## NVSHMEM: $NVSHMEM"
    ls -l "$PLUGIN_DIR" 2>&1
    readelf -d "$PLUGIN" 2>&1 | grep -E 'SONAME|NEEDED|RUNPATH'
} >"$OUT/env.log" 2>&1

# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------
arch=${GPU_ARCH:-sm_90}
ARCH_FLAGS=(-arch="$arch")
LDFLAGS_X=("${mpi_ldflags[@]}")
if [ -n "$bin_dir" ]; then
    [ -x "$bin_dir/gda_tests" ] && [ -x "$bin_dir/gda_bench" ] ||
        die "--bin-dir $bin_dir lacks executable gda_tests and gda_bench"
    cp "$bin_dir/gda_tests" "$bin_dir/gda_bench" "$work/"
    record "build" skipped "prebuilt programs from $bin_dir"
elif ! build_programs "" "" "${mpi_cflags[@]}"; then
    record "build ($arch)" FAILED "$OUT/build-*.log $OUT/link-*.log"
    printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
    exit 1
else
    record "build ($arch)" ok "$OUT/build-*.log"
    if [ -n "$save_bins" ]; then
        mkdir -p "$save_bins" && cp "$work/gda_tests" "$work/gda_bench" "$save_bins/" &&
            say "saved gda_tests, gda_bench ($arch) in $save_bins (rerun with --bin-dir)"
    fi
fi
TESTS=$work/gda_tests
BENCH=$work/gda_bench

# ----------------------------------------------------------------------------------------------
# Environments
# ----------------------------------------------------------------------------------------------
common_env=(
    NVSHMEM_DISABLE_NVLS=1
    NVSHMEM_DISABLE_NCCL=1
    "NVSHMEM_DISABLE_CUDA_VMM=${NVSHMEM_DISABLE_CUDA_VMM:-1}"
    "NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-1G}"
    "NVSHMEM_DEBUG=$dbg_level"
    "NVSHMEM_BOOTSTRAP_MPI_PLUGIN=$NVSHMEM/lib/nvshmem_bootstrap_mpi.so.3"
    "${GPU_ENV[@]}"
)
[ -n "${GDA_TESTS_CASE_TIMEOUT:-}" ] && common_env+=("GDA_TESTS_CASE_TIMEOUT=$GDA_TESTS_CASE_TIMEOUT")
lib_env=(
    "${common_env[@]}"
    NVSHMEM_REMOTE_TRANSPORT=libfabric
    "NVSHMEM_LIBFABRIC_PROVIDER=$provider"
    NVSHMEM_DISABLE_P2P=1
    "NVSHMEM_EFA_GDA=${NVSHMEM_EFA_GDA:-soft}"
    "FI_LOG_LEVEL=${FI_LOG_LEVEL:-warn}"
    "LD_PRELOAD=$PLUGIN"
    "LD_LIBRARY_PATH=$fabric_lib:$PLUGIN_DIR:$NVSHMEM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
)
[ -d "$fabric_lib/libfabric" ] && lib_env+=("FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-$fabric_lib/libfabric}")
for name in $(compgen -e); do
    case "$name" in
    FI_LOG_LEVEL | FI_PROVIDER_PATH | NVSHMEM_EFA_GDA | NVSHMEM_EFA_SQ_DEPTH | NVSHMEM_EFA_SOFT_NULL | NVSHMEM_EFA_SOFT_THREADS) ;;
    NVSHMEM_EFA_* | FI_*) lib_env+=("$name=${!name-}") ;;
    esac
done
# The benchmark runs with the library's default queue depth (or the caller's); the tests with a
# 256-entry send queue so that every case wraps the ring many times.
bench_env=("${lib_env[@]}")
[ -n "${NVSHMEM_EFA_SQ_DEPTH:-}" ] && bench_env+=("NVSHMEM_EFA_SQ_DEPTH=$NVSHMEM_EFA_SQ_DEPTH")
# The software queue's consumer threads: the caller's NVSHMEM_EFA_SOFT_THREADS for every run but
# the sweep, which sets its own per point (GDA_SWEEP_THREADS) on sweep_base.
sweep_base=("${bench_env[@]}")
if [ -n "${NVSHMEM_EFA_SOFT_THREADS:-}" ]; then
    bench_env+=("NVSHMEM_EFA_SOFT_THREADS=$NVSHMEM_EFA_SOFT_THREADS")
    lib_env+=("NVSHMEM_EFA_SOFT_THREADS=$NVSHMEM_EFA_SOFT_THREADS")
fi
lib_env+=("NVSHMEM_EFA_SQ_DEPTH=${NVSHMEM_EFA_SQ_DEPTH:-256}")
# The tests with 4 queues per PE (docs/gda-queues.md), so that ibgda_compat's qp ids 0-3 post on
# queues of their own; the caller's NVSHMEM_IBGDA_NUM_RC_PER_PE wins (1: the one-queue layout).
lib_env+=("NVSHMEM_IBGDA_NUM_RC_PER_PE=${NVSHMEM_IBGDA_NUM_RC_PER_PE:-4}")
# NVSHMEM's own P2P path: no remote transport, nothing preloaded (the programs still need
# libnvshmem_efa_gda.so and its libfabric to load).
p2p_env=(
    "${common_env[@]}"
    NVSHMEM_REMOTE_TRANSPORT=none
    NVSHMEM_DISABLE_P2P=0
    "LD_LIBRARY_PATH=$fabric_lib:$PLUGIN_DIR:$NVSHMEM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
)

# run_mpi NAME LOG TIMEOUT ENV_ARRAY -- PROGRAM ARGS...
run_mpi() {
    local name=$1 log=$2 tmo=$3
    local -n envs_ref=$4
    shift 5
    local cmd=("$MPIRUN" --allow-run-as-root -np 2 "${mpirun_extra[@]}") e
    for e in "${envs_ref[@]}"; do cmd+=(-x "$e"); done
    cmd+=("$@")
    local full=(timeout -k 15 "$tmo" "${cmd[@]}")
    say "$name: running (limit $tmo s)"
    {
        echo "# $(date -u +%FT%TZ) $name"
        printf '%q ' "${full[@]}"
        echo
    } >"$log"
    local t0=$SECONDS rc
    "${full[@]}" >>"$log" 2>&1 </dev/null
    rc=$?
    echo "# exit status $rc after $((SECONDS - t0)) s" >>"$log"
    say "$name: exit status $rc after $((SECONDS - t0)) s (log: $log)"
    return $rc
}

status_of() { case "$1" in 0) echo ok ;; 124 | 137) echo TIMEOUT ;; *) echo FAILED ;; esac; }

show_tests() { # log rc
    grep -E '^(PASS|FAIL|WATCHDOG|FATAL|gda_tests:|nvshmem_efa_gda)|^[0-9]+ passed, [0-9]+ failed|ERROR SUMMARY|RACECHECK SUMMARY' "$1" |
        head -n 80 | sed 's/^/    /'
    if [ "$2" != 0 ]; then
        echo "    --- last lines of $1:"
        tail -n 25 "$1" | sed 's/^/    /'
    fi
}

run_tests() { # name timeout [prefix...] -- args
    local name=$1 tmo=$2 log=$OUT/$1.log rc line st
    shift 2
    local pre=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do pre+=("$1"); shift; done
    shift
    run_mpi "$name" "$log" "$tmo" "${TEST_ENV:-lib_env}" -- "${pre[@]}" "$TESTS" "$@"
    rc=$?
    show_tests "$log" $rc
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    st=$(status_of $rc)
    if [ $rc = 0 ] && ! echo "$line" | grep -q ' 0 failed'; then st=FAILED; fi
    record "$name" "$st" "${line:-no summary line} (rc $rc)"
}

# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------
targs=()
[ -n "$cases" ] && targs+=("$cases")
if [ $do_tests = 1 ]; then
    run_tests tests-gda "${GDA_TESTS_TIMEOUT:-300}" -- "${targs[@]}"
else
    record "tests-gda" skipped "--no-tests"
fi

if [ $do_sanitizer = 1 ]; then
    san=""
    for c in "${COMPUTE_SANITIZER:-}" "$nvcc_dir/compute-sanitizer" "${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}" \
        "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
        /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        [ -n "$c" ] && [ -x "$c" ] && { san=$c; break; }
    done
    if [ -z "$san" ]; then
        record "memcheck" skipped "compute-sanitizer not found (set COMPUTE_SANITIZER)"
        record "racecheck" skipped "compute-sanitizer not found"
    else
        say "compute-sanitizer: $san"
        # Under compute-sanitizer, NVSHMEM's dlopen of its plugin by file name returned the stock
        # plugin next to libnvshmem_host.so.3 ($ORIGIN) although the preloaded one was in the
        # process (seen with LD_DEBUG; the sanitizer's injected interceptors are the likely cause).
        # So the sanitizer runs use a private copy of NVSHMEM's lib directory whose plugin file is
        # this transport (the install-over route).
        overlay=$work/nvshmem-lib
        mkdir -p "$overlay"
        for f in "$NVSHMEM"/lib/*; do ln -s "$f" "$overlay/"; done
        rm -f "$overlay/libnvshmem_host.so.3" "$overlay/nvshmem_transport_libfabric.so.3"
        cp "$(readlink -f "$NVSHMEM/lib/libnvshmem_host.so.3")" "$overlay/libnvshmem_host.so.3"
        ln -s "$PLUGIN" "$overlay/nvshmem_transport_libfabric.so.3"
        san_env=()
        for e in "${lib_env[@]}"; do
            case "$e" in
            LD_PRELOAD=*) ;;
            LD_LIBRARY_PATH=*) san_env+=("LD_LIBRARY_PATH=$overlay:${e#LD_LIBRARY_PATH=}") ;;
            *) san_env+=("$e") ;;
            esac
        done
        san_pre=(--target-processes all --error-exitcode 99)
        export TEST_ENV=san_env
        run_tests sanitizer-memcheck "${GDA_SANITIZER_TIMEOUT:-420}" "$san" --tool memcheck "${san_pre[@]}" -- --reduced "${targs[@]}"
        run_tests sanitizer-racecheck "${GDA_SANITIZER_TIMEOUT:-420}" "$san" --tool racecheck "${san_pre[@]}" -- --reduced "${targs[@]}"
        unset TEST_ENV
    fi
else
    record "sanitizer" skipped "--no-sanitizer"
fi

if [ $do_bench = 1 ]; then
    bench_one() { # name env timeout paths [gda_bench options]
        local name=$1 envname=$2 tmo=$3 paths=$4 log=$OUT/$1.log csv=$OUT/$1.csv rc rows
        shift 4
        rm -f "$csv"
        # shellcheck disable=SC2086 # GDA_BENCH_EXTRA: extra gda_bench options, split on spaces
        run_mpi "$name" "$log" "$tmo" "$envname" -- "$BENCH" "$csv" --paths "$paths" "$@" ${GDA_BENCH_EXTRA:-}
        rc=$?
        grep -E '^gda_bench|^  [a-z0-9-]+ +[0-9]+ B|^  gda-exchange|^  profile|FAIL|FATAL|WATCHDOG' "$log" | sed 's/^/    /'
        [ $rc != 0 ] && { echo "    --- last lines of $log:"; tail -n 20 "$log" | sed 's/^/    /'; }
        rows=0
        [ -f "$csv" ] && rows=$(($(wc -l <"$csv") - 1))
        record "$name" "$(status_of $rc)" "$rows rows -> $csv (rc $rc)"
    }
    want_set() { case ",${GDA_BENCH_SETS:-main,null,thread}," in *",$1,"*) return 0 ;; esac; return 1; }
    # Only with GDA_BENCH_SETS naming them: the host copy route (NVSHMEM_EFA_SOFT_IPC=host, rows
    # gda-host) in the same run as main's gda (default route: the copy kernel) and proxy rows; the
    # gda path alone on the default route.
    host_env=("${bench_env[@]}" NVSHMEM_EFA_SOFT_IPC=host)
    case ",${GDA_BENCH_SETS:-}," in *,host,*) bench_one bench-host host_env 120 gda ;; esac
    case ",${GDA_BENCH_SETS:-}," in *,gda,*) bench_one bench-gda bench_env 120 gda ;; esac
    # Only with GDA_BENCH_SETS naming it: counts (DeepEP's "data, then count"): every warp adds 1 to a
    # word of its own at the peer after each GDA_COUNT_EVERY-th put (default 1), on its own queue of
    # GDA_COUNT_QUEUES (default 16), 16 blocks x 4 warps, 8 B to 64 KiB; rows gda-countN, the
    # counts checked at the target. The target applies each count to GPU memory (AMO messages).
    count_env=("${bench_env[@]}" NVSHMEM_IBGDA_NUM_RC_PER_PE="${GDA_COUNT_QUEUES:-16}")
    case ",${GDA_BENCH_SETS:-}," in *,count,*)
        bench_one bench-count count_env 120 gda --count-every "${GDA_COUNT_EVERY:-1}" \
            --queues "${GDA_COUNT_QUEUES:-16}" --blocks 16 --warps 4 --max-bytes 65536 --budget-s 40 ;;
    esac
    # Only with GDA_BENCH_SETS naming it: the exchange (DeepEP's low-latency dispatch with the wait
    # in the kernel, both directions; gda_bench --exchange). GDA_EXCHANGE="ROUNDS BLOCKSxWARPS QUEUES
    # TOKENS SIZE" (default "50 36x4 144 4 7168": 144 experts per PE, each with its own queue, as
    # DeepEP's default config on 2 ranks); rows gda-exchange and the per-round times in
    # bench-exchange.csv.rounds.csv.
    case ",${GDA_BENCH_SETS:-}," in *,exchange,*)
        read -r x_rounds x_bw x_q x_tokens x_size <<<"${GDA_EXCHANGE:-50 36x4 144 4 7168}"
        exchange_env=("${bench_env[@]}" NVSHMEM_IBGDA_NUM_RC_PER_PE="$x_q")
        bench_one bench-exchange exchange_env 120 gda --exchange "$x_rounds" --blocks "${x_bw%x*}" \
            --warps "${x_bw#*x}" --queues "$x_q" --tokens "$x_tokens" --size "$x_size" ;;
    esac
    if want_set main; then
        bench_one bench-gda-proxy bench_env 120 gda,proxy
        bench_one bench-p2p p2p_env 90 p2p
    fi
    # The GPU's WQE post rate: the software queue's null consumer completes WQEs without moving data
    # (rows gda-null, column wqe_rate_mwps; not plotted: their bandwidth is not a transfer's).
    null_env=("${bench_env[@]}" NVSHMEM_EFA_SOFT_NULL=1)
    want_set null && bench_one bench-null null_env 90 gda
    # Thread scope (every thread posts; a warp's 32 WQEs share one reservation and commit), 8 B to
    # 64 KiB: the null consumer's post rate, then GDA with data against NVSHMEM's proxy path.
    if want_set thread; then
        bench_one bench-null-thread null_env 90 gda --scope thread --max-bytes 65536 --budget-s 40
        bench_one bench-thread bench_env 120 gda,proxy --scope thread --max-bytes 65536 --budget-s 60
    fi
    # Sweep over posting warps (blocks x warps per block) and queues, 8-byte messages: the null
    # consumer's post rate (WQEs/s) and the message rate with data, one row per point, queue count
    # and kind in bench-sweep.csv. Queues Q (GDA_SWEEP_QUEUES): NVSHMEM_IBGDA_NUM_RC_PER_PE=Q and
    # gda_bench --queues Q, warp w posting on qp_id w % Q (docs/gda-queues.md); a point with fewer
    # posting warps than Q is skipped. The queues column is Q; how many distinct queues the table
    # has behind it is in each run's log ("queue table: ... distinct queue(s)"). Threads T
    # (GDA_SWEEP_THREADS): NVSHMEM_EFA_SOFT_THREADS=T, column threads, runs named ...-tT when T > 1.
    if want_set sweep; then
        sweep_csv=$OUT/bench-sweep.csv
        echo "blocks,warps,posters,queues,kind,path,size_bytes,msgs,usec,msg_rate_mps,wqe_rate_mwps,threads" >"$sweep_csv"
        for t in ${GDA_SWEEP_THREADS:-${NVSHMEM_EFA_SOFT_THREADS:-1}}; do
            case "$t" in '' | *[!0-9]* | 0) record "bench-sweep-t$t" FAILED "GDA_SWEEP_THREADS entry '$t' is not 1 to 16"; continue ;; esac
            [ "$t" -gt 16 ] && { record "bench-sweep-t$t" FAILED "GDA_SWEEP_THREADS entry '$t' is not 1 to 16"; continue; }
            tag=""
            [ "$t" != 1 ] && tag="-t$t"
            for q in ${GDA_SWEEP_QUEUES:-1 4 16 64}; do
                case "$q" in '' | *[!0-9]* | 0) record "bench-sweep-q$q" FAILED "GDA_SWEEP_QUEUES entry '$q' is not a positive number"; continue ;; esac
                for bw in ${GDA_SWEEP:-1x1 1x4 4x4 16x4 32x8 66x8 132x8}; do
                    b=${bw%x*} w=${bw#*x}
                    case "$b,$w" in *[!0-9,]* | ,* | *,) record "bench-sweep-$bw" FAILED "GDA_SWEEP point '$bw' is not BLOCKSxWARPS"; continue ;; esac
                    if [ $((b * w)) -lt "$q" ]; then
                        record "bench-sweep-$bw-q$q$tag" skipped "$((b * w)) posting warps < $q queues"
                        continue
                    fi
                    for kind in null data; do
                        sweep_env=("${sweep_base[@]}" NVSHMEM_IBGDA_NUM_RC_PER_PE="$q" NVSHMEM_EFA_SOFT_THREADS="$t")
                        [ $kind = null ] && sweep_env+=(NVSHMEM_EFA_SOFT_NULL=1)
                        bench_one "bench-sweep-$kind-$bw-q$q$tag" sweep_env 90 gda --blocks "$b" --warps "$w" \
                            --queues "$q" --max-bytes 8 --budget-s "${GDA_SWEEP_BUDGET_S:-8}"
                        f=$OUT/bench-sweep-$kind-$bw-q$q$tag.csv
                        [ -s "$f" ] && awk -F, -v b="$b" -v w="$w" -v k=$kind -v q="$q" -v t="$t" \
                            'NR > 1 { print b "," w "," b * w "," q "," k "," $1 "," $2 "," $3 "," $4 "," $5 "," $8 "," t }' \
                            "$f" >>"$sweep_csv"
                    done
                done
            done
        done
        rows=$(($(wc -l <"$sweep_csv") - 1))
        [ "$rows" -gt 0 ] && record "bench-sweep" ok "$rows rows -> $sweep_csv" ||
            record "bench-sweep" FAILED "no sweep rows (see $OUT/bench-sweep-*.log)"
    fi
    inputs=()
    for f in "$OUT/bench-gda-proxy.csv" "$OUT/bench-p2p.csv"; do [ -s "$f" ] && inputs+=("$f"); done
    [ -s "$OUT/bench-host.csv" ] && host_rows=("$OUT/bench-host.csv") || host_rows=()
    if ! want_set main; then
        record "bench-plot" skipped "GDA_BENCH_SETS has no main"
    elif [ ${#inputs[@]} -gt 0 ] && python3 "$here/plot.py" "$OUT/bench" "${inputs[@]}" "${host_rows[@]}" >"$OUT/plot.log" 2>&1; then
        sed 's/^/    /' "$OUT/plot.log"
        if [ ${#inputs[@]} = 2 ]; then
            png="$OUT/bench.png"
            [ -f "$png" ] || png="(no PNG: matplotlib missing)"
            record "bench-plot" ok "$OUT/bench.csv $OUT/bench.txt $png"
        else
            record "bench-plot" FAILED "only ${inputs[*]} produced rows"
        fi
    else
        [ -f "$OUT/plot.log" ] && cat "$OUT/plot.log"
        record "bench-plot" FAILED "no benchmark rows (see $OUT/bench-*.log)"
    fi
else
    record "bench" skipped "--no-bench"
fi

{
    echo "== summary ($(date -u +%FT%TZ), provider $provider, logs in $OUT) =="
    printf '%s\n' "${summary[@]}"
    for f in "$OUT"/tests-gda.log "$OUT"/sanitizer-*.log; do
        [ -f "$f" ] || continue
        grep -E '^(FAIL|WATCHDOG|FATAL)' "$f" | sed "s|^|  $(basename "$f" .log): |" | head -n 30
    done
    if [ $overall = 0 ]; then echo "RESULT: all steps passed"; else echo "RESULT: FAILED"; fi
} | tee "$OUT/summary.txt"
exit $overall
