#!/usr/bin/env bash
# DeepEP's low-latency matrix in one GPU-node call, within a time budget, with an extension built
# earlier (no 10-minute build): the three configs on the GDA path, DeepEP's pressure test for a few
# seeds, the default config in the two-host layout, and the default config with several consumer
# threads. Each step runs only if the budget still holds its time limit; what is skipped says so.
#
#   PLUGIN_DIR=.gpu/plugin/lib LIBFABRIC_HOME=.gpu/libfabric NVSHMEM_DISABLE_NVLS=1 \
#   LOAD_EXT=.gpu/deepep-ext.tgz OUT=<dir> bash tests/deepep/followup.sh [--budget S] [--p2p] \
#       [--steps LIST] [--before PLUGIN_LIB_DIR] DEEPEP_TREE
#
# Staged here with tests/deepep/stage_followup.sh (.gpu/followup.tgz, unpacked into .gpu on the
# node). LOAD_EXT: the extension SAVE_EXT kept (tests/deepep/build_ext.sh, ll_matrix.sh). --p2p adds the
# NVLink reference rows. Writes $OUT/<step>/ (ll_matrix.sh's logs and deepep-ll.csv per step),
# $OUT/deepep-ll.csv (every step's rows, with a label column naming the step) and $OUT/summary.txt.
# --steps: a comma-separated subset of matrix,before,pressure,two-host,threads4 (default: all but
# before), run in that order. --before DIR: the step "before" runs the default config with the library
# in DIR (an older build, e.g. .gpu/plugin-0a83360/lib), so that a change is compared with what it
# replaced in one call, on one node and layout.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
budget=540
p2p=0
tree=""
steps="matrix,pressure,two-host,threads4"
before=""
while [ $# -gt 0 ]; do
    case "$1" in
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    --p2p) p2p=1 ;;
    --steps) steps=${2:?--steps needs a list}; shift ;;
    --before) before=${2:?--before needs a directory}; steps="$steps,before"; shift ;;
    -*) echo "followup.sh: unknown option $1" >&2; exit 2 ;;
    *) tree=$1 ;;
    esac
    shift
done
[ -d "$tree" ] || { echo "followup.sh: DEEPEP_TREE missing" >&2; exit 2; }
case $budget in '' | *[!0-9]*) echo "followup.sh: --budget must be seconds" >&2; exit 2 ;; esac
for s in ${steps//,/ }; do
    case $s in
    matrix | before | pressure | two-host | threads4) ;;
    *) echo "followup.sh: unknown step '$s' (matrix,before,pressure,two-host,threads4)" >&2; exit 2 ;;
    esac
done
if [[ ",$steps," == *",before,"* ]]; then
    [ -f "$before/nvshmem_transport_libfabric.so.3" ] ||
        { echo "followup.sh: step before needs --before DIR holding nvshmem_transport_libfabric.so.3" >&2; exit 2; }
    before=$(cd "$before" && pwd)
fi
OUT=${OUT:-$PWD/deepep-followup}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
summary=$OUT/summary.txt
: >"$summary"
say() { echo "[deepep followup] $*" | tee -a "$summary"; }
T0=$SECONDS
left() { echo $((budget - (SECONDS - T0))); }
status=0
csvs=()

# step NAME LIMIT ENV... -- ll_matrix.sh ARGS...: runs when LIMIT seconds are left.
step() {
    local name=$1 limit=$2
    if [[ ",$steps," != *",$name,"* ]]; then return; fi
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    if [ "$(left)" -lt "$limit" ]; then
        say "$name: SKIPPED ($(left) s left, needs $limit)"
        return
    fi
    say "$name: ${envs[*]} ll_matrix.sh $* ($(left) s left)"
    local t0=$SECONDS
    env "${envs[@]}" OUT="$OUT/$name" timeout -k 10 "$limit" bash "$here/ll_matrix.sh" "$@" "$tree" \
        >"$OUT/$name.console.txt" 2>&1
    local rc=$?
    say "$name: rc=$rc in $((SECONDS - t0)) s"
    grep -h "^128x" "$OUT/$name/deepep-ll.csv" 2>/dev/null | sed 's/^/    /' | tee -a "$summary"
    [ $rc = 0 ] || status=1
    [ -f "$OUT/$name/deepep-ll.csv" ] && csvs+=("$name:$OUT/$name/deepep-ll.csv")
}

ref=(--no-p2p-ref)
mlimit=240
[ $p2p = 1 ] && { ref=(); mlimit=330; }
step matrix $mlimit CASE_TIMEOUT=75 -- "${ref[@]}"
step before 110 CASE_TIMEOUT=100 "PLUGIN_DIR=$before" -- --no-p2p-ref --configs "128:7168:288:8"
step pressure 120 CASE_TIMEOUT=110 -- --no-p2p-ref --configs "128:7168:288:8" --seeds 2
step two-host 100 CASE_TIMEOUT=90 -- --two-host --configs "128:7168:288:8"
step threads4 80 CASE_TIMEOUT=70 NVSHMEM_EFA_SOFT_THREADS=4 -- --no-p2p-ref --configs "128:7168:288:8"

# Every step's rows in one CSV, labelled by step.
{
    echo "config,path,ranks,gpus,dispatch_us,combine_us,dispatch_combine_us,dispatch_send_us,combine_send_us,label"
    for c in "${csvs[@]}"; do
        tail -n +2 "${c#*:}" | sed "s/\$/,${c%%:*}/"
    done
} >"$OUT/deepep-ll.csv"
say "done in $((SECONDS - T0)) s; $OUT/deepep-ll.csv"
exit $status
