#!/usr/bin/env bash
# Builds and runs the NVSHMEM GPU tests and the put benchmark with 2 PEs on one node (one GPU each,
# or both on one GPU under CUDA MPS; tests/gpu/mps.sh), through this project's transport (preloaded
# as NVSHMEM's libfabric transport) and, for reference, through NVSHMEM's own P2P path. Works with
# NVSHMEM 3.4.x to 3.8.x: the transport file preloaded is nvshmem_transport_libfabric.so.<ABI major>,
# the major read from NVSHMEM_TRANSPORT_PLUGIN_MAJOR_VERSION of the NVSHMEM headers. See
# tests/gpu/README.md.
#
#   PLUGIN_DIR=<dir with nvshmem_transport_libfabric.so.N> LIBFABRIC_HOME=<libfabric prefix> \
#   OUT=<log dir> bash tests/gpu/run.sh [options]
#   bash tests/gpu/run.sh --compile-only          # no GPU needed (CI)
#
# Exit status: 0 when every step passed, 1 when a step failed, 2 on a usage/setup error.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

usage() {
    cat <<'EOF'
usage: tests/gpu/run.sh [options]
  --compile-only      build the programs (nvshmem_tests, nvshmem_bench, stream_bench) for sm_80
                      and sm_90 and link them; no GPU, no run
  --plugin-dir DIR    directory with nvshmem_transport_libfabric.so.N, N = NVSHMEM's transport ABI
                      major (3 to 7), and libnvshmem_efa_gda.so
                      (default: $PLUGIN_DIR)
  --libfabric DIR     libfabric prefix with lib/ and bin/ (default: $LIBFABRIC_HOME)
  --out DIR           log directory (default: $OUT, else ./gpu-out)
  --cases LIST        comma-separated test cases (default: all; see nvshmem_tests --list)
  --no-bench          skip the benchmark
  --bench-args "ARGS" more arguments for both benchmark runs, e.g. "--op get --blocks 4" (blocking
                      nvshmemx_getmem_block from 4 blocks, PyTorch's all_to_all_vdev pattern)
  --no-fabtests       skip the raw-libfabric reference of the benchmark (fabtests -D cuda,
                      tests/gpu/fabtests_cuda.sh)
  --no-tests          skip the test run through the library (e.g. to run only the benchmark)
  --no-p2p-tests      skip the reference run of the tests on NVSHMEM's P2P path
  --debug             NVSHMEM_DEBUG=INFO and NVSHMEM_INFO=1 (default NVSHMEM_DEBUG=WARN)
  --bin-dir DIR       run the nvshmem_tests / nvshmem_bench found in DIR instead of building
  --save-bins DIR     with --compile-only: copy the built programs (sm_80 + sm_90) to DIR
environment: NVSHMEM_HOME, NVCC, CUDA_HOME, GPU_ARCH (default sm_90), MPIRUN_ARGS,
  NVSHMEM_LIBFABRIC_PROVIDER (default shm), NVSHMEM_SYMMETRIC_SIZE (default 1G),
  NVSHMEM_TESTS_TIMEOUT (s per case, default 60), NVSHMEM_TESTS_WAIT (s per device wait, default 10);
  NVSHMEM_EFA_* and FI_* variables are passed to the library runs.
EOF
}

compile_only=0
debug=0
cases=""
do_bench=1
bench_args=""
do_fabtests=1
do_p2p_tests=1
do_tests=1
bin_dir=""
save_bins=""
while [ $# -gt 0 ]; do
    case "$1" in
    --compile-only) compile_only=1 ;;
    --debug) debug=1 ;;
    --cases) cases=${2:?--cases needs a value}; shift ;;
    --no-bench) do_bench=0 ;;
    --bench-args) bench_args=${2?--bench-args needs a value}; shift ;;
    --no-fabtests) do_fabtests=0 ;;
    --no-p2p-tests) do_p2p_tests=0 ;;
    --no-tests) do_tests=0 ;;
    --plugin-dir) PLUGIN_DIR=${2:?--plugin-dir needs a value}; shift ;;
    --libfabric) LIBFABRIC_HOME=${2:?--libfabric needs a value}; shift ;;
    --out) OUT=${2:?--out needs a value}; shift ;;
    --bin-dir) bin_dir=${2:?--bin-dir needs a value}; shift ;;
    --save-bins) save_bins=${2:?--save-bins needs a value}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

say() { echo "[run.sh] $*"; }
die() { echo "[run.sh] ERROR: $*" >&2; exit 2; }

created_out=""
if [ -n "${OUT:-}" ]; then
    :
elif [ $compile_only = 1 ]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/nvshmem-gpu-build.XXXXXX")
    created_out=$OUT
else
    OUT=$PWD/gpu-out
fi
mkdir -p "$OUT" || die "cannot create OUT=$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/nvshmem-gpu.XXXXXX") || die "mktemp failed"
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
# Prebuilt programs need only NVSHMEM's runtime (no libnvshmem_device.a).
need_device_lib=1
[ -n "$bin_dir" ] && [ $compile_only = 0 ] && need_device_lib=0

# mpicc -showme output -> nvcc arguments (one per line)
if ! NVCC=$(find_nvcc); then
    [ -n "$bin_dir" ] && [ $compile_only = 0 ] || die "nvcc not found (set NVCC or CUDA_HOME, or put nvcc on PATH)"
    NVCC=""
fi
NVSHMEM=$(find_nvshmem) || die "NVSHMEM not found (set NVSHMEM_HOME to the wheel's nvidia/nvshmem directory, or one tests/gpu/fetch_nvshmem.sh made)"
NVSHMEM=$(cd "$NVSHMEM" && pwd)
say "nvcc:    ${NVCC:-(none; using --bin-dir)}"
nvshmem_ver=$(nvshmem_version "$NVSHMEM")
abi_major=$(nvshmem_transport_major "$NVSHMEM")
[ -n "$abi_major" ] || die "no NVSHMEM_TRANSPORT_PLUGIN_MAJOR_VERSION in $NVSHMEM/include/non_abi/nvshmem_version.h"
say "NVSHMEM: $NVSHMEM (version ${nvshmem_ver:-unknown}, transport ABI $abi_major)"

nvcc_extra=()
if [ -n "$NVCC" ] && [ -f "$(dirname "$NVCC")/../lib/libcudart_static.a" ]; then
    nvcc_extra+=(-L"$(cd "$(dirname "$NVCC")/../lib" && pwd)") # PyPI layout: lib/, not lib64/
fi

# MPI: used when mpi.h is available; otherwise the programs use NVSHMEM's unique-id bootstrap
# (id exchanged through a file) and mpirun only launches them.
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
if [ $use_mpi = 1 ]; then
    say "MPI:     $MPICC (mpi.h found): MPI bootstrap"
else
    say "MPI:     no mpicc with mpi.h: building with -DNVSHMEM_TESTS_NO_MPI (unique-id bootstrap)"
fi

# build SRC BIN LOG: compiles and links one program with the current ARCH_FLAGS, CFLAGS_X
# (before the source) and LDFLAGS_X (after the objects, so --as-needed linkers keep them).
ARCH_FLAGS=()
CFLAGS_X=()
LDFLAGS_X=()
build() {
    local src=$1 bin=$2 log=$3
    local cmd=("$NVCC" -std=c++17 -O2 -lineinfo -rdc=true "${ARCH_FLAGS[@]}" "${CFLAGS_X[@]}"
        -I"$here" -I"$NVSHMEM/include" -o "$bin" "$src" "${nvcc_extra[@]}"
        "$NVSHMEM/lib/libnvshmem_device.a" -Xlinker "$NVSHMEM/lib/libnvshmem_host.so.3"
        -Xlinker -rpath -Xlinker "$NVSHMEM/lib" "${LDFLAGS_X[@]}")
    { printf '%q ' "${cmd[@]}"; echo; } >"$log"
    "${cmd[@]}" >>"$log" 2>&1
}

# build_variant TAG: the three programs, in parallel, into $work/{nvshmem_tests,nvshmem_bench,stream_bench}TAG
build_variant() {
    local tag=$1
    local t0=$SECONDS rc1 rc2 rc3 p q
    build "$here/nvshmem_tests.cu" "$work/nvshmem_tests$tag" "$OUT/build-tests$tag.log" &
    p=$!
    build "$here/stream_bench.cu" "$work/stream_bench$tag" "$OUT/build-stream$tag.log" &
    q=$!
    build "$here/nvshmem_bench.cu" "$work/nvshmem_bench$tag" "$OUT/build-bench$tag.log"
    rc2=$?
    wait $p
    rc1=$?
    wait $q
    rc3=$?
    if [ $rc1 != 0 ] || [ $rc2 != 0 ] || [ $rc3 != 0 ]; then
        say "build$tag FAILED ($((SECONDS - t0)) s); compiler output:"
        [ $rc1 != 0 ] && tail -n 40 "$OUT/build-tests$tag.log"
        [ $rc2 != 0 ] && tail -n 40 "$OUT/build-bench$tag.log"
        [ $rc3 != 0 ] && tail -n 40 "$OUT/build-stream$tag.log"
        return 1
    fi
    say "build$tag ok ($((SECONDS - t0)) s)"
}

# ----------------------------------------------------------------------------------------------
# --compile-only
# ----------------------------------------------------------------------------------------------
if [ $compile_only = 1 ]; then
    # shellcheck disable=SC2054 # the commas belong to nvcc's -gencode syntax
    ARCH_FLAGS=(-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90)
    status=0
    if [ $use_mpi = 1 ]; then
        CFLAGS_X=("${mpi_cflags[@]}")
        LDFLAGS_X=("${mpi_ldflags[@]}")
        build_variant "-mpi" || status=1
    fi
    CFLAGS_X=(-DNVSHMEM_TESTS_NO_MPI)
    LDFLAGS_X=()
    build_variant "-nompi" || status=1
    if [ $status = 0 ]; then
        # The binaries load (libnvshmem_host.so.3 through their RPATH) and list their cases.
        for b in "$work"/nvshmem_tests-*; do
            "$b" --list >"$work/list.txt" 2>&1 && grep -q '^  collectives ' "$work/list.txt" ||
                { say "$(basename "$b") --list failed:"; cat "$work/list.txt"; status=1; }
        done
        for b in "$work"/nvshmem_bench-* "$work"/stream_bench-*; do
            "$b" --help >/dev/null 2>&1 || { say "$(basename "$b") --help failed"; status=1; }
        done
        # compare.py on two small synthetic CSVs
        printf 'path,size_bytes,iters,usec_per_op,gbytes_per_s\nlib,8,100,10.0,0.0008\nlib,4096,100,12.0,0.34\n' >"$work/a.csv"
        printf 'path,size_bytes,iters,usec_per_op,gbytes_per_s\np2p,8,100,1.0,0.008\np2p,4096,100,2.0,2.05\np2p,8192,50,2.5,3.3\n' >"$work/b.csv"
        if python3 "$here/compare.py" "$work/a.csv" "$work/b.csv" "$work/c.csv" >"$work/cmp.txt" 2>&1 &&
            [ "$(wc -l <"$work/c.csv")" = 4 ] && grep -q '^4096,12.0000,2.0000,' "$work/c.csv"; then
            say "compare.py ok"
        else
            say "compare.py FAILED:"
            cat "$work/cmp.txt"
            status=1
        fi
    fi
    bash -n "$here/run.sh" || status=1
    if [ $status = 0 ] && [ -n "$save_bins" ]; then
        v=-nompi
        [ $use_mpi = 1 ] && v=-mpi
        mkdir -p "$save_bins" && cp "$work/nvshmem_tests$v" "$save_bins/nvshmem_tests" &&
            cp "$work/nvshmem_bench$v" "$save_bins/nvshmem_bench" &&
            cp "$work/stream_bench$v" "$save_bins/stream_bench" &&
            say "saved nvshmem_tests, nvshmem_bench, stream_bench ($v, sm_80 + sm_90) in $save_bins" || status=1
    fi
    if [ $status = 0 ]; then say "compile-only: ok"; else say "compile-only: FAILED"; fi
    exit $status
fi

# ----------------------------------------------------------------------------------------------
# GPU run: inputs
# ----------------------------------------------------------------------------------------------
[ -n "${PLUGIN_DIR:-}" ] || die "PLUGIN_DIR is not set (directory with nvshmem_transport_libfabric.so.$abi_major)"
[ -n "${LIBFABRIC_HOME:-}" ] || die "LIBFABRIC_HOME is not set (libfabric prefix with lib/ and bin/)"
[ -d "$PLUGIN_DIR" ] || die "PLUGIN_DIR=$PLUGIN_DIR is not a directory"
[ -d "$LIBFABRIC_HOME" ] || die "LIBFABRIC_HOME=$LIBFABRIC_HOME is not a directory"
PLUGIN_DIR=$(cd "$PLUGIN_DIR" && pwd)
LIBFABRIC_HOME=$(cd "$LIBFABRIC_HOME" && pwd)
PLUGIN=$PLUGIN_DIR/nvshmem_transport_libfabric.so.$abi_major
[ -f "$PLUGIN" ] || die "$PLUGIN not found (NVSHMEM $nvshmem_ver opens transport ABI $abi_major; cmake/install.sh installs .so.3 to .so.7)"
[ -f "$PLUGIN_DIR/libnvshmem_efa_gda.so" ] || say "note: $PLUGIN_DIR/libnvshmem_efa_gda.so not found (only the transport file is preloaded)"
fabric_lib=$LIBFABRIC_HOME/lib
[ -e "$fabric_lib/libfabric.so.1" ] || { [ -e "$LIBFABRIC_HOME/lib64/libfabric.so.1" ] && fabric_lib=$LIBFABRIC_HOME/lib64; }
[ -e "$fabric_lib/libfabric.so.1" ] || die "no libfabric.so.1 under $LIBFABRIC_HOME/lib or lib64"
MPIRUN=$(command -v mpirun 2>/dev/null) || die "mpirun not found"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: is this a GPU node?"
command -v timeout >/dev/null 2>&1 || die "timeout (coreutils) not found"
# shellcheck source=tests/gpu/mps.sh
source "$repo/tests/gpu/mps.sh"
gpu_placement 2 || die "no usable GPU layout for 2 PEs ($GPU_LAYOUT)"
trap 'gpu_placement_end; cleanup' EXIT

provider=${NVSHMEM_LIBFABRIC_PROVIDER:-shm}
dbg_level=WARN
[ $debug = 1 ] && dbg_level=INFO
# ob1 + vader/tcp only: no UCX or libfabric inside MPI (memory hooks, a second libfabric user);
# no CMA single copy (refused in many containers); no core binding (the proxy thread needs a core).
read -ra mpirun_extra <<<"${MPIRUN_ARGS:---bind-to none --mca pml ob1 --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none --mca osc ^ucx}"

say "OUT:     $OUT"
say "GPUs:    $GPU_LAYOUT"
say "plugin:  $PLUGIN"
say "libfabric: $LIBFABRIC_HOME (provider $provider)"

summary=()
overall=0
record() { # step status detail
    summary+=("$(printf '%-24s %-9s %s' "$1" "$2" "$3")")
    case "$2" in ok | skipped) ;; *) overall=1 ;; esac
}

# ----------------------------------------------------------------------------------------------
# Environment facts
# ----------------------------------------------------------------------------------------------
env_log=$OUT/env.log
{
    fact() { echo "## $*"; timeout 30 "$@" 2>&1 || echo "(exit status $?)"; echo; }
    echo "## date: $(date -u +%FT%TZ)  host: $(hostname)  kernel: $(uname -r)"
    echo
    fact nvidia-smi -L
    fact nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv
    fact nvidia-smi topo -m
    [ -n "$NVCC" ] && fact "$NVCC" --version
    echo "## NVSHMEM: $NVSHMEM"
    grep -E '#define NVSHMEM_(VENDOR_(MAJOR|MINOR|PATCH)|TRANSPORT_PLUGIN_MAJOR)_VERSION' \
        "$NVSHMEM/include/non_abi/nvshmem_version.h" 2>&1
    echo
    fact "$MPIRUN" --version
    echo "## MPI build: use_mpi=$use_mpi"
    echo
    fact env LD_LIBRARY_PATH="$fabric_lib" "$LIBFABRIC_HOME/bin/fi_info" --version
    fact env LD_LIBRARY_PATH="$fabric_lib" FI_LOG_LEVEL=warn "$LIBFABRIC_HOME/bin/fi_info" -p "$provider"
    fact env LD_LIBRARY_PATH="$fabric_lib" FI_LOG_LEVEL=warn "$LIBFABRIC_HOME/bin/fi_info" -p "$provider" -c FI_HMEM
    fact ls -l "$PLUGIN_DIR"
    echo "## dynamic section of $PLUGIN"
    (readelf -d "$PLUGIN" 2>&1 | grep -E 'SONAME|NEEDED|RPATH|RUNPATH') || echo "(readelf unavailable)"
    echo
    fact env LD_LIBRARY_PATH="$fabric_lib:$PLUGIN_DIR:$NVSHMEM/lib" ldd "$PLUGIN"
    fact df -h /dev/shm
    echo "## ulimit -l: $(ulimit -l)"
} >"$env_log" 2>&1
ldd_fabric=$(env LD_LIBRARY_PATH="$fabric_lib:$PLUGIN_DIR:$NVSHMEM/lib" ldd "$PLUGIN" 2>/dev/null |
    grep 'libfabric.so' | sed 's/^[[:space:]]*//' | head -n 1)
n_fi=$(env LD_LIBRARY_PATH="$fabric_lib" FI_LOG_LEVEL=warn timeout 30 "$LIBFABRIC_HOME/bin/fi_info" -p "$provider" 2>/dev/null | grep -c 'provider:')
n_hmem=$(env LD_LIBRARY_PATH="$fabric_lib" FI_LOG_LEVEL=warn timeout 30 "$LIBFABRIC_HOME/bin/fi_info" -p "$provider" -c FI_HMEM 2>/dev/null | grep -c 'provider:')
say "environment facts (full: $env_log):"
echo "    GPUs:      $(timeout 30 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | paste -sd ';' -)"
[ -n "$NVCC" ] && echo "    nvcc:      $("$NVCC" --version 2>&1 | grep -o 'release [0-9.]*' | head -n 1)"
echo "    NVSHMEM:   $nvshmem_ver ($NVSHMEM)"
echo "    MPI:       $("$MPIRUN" --version 2>&1 | head -n 1) (bootstrap: $([ $use_mpi = 1 ] && echo MPI || echo unique id))"
echo "    libfabric: $(env LD_LIBRARY_PATH="$fabric_lib" timeout 30 "$LIBFABRIC_HOME/bin/fi_info" --version 2>&1 | grep -i 'libfabric:' | head -n 1); fi_info -p $provider: $n_fi entries, $n_hmem with FI_HMEM"
echo "    plugin:    ${ldd_fabric:-libfabric.so.1 not linked directly}"
echo "    /dev/shm:  $(df -h /dev/shm 2>/dev/null | tail -n 1)"
if [ -n "$ldd_fabric" ] && ! echo "$ldd_fabric" | grep -q "=> $fabric_lib/"; then
    say "WARNING: the plugin does not resolve libfabric.so.1 from $fabric_lib"
fi
[ "$n_fi" -gt 0 ] 2>/dev/null || say "WARNING: fi_info -p $provider found no provider entries (see $env_log)"
record "environment" ok "$env_log"

# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------
if [ -n "$bin_dir" ]; then
    [ -x "$bin_dir/nvshmem_tests" ] && [ -x "$bin_dir/nvshmem_bench" ] ||
        die "--bin-dir $bin_dir lacks executable nvshmem_tests and nvshmem_bench"
    cp "$bin_dir/nvshmem_tests" "$bin_dir/nvshmem_bench" "$work/"
    record "build" skipped "prebuilt programs from $bin_dir"
fi
arch=${GPU_ARCH:-sm_90}
ARCH_FLAGS=(-arch="$arch")
if [ $use_mpi = 1 ]; then
    CFLAGS_X=("${mpi_cflags[@]}")
    LDFLAGS_X=("${mpi_ldflags[@]}")
else
    CFLAGS_X=(-DNVSHMEM_TESTS_NO_MPI)
    LDFLAGS_X=()
fi
if [ -z "$bin_dir" ] && ! build_variant ""; then
    record "build ($arch)" FAILED "$OUT/build-*.log"
    printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
    exit 1
fi
[ -z "$bin_dir" ] && record "build ($arch)" ok "$OUT/build-tests.log, $OUT/build-bench.log"
TESTS=$work/nvshmem_tests
BENCH=$work/nvshmem_bench

# ----------------------------------------------------------------------------------------------
# Run environments
# ----------------------------------------------------------------------------------------------
common_env=(
    NVSHMEM_DISABLE_NVLS=1
    NVSHMEM_DISABLE_NCCL=1
    "NVSHMEM_DISABLE_CUDA_VMM=${NVSHMEM_DISABLE_CUDA_VMM:-1}"
    "NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-1G}"
    "NVSHMEM_DEBUG=$dbg_level"
    "NVSHMEM_BOOTSTRAP_MPI_PLUGIN=$NVSHMEM/lib/nvshmem_bootstrap_mpi.so.3"
    "NVSHMEM_TESTS_TIMEOUT=${NVSHMEM_TESTS_TIMEOUT:-60}"
    "${GPU_ENV[@]}"
    "NVSHMEM_TESTS_WAIT=${NVSHMEM_TESTS_WAIT:-10}"
)
[ $debug = 1 ] && common_env+=(NVSHMEM_INFO=1)
lib_env=(
    "${common_env[@]}"
    NVSHMEM_REMOTE_TRANSPORT=libfabric
    "NVSHMEM_LIBFABRIC_PROVIDER=$provider"
    NVSHMEM_DISABLE_P2P=1
    "FI_LOG_LEVEL=${FI_LOG_LEVEL:-warn}"
    "LD_PRELOAD=$PLUGIN"
    "LD_LIBRARY_PATH=$fabric_lib:$PLUGIN_DIR:$NVSHMEM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
)
[ -d "$fabric_lib/libfabric" ] && lib_env+=("FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-$fabric_lib/libfabric}")
# Pass the caller's NVSHMEM_EFA_* and FI_* settings to the library runs.
for name in $(compgen -e); do
    case "$name" in
    FI_LOG_LEVEL | FI_PROVIDER_PATH) ;;
    NVSHMEM_EFA_* | FI_*) lib_env+=("$name=${!name-}") ;;
    esac
done
# shellcheck disable=SC2034 # used through run_mpi's name reference
p2p_env=(
    "${common_env[@]}"
    NVSHMEM_REMOTE_TRANSPORT=none
    NVSHMEM_DISABLE_P2P=0
    "LD_LIBRARY_PATH=$NVSHMEM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
)

# run_mpi NAME LOG TIMEOUT ENV_ARRAY -- PROGRAM ARGS...
run_mpi() {
    local name=$1 log=$2 tmo=$3
    local -n envs_ref=$4
    local log_tag
    log_tag=$(basename "$log" .log)
    shift 5
    local cmd=("$MPIRUN" --allow-run-as-root -np 2 "${mpirun_extra[@]}") e
    for e in "${envs_ref[@]}"; do cmd+=(-x "$e"); done
    # Read only by programs built without MPI (unique-id bootstrap); a fresh path per job.
    rm -f "$work/uid-$log_tag"
    cmd+=(-x "NVSHMEM_TESTS_UID_FILE=$work/uid-$log_tag")
    cmd+=("$@")
    local full=(timeout -k 15 "$tmo" "${cmd[@]}")
    say "$name: running (limit $tmo s); command line:"
    printf ' %q' "${full[@]}"
    echo
    {
        echo "# $(date -u +%FT%TZ) $name"
        echo "# command: $(printf '%q ' "${full[@]}")"
    } >"$log"
    local t0=$SECONDS rc
    "${full[@]}" >>"$log" 2>&1 </dev/null
    rc=$?
    echo "# exit status $rc after $((SECONDS - t0)) s" >>"$log"
    say "$name: exit status $rc after $((SECONDS - t0)) s (log: $log)"
    return $rc
}

status_of() { # rc -> word
    case "$1" in 0) echo ok ;; 124 | 137) echo TIMEOUT ;; *) echo FAILED ;; esac
}

show_tests() { # log rc
    grep -E '^(PASS|FAIL|WATCHDOG|FATAL|WARNING|env:|nvshmem_tests:|peer access:|finalize ok)|^  note:|^  \[pe [0-9]+\]|^[0-9]+ passed, [0-9]+ failed' "$1" | head -n 120 | sed 's/^/    /'
    if [ "$2" != 0 ] && ! grep -q '^finalize ok' "$1"; then
        echo "    --- last lines of $1:"
        grep -vE '^(# |RUN |PASS )' "$1" | tail -n 25 | sed 's/^/    /'
    fi
}

# run_tests NAME ENV_ARRAY LIMIT_S
# Runs the selected cases; when a run ends without its final count (a case crashed the process,
# hung past the watchdog, or hit the time limit), the case that was running is marked CRASH and
# the remaining cases run again in a new job, while time is left (NAME.log, NAME-2.log, ...).
run_tests() {
    local name=$1 envname=$2 limit=$3
    local deadline=$((SECONDS + limit)) attempt=1 log rc left c crashed
    local all=() sel=() remaining=() next=() want=() w
    mapfile -t all < <(LD_LIBRARY_PATH="$NVSHMEM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$TESTS" --names)
    [ ${#all[@]} -gt 0 ] || { record "$name" FAILED "$TESTS --names printed nothing (does it load?)"; return; }
    if [ -n "$cases" ]; then IFS=, read -ra want <<<"$cases"; else want=("${all[@]}"); fi
    for w in "${want[@]}"; do
        [[ " ${all[*]} " == *" $w "* ]] || say "WARNING: unknown test case '$w' ignored (known: ${all[*]})"
    done
    for c in "${all[@]}"; do
        for w in "${want[@]}"; do [ "$c" = "$w" ] && sel+=("$c"); done
    done
    if [ ${#sel[@]} = 0 ]; then
        record "$name" FAILED "no known case selected by --cases '$cases'"
        return
    fi
    declare -A res=()
    remaining=("${sel[@]}")
    while [ ${#remaining[@]} -gt 0 ]; do
        left=$((deadline - SECONDS))
        if [ $attempt -gt 1 ] && [ $left -lt 30 ]; then
            say "$name: not enough time left to resume ${remaining[*]}"
            break
        fi
        log=$OUT/$name.log
        [ $attempt -gt 1 ] && log=$OUT/$name-$attempt.log
        [ $attempt -gt 1 ] && say "$name: resuming after a crash with: ${remaining[*]}"
        run_mpi "$name" "$log" "$left" "$envname" -- "$TESTS" "$(IFS=,; echo "${remaining[*]}")"
        rc=$?
        show_tests "$log" $rc
        for c in "${remaining[@]}"; do
            if grep -q "^PASS $c " "$log"; then res[$c]=PASS
            elif grep -q "^FAIL $c " "$log"; then res[$c]=FAIL; fi
        done
        if ! grep -q '^RUN ' "$log"; then
            say "$name: the job ended before its first case started (status $rc); see $log"
            res[__startup__]=CRASH
            break
        fi
        crashed=""
        next=()
        for c in "${remaining[@]}"; do
            if [ -z "${res[$c]:-}" ]; then
                if [ -z "$crashed" ]; then crashed=$c; res[$c]=CRASH; else next+=("$c"); fi
            fi
        done
        if [ -z "$crashed" ]; then
            # Every case reported; the job must also shut down cleanly.
            if ! grep -q '^finalize ok' "$log" || { [ $rc != 0 ] && ! grep -q '^FAIL ' "$log"; }; then
                say "$name: every case reported, but shutting down failed (status $rc); see $log"
                res[__finalize__]=CRASH
            fi
            break
        fi
        say "$name: case '$crashed' did not report a result (status $rc: $(status_of $rc)); see $log"
        remaining=("${next[@]}")
        attempt=$((attempt + 1))
    done
    local npass=0 nfail=0 ncrash=0 nnot=0 failed=() crashes=() notrun=()
    for c in "${sel[@]}"; do
        case "${res[$c]:-}" in
        PASS) npass=$((npass + 1)) ;;
        FAIL) nfail=$((nfail + 1)); failed+=("$c") ;;
        CRASH) ncrash=$((ncrash + 1)); crashes+=("$c") ;;
        *) nnot=$((nnot + 1)); notrun+=("$c") ;;
        esac
    done
    local detail="$npass passed, $nfail failed, $ncrash crashed, $nnot not run"
    [ $nfail -gt 0 ] && detail+="; failed: ${failed[*]}"
    [ $ncrash -gt 0 ] && detail+="; crashed: ${crashes[*]}"
    [ $nnot -gt 0 ] && detail+="; not run: ${notrun[*]}"
    [ -n "${res[__finalize__]:-}" ] && detail+="; nvshmem_finalize / shutdown failed"
    [ -n "${res[__startup__]:-}" ] && detail+="; start-up failed (see the log)"
    if [ $npass = ${#sel[@]} ] && [ -z "${res[__finalize__]:-}" ]; then
        record "$name" ok "$detail"
    else
        record "$name" FAILED "$detail"
    fi
}

run_bench() { # name env_array timeout
    local name=$1 envname=$2 log=$OUT/$1.log csv=$OUT/$1.csv rc st rows
    rm -f "$csv"
    # shellcheck disable=SC2086 # $bench_args: several words by design
    run_mpi "$name" "$log" "$3" "$envname" -- "$BENCH" "$csv" --label "${name#bench-}" $bench_args
    rc=$?
    grep -E '^nvshmem_bench|^ +size_bytes|^ +[0-9]+ +[0-9]+ |sizes measured|FAIL|VERIFY|FATAL|WATCHDOG' "$log" | sed 's/^/    /'
    [ $rc != 0 ] && { echo "    --- last lines of $log:"; grep -v '^# ' "$log" | tail -n 20 | sed 's/^/    /'; }
    rows=0
    [ -f "$csv" ] && rows=$(($(wc -l <"$csv") - 1))
    st=$(status_of $rc)
    record "$name" "$st" "$rows sizes -> $csv (rc $rc)"
}

# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------
if [ $do_tests = 1 ]; then
    run_tests tests-library lib_env 180
else
    record "tests-library" skipped "--no-tests"
fi
if [ $do_bench = 1 ]; then
    run_bench bench-library lib_env 90
    run_bench bench-p2p p2p_env 60
    fab_csvs=()
    if [ $do_fabtests = 1 ]; then
        # Raw libfabric on GPU memory (fi_rma_bw / fi_rma_pingpong -D cuda), same provider.
        if LIBFABRIC_HOME=$LIBFABRIC_HOME RUN_TIMEOUT=30 bash "$here/fabtests_cuda.sh" "$OUT" "$provider" \
            >"$OUT/fabtests-cuda.out" 2>&1; then
            sed 's/^/    /' "$OUT/fabtests-cuda.out"
            fab_csvs=("$OUT/fabtests-cuda-bw.csv")
            [ "$(wc -l <"$OUT/fabtests-cuda-lat.csv")" -gt 1 ] && fab_csvs+=("$OUT/fabtests-cuda-lat.csv")
            record "bench-fabtests-cuda" ok "$OUT/fabtests-cuda-bw.csv"
        else
            tail -n 20 "$OUT/fabtests-cuda.out" | sed 's/^/    /'
            record "bench-fabtests-cuda" FAILED "$OUT/fabtests-cuda.out, $OUT/fabtests-cuda.log"
        fi
    fi
    if [ -s "$OUT/bench-library.csv" ] && [ -s "$OUT/bench-p2p.csv" ]; then
        what="put (1 block, putmem_nbi_block + quiet)"
        [ -n "$bench_args" ] && what="nvshmem_bench $bench_args"
        if NVSHMEM_BENCH_WHAT=$what python3 "$here/compare.py" "$OUT/bench-library.csv" "$OUT/bench-p2p.csv" \
            "$OUT/bench-compare.csv" "${fab_csvs[@]}" >"$OUT/bench-compare.log" 2>&1; then
            sed 's/^/    /' "$OUT/bench-compare.log"
            record "bench-compare" ok "$OUT/bench-compare.csv"
        else
            cat "$OUT/bench-compare.log"
            record "bench-compare" FAILED "$OUT/bench-compare.log"
        fi
    else
        record "bench-compare" FAILED "a benchmark CSV is missing or empty"
    fi
else
    record "bench" skipped "--no-bench"
fi
if [ $do_p2p_tests = 1 ]; then
    run_tests tests-p2p p2p_env 75
else
    record "tests-p2p" skipped "--no-p2p-tests"
fi

# ----------------------------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------------------------
{
    echo "== summary ($(date -u +%FT%TZ), provider $provider, logs in $OUT) =="
    printf '%s\n' "${summary[@]}"
    for f in "$OUT"/tests-library.log "$OUT"/tests-library-*.log "$OUT"/tests-p2p.log "$OUT"/tests-p2p-*.log; do
        [ -f "$f" ] || continue
        grep -E '^(FAIL|WATCHDOG|FATAL)' "$f" | sed "s|^|  $(basename "$f" .log): |" | head -n 30
    done
    if [ $overall = 0 ]; then echo "RESULT: all steps passed"; else echo "RESULT: FAILED"; fi
} | tee "$OUT/summary.txt"
exit $overall
