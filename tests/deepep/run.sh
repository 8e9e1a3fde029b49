#!/usr/bin/env bash
# DeepEP's own low-latency test (V1 kernels) on this library's GDA queue, on one GPU node.
#
#   PLUGIN_DIR=.gpu/plugin/lib LIBFABRIC_HOME=.gpu/libfabric OUT=deepep-out \
#       bash tests/deepep/run.sh DEEPEP_TREE
#
# Steps (logs and a summary under $OUT):
#   1. patches/deepep/apply.sh DEEPEP_TREE (in place; idempotent);
#   2. builds DeepEP's extension in place (python setup.py build_ext --inplace, sm_90 only,
#      MAX_JOBS = cores) with the torch venv's python, unless it is already built from these sources;
#   3. with fewer GPUs than ranks: starts CUDA MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 50 / ranks
#      per GPU, or DEEPEP_MPS_PERCENT) and stops it at the end if this script started it. That is
#      half of NVSHMEM's 100 / ranks per GPU: DeepEP sizes its cooperative grids from the SMs a rank
#      sees, and at 50 % each its own P2P path, with no part of this library, stops in the first
#      combine on an H200 (64-block grids, both ranks waiting); at 25 % each (32-block grids) it
#      passes (results/gpu-2026-11-29f). Two cooperative grids of one block per SM, 66 blocks
#      each, do not run together at 50 % (tests/gpu/mps_coop.sh; they do at 40 and 25 %). Also
#      with ranks sharing a GPU, every dispatch / combine call is made by the ranks together
#      (DEEPEP_SYNC_CALLS=1 of launch_ll.py, unless DEEPEP_SYNC_CALLS is set): unsynchronized,
#      the library's path stopped at 25 % too, at a different call each time, one rank's combine
#      having posted its data and not its flags and nothing pending in the library; synchronized,
#      every config passed (results/gpu-2026-11-29g). DeepEP's kernel times (kineto) are then
#      its own; its wall-clock dispatch + combine (avg_t) holds the host synchronization and is
#      not comparable;
#   4. test_low_latency.py, 2 ranks, --disable-nvlink (DeepEP then sets NVSHMEM_DISABLE_P2P=1: every
#      token goes through NVSHMEM's remote transport = this library, GDA software queue), the library
#      preloaded as nvshmem_transport_libfabric.so.3;
#   5. the same test with NVLink/P2P allowed and without the library (NVSHMEM's P2P path), for
#      reference.
# With --two-host, step 4 runs the 2 ranks in two network + UTS namespaces joined by a veth pair
# (tests/twohost/netns.sh): the library sees two hosts and takes the path between hosts (provider
# tcp over the veth, GPU memory staged by the software queue); rank r on GPU r (both on GPU 0 under
# MPS on a one-GPU node), process group gloo over the veth; no P2P reference (NVSHMEM's P2P path does
# not cross hosts).
# Exit status: 0 when every run passed, 1 when one failed, 2 on a usage/setup error.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

usage() {
    cat <<'EOT'
usage: tests/deepep/run.sh [options] DEEPEP_TREE
  --ranks N           ranks (default 2)
  --no-build          use the extension already built in DEEPEP_TREE
  --rebuild           build even when the extension looks current
  --no-p2p-ref        skip the reference run on NVSHMEM's P2P path
  --no-gda            skip the run through the library
  --timeout S         seconds per test run (default 420)
  --test-args "..."   extra arguments for test_low_latency.py (default: its own defaults,
                      128 tokens, hidden 7168, top-8 of 288 experts)
  --single-registration
                      a heap NVSHMEM registers in one piece (NVSHMEM_DISABLE_CUDA_VMM=1,
                      NVSHMEM_SYMMETRIC_SIZE=1536M) and --num-experts 144 (a ~1 GiB buffer) unless
                      --test-args says otherwise. Without it, DeepEP's default 288 experts need
                      ~2 GiB, which NVSHMEM's VMM heap registers as several chunks (the library
                      publishes every chunk: device state version 2)
  --debug             NVSHMEM_DEBUG=INFO and NVSHMEM_EFA_LOG=nvshmem_efa_gda=debug
  --two-host          the GDA run with each rank in its own network + UTS namespace (two "hosts"
                      over a veth pair, provider tcp by default; needs root, unshare, nsenter and
                      an ip command: on PATH, TWOHOST_IP, or .gpu/iproute2/bin/ip); implies
                      --no-p2p-ref and --ranks 2
  --stacks S          when a run is still going after S seconds, dump its processes' threads,
                      host stacks and resident GPU kernels (tests/deepep/stacks.sh) to
                      $OUT/<run>-stacks.txt
environment: PLUGIN_DIR (libnvshmem_efa_gda.so + nvshmem_transport_libfabric.so.3),
  LIBFABRIC_HOME (libfabric prefix), OUT (default ./deepep-out), PYTHON (default
  /opt/torch/.venv/bin/python, else python3), MAX_JOBS (default: cores),
  NVSHMEM_LIBFABRIC_PROVIDER (default shm); NVSHMEM_EFA_* and FI_* are passed through.
EOT
}

ranks=2
do_build=1
rebuild=0
do_p2p=1
do_gda=1
timeout_s=420
test_args=""
debug=0
stacks=0
single_reg=0
two_host=0
tree=""
while [ $# -gt 0 ]; do
    case "$1" in
    --ranks) ranks=${2:?--ranks needs a value}; shift ;;
    --no-build) do_build=0 ;;
    --rebuild) rebuild=1 ;;
    --no-p2p-ref) do_p2p=0 ;;
    --no-gda) do_gda=0 ;;
    --timeout) timeout_s=${2:?--timeout needs a value}; shift ;;
    --test-args) test_args=${2?--test-args needs a value}; shift ;;
    --debug) debug=1 ;;
    --stacks) stacks=${2:?--stacks needs seconds}; shift ;;
    --single-registration) single_reg=1 ;;
    --two-host) two_host=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "run.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) [ -z "$tree" ] || { echo "run.sh: one DEEPEP_TREE only" >&2; exit 2; }; tree=$1 ;;
    esac
    shift
done

OUT=${OUT:-$PWD/deepep-out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
summary=$OUT/summary.txt
: >"$summary"
say() { echo "[deepep run.sh] $*" | tee -a "$summary"; }
die() { say "error: $1"; exit "${2:-2}"; }

[ -n "$tree" ] || { usage >&2; exit 2; }
[ -d "$tree" ] || die "DEEPEP_TREE $tree is not a directory"
tree=$(cd "$tree" && pwd)
case $ranks in '' | *[!0-9]*) die "--ranks must be a number" ;; esac
[ "$ranks" -ge 2 ] || die "--ranks must be at least 2"
if [ $two_host = 1 ]; then
    [ "$ranks" = 2 ] || die "--two-host runs 2 ranks (one per namespace)"
    [ $do_p2p = 1 ] && say "two-host: no P2P reference run (NVSHMEM's P2P path does not cross hosts)"
    do_p2p=0
fi

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
    if [ -x /opt/torch/.venv/bin/python ]; then PYTHON=/opt/torch/.venv/bin/python; else PYTHON=$(command -v python3); fi
fi
"$PYTHON" -c 'import torch' 2>/dev/null || die "$PYTHON cannot import torch (set PYTHON)"
say "python:  $PYTHON ($("$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
nvshmem_dir=$("$PYTHON" -c 'import importlib.util as u; print(u.find_spec("nvidia.nvshmem").submodule_search_locations[0])' 2>/dev/null) ||
    die "the torch venv has no nvidia.nvshmem (NVSHMEM wheel)"
say "nvshmem: $nvshmem_dir"

# GDA runs need the library.
if [ $do_gda = 1 ]; then
    [ -n "${PLUGIN_DIR:-}" ] || die "PLUGIN_DIR is not set (libnvshmem_efa_gda.so + nvshmem_transport_libfabric.so.3; bash .ci/stage-gpu.sh)"
    [ -n "${LIBFABRIC_HOME:-}" ] || die "LIBFABRIC_HOME is not set (libfabric prefix)"
    PLUGIN_DIR=$(cd "$PLUGIN_DIR" && pwd) || die "PLUGIN_DIR $PLUGIN_DIR missing"
    [ -f "$PLUGIN_DIR/libnvshmem_efa_gda.so" ] || die "$PLUGIN_DIR/libnvshmem_efa_gda.so missing"
    [ -f "$PLUGIN_DIR/nvshmem_transport_libfabric.so.3" ] || die "$PLUGIN_DIR/nvshmem_transport_libfabric.so.3 missing"
    fabric_lib=$LIBFABRIC_HOME/lib
    [ -e "$fabric_lib/libfabric.so.1" ] || fabric_lib=$LIBFABRIC_HOME/lib64
    [ -e "$fabric_lib/libfabric.so.1" ] || die "no libfabric.so.1 under $LIBFABRIC_HOME/lib or lib64"
fi
lib_dir=${PLUGIN_DIR:-$repo/target/release}
# The extension links libnvshmem_efa_gda.so, which needs libfabric 2.x: the P2P reference run needs
# it on the library path too (a system libfabric 1.x lacks its symbol versions).
if [ -z "${fabric_lib:-}" ] && [ -n "${LIBFABRIC_HOME:-}" ]; then
    fabric_lib=$LIBFABRIC_HOME/lib
    [ -e "$fabric_lib/libfabric.so.1" ] || fabric_lib=$LIBFABRIC_HOME/lib64
fi

# 1. the kit
bash "$repo/patches/deepep/apply.sh" "$tree" 2>&1 | tee -a "$summary"
[ "${PIPESTATUS[0]}" = 0 ] || die "the DeepEP kit does not apply to $tree" 1

# 2. the build
ext=$(ls "$tree"/deep_ep_cpp*.so 2>/dev/null | head -n 1)
if [ $do_build = 1 ]; then
    stale=$rebuild
    if [ -z "$ext" ]; then stale=1
    elif [ -n "$(find "$tree/csrc" "$tree/setup.py" "$repo/cuda" "$repo/include" -newer "$ext" -type f 2>/dev/null | head -n 1)" ]; then stale=1; fi
    if [ $stale = 1 ]; then
        jobs=${MAX_JOBS:-$(nproc)}
        if "$PYTHON" -c 'import ninja' 2>/dev/null || command -v ninja >/dev/null; then
            say "build:   ninja, MAX_JOBS=$jobs, TORCH_CUDA_ARCH_LIST=9.0 (log $OUT/build.log)"
        else
            say "build:   no ninja: setuptools compiles the 7 sources one after the other (slower) (log $OUT/build.log)"
        fi
        # CUDA 13 keeps libcu++ (cuda/std/...) under include/cccl, which nvcc finds by itself but the
        # host compiler does not; NVSHMEM 3.4.5's nvshmem.h includes cuda/std/tuple, and DeepEP
        # v1.2.1's deep_ep.cpp includes nvshmem.h (DeepEP main adds the directory itself).
        cuda_home=$("$PYTHON" -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")' 2>/dev/null)
        cccl_inc=""
        [ -n "$cuda_home" ] && [ -d "$cuda_home/include/cccl" ] && cccl_inc=$cuda_home/include/cccl
        say "build:   CUDA_HOME=${cuda_home:-?}${cccl_inc:+, host include $cccl_inc}"
        t0=$(date +%s)
        (cd "$tree" && env NVSHMEM_EFA_GDA_HOME="$repo" NVSHMEM_EFA_GDA_LIB_DIR="$lib_dir" \
            ${cccl_inc:+CPLUS_INCLUDE_PATH="$cccl_inc${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"} \
            TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS="$jobs" "$PYTHON" setup.py build_ext --inplace) >"$OUT/build.log" 2>&1
        rc=$?
        say "build:   rc=$rc in $(( $(date +%s) - t0 )) s"
        [ $rc = 0 ] || { tail -n 30 "$OUT/build.log"; die "DeepEP build failed (see $OUT/build.log)" 1; }
        ext=$(ls "$tree"/deep_ep_cpp*.so 2>/dev/null | head -n 1)
        "$PYTHON" -c 'import torch; print(torch.__version__)' >"$tree/.nvshmem_efa_gda_torch" 2>/dev/null
        # SAVE_EXT=FILE keeps the built extension (gzip'd tar, relative to the tree) so that a later
        # run on a fresh node can unpack it into the same tree and use --no-build.
        if [ -n "${SAVE_EXT:-}" ]; then
            (cd "$tree" && tar czf "$SAVE_EXT" "$(basename "$ext")" .nvshmem_efa_gda_torch) &&
                say "build:   extension saved in $SAVE_EXT"
        fi
    else
        say "build:   $ext is current"
    fi
fi
[ -n "$ext" ] || die "no deep_ep_cpp*.so in $tree (build it, or drop --no-build)"
# An extension built elsewhere (e.g. carried to the node) must match this torch exactly.
torch_now=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null)
if [ -f "$tree/.nvshmem_efa_gda_torch" ] && [ "$(cat "$tree/.nvshmem_efa_gda_torch")" != "$torch_now" ]; then
    die "$ext was built with torch $(cat "$tree/.nvshmem_efa_gda_torch"), this python has torch $torch_now: rebuild (--rebuild)"
fi

# 3. placement: GPUs, MPS
# shellcheck source=../gpu/mps.sh
source "$repo/tests/gpu/mps.sh"
ngpu=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
[ "$ngpu" -ge 1 ] || die "no GPU visible"
mps_started=0
mps_env=()
if [ "$ngpu" -lt "$ranks" ]; then
    mps_start || die "could not start the CUDA MPS control daemon"
    mps_started=$MPS_STARTED
    mps_env=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${DEEPEP_MPS_PERCENT:-$((50 / ((ranks + ngpu - 1) / ngpu)))}
        DEEPEP_SYNC_CALLS="${DEEPEP_SYNC_CALLS:-1}")
    say "placement: $ranks ranks on $ngpu GPU(s), CUDA MPS (${mps_env[*]}), process group gloo"
else
    say "placement: $ranks ranks on $ngpu GPUs, one per GPU, process group nccl"
fi
# The two "hosts": namespaces held open for the run, gone at exit.
if [ $two_host = 1 ] && [ $do_gda = 1 ]; then
    if [ -z "${TWOHOST_IP:-}" ] && ! command -v ip >/dev/null 2>&1; then
        [ -x "$repo/.gpu/iproute2/bin/ip" ] || die "--two-host needs an ip command (PATH, TWOHOST_IP or .gpu/iproute2)"
        export TWOHOST_IP=$repo/.gpu/iproute2/bin/ip TWOHOST_IP_LIBS=$repo/.gpu/iproute2/lib
        command -v nsenter >/dev/null 2>&1 || export PATH="$PATH:$repo/.gpu/iproute2/bin"
    fi
    # shellcheck source=../twohost/netns.sh
    source "$repo/tests/twohost/netns.sh"
    twohost_up dpp && twohost_check || die "the two-host layout cannot be made here (root, unshare, ip)"
    say "two-host: ${TH_HOST[0]} ${TH_ADDR[0]} | ${TH_HOST[1]} ${TH_ADDR[1]} over veth ${TH_IF[0]}"
fi
stop_mps() { [ $mps_started = 1 ] && mps_stop; mps_started=0; }
trap 'stop_mps; if declare -F twohost_down >/dev/null; then twohost_down; fi' EXIT

# NVSHMEM's host library by path too: an extension built elsewhere carries another rpath.
export LD_LIBRARY_PATH="$nvshmem_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
common_env=(DEEPEP_TREE="$tree" PYTHONUNBUFFERED=1 MASTER_PORT=$((8361 + RANDOM % 500))
    NVSHMEM_DISABLE_NVLS=1 NVSHMEM_DEBUG=$([ $debug = 1 ] && echo INFO || echo WARN) "${mps_env[@]}")
[ $debug = 1 ] && common_env+=(NVSHMEM_EFA_LOG=nvshmem_efa_gda=debug)
if [ $single_reg = 1 ]; then
    common_env+=(NVSHMEM_DISABLE_CUDA_VMM=1 NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-1536M})
    case " $test_args " in *" --num-experts "*) ;; *) test_args="$test_args --num-experts 144" ;; esac
    say "single registration: NVSHMEM_DISABLE_CUDA_VMM=1 NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-1536M}, test args:$test_args"
fi

status=0
run_case() { # run_case NAME ENV... -- TEST-ARGS...
    local name=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local log=$OUT/$name.log
    say "run $name: test_low_latency.py --num-processes $ranks $* (log $log)"
    local t0; t0=$(date +%s)
    local watch=""
    if [ "$stacks" -gt 0 ]; then
        (sleep "$stacks"; bash "$here/stacks.sh" "$OUT/$name-stacks.txt") &
        watch=$!
    fi
    local rc
    if [ $two_host = 1 ]; then
        # One process per namespace, one rank each: node r of 2 (launch_ll.py's init_dist reads
        # WORLD_SIZE / RANK as nodes), GPU r, the bootstrap, the provider and gloo on the veth.
        local pids=() r gpu port=$((29500 + RANDOM % 1000))
        for r in 0 1; do
            gpu=$([ "$ngpu" -ge 2 ] && echo "$r" || echo 0)
            # shellcheck disable=SC2086
            timeout -k 20 "$timeout_s" nsenter -t "${TH_PID[$r]}" -n -u -- env "${common_env[@]}" "${envs[@]}" \
                CUDA_VISIBLE_DEVICES="$gpu" WORLD_SIZE=2 RANK="$r" MASTER_ADDR="${TH_ADDR[0]}" MASTER_PORT="$port" \
                DEEPEP_PG_BACKEND=gloo GLOO_SOCKET_IFNAME="${TH_IF[$r]}" NCCL_SOCKET_IFNAME="${TH_IF[$r]}" \
                FI_TCP_IFACE="${TH_IF[$r]}" NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME="${TH_IF[$r]}" \
                NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY=AF_INET \
                "$PYTHON" "$here/launch_ll.py" --num-processes 1 "$@" $test_args >"$OUT/$name.rank$r.log" 2>&1 &
            pids+=($!)
        done
        rc=0
        for r in "${pids[@]}"; do wait "$r" || rc=$?; done
        cat "$OUT/$name.rank0.log" "$OUT/$name.rank1.log" >"$log"
    else
        # shellcheck disable=SC2086
        timeout -k 20 "$timeout_s" env "${common_env[@]}" "${envs[@]}" \
            "$PYTHON" "$here/launch_ll.py" --num-processes "$ranks" "$@" $test_args >"$log" 2>&1
        rc=$?
    fi
    if [ -n "$watch" ]; then
        # A run that ended first needs no dump; one that hung waits for its dump to finish.
        if [ $rc = 0 ]; then kill "$watch" 2>/dev/null; fi
        wait "$watch" 2>/dev/null
        [ -s "$OUT/$name-stacks.txt" ] && say "run $name: stacks in $OUT/$name-stacks.txt"
    fi
    grep -E 'Dispatch|Combine|bandwidth|launch_ll|Error|error|Traceback|assert' "$log" | head -n 40 | tee -a "$summary"
    if [ $rc = 0 ]; then say "run $name: PASS in $(( $(date +%s) - t0 )) s"
    else
        [ $rc = 124 ] && say "run $name: TIMEOUT after $timeout_s s"
        say "run $name: FAIL (rc=$rc)"; tail -n 30 "$log"; status=1
    fi
}

if [ $do_gda = 1 ]; then
    run_case gda \
        LD_PRELOAD="$PLUGIN_DIR/nvshmem_transport_libfabric.so.3" \
        LD_LIBRARY_PATH="$PLUGIN_DIR:$fabric_lib:${LD_LIBRARY_PATH:-}" \
        NVSHMEM_REMOTE_TRANSPORT=libfabric \
        NVSHMEM_LIBFABRIC_PROVIDER="${NVSHMEM_LIBFABRIC_PROVIDER:-$([ $two_host = 1 ] && echo tcp || echo shm)}" \
        NVSHMEM_DISABLE_P2P=1 \
        -- --disable-nvlink
fi
if [ $do_p2p = 1 ]; then
    # A run that ended by timeout leaves its killed clients in the MPS server, which then refuses
    # new clients ("MPS server is not ready"): start the daemon afresh between the runs.
    if [ $mps_started = 1 ] && [ $do_gda = 1 ]; then
        stop_mps
        mps_start || die "could not restart the CUDA MPS control daemon"
        mps_started=$MPS_STARTED
    fi
    # NVSHMEM's own P2P path; DeepEP links the library but never needs its queue here
    # (nvshmem_efa_gda_ibgda_setup returns 0 when every peer is P2P-mapped).
    run_case p2p LD_LIBRARY_PATH="$lib_dir:${fabric_lib:+$fabric_lib:}${LD_LIBRARY_PATH:-}" NVSHMEM_REMOTE_TRANSPORT=none --
fi
stop_mps
[ $status = 0 ] && say "all runs passed" || say "a run failed"
exit $status
