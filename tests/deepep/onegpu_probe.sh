#!/usr/bin/env bash
# DeepEP's low-latency test with both ranks on one GPU under CUDA MPS, in variants that tell apart
# why it stops there. Found so far (results/gpu-2026-11-29e and -29f): at 50 % each, DeepEP's own P2P
# path stops in the first combine as the library's path does (one rank's combine never posts); at 25 %
# each the P2P path passes, and the library's path passes every correctness check and stops at the
# start of the timed loop (dispatch / combine pairs launched back to back), one rank one phase behind
# and nothing pending in the library's last report.
#
#   PLUGIN_DIR=.gpu/plugin/lib LIBFABRIC_HOME=.gpu/libfabric NVSHMEM_DISABLE_NVLS=1 \
#   LOAD_EXT=.gpu/deepep-ext-q.tgz OUT=<dir> bash tests/deepep/onegpu_probe.sh [--limit S] \
#       [--config T:H:E:K] [--variants LIST] DEEPEP_TREE
#
# Variants (--variants, comma-separated; default all, in this order):
#   host25 25 % each, the software queue's host copy route (NVSHMEM_EFA_SOFT_IPC=host): no kernel of
#          the library in either process. Passing here, where mps25 stops, would put the stop on the
#          copy kernel's launches competing with DeepEP's grids for a rank's SMs
#   mps25  25 % each (32 SMs seen, the runner's placement): grids of 32 blocks
#   sync25 25 % each, every dispatch / combine call made by both ranks together
#          (DEEPEP_SYNC_CALLS=1; run.sh's default on a shared GPU): passes where mps25 stops
#          (results/gpu-2026-11-29g)
#   p2p25  DeepEP's own NVLink path on NVSHMEM's P2P transport (no queue of the library), 25 %
#   mps50  50 % each (NVSHMEM's 100 / ranks; 66 SMs seen): combine grids of 64 blocks
#   mps40  40 % each (52 SMs seen): combine grids of 43 blocks
#   host   50 %, the host copy route
#   sync   50 %, every dispatch / combine call made by both ranks together (DEEPEP_SYNC_CALLS=1)
#   p2p    DeepEP's own NVLink path, 50 %
# Calls are not synchronized unless the variant says so (run.sh's default with ranks sharing a GPU
# is to synchronize them; env's last assignment wins). Each variant is tests/deepep/ll_matrix.sh
# with one config (default 128:7168:32:8, a 32-expert one: one warp group per SM), CASE_TIMEOUT=S
# (--limit, default 150; a pass takes about 35 s on two GPUs, 28 s on DeepEP's P2P path at 25 % on
# one GPU and 41 s on the library's path there, sync25),
# DEEPEP_TRACE_CALLS=8 (or PROBE_TRACE_CALLS), Python stacks 20 s before the limit, the library's
# log at debug level (its idle report gives each PE's WQEs taken and AMOs applied). Each runs in a
# session of its own (setsid), killed as a whole session 30 s after its limit, and the MPS daemon is
# stopped after it (tests/gpu/mps.sh mps_stop, which kills it when it does not quit), so that a hung
# variant does not take the next with it (a killed client left in the MPS server makes it refuse
# new ones). No output goes through a pipe (a process that outlives its runner would hold the pipe
# open).
# Prints, and writes to $OUT/probe.txt, per variant: the runner's verdict, the last DeepEP call of
# each rank, each PE's WQEs taken and AMOs applied, copy-kernel launches taken over, consumer
# threads the software queue's watchdog found blocked, and from each PE's last report the rings whose
# GPU side is not at the consumer and the AMO words changed since the consumer wrote them. Logs:
# $OUT/<variant>/.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
limit=150
config=128:7168:32:8
variants=host25,mps25,sync25,p2p25,mps50,mps40,host,sync,p2p
tree=""
while [ $# -gt 0 ]; do
    case "$1" in
    --limit) limit=${2:?--limit needs seconds}; shift ;;
    --config) config=${2:?--config needs T:H:E:K}; shift ;;
    --variants) variants=${2:?--variants needs a list}; shift ;;
    -*) echo "onegpu_probe.sh: unknown option $1" >&2; exit 2 ;;
    *) tree=$1 ;;
    esac
    shift
done
[ -d "$tree" ] || { echo "onegpu_probe.sh: DEEPEP_TREE missing" >&2; exit 2; }
case $limit in '' | *[!0-9]*) echo "onegpu_probe.sh: --limit must be seconds" >&2; exit 2 ;; esac
case $config in *:*:*:*) ;; *) echo "onegpu_probe.sh: --config must be T:H:E:K" >&2; exit 2 ;; esac
for v in ${variants//,/ }; do
    case $v in host25 | mps25 | sync25 | p2p25 | mps50 | mps40 | host | sync | p2p) ;;
    *) echo "onegpu_probe.sh: unknown variant '$v' (host25,mps25,sync25,p2p25,mps50,mps40,host,sync,p2p)" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-$PWD/onegpu-probe}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
probe=$OUT/probe.txt
: >"$probe"
say() { echo "[onegpu probe] $*" | tee -a "$probe"; }
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps-log}
# shellcheck source=../gpu/mps.sh
source "$here/../gpu/mps.sh"
stop_mps() { mps_stop; }

summarize() { # summarize VARIANT DIR
    local v=$1 d=$2 log verdict r
    log=$(ls "$d"/*/gda.log "$d"/*/p2p.log 2>/dev/null | head -n 1)
    verdict=$(grep -hE 'run (gda|p2p): (PASS|TIMEOUT|FAIL)' "$d/console.txt" 2>/dev/null | tail -n 1)
    say "$v: ${verdict:-no verdict (killed by the probe after $((limit + 30)) s?)}"
    [ -n "$log" ] || { say "$v:   no test log"; return; }
    for r in 0 1; do
        say "$v:   rank $r last call: $(grep -ao "rank $r call [0-9]*: [a-z_]*" "$log" | tail -n 1 | sed "s/rank $r call //")"
    done
    # The library's debug report: "software queue of PE P: ... ring R's doorbell D, T WQEs taken (...)
    # ... AMO messages: A applied in B batches"; the last one per PE.
    for r in 0 1; do
        local line
        line=$(grep -a "software queue of PE $r:" "$log" | tail -n 1)
        [ -n "$line" ] || { say "$v:   PE $r: no report of the software queue"; continue; }
        say "$v:   PE $r: $(echo "$line" | grep -o '[0-9]* WQEs taken (' | tr -d '(')total, $(echo "$line" | grep -o 'AMO messages: [0-9]* applied' | sed 's/AMO messages: //') AMOs"
        # Rings whose GPU side is not at the consumer (a poster waiting for room or its turn) and
        # AMO words changed since this PE's consumer wrote them (a count overwritten after
        # delivery): the report's tail, at debug level.
        say "$v:   PE $r: $(echo "$line" | grep -o '[0-9]* slots reserved and not taken.*' | cut -c1-1500)"
    done
    say "$v:   copy-kernel launches taken over (warnings): $(grep -ac 'had not started after' "$log")"
    # The software queue's watchdog (NVSHMEM_EFA_SOFT_WATCHDOG_MS): a consumer thread blocked inside
    # a call, which its own reports cannot show.
    say "$v:   consumer threads reported blocked (watchdog): $(grep -ac 'has not finished a loop pass' "$log")"
    grep -aE '^\[(Dispatch|Combine)|Dispatch \+ combine|passed' "$log" | head -n 6 | sed "s/^/[onegpu probe] $v:   /" | tee -a "$probe"
}

say "config $config, limit $limit s per variant, variants $variants"
for v in ${variants//,/ }; do
    d=$OUT/$v
    mkdir -p "$d"
    venv=(DEEPEP_TRACE_CALLS="${PROBE_TRACE_CALLS:-8}" DEEPEP_DUMP_AFTER=$((limit > 40 ? limit - 20 : 20))
        CASE_TIMEOUT="$limit" OUT="$d" DEEPEP_SYNC_CALLS=0)
    vargs=(--no-p2p-ref --debug)
    case $v in
    host25) venv+=(DEEPEP_MPS_PERCENT=25 NVSHMEM_EFA_SOFT_IPC=host) ;;
    mps25) venv+=(DEEPEP_MPS_PERCENT=25) ;;
    sync25) venv+=(DEEPEP_MPS_PERCENT=25 DEEPEP_SYNC_CALLS=1) ;;
    p2p25) venv+=(DEEPEP_MPS_PERCENT=25); vargs=(--no-gda) ;;
    mps50) venv+=(DEEPEP_MPS_PERCENT=50) ;;
    mps40) venv+=(DEEPEP_MPS_PERCENT=40) ;;
    host) venv+=(DEEPEP_MPS_PERCENT=50 NVSHMEM_EFA_SOFT_IPC=host) ;;
    sync) venv+=(DEEPEP_MPS_PERCENT=50 DEEPEP_SYNC_CALLS=1) ;;
    p2p) venv+=(DEEPEP_MPS_PERCENT=50); vargs=(--no-gda) ;;
    esac
    stop_mps
    t0=$SECONDS
    setsid env "${venv[@]}" bash "$here/ll_matrix.sh" "${vargs[@]}" --configs "$config" "$tree" \
        >"$d/console.txt" 2>&1 </dev/null &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt $((limit + 30)) ]; do sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
        # The whole session: timeout(1) in run.sh puts each test in a process group of its own.
        kill -9 -- "-$pid" 2>/dev/null
        pkill -9 -s "$pid" 2>/dev/null
        say "$v: killed after $((SECONDS - t0)) s"
    fi
    wait "$pid" 2>/dev/null
    summarize "$v" "$d"
    stop_mps
done
say "done"
